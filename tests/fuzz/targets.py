"""Fuzz targets shared by the hypothesis tests and the atheris harness (no atheris here)."""

from __future__ import annotations

import itertools

from kproxy.codecs import api_keys, interpreter, skipping
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.messages import decode_response
from kproxy.codecs.partial.fetch_walk import FetchWalk, knows
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.policies.addressing import PortMap
from kproxy.policies.rewrite import rewrite_tags_in_place

PORT_MAP = PortMap("proxy.example", 30000, 40000, 1, 3)


def walk_response(key: int, version: int, data: bytes) -> None:
    """The proxy's skipping walk over a response: header, then body or top-level tags."""
    spec = DECODED[key].response
    r = Reader(data)
    read_response_header(r, key, version)
    if spec.is_flexible(version):
        interpreter.read_top_level_tags(spec, version, r)
    else:
        skipping.skip(spec, version, r)


def decode_response_opaque(key: int, version: int, data: bytes) -> None:
    """Decoding with every top-level field kept opaque: the skip programs on every field."""
    spec = DECODED[key].response
    decode_response(data, key, version, frozenset(f.name for f in spec.body.fields))


def relay_fetch(frame: bytes, version: int, pieces: list[int]) -> tuple[FetchWalk, bytes, int]:
    """Relay ``frame`` as ``proxy.session.streamed`` does, its bytes arriving in pieces of
    the given sizes: what went out (skeleton and opaque runs, then the tail) and how
    many bytes went as opaque runs that were not yet received (spliced)."""
    walk = FetchWalk(version, len(frame))
    sizes = itertools.cycle([max(p, 1) for p in pieces] or [1])
    received = next(sizes)
    window = memoryview(frame)[:received]
    out = bytearray()
    spliced = 0
    for _ in range(4 * len(frame) + 10):  # each turn takes bytes or receives some
        used = walk.advance(window)
        out += window[:used]
        window = window[used:]
        if walk.opaque:
            here = min(walk.opaque, len(window))
            if here:
                out += window[:here]
                window = window[here:]
                walk.skip(here)
            if walk.opaque:
                n = walk.opaque
                out += frame[received : received + n]
                received += n
                spliced += n
                walk.skip(n)
            continue
        if walk.at_tail:
            tail = bytes(window) + frame[received:]
            assert len(tail) == walk.tail_size
            return walk, bytes(out) + tail, spliced
        if received >= len(frame):
            raise CodecError("response ends inside its structure")
        more = next(sizes)
        window = memoryview(bytes(window) + frame[received : received + more])
        received += more
    raise AssertionError("the walk made no progress")


def stream_fetch_response(version: int, data: bytes, piece: int) -> None:
    """A Fetch response relayed as it arrives (``proxy.session.streamed``), its bytes
    coming ``piece`` at a time: the walk, then the in-place rewrite of its tail."""
    if not knows(version):
        return
    walk, out, _ = relay_fetch(data, version, [piece])
    tail = out[walk.pos:]
    rewritten = rewrite_tags_in_place(api_keys.FETCH, version, tail, PORT_MAP)
    if rewritten.frame is not None and len(rewritten.frame) != len(tail):
        raise AssertionError("a tail rewritten in place changed its size")
