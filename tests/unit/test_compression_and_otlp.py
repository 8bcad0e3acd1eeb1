"""Compression round-trips, bounded decompression, and OTLP decoding."""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc
import zlib

import lz4.frame
import pytest
import snappy
import zstandard

from kproxy.codecs import compression
from kproxy.codecs.compression import CompressionType, DecompressionLimitExceeded
from kproxy.codecs.errors import CodecError
from kproxy.codecs.otlp import model as otlp

from ..otlp_samples import librdkafka_like_payload

PAYLOAD = librdkafka_like_payload(points=50)


@pytest.mark.parametrize("kind", list(CompressionType))
def test_roundtrip_every_type(kind: CompressionType) -> None:
    packed = compression.compress(kind, PAYLOAD)
    assert compression.decompress(kind, packed, len(PAYLOAD)) == PAYLOAD
    with pytest.raises(DecompressionLimitExceeded):
        compression.decompress(kind, packed, len(PAYLOAD) - 1)


@pytest.mark.parametrize(("kind", "packed"), [
    # The same libraries librdkafka links against, driven the way it drives them.
    (CompressionType.GZIP, gzip.compress(PAYLOAD)),
    (CompressionType.SNAPPY, snappy.compress(PAYLOAD)),
    (CompressionType.LZ4, lz4.frame.compress(PAYLOAD, content_checksum=True)),
    (CompressionType.ZSTD, zstandard.ZstdCompressor(level=3).compress(PAYLOAD)),
    (CompressionType.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(PAYLOAD)),
])
def test_foreign_payloads_decode(kind: CompressionType, packed: bytes) -> None:
    assert compression.decompress(kind, packed, 1 << 20) == PAYLOAD


def test_snappy_xerial_framing() -> None:
    packed = compression.xerial_compress(PAYLOAD, block_size=100)
    assert packed.startswith(compression.XERIAL_MAGIC)
    assert compression.decompress(CompressionType.SNAPPY, packed, 1 << 20) == PAYLOAD
    with pytest.raises(CodecError, match="overruns"):
        compression.decompress(CompressionType.SNAPPY, packed[:-3], 1 << 20)


def _bomb(kind: CompressionType, total: int) -> bytes:
    """``total`` zero bytes compressed in 1 MiB steps, never held in memory at once."""
    zeros = bytes(1 << 20)
    steps = total >> 20
    if kind is CompressionType.GZIP:
        co = zlib.compressobj(wbits=31)
        return b"".join(co.compress(zeros) for _ in range(steps)) + co.flush()
    if kind is CompressionType.LZ4:
        lc = lz4.frame.LZ4FrameCompressor()
        framed: bytes = (lc.begin() + b"".join(lc.compress(zeros) for _ in range(steps))
                         + lc.flush())
        return framed
    if kind is CompressionType.ZSTD:
        zc = zstandard.ZstdCompressor().compressobj()
        return b"".join(zc.compress(zeros) for _ in range(steps)) + zc.flush()
    return compression.XERIAL_MAGIC + struct.pack(">ii", 1, 1) + b"".join(
        struct.pack(">i", len(block)) + block for block in [snappy.compress(zeros)] * steps)


@pytest.mark.parametrize("kind", [k for k in CompressionType if k])
def test_decompression_bomb_fails_fast_without_allocating(kind: CompressionType) -> None:
    bomb = _bomb(kind, 256 << 20)  # 256 MiB of zeros
    tracemalloc.start()
    try:
        with pytest.raises(DecompressionLimitExceeded, match="limit of 1048576"):
            compression.decompress(kind, bomb, 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The bound is 1 MiB; allow the input copy and one chunk of slack, nothing near 256 MiB.
    assert peak < len(bomb) + (4 << 20), f"peak allocation {peak} bytes"


def test_snappy_block_that_lies_about_its_length() -> None:
    liar = b"\xff\xff\xff\xff\x0f" + os.urandom(10)  # claims 4 GiB
    with pytest.raises(DecompressionLimitExceeded):
        compression.decompress(CompressionType.SNAPPY, liar, 1 << 20)


def test_unknown_compression_type() -> None:
    with pytest.raises(CodecError, match="unsupported compression type 9"):
        compression.decompress(9, b"", 10)


@pytest.mark.parametrize("kind", [k for k in CompressionType if k])
def test_corrupt_payloads_are_codec_errors(kind: CompressionType) -> None:
    packed = compression.compress(kind, PAYLOAD)
    for bad in (packed[: len(packed) // 2], b"\x00" * 16, struct.pack(">i", 7) + packed):
        with pytest.raises(CodecError):
            compression.decompress(kind, bad, 1 << 20)


def test_otlp_decodes_kinds_temporality_and_attributes() -> None:
    [rm] = otlp.decode_metrics_data(librdkafka_like_payload(points=2))
    assert rm.attributes == {"client_rack": "r1", "transactional_id": "tx"}
    [scope] = rm.scopes
    assert (scope.name, scope.version) == ("librdkafka", "2.16.1")
    by_name = {m.name: m for m in scope.metrics}
    total = by_name["org.apache.kafka.producer.connection.creation.total"]
    assert (total.kind, total.temporality, total.monotonic) == ("sum", "cumulative", True)
    assert [p.value for p in total.points] == [10, 11]  # type: ignore[union-attr]
    gauge = by_name["org.apache.kafka.producer.node.request.latency.avg"]
    assert gauge.kind == "gauge" and gauge.unit == "ms"
    assert [p.attributes for p in gauge.points] == [{"node.id": 0}, {"node.id": 1}]
    hist = by_name["org.apache.kafka.producer.record.queue.time"]
    [hp] = hist.points
    assert isinstance(hp, otlp.HistogramPoint)
    assert (hp.count, hp.sum, hp.bucket_counts, hp.explicit_bounds, hp.min, hp.max) == (
        6, 21.0, [1, 2, 3], [1.0, 5.0], 0.5, 9.0)


def test_otlp_rejects_garbage() -> None:
    with pytest.raises(CodecError, match="OTLP"):
        otlp.decode_metrics_data(b"\x0a\xff\xff\xff\xff\x0f")


def _real_pushes() -> list[tuple[str, bytes]]:
    import json
    from pathlib import Path

    path = Path(__file__).parent.parent / "vectors" / "librdkafka-telemetry.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["compression"], bytes.fromhex(r["hex"])) for r in rows
            if r["api_key"] == 72 and r["direction"] == "request"]


@pytest.mark.parametrize(("codec", "frame"), _real_pushes(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_real_librdkafka_pushes_decompress_and_decode(codec: str, frame: bytes) -> None:
    from kproxy.codecs.messages import decode_request
    from kproxy.policies.telemetry.subscriptions import COMPRESSION_NAMES

    body = decode_request(frame).body
    assert body["compression_type"] == COMPRESSION_NAMES[codec]
    raw = compression.decompress(body["compression_type"], body["metrics"], 1 << 20)
    [rm] = otlp.decode_metrics_data(raw)
    names = {m.name for scope in rm.scopes for m in scope.metrics}
    assert any(n.startswith("org.apache.kafka.producer.") for n in names)
    assert compression.compress(body["compression_type"], raw)  # and back again


def test_real_pushes_cover_every_codec() -> None:
    assert {codec for codec, _ in _real_pushes()} == {"zstd", "lz4", "gzip", "snappy"}
