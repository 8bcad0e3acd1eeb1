"""Kafka compression codecs with a hard bound on decompressed size.

Types follow Kafka's ``CompressionType`` ids: 0 none, 1 gzip, 2 snappy, 3 lz4,
4 zstd. Every decompressor stops as soon as output would pass ``max_bytes``, so a
small payload that claims (or expands to) gigabytes fails fast with a
``DecompressionLimitExceeded`` and never allocates more than the bound.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from enum import IntEnum

import lz4.frame
import snappy
import zstandard

from kproxy.codecs.errors import CodecError


class CompressionType(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_BY_KIND = {int(ctype): ctype for ctype in CompressionType}


class DecompressionLimitExceeded(CodecError):
    def __init__(self, codec: str, limit: int) -> None:
        super().__init__(f"{codec} payload expands past the limit of {limit} bytes",
                         what=f"{codec} payload")
        self.limit = limit


_CHUNK = 64 * 1024
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")


def compress(kind: int, data: bytes) -> bytes:
    ctype = _ctype(kind)
    if ctype is CompressionType.NONE:
        return bytes(data)
    if ctype is CompressionType.GZIP:
        co = zlib.compressobj(wbits=31)
        return co.compress(data) + co.flush()
    if ctype is CompressionType.SNAPPY:
        return bytes(snappy.compress(data))
    if ctype is CompressionType.LZ4:
        return bytes(lz4.frame.compress(data))
    return bytes(zstandard.ZstdCompressor().compress(data))


def xerial_compress(data: bytes, block_size: int = 32 * 1024) -> bytes:
    """Snappy in the xerial (snappy-java) stream framing that Java clients write."""
    out = bytearray(_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1))
    for i in range(0, len(data), block_size):
        block = snappy.compress(data[i : i + block_size])
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


def decompress(kind: int, data: bytes | memoryview, max_bytes: int) -> bytes:
    """Decompress ``data`` of compression ``kind``, producing at most ``max_bytes``."""
    ctype = _ctype(kind)
    try:
        return _DECOMPRESSORS[ctype](bytes(data), max_bytes)
    except CodecError:
        raise
    except Exception as exc:  # every codec library raises its own types
        raise CodecError(f"corrupt {ctype.name.lower()} payload: {type(exc).__name__} {exc}",
                         what=f"{ctype.name.lower()} payload") from None


def _ctype(kind: int) -> CompressionType:
    ctype = _BY_KIND.get(kind)  # a dict: an Enum call costs a small push's 0.3 us
    if ctype is None:
        raise CodecError(f"unsupported compression type {kind}", what="compression type")
    return ctype


def _none(data: bytes, max_bytes: int) -> bytes:
    if len(data) > max_bytes:
        raise DecompressionLimitExceeded("uncompressed", max_bytes)
    return data


def _gzip(data: bytes, max_bytes: int) -> bytes:
    d = zlib.decompressobj(wbits=47)  # gzip or zlib header, auto-detected
    out = bytearray()
    buf = data
    while not d.eof:
        chunk = d.decompress(buf, min(_CHUNK, max_bytes + 1 - len(out)))
        out += chunk
        if len(out) > max_bytes:
            raise DecompressionLimitExceeded("gzip", max_bytes)
        if not chunk and not d.unconsumed_tail:
            raise CodecError("truncated gzip payload", what="gzip payload")
        buf = d.unconsumed_tail
    return bytes(out)


def _snappy(data: bytes, max_bytes: int) -> bytes:
    if data.startswith(XERIAL_MAGIC):
        return _xerial(data, max_bytes)
    return _snappy_block(data, max_bytes)


def _snappy_block(block: bytes, max_bytes: int, budget: int | None = None) -> bytes:
    # A raw snappy block starts with its uncompressed length: check it before
    # letting the library allocate that much.
    claimed = _snappy_length(block)
    if claimed > (max_bytes if budget is None else budget):
        raise DecompressionLimitExceeded("snappy", max_bytes)
    return bytes(snappy.decompress(block))


def _snappy_length(block: bytes) -> int:
    result = 0
    for i, byte in enumerate(block[:5]):
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return result
    raise CodecError("snappy block has no valid length preamble", what="snappy payload")


def _xerial(data: bytes, max_bytes: int) -> bytes:
    if len(data) < _XERIAL_HEADER.size:
        raise CodecError("truncated xerial snappy header", what="snappy payload")
    pos = _XERIAL_HEADER.size
    out = bytearray()
    while pos < len(data):
        if pos + 4 > len(data):
            raise CodecError("truncated xerial block length", what="snappy payload", offset=pos)
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise CodecError(f"xerial block of {n} bytes overruns the payload",
                             what="snappy payload", offset=pos - 4)
        out += _snappy_block(data[pos : pos + n], max_bytes, max_bytes - len(out))
        pos += n
    return bytes(out)


def _lz4(data: bytes, max_bytes: int) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    out = bytearray()
    buf = data
    idle = 0
    while not d.eof:
        chunk = d.decompress(buf, max_length=min(_CHUNK, max_bytes + 1 - len(out)))
        buf = b""
        out += chunk
        if len(out) > max_bytes:
            raise DecompressionLimitExceeded("lz4", max_bytes)
        idle = 0 if chunk else idle + 1
        if idle > 2 or (not chunk and d.needs_input):
            raise CodecError("truncated lz4 frame", what="lz4 payload")
    return bytes(out)


_local = threading.local()


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread: making one costs more than a small push's decoding."""
    d: zstandard.ZstdDecompressor | None = getattr(_local, "zstd", None)
    if d is None:
        d = _local.zstd = zstandard.ZstdDecompressor()
    return d


