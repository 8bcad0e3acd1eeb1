"""Splitting a byte stream into Kafka's size-prefixed frames, sans-IO and without copying.

Feed it whatever the socket returned; take out complete frames. A frame that lies
inside one received chunk is returned as a view of that chunk (no copy); only a
frame that spans several chunks is assembled, once. Runs of frames that sit next to
each other in the same chunk can be relayed as one slice (``Frame.extends``). The
declared size is checked before any buffering, so a peer cannot make us hold more
than ``max_frame_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB by default).

For a trusted peer (the broker) a large frame can instead be received in place: once
its size is known, a buffer of that size is allocated and the rest of the frame is
read straight into it (``room``/``filled``), so it is not assembled from chunks.
Clients do not get this: a declared size alone would make the proxy allocate it.
Or a large frame can be passed through: ``take_partial`` hands over what is buffered
of it and how much is still to come, and the caller relays the rest as it arrives
without buffering it here at all (cut-through).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from kproxy.codecs.errors import CodecError

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")

Buffer = bytes | bytearray


def _uninitialised_maker() -> Callable[[int], bytearray]:
    """``bytearray(n)`` zero-fills its ``n`` bytes, and a frame received in place is
    overwritten whole before anyone reads it: for a consumer's multi-megabyte Fetch
    responses that fill was 15% of the proxy's CPU. CPython's
    ``PyByteArray_FromStringAndSize(NULL, n)`` allocates without filling; where it
    cannot be reached (another interpreter), the zero-filled kind serves."""
    try:
        import ctypes

        make = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except (ImportError, AttributeError):  # pragma: no cover - not CPython
        return bytearray
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)

    def uninitialised(n: int) -> bytearray:
        buf = make(None, n)
        assert type(buf) is bytearray and len(buf) == n
        return buf

    return uninitialised


# A buffer whose bytes are whatever the allocator left there: only for a frame that is
# filled before it is read (``next_wire`` hands an in-place frame out only when full).
uninitialised = _uninitialised_maker()


class FrameTooLarge(CodecError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes",
                         what="frame size", offset=0)
        self.size = size
        self.limit = limit


class Frame:
    """One frame: ``buf[start:end]`` is its wire form (size prefix included)."""

    __slots__ = ("buf", "end", "start")

    def __init__(self, buf: Buffer, start: int, end: int) -> None:
        self.buf = buf
        self.start = start
        self.end = end

    @property
    def wire(self) -> memoryview:
        return memoryview(self.buf)[self.start : self.end]

    @property
    def body(self) -> memoryview:
        return memoryview(self.buf)[self.start + 4 : self.end]

    def __len__(self) -> int:
        return self.end - self.start - 4

    def extends(self, previous: Frame) -> bool:
        """Whether this frame directly follows ``previous`` in the same buffer."""
        return self.buf is previous.buf and self.start == previous.end


class FrameReader:
    """Accumulates received chunks and yields complete frames."""

    __slots__ = ("_buffered", "_chunks", "_filled", "_frame", "_pos", "in_place_from",
                 "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 in_place_from: int | None = None) -> None:
        self.max_frame_bytes = max_frame_bytes
        # Frames at least this large are received in place (trusted peers only).
        self.in_place_from = in_place_from
        # A list, not a deque: an empty deque keeps a 64-slot block (~760 bytes) for the
        # life of an idle connection; an empty list keeps nothing. A frame rarely lies in
        # more than a few chunks, so taking them from the front costs no more.
        self._chunks: list[Buffer] = []
        self._pos = 0  # read position in the first chunk
        self._buffered = 0
        self._frame: bytearray | None = None  # a large frame being received in place
        self._filled = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if data and self._frame is not None:  # the open frame takes what it still lacks
            take = min(len(data), len(self._frame) - self._filled)
            self._frame[self._filled : self._filled + take] = data[:take]
            self._filled += take
            data = data[take:]
        if data:
            # Received chunks are never modified, so frames may be views into them.
            self._chunks.append(data if isinstance(data, bytes) else bytes(data))
            self._buffered += len(data)

    def room(self) -> memoryview | None:
        """Where the rest of a large frame is to be received, or None: ``feed`` chunks."""
        if self._frame is None or self._filled == len(self._frame):
            return None
        return memoryview(self._frame)[self._filled :]

    def filled(self, n: int) -> None:
        """``n`` more bytes were received into ``room()``."""
        assert self._frame is not None and self._filled + n <= len(self._frame)
        self._filled += n

    def _open_in_place(self, total: int) -> None:
        """Move the buffered start of a large frame into a buffer of its full size (not
        zero-filled: every byte of it is received before the frame is handed out)."""
        frame = uninitialised(total)
        filled = 0
        for chunk in self._chunks:
            part = memoryview(chunk)[self._pos :] if filled == 0 else memoryview(chunk)
            frame[filled : filled + len(part)] = part
            filled += len(part)
        self._chunks.clear()
        self._pos = self._buffered = 0
        self._frame, self._filled = frame, filled

    def buffered(self) -> int:
        return self._buffered

    def held(self) -> int:
        """Bytes this reader keeps alive: buffered chunks and a frame opened in place."""
        return self._buffered + (len(self._frame) if self._frame is not None else 0)

    def _next_total(self) -> int:
        """The buffered next frame's whole size, prefix included, once checked."""
        (size,) = _SIZE.unpack(self._peek(4))
        if size < 0:
            raise CodecError(f"negative frame size {size}", what="frame size", offset=0)
        if size > self.max_frame_bytes:
            raise FrameTooLarge(size, self.max_frame_bytes)
        return int(size) + 4

    def pending(self) -> tuple[int, bytes] | None:
        """The frame being received, when its start is buffered but not all of it.

        Returns its total size (prefix included) and up to its first 8 bytes (size and,
        for a response, the correlation id), or None: no frame or a complete one is
        next, or it is already open in place. Checks the size like ``next_wire``.
        """
        if self._frame is not None or self._buffered < 4:
            return None
        total = self._next_total()
        if self._buffered >= total:
            return None
        return total, self._peek(min(8, self._buffered))

    def head(self, n: int) -> bytes:
        """A copy of up to the first ``n`` buffered bytes (to peek a pending frame's header)."""
        return self._peek(min(n, self._buffered)) if self._buffered else b""

    def open_in_place(self) -> None:
        """Receive the pending frame (see ``pending``) in place from now on."""
        pending = self.pending()
        assert pending is not None
        self._open_in_place(pending[0])

    def take_partial(self) -> tuple[list[memoryview], int]:
        """Hand over the pending frame: its buffered bytes, and how many are still to come.

        The reader is empty afterwards; the caller relays the rest of the frame and
        feeds whatever follows it back in.
        """
        pending = self.pending()
        assert pending is not None
        parts = [memoryview(c) for c in self._chunks]
        if parts:
            parts[0] = parts[0][self._pos :]
        rest = pending[0] - self._buffered
        self._chunks.clear()
        self._pos = self._buffered = 0
        return parts, rest

    def _peek(self, n: int) -> bytes:
        """The next ``n`` buffered bytes (only called for the 4-byte size)."""
        head = self._chunks[0]
        if len(head) - self._pos >= n:
            return bytes(head[self._pos : self._pos + n])
        out = bytearray(head[self._pos :])
        for chunk in self._chunks[1:]:
            out += chunk[: n - len(out)]
            if len(out) >= n:
                break
        return bytes(out)

    def next_wire(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed."""
        if self._frame is not None:
            if self._filled < len(self._frame):
                return None
            whole, self._frame = self._frame, None
            return Frame(whole, 0, len(whole))
        if self._buffered < 4:
            return None
        total = self._next_total()
        if self._buffered < total:
            if self.in_place_from is not None and total >= self.in_place_from:
                self._open_in_place(total)
            return None
        self._buffered -= total
        head = self._chunks[0]
        if len(head) - self._pos >= total:  # inside one chunk: a view, no copy
            frame = Frame(head, self._pos, self._pos + total)
            self._pos += total
            if self._pos == len(head):
                del self._chunks[0]
                self._pos = 0
            return frame
        out = bytearray()  # spans chunks: assemble it once
        used = 0  # chunks wholly consumed, dropped at the end in one go
        while len(out) < total:
            head = self._chunks[used]
            take = min(total - len(out), len(head) - self._pos)
            out += memoryview(head)[self._pos : self._pos + take]
            self._pos += take
            if self._pos == len(head):
                used += 1
                self._pos = 0
        del self._chunks[:used]
        return Frame(out, 0, total)

    def wire_frames(self) -> list[Frame]:
        chunks = self._chunks
        if len(chunks) == 1 and not self._pos and self._frame is None:
            # The usual small request or response: one chunk received, one frame exactly.
            head = chunks[0]
            n = len(head)
            if n >= 4 and _SIZE.unpack_from(head)[0] + 4 == n and n - 4 <= self.max_frame_bytes:
                chunks.clear()
                self._buffered = 0
                return [Frame(head, 0, n)]
        out: list[Frame] = []
        while (frame := self.next_wire()) is not None:
            out.append(frame)
        return out

    def next_frame(self) -> bytes | None:
        """The next complete frame body as bytes (a copy), or None."""
        frame = self.next_wire()
        return None if frame is None else bytes(frame.body)

    def frames(self) -> list[bytes]:
        return [bytes(f.body) for f in self.wire_frames()]


def frame(body: bytes | bytearray | memoryview) -> bytes:
    """Prefix a body with its 4-byte size."""
    return _SIZE.pack(len(body)) + bytes(body)
