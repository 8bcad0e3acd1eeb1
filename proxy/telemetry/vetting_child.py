"""The vetting helper's main: ``python -m kproxy.telemetry.vetting_child``.

Reads vetting requests (``codecs.otlp.vetting``) from its standard input and writes a
verdict for each to its standard output, one at a time, until its input closes (the
proxy stopped or died). It runs in the kernel's idle class where that is allowed, so
the work of checking pushes takes only processor time nothing else wants, and it
holds no interpreter lock the proxy needs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
from collections.abc import Callable
from typing import BinaryIO

from kproxy.codecs.framing import FrameReader
from kproxy.codecs.otlp import vetting
from kproxy.telemetry.idle_thread import enter_idle_class

READ_CHUNK = 64 * 1024


def serve(receive: Callable[[], bytes], out: BinaryIO, max_request_bytes: int) -> None:
    """Answer requests until ``receive`` returns b"" (the input ended; a request cut
    short there is dropped). A request over ``max_request_bytes`` ends the helper
    (``FrameTooLarge``)."""
    reader = FrameReader(max_request_bytes)
    while chunk := receive():
        reader.feed(chunk)
        while (body := reader.next_frame()) is not None:
            out.write(vetting.encode_verdict(vetting.vet(vetting.decode_request(body))))
            out.flush()


def main() -> None:
    # Ctrl-C at a terminal reaches the whole process group: the proxy stops, and this
    # helper ends when its input closes, with no traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    enter_idle_class("telemetry vetting")
    # As a worker does (``commands.heap.settle_heap``): what the imports made never
    # dies, and unfrozen it made each of this helper's full collections walk 30,000
    # objects (25-30 ms, pushes waiting for their verdicts).
    gc.collect()
    gc.freeze()
    with contextlib.suppress(BrokenPipeError):  # the proxy is gone
        serve(functools.partial(os.read, sys.stdin.fileno(), READ_CHUNK), sys.stdout.buffer,
              vetting.MAX_REQUEST_BYTES)


if __name__ == "__main__":
    main()
