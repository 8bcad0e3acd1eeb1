"""Byte relays with no Kafka code, one per way of waiting for sockets (``relay_floor``).

Each forwards every byte from each client to one new upstream connection and back, and
nothing else: no framing, no ordering, no limits. They are measuring instruments, not
proxies. What they cost per request at 1,000/s is the floor a proxy built the same way
cannot go under, whatever its own code does.

- ``epoll``: one thread, ``select.epoll`` level-triggered, a receive and a send per
  wake-up; no trio at all (a C proxy's shape, in Python).
- ``trio-lowlevel``: trio, two tasks per connection, each ``wait_readable`` then
  ``recv_into``/``send`` on the raw socket (kproxy's ``SocketTransport`` shape).
- ``trio-stream``: trio, two tasks per connection over ``trio.SocketStream``.
- ``trio-splice``: as ``trio-lowlevel``, the bytes moved socket to pipe to socket with
  ``os.splice`` (kproxy's way for a large frame's rest), never copied into Python.
- ``trio-express``: trio accepts and connects; a second thread relays from its own
  epoll. The two threads never run Python at once: a lock that trio holds except while
  it waits for I/O (an instrument releases it in ``before_io_wait`` and takes it back in
  ``after_io_wait``), and that the relay thread takes for each batch of events. To the
  code they run, the process is single-threaded.

Usage: ``python floor_relays.py MODE LISTEN_PORT UPSTREAM_HOST:PORT``. Sockets stay
blocking for sends (the responses relayed here are small: a send never waits).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import sys
import threading
from collections.abc import Awaitable, Callable

import trio

RECV_BYTES = 256 * 1024
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named there from Python 3.10 on Linux
PIPE_BYTES = 1024 * 1024


def _listener(port: int) -> socket.socket:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(128)
    return ls


def _pair(client: socket.socket, upstream: tuple[str, int]) -> socket.socket:
    up = socket.create_connection(upstream)
    for s in (client, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return up


class _EpollRelay:
    """Both directions of every connection from one epoll, level-triggered."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.peer: dict[int, tuple[socket.socket, socket.socket]] = {}
        self.buf = bytearray(RECV_BYTES)

    def add(self, client: socket.socket, up: socket.socket) -> None:
        self.peer[client.fileno()] = (client, up)
        self.peer[up.fileno()] = (up, client)
        for s in (client, up):
            self.epoll.register(s.fileno(), select.EPOLLIN)

    def on_ready(self, events: list[tuple[int, int]]) -> None:
        view = memoryview(self.buf)
        for fd, _ in events:
            pair = self.peer.get(fd)
            if pair is None:
                continue
            src, dst = pair
            try:
                n = src.recv_into(self.buf)
                if n:
                    dst.sendall(view[:n])
                    continue
            except OSError:
                pass
            self._close(src, dst)

    def _close(self, a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            self.peer.pop(s.fileno(), None)
            with contextlib.suppress(OSError, ValueError):
                self.epoll.unregister(s.fileno())
            s.close()


def run_epoll(port: int, upstream: tuple[str, int]) -> None:
    relay = _EpollRelay()
    ls = _listener(port)
    relay.epoll.register(ls.fileno(), select.EPOLLIN)
    while True:
        events = relay.epoll.poll()
        if any(fd == ls.fileno() for fd, _ in events):
            client, _ = ls.accept()
            relay.add(client, _pair(client, upstream))
        relay.on_ready([e for e in events if e[0] != ls.fileno()])


async def _accept_loop(port: int, upstream: tuple[str, int],
                       on_pair: Callable[[socket.socket, socket.socket], None]) -> None:
    ls = _listener(port)
    ls.setblocking(False)
    while True:
        await trio.lowlevel.wait_readable(ls)
        client, _ = ls.accept()
        on_pair(client, _pair(client, upstream))


def _close_pair(src: socket.socket, dst: socket.socket) -> None:
    for s in (src, dst):  # the other direction's wait ends before its fd is reused
        if s.fileno() != -1:
            trio.lowlevel.notify_closing(s)
            s.close()


def _run_pumps(port: int, upstream: tuple[str, int],
               pump: Callable[[socket.socket, socket.socket], Awaitable[None]]) -> None:
    """trio, two tasks a connection: ``pump`` each way."""
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            def on_pair(client: socket.socket, up: socket.socket) -> None:
                nursery.start_soon(pump, client, up)
                nursery.start_soon(pump, up, client)
            await _accept_loop(port, upstream, on_pair)

    trio.run(main)


def run_trio_lowlevel(port: int, upstream: tuple[str, int]) -> None:
    async def pump(src: socket.socket, dst: socket.socket) -> None:
        buf = bytearray(RECV_BYTES)
        view = memoryview(buf)
        try:
            while True:
                await trio.lowlevel.wait_readable(src)
                n = src.recv_into(buf)
                if not n:
                    break
                dst.sendall(view[:n])
        except (OSError, trio.ClosedResourceError):
            pass
        _close_pair(src, dst)

    _run_pumps(port, upstream, pump)


def run_trio_splice(port: int, upstream: tuple[str, int]) -> None:
    async def pump(src: socket.socket, dst: socket.socket) -> None:
        r, w = os.pipe()
        with contextlib.suppress(OSError):  # kproxy asks for the same (splice.PIPE_BYTES)
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_BYTES)
        try:
            while True:
                # Blocking sockets, as in trio-lowlevel: once readable, a splice takes
                # what is there and returns; the pipe is emptied before the next one.
                await trio.lowlevel.wait_readable(src)
                n = os.splice(src.fileno(), w, PIPE_BYTES, flags=os.SPLICE_F_MOVE)
                if not n:
                    break
                while n:
                    n -= os.splice(r, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
        except (OSError, trio.ClosedResourceError):
            pass
        os.close(r)
        os.close(w)
        _close_pair(src, dst)

    _run_pumps(port, upstream, pump)


def run_trio_stream(port: int, upstream: tuple[str, int]) -> None:
    async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
        try:
            while data := await src.receive_some(RECV_BYTES):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await trio.aclose_forcefully(dst)

    async def handle(client: trio.SocketStream) -> None:
        up = await trio.open_tcp_stream(*upstream)
        for s in (client, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, up)
            nursery.start_soon(pump, up, client)

    async def main() -> None:
        await trio.serve_tcp(handle, port, host="127.0.0.1")

    trio.run(main)


class _Handoff(trio.abc.Instrument):
    """trio holds ``lock`` except while it waits for I/O."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def before_io_wait(self, timeout: float) -> None:
        self.lock.release()

    def after_io_wait(self, timeout: float) -> None:
        self.lock.acquire()


def run_trio_express(port: int, upstream: tuple[str, int]) -> None:
    lock = threading.Lock()
    relay = _EpollRelay()

    def express() -> None:
        while True:
            events = relay.epoll.poll()
            with lock:
                relay.on_ready(events)

    async def main() -> None:
        lock.acquire()
        trio.lowlevel.add_instrument(_Handoff(lock))
        threading.Thread(target=express, name="express", daemon=True).start()
        await _accept_loop(port, upstream, relay.add)

    trio.run(main)


MODES: dict[str, Callable[[int, tuple[str, int]], None]] = {
    "epoll": run_epoll, "trio-lowlevel": run_trio_lowlevel, "trio-stream": run_trio_stream,
    "trio-express": run_trio_express, "trio-splice": run_trio_splice}


if __name__ == "__main__":
    mode, listen, target = sys.argv[1:4]
    host, up_port = target.rsplit(":", 1)
    MODES[mode](int(listen), (host, int(up_port)))
