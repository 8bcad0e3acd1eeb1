"""TLS TERMINATOR in front of tansu — a named stand-in for a broker's TLS listener.

tansu 0.6 takes ``--cert`` but its TLS listener did not complete a handshake with
librdkafka here, so the broker's TLS side is played by this relay: it terminates
TLS with the given certificate and pipes bytes to the real broker. The broker
advertises the relay's port, so every address the proxy learns leads through TLS.
"""

from __future__ import annotations

import ssl

import trio


async def _pipe(src: trio.abc.Stream, dst: trio.abc.Stream) -> None:
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(dst)


async def serve_tls_front(ctx: ssl.SSLContext, backend: tuple[str, int], port: int,
                          *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
    async def handle(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, ctx, server_side=True)
        try:
            await tls.do_handshake()
            upstream = await trio.open_tcp_stream(*backend)
        except (trio.BrokenResourceError, OSError):
            await trio.aclose_forcefully(stream)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pipe, tls, upstream)
            nursery.start_soon(_pipe, upstream, tls)

    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)
