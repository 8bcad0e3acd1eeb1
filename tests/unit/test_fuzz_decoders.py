"""Fuzz: arbitrary and mutated bytes make every decoder raise CodecError and nothing else."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys, compression, messages
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.otlp import model as otlp
from kproxy.codecs.peek import peek_request
from kproxy.codecs.registry import DECODED

from ..conftest import load_vectors
from ..fuzz.targets import decode_response_opaque, stream_fetch_response, walk_response

RESPONSE_APIS = [(key, v) for key, api in DECODED.items()
                 for v in range(api.response.valid.lo, api.response.valid.hi + 1)]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def only_codec_errors(fn: Callable[[], object]) -> None:
    with contextlib.suppress(CodecError):
        fn()


@FUZZ
@given(st.binary(max_size=256))
def test_request_decoders(data: bytes) -> None:
    only_codec_errors(lambda: messages.decode_request(data))
    only_codec_errors(lambda: peek_request(data))


@FUZZ
@given(st.sampled_from(RESPONSE_APIS), st.binary(max_size=256))
def test_response_decoders(api: tuple[int, int], data: bytes) -> None:
    key, version = api
    only_codec_errors(lambda: messages.decode_response(data, key, version))
    only_codec_errors(lambda: walk_response(key, version, data))
    only_codec_errors(lambda: decode_response_opaque(key, version, data))
    if key == api_keys.FETCH:  # as relayed when it arrives in pieces (session.streamed)
        only_codec_errors(lambda: stream_fetch_response(version, data, 1 + len(data) % 61))


@FUZZ
@given(st.integers(0, 9), st.binary(max_size=512), st.integers(1, 1 << 20))
def test_decompressors(kind: int, data: bytes, limit: int) -> None:
    only_codec_errors(lambda: compression.decompress(kind, data, limit))


@FUZZ
@given(st.binary(max_size=512))
def test_otlp_decoder(data: bytes) -> None:
    only_codec_errors(lambda: otlp.decode_metrics_data(data))


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(0, 1 << 16))
def test_frame_reader(chunks: list[bytes], limit: int) -> None:
    reader = FrameReader(max_frame_bytes=limit)

    def feed_all() -> None:
        for chunk in chunks:
            reader.feed(chunk)
            for frame in reader.frames():
                assert len(frame) <= limit

    only_codec_errors(feed_all)


VECTORS = [v for v in load_vectors() if len(v.frame) < 4096]


@pytest.mark.parametrize("direction", ["request", "response"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_real_frames(direction: str, data: st.DataObject) -> None:
    vec = data.draw(st.sampled_from([v for v in VECTORS if v.direction == direction]))
    frame = bytearray(vec.frame)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[pos] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del frame[pos:]
        elif op == "insert":
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif frame:
            del frame[pos]
    raw = bytes(frame)
    if direction == "request":
        only_codec_errors(lambda: messages.decode_request(raw))
        only_codec_errors(lambda: peek_request(raw))
    elif vec.api_key in DECODED and vec.api_version in DECODED[vec.api_key].response.valid:
        only_codec_errors(lambda: messages.decode_response(raw, vec.api_key, vec.api_version))