def _zstd(data: bytes, max_bytes: int) -> bytes:
    try:
        declared = zstandard.get_frame_parameters(data).content_size
    except zstandard.ZstdError as exc:
        raise CodecError(f"corrupt zstd frame header: {exc}", what="zstd payload") from None
    if declared != zstandard.CONTENTSIZE_UNKNOWN and declared > max_bytes:
        raise DecompressionLimitExceeded("zstd", max_bytes)
    try:
        return _zstd_bounded(data, declared, max_bytes)
    except zstandard.ZstdError as exc:
        if declared == zstandard.CONTENTSIZE_UNKNOWN and _zstd_exceeds(data, max_bytes):
            raise DecompressionLimitExceeded("zstd", max_bytes) from None
        raise CodecError(f"corrupt zstd payload: {exc}", what="zstd payload") from None


def _zstd_bounded(data: bytes, declared: int, max_bytes: int) -> bytes:
    """Decompress into a buffer of the declared size, else one that never exceeds ``max_bytes``.

    With no declared size (librdkafka's pushes) a buffer of ``max_bytes`` for every push
    would cost more than decoding it, so a small one is tried first: a payload that
    does not fit it is decompressed again with the full bound.
    """
    d = _zstd_decompressor()
    if declared != zstandard.CONTENTSIZE_UNKNOWN:
        return bytes(d.decompress(data))
    first = min(max_bytes, max(_CHUNK, 16 * len(data)))
    if first < max_bytes:
        try:
            return bytes(d.decompress(data, max_output_size=first))
        except zstandard.ZstdError:
            pass
    return bytes(d.decompress(data, max_output_size=max_bytes))


def _zstd_exceeds(data: bytes, max_bytes: int) -> bool:
    """Whether a frame of unknown size expands past ``max_bytes``, reading in chunks."""
    total = 0
    with zstandard.ZstdDecompressor().stream_reader(data) as reader:
        while chunk := reader.read(_CHUNK):
            total += len(chunk)
            if total > max_bytes:
                return True
    return False


_DECOMPRESSORS: dict[CompressionType, Callable[[bytes, int], bytes]] = {
    CompressionType.NONE: _none,
    CompressionType.GZIP: _gzip,
    CompressionType.SNAPPY: _snappy,
    CompressionType.LZ4: _lz4,
    CompressionType.ZSTD: _zstd,
}
