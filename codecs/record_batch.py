"""Record batches (magic 2): the records inside a Produce partition, read without copying.

A filter that checks record contents needs each record's key and value. Uncompressed,
they are views into the request's own buffer; a compressed batch (everything after the
61-byte header is compressed as a whole) is first decompressed with a hard bound
(``compression.decompress``), so a batch that claims or expands past it is refused
before it is expanded. Records are yielded one by one: nothing is built for the batch.

Layout (Kafka's ``DefaultRecordBatch``): base offset (int64), batch length (int32),
leader epoch (int32), magic (int8), CRC (uint32), attributes (int16), last offset
delta (int32), first and max timestamps (int64), producer id (int64), producer epoch
(int16), base sequence (int32), record count (int32), then the records. A record is a
varint length, int8 attributes, varlong timestamp delta, varint offset delta, varint
key length and key, varint value length and value, varint header count and headers.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from kproxy.codecs.compression import decompress
from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import Reader

_HEAD = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = _HEAD.size  # 61
_LENGTH_OFFSET = 8  # the batch length counts the bytes after itself
_LOG_OVERHEAD = 12  # base offset and batch length
COMPRESSION_MASK = 0x07
CONTROL_FLAG = 0x20


@dataclass(frozen=True, slots=True)
class Record:
    """One record's position in its batch and its key and value (None when null)."""

    index: int  # within the batch, as KIP-467's ``batch_index`` counts
    key: memoryview | bytes | None
    value: memoryview | bytes | None


@dataclass(frozen=True, slots=True)
class BatchHead:
    magic: int
    compression: int
    control: bool
    count: int


def batches(records: memoryview) -> Iterator[tuple[BatchHead, memoryview]]:
    """Each batch in a partition's records: its header and its record bytes (as sent)."""
    pos = 0
    end = len(records)
    while pos < end:
        if end - pos < _LOG_OVERHEAD + 5:
            raise CodecError(f"{end - pos} trailing bytes are no record batch",
                             what="RecordBatch", offset=pos)
        (length,) = struct.unpack_from(">i", records, pos + _LENGTH_OFFSET)
        magic = records[pos + 16]
        if magic != 2:
            raise CodecError(f"record format v{magic} (magic {magic}) cannot be read; "
                             "only magic 2 (Kafka 0.11+) batches are", what="RecordBatch",
                             offset=pos)
        stop = pos + _LOG_OVERHEAD + length
        if length < HEADER_BYTES - _LOG_OVERHEAD or stop > end:
            raise CodecError(f"batch length {length} does not fit the {end - pos} bytes "
                             "left", what="RecordBatch", offset=pos)
        fields = _HEAD.unpack_from(records, pos)
        attributes, count = fields[5], fields[12]
        if count < 0:
            raise CodecError(f"negative record count {count}", what="RecordBatch",
                             offset=pos)
        head = BatchHead(magic, attributes & COMPRESSION_MASK,
                         bool(attributes & CONTROL_FLAG), count)
        yield head, records[pos + HEADER_BYTES: stop]
        pos = stop


def iter_records(records: memoryview, max_decompressed_bytes: int) -> Iterator[Record]:
    """Every data record of a partition's batches, in order (control batches skipped).

    The index counts from 0 in each batch. A compressed batch is decompressed into at
    most ``max_decompressed_bytes`` (else ``DecompressionLimitExceeded``, a
    ``CodecError``); malformed bytes raise ``CodecError``.
    """
    for head, body in batches(records):
        if head.control:
            continue
        data: memoryview | bytes = body
        if head.compression:
            data = decompress(head.compression, body, max_decompressed_bytes)
        yield from _records(Reader(data), head.count)


def _records(r: Reader, count: int) -> Iterator[Record]:
    # Every record takes at least 7 bytes: a count that cannot fit is refused at once.
    if count > r.remaining():
        raise CodecError(f"{count} records cannot fit in {r.remaining()} bytes",
                         what="RecordBatch.records")
    for index in range(count):
        try:
            start = r.pos
            length = r.varint()
            if length < 0 or length > r.remaining():
                raise CodecError(f"record length {length} with {r.remaining()} bytes left",
                                 offset=start)
            end = r.pos + length
            rec = Reader(r.buf, r.pos, end)
            rec.int8()  # attributes
            rec.varlong()  # timestamp delta
            rec.varint()  # offset delta
            key = _nullable(rec)
            value = _nullable(rec)
            for _ in range(_count(rec)):  # headers: checked for shape, not kept
                _nullable(rec)
                _nullable(rec)
            rec.expect_end("Record")
            r.pos = end
        except CodecError as exc:
            raise exc.within(f"RecordBatch.records[{index}]") from None
        yield Record(index, key, value)
    if r.remaining():
        raise CodecError(f"{r.remaining()} bytes after the last record",
                         what="RecordBatch.records", offset=r.pos)


def _nullable(r: Reader) -> memoryview | None:
    at = r.pos
    n = r.varint()
    if n < -1:
        raise CodecError(f"invalid length {n}", offset=at)
    return None if n == -1 else r.view(n)


def _count(r: Reader) -> int:
    at = r.pos
    n = r.varint()
    if n < 0 or n > r.remaining():
        raise CodecError(f"invalid header count {n}", offset=at)
    return n


def encode_records(values: list[tuple[bytes | None, bytes | None]]) -> bytes:
    """The records part of a batch (what a codec compresses), for tests and stand-ins."""
    from kproxy.codecs.primitives import Writer

    body = Writer()
    for i, (key, value) in enumerate(values):
        rec = Writer()
        rec.int8(0)
        rec.varlong(0)
        rec.varint(i)
        for part in (key, value):
            if part is None:
                rec.varint(-1)
            else:
                rec.varint(len(part))
                rec.raw(part)
        rec.varint(0)
        body.varint(len(rec.out))
        body.raw(rec.out)
    return body.getvalue()


def encode_batch(values: list[tuple[bytes | None, bytes | None]], compression: int = 0,
                 compressed: bytes | None = None) -> bytes:
    """A magic-2 batch of these (key, value) records, for tests and the bench's stand-in
    producers. ``compressed`` replaces the compressed record bytes (a crafted bomb).
    The CRC is computed; offsets, timestamps and producer fields are zero."""
    from kproxy.codecs.compression import compress
    from kproxy.codecs.crc32c import crc32c

    payload = (compressed if compressed is not None
               else compress(compression, encode_records(values)))
    tail = struct.pack(">hiqqqhii", compression, max(len(values) - 1, 0), 0, 0, -1, -1, -1,
                       len(values)) + payload
    head = struct.pack(">qiib", 0, len(tail) + 9, 0, 2)
    return head + struct.pack(">I", crc32c(tail)) + tail
