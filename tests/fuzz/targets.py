"""Fuzz targets shared by the hypothesis tests and the atheris harness (no atheris here)."""

from __future__ import annotations

from kproxy.codecs import interpreter, skipping
from kproxy.codecs.headers import read_response_header
from kproxy.codecs.messages import decode_response
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED


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
