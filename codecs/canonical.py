"""Kafka's canonical form of a decoded message: tagged fields at their default are left out.

Kafka's own encoder never writes a tagged field whose value equals its default. Some
backends do (tansu writes all four ApiVersions tags), and some clients mis-skip such
fields (librdkafka 2.0.2 reads past the end of an ApiVersions v3 response). Where the
proxy re-encodes a response for a client anyway, it can write the canonical form.

This is a decision about what to write, so it is applied only where a policy asks for
it; ``decode`` → ``encode`` without it stays byte-exact. Unknown tags are kept: their
default is not known here. ``Opaque`` parts are bytes and stay as they are.
"""

from __future__ import annotations

from typing import Any

from kproxy.codecs.interpreter import Message, Opaque, default_of
from kproxy.codecs.schema import ArrayOf, Field, FieldType, MessageSpec, Struct


def omit_default_tags(spec: MessageSpec, msg: Message) -> Message:
    """Remove tagged fields equal to their default from ``msg`` (in place, nested too).

    The version does not matter: a field is removed only when its value is its
    default, and a regular field missing from a message is encoded as its default,
    so removing one never changes what a regular field writes.
    """
    _struct(spec.body, msg)
    return msg


def _struct(st: Struct, msg: Message) -> None:
    for fld in st.fields:
        if fld.name not in msg:
            continue
        value = msg[fld.name]
        if isinstance(value, Opaque):
            continue
        _nested(fld.type, value)
        if fld.tag is not None and _is_default(fld, value):
            del msg[fld.name]


def _nested(t: FieldType, value: Any) -> None:
    if isinstance(t, ArrayOf) and isinstance(value, list):
        for item in value:
            _nested(t.item, item)
    elif isinstance(t, Struct) and isinstance(value, dict):
        _struct(t, value)


def _is_default(fld: Field, value: Any) -> bool:
    if isinstance(fld.type, Struct):
        # A struct at its default is one whose every field is at its default. Only a
        # field tagged at every version it exists in may go: a regular struct field
        # cannot be encoded from nothing.
        return (fld.tagged == fld.versions and isinstance(value, dict)
                and _struct_is_default(fld.type, value))
    return bool(value == default_of(fld)) and type(value) is type(default_of(fld))


def _struct_is_default(st: Struct, value: Message) -> bool:
    if set(value) - {f.name for f in st.fields}:
        return False  # unknown tags, or anything else not in the schema
    for fld in st.fields:
        if fld.name not in value:
            continue
        v = value[fld.name]
        if isinstance(fld.type, Struct):
            if not (isinstance(v, dict) and _struct_is_default(fld.type, v)):
                return False
        elif not (v == default_of(fld) and type(v) is type(default_of(fld))):
            return False
    return True
