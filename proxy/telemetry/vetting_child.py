"""The vetting helper's main: ``python -m kproxy.telemetry.vetting_child``.

Reads vetting requests (``codecs.otlp.vetting``) from its standard input and writes a
verdict for each to its standard output, one at a time, until its input closes (the
proxy stopped or died). It runs in the kernel's idle class where that is allowed, so
the work of checking pushes takes only processor time nothing else wants, and it
holds no interpreter lock the proxy needs.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import BinaryIO

from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp import vetting
from kproxy.telemetry.idle_thread import enter_idle_class


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    """``n`` bytes, or None at the end of the stream (a partial read is the end too)."""
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(inp: BinaryIO, out: BinaryIO, max_request_bytes: int) -> None:
    """Answer requests until ``inp`` ends; a malformed request ends the helper."""
    while (head := _read_exactly(inp, vetting.LENGTH.size)) is not None:
        (size,) = vetting.LENGTH.unpack(head)
        if size > max_request_bytes:
            raise CodecError(f"a vetting request of {size} bytes, over {max_request_bytes}",
                             what="vetting request")
        body = _read_exactly(inp, size)
        if body is None:
            return
        out.write(vetting.encode_verdict(vetting.vet(vetting.decode_request(body))))
        out.flush()


def main() -> None:
    # Ctrl-C at a terminal reaches the whole process group: the proxy stops, and this
    # helper ends when its input closes, with no traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    enter_idle_class("telemetry vetting")
    with contextlib.suppress(BrokenPipeError):  # the proxy is gone
        serve(sys.stdin.buffer, sys.stdout.buffer, vetting.MAX_REQUEST_BYTES)


if __name__ == "__main__":
    main()
