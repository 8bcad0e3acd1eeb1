"""Decode only the end of a body: skip its regular fields up to one, read the rest.

KIP-932's ShareFetch and ShareAcknowledge responses carry ``node_endpoints`` as their
last regular field, after the records. To rewrite it the proxy skips everything
before it (records by length, never copied), decodes it and what follows (the
top-level tags), and writes back ``body[:start]`` plus the re-encoded tail.
"""

from __future__ import annotations

from functools import lru_cache

from kproxy.codecs.errors import CodecError
from kproxy.codecs.interpreter import Message, _decode_struct, _encode_struct
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.schema import MessageSpec, Struct
from kproxy.codecs.skipping import run_skip, skip_program
from kproxy.codecs.struct_plan import plan_of


@lru_cache(maxsize=256)
def _split(spec: MessageSpec, version: int, name: str) -> tuple[Struct, Struct]:
    """The regular fields before ``name`` (no tags), and ``name`` onwards with the tags."""
    flexible = spec.is_flexible(version)
    plan = plan_of(spec.body, version, flexible)
    names = [fld.name for fld in plan.regular]
    if name not in names:
        raise CodecError(f"{spec.name} v{version} has no regular field {name}", what=spec.name)
    at = names.index(name)
    head = Struct(spec.body.name + "Head", tuple(plan.regular[:at]))
    tail = Struct(spec.body.name + "Tail", (*plan.regular[at:], *plan.tagged))
    return head, tail


def read_tail(spec: MessageSpec, version: int, r: Reader, name: str) -> tuple[int, Message]:
    """Skip to regular field ``name``; return where it starts and it and all after it."""
    head, tail = _split(spec, version, name)
    flexible = spec.is_flexible(version)
    program = skip_program(head, version, flexible)
    if flexible:
        program = program[:-1]  # the head has no tag section of its own
    try:
        run_skip(program, flexible, r)
        start = r.pos
        out = _decode_struct(tail, version, flexible, r)
    except CodecError as exc:
        raise exc.within(spec.name) from None
    r.expect_end(spec.name)
    return start, out


def encode_tail(spec: MessageSpec, version: int, name: str, tail_msg: Message) -> bytes:
    _, tail = _split(spec, version, name)
    w = Writer()
    try:
        _encode_struct(tail, version, spec.is_flexible(version), tail_msg, w)
    except CodecError as exc:
        raise exc.within(spec.name) from None
    return w.getvalue()
