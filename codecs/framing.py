"""Splitting a byte stream into Kafka's size-prefixed frames, sans-IO.

Feed it whatever the socket returned; take out complete frames. The declared size
is checked before any buffering, so a peer cannot make us hold more than
``max_frame_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB by default).
"""

from __future__ import annotations

import struct

from kproxy.codecs.errors import CodecError

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")


class FrameTooLarge(CodecError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes",
                         what="frame size", offset=0)
        self.size = size
        self.limit = limit


class FrameReader:
    """Accumulates bytes and yields complete frames (without their size prefix)."""

    __slots__ = ("_buf", "_start", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._start = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def buffered(self) -> int:
        return len(self._buf) - self._start

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None when more bytes are needed."""
        buf = self._buf
        start = self._start
        if len(buf) - start < 4:
            self._compact()
            return None
        (size,) = _SIZE.unpack_from(buf, start)
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLarge(size, self.max_frame_bytes) if size >= 0 else CodecError(
                f"negative frame size {size}", what="frame size", offset=0)
        end = start + 4 + size
        if len(buf) < end:
            self._compact()
            return None
        frame = bytes(buf[start + 4 : end])
        self._start = end
        return frame

    def frames(self) -> list[bytes]:
        out: list[bytes] = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out

    def _compact(self) -> None:
        if self._start:
            del self._buf[: self._start]
            self._start = 0


def frame(body: bytes | bytearray | memoryview) -> bytes:
    """Prefix a body with its 4-byte size."""
    return _SIZE.pack(len(body)) + bytes(body)
