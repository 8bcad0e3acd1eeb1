"""Kafka wire primitives: fixed-width ints, varints, strings, bytes, UUIDs.

``Reader`` walks a memoryview without copying; ``Writer`` appends to a bytearray.
Every read checks bounds and raises ``CodecError`` rather than ``struct.error`` or
``IndexError``, so callers only ever handle one error type.
"""

from __future__ import annotations

import struct
import uuid

from kproxy.codecs.errors import CodecError

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

ZERO_UUID = uuid.UUID(int=0)


class Reader:
    """A bounds-checked cursor over a buffer; slices are views, never copies."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None):
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def expect_end(self, what: str) -> None:
        """A message must use every byte of its frame: anything left is an error."""
        if self.remaining():
            raise CodecError(f"{self.remaining()} unexpected trailing bytes", what=what,
                             offset=self.pos)

    def _need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise CodecError(
                f"need {n} bytes for {what}, {self.end - start} left", offset=start
            )
        self.pos = start + n
        return start

    def _fixed(self, s: struct.Struct, what: str) -> int:
        start = self._need(s.size, what)
        return int(s.unpack_from(self.buf, start)[0])

    def int8(self) -> int:
        return self._fixed(_I8, "int8")

    def int16(self) -> int:
        return self._fixed(_I16, "int16")

    def uint16(self) -> int:
        return self._fixed(_U16, "uint16")

    def int32(self) -> int:
        return self._fixed(_I32, "int32")

    def uint32(self) -> int:
        return self._fixed(_U32, "uint32")

    def int64(self) -> int:
        return self._fixed(_I64, "int64")

    def float64(self) -> float:
        start = self._need(8, "float64")
        return float(_F64.unpack_from(self.buf, start)[0])

    def boolean(self) -> bool:
        start = self._need(1, "bool")
        value = self.buf[start]
        if value > 1:
            raise CodecError(f"bool byte must be 0 or 1, got {value}", offset=start)
        return value == 1

    def uuid(self) -> uuid.UUID:
        start = self._need(16, "uuid")
        return uuid.UUID(bytes=bytes(self.buf[start : start + 16]))

    def uvarint(self) -> int:
        """Unsigned LEB128, at most 5 bytes (32 bits) as Kafka's ByteUtils reads it."""
        return self._leb128(28, "varint")

    def uvarlong(self) -> int:
        return self._leb128(63, "varlong")

    def _leb128(self, max_shift: int, what: str) -> int:
        start = self.pos
        result = 0
        shift = 0
        while True:
            if self.pos >= self.end:
                raise CodecError(f"truncated {what}", offset=start)
            byte = self.buf[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > max_shift:
                raise CodecError(f"{what} longer than {max_shift // 7 + 1} bytes", offset=start)

    def varint(self) -> int:
        """Zig-zag signed varint (record fields)."""
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def varlong(self) -> int:
        raw = self.uvarlong()
        return (raw >> 1) ^ -(raw & 1)

    def view(self, n: int) -> memoryview:
        """The next ``n`` bytes as a view into the original buffer."""
        start = self._need(n, "bytes")
        return self.buf[start : start + n]

    def skip(self, n: int) -> None:
        self._need(n, "bytes")

    # Length prefixes: classic (int16/int32, -1 = null) and compact (uvarint, 0 = null).
    def string_length(self, compact: bool) -> int:
        if compact:
            return self.uvarint() - 1
        return self.int16()

    def bytes_length(self, compact: bool) -> int:
        if compact:
            return self.uvarint() - 1
        return self.int32()

    def array_length(self, compact: bool) -> int:
        if compact:
            return self.uvarint() - 1
        return self.int32()

    def string(self, compact: bool) -> str | None:
        start = self.pos
        n = self.string_length(compact)
        if n < 0:
            if n == -1:
                return None
            raise CodecError(f"negative string length {n}", offset=start)
        raw = self.view(n)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"string is not valid UTF-8 ({exc.reason})", offset=start) from None

    def bytes_(self, compact: bool) -> memoryview | None:
        start = self.pos
        n = self.bytes_length(compact)
        if n < 0:
            if n == -1:
                return None
            raise CodecError(f"negative bytes length {n}", offset=start)
        return self.view(n)


class Writer:
    """Append-only encoder; ``getvalue`` returns the bytes written so far."""

    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self.out)

    def int8(self, v: int) -> None:
        self.out += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.out += _I16.pack(v)

    def uint16(self, v: int) -> None:
        self.out += _U16.pack(v)

    def int32(self, v: int) -> None:
        self.out += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self.out += _U32.pack(v)

    def int64(self, v: int) -> None:
        self.out += _I64.pack(v)

    def float64(self, v: float) -> None:
        self.out += _F64.pack(v)

    def boolean(self, v: bool) -> None:
        self.out.append(1 if v else 0)

    def uuid(self, v: uuid.UUID) -> None:
        self.out += v.bytes

    def uvarint(self, v: int) -> None:
        if v < 0:
            raise CodecError(f"cannot encode negative unsigned varint {v}")
        while v >= 0x80:
            self.out.append((v & 0x7F) | 0x80)
            v >>= 7
        self.out.append(v)

    def varint(self, v: int) -> None:
        self.uvarint((v << 1) ^ (v >> 31))

    def varlong(self, v: int) -> None:
        self.uvarint((v << 1) ^ (v >> 63))

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def _length(self, n: int, compact: bool, wide: bool) -> None:
        if compact:
            self.uvarint(n + 1)
        elif wide:
            self.int32(n)
        else:
            self.int16(n)

    def string(self, v: str | None, compact: bool) -> None:
        if v is None:
            self._length(-1, compact, wide=False)
            return
        data = v.encode("utf-8")
        self._length(len(data), compact, wide=False)
        self.out += data

    def bytes_(self, v: bytes | bytearray | memoryview | None, compact: bool) -> None:
        if v is None:
            self._length(-1, compact, wide=True)
            return
        self._length(len(v), compact, wide=True)
        self.out += v

    def array_length(self, n: int | None, compact: bool) -> None:
        self._length(-1 if n is None else n, compact, wide=True)
