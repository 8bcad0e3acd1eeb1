"""One interpreter that decodes and encodes any message described in ``schema``.

Decoded messages are plain dicts keyed by field name. A tagged field that was not
on the wire is absent from the dict (so decode → encode reproduces the bytes
exactly), and tagged fields this schema does not know are kept as raw bytes under
``UNKNOWN_TAGS`` and written back unchanged.

A caller that needs only some of a message can name top-level fields to keep
``Opaque``: they are skipped rather than built, and encoded by copying their bytes.
Skipping, walking past a value without building it, lives in ``skipping``.
"""

from __future__ import annotations

import uuid
from typing import Any

from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import ZERO_UUID, Reader, Writer
from kproxy.codecs.schema import ArrayOf, Field, FieldType, MessageSpec, Struct
from kproxy.codecs.skipping import skip, skip_value
from kproxy.codecs.struct_plan import Plan, is_null_struct, plan_of

UNKNOWN_TAGS = "_unknown_tags"

Message = dict[str, Any]
NO_FIELDS: frozenset[str] = frozenset()


class Opaque:
    """A field kept as its wire bytes: decoded by skipping it, encoded by copying them.

    The bytes are valid only where the field travels the same way, i.e. at a version
    whose encoding of it equals the one it was read at.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"Opaque({len(self.raw)} bytes)"


def _zero(t: FieldType) -> Any:
    if isinstance(t, ArrayOf):
        return []
    if isinstance(t, Struct):
        return None
    return {
        "bool": False,
        "uuid": ZERO_UUID,
        "string": "",
        "bytes": b"",
        "records": None,
    }.get(t, 0)


def default_of(fld: Field) -> Any:
    return fld.default if fld.default is not None else _zero(fld.type)


# ----------------------------------------------------------------------------- decode


def decode(spec: MessageSpec, version: int, data: bytes | bytearray | memoryview,
           opaque: frozenset[str] = NO_FIELDS) -> Message:
    """Decode a whole body; trailing bytes are an error (they mean a schema mismatch)."""
    if version not in spec.valid:
        raise CodecError(f"{spec.name} v{version} is not a version this proxy understands",
                         what=spec.name)
    r = Reader(data)
    msg = decode_from(spec, version, r, opaque)
    r.expect_end(spec.name)
    return msg


def decode_from(spec: MessageSpec, version: int, r: Reader,
                opaque: frozenset[str] = NO_FIELDS) -> Message:
    """Decode a body from ``r``; top-level fields named in ``opaque`` stay ``Opaque``."""
    try:
        return _decode_struct(spec.body, version, spec.is_flexible(version), r, opaque)
    except CodecError as exc:
        raise exc.within(spec.name) from None


def _decode_struct(st: Struct, version: int, flexible: bool, r: Reader,
                   opaque: frozenset[str] = NO_FIELDS) -> Message:
    plan = plan_of(st, version, flexible)
    out: Message = {}
    for fld in plan.regular:
        start = r.pos
        try:
            if fld.name in opaque:
                skip_value(fld, version, flexible, r)
                out[fld.name] = Opaque(bytes(r.buf[start : r.pos]))
                continue
            out[fld.name] = _decode_value(fld, fld.type, version, flexible, r)
        except CodecError as exc:
            if exc.offset is None:
                exc = CodecError(exc.reason, what=exc.what, offset=start)
            raise exc.within(fld.name) from None
    if flexible:
        _decode_tags(plan, version, r, out)
    return out


def _decode_tags(plan: Plan, version: int, r: Reader, out: Message) -> None:
    start = r.pos
    count = r.uvarint()
    if count > r.remaining():
        raise CodecError(f"tagged field count {count} exceeds the bytes left", offset=start)
    last = -1
    for _ in range(count):
        tag_at = r.pos
        tag = r.uvarint()
        if tag <= last:
            raise CodecError(f"tag {tag} out of order or repeated", what="tagged fields",
                             offset=tag_at)
        last = tag
        size = r.uvarint()
        body = r.view(size) if size <= r.remaining() else None
        if body is None:
            raise CodecError(f"tag {tag} claims {size} bytes, {r.remaining()} left",
                             what="tagged fields", offset=tag_at)
        fld = plan.by_tag.get(tag)
        if fld is None:
            out.setdefault(UNKNOWN_TAGS, {})[tag] = bytes(body)
            continue
        sub = Reader(body)
        try:
            out[fld.name] = _decode_value(fld, fld.type, version, True, sub)
        except CodecError as exc:
            raise CodecError(exc.reason, what=exc.what, offset=tag_at).within(fld.name) from None
        if sub.remaining():
            raise CodecError(f"tag {tag} has {sub.remaining()} bytes left over",
                             what=fld.name, offset=tag_at)


def _decode_value(fld: Field, t: FieldType, version: int, flexible: bool, r: Reader) -> Any:
    if isinstance(t, ArrayOf):
        at = r.pos
        n = r.array_length(flexible)
        if n < 0:
            if n == -1 and version in fld.nullable:
                return None
            raise CodecError(f"invalid array length {n}", offset=at)
        # Every element takes at least one byte: a huge count in a short frame is
        # rejected before we build a list for it.
        if n > r.remaining():
            raise CodecError(f"array of {n} elements cannot fit in {r.remaining()} bytes",
                             offset=at)
        items = []
        for i in range(n):
            try:
                items.append(_decode_value(fld, t.item, version, flexible, r))
            except CodecError as exc:
                raise exc.within(f"[{i}]") from None
        return items
    if isinstance(t, Struct):
        if t is fld.type and version in fld.nullable and is_null_struct(r):
            return None
        return _decode_struct(t, version, flexible, r)
    if t == "int32":
        return r.int32()
    if t == "int16":
        return r.int16()
    if t == "int64":
        return r.int64()
    if t == "int8":
        return r.int8()
    if t == "bool":
        return r.boolean()
    if t == "string":
        at = r.pos
        s = r.string(flexible)
        if s is None and version not in fld.nullable:
            raise CodecError("null string in a non-nullable field", offset=at)
        return s
    if t in ("bytes", "records"):
        at = r.pos
        b = r.bytes_(flexible)
        if b is None:
            if t == "records" or version in fld.nullable:
                return None
            raise CodecError("null bytes in a non-nullable field", offset=at)
        return bytes(b)
    if t == "uuid":
        return r.uuid()
    if t == "uint16":
        return r.uint16()
    if t == "float64":
        return r.float64()
    raise CodecError(f"no decoder for type {t}")  # pragma: no cover - schema bug


# ----------------------------------------------------------------------------- top-level tags


def read_top_level_tags(spec: MessageSpec, version: int, r: Reader) -> tuple[int, Message]:
    """Skip a body's regular fields and decode only its top-level tagged section.

    Returns the offset where that section starts and its fields (known by name,
    unknown under ``UNKNOWN_TAGS``). A flexible body ends with that section, so a
    rewrite can keep ``body[:offset]`` as it is and append a new section.
    """
    if not spec.is_flexible(version):
        raise CodecError(f"{spec.name} v{version} has no tagged fields", what=spec.name)
    skip(spec, version, r, stop_before_tags=True)
    start = r.pos
    return start, decode_top_level_tags(spec, version, r)


def decode_top_level_tags(spec: MessageSpec, version: int, r: Reader) -> Message:
    """Decode a body's top-level tagged section, which starts at ``r`` and ends the body."""
    out: Message = {}
    try:
        _decode_tags(plan_of(spec.body, version, True), version, r, out)
    except CodecError as exc:
        raise exc.within(spec.name) from None
    r.expect_end(spec.name)
    return out


def encode_top_level_tags(spec: MessageSpec, version: int, tags: Message) -> bytes:
    w = Writer()
    encode_tags(plan_of(spec.body, version, True).tagged, version, tags, w)
    return w.getvalue()


# ----------------------------------------------------------------------------- encode


def encode(spec: MessageSpec, version: int, msg: Message) -> bytes:
    if version not in spec.valid:
        raise CodecError(f"{spec.name} v{version} is not a version this proxy understands",
                         what=spec.name)
    w = Writer()
    encode_into(spec, version, msg, w)
    return w.getvalue()


def encode_into(spec: MessageSpec, version: int, msg: Message, w: Writer) -> None:
    try:
        _encode_struct(spec.body, version, spec.is_flexible(version), msg, w)
    except CodecError as exc:
        raise exc.within(spec.name) from None


def _encode_struct(st: Struct, version: int, flexible: bool, msg: Message, w: Writer) -> None:
    plan = plan_of(st, version, flexible)
    for fld in plan.regular:
        value = msg[fld.name] if fld.name in msg else default_of(fld)
        try:
            _encode_value(fld, fld.type, version, flexible, value, w)
        except CodecError as exc:
            raise exc.within(fld.name) from None
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise CodecError(f"cannot encode {value!r}: {exc}", what=fld.name) from None
    if flexible:
        encode_tags(plan.tagged, version, msg, w)


def encode_tags(tagged: list[Field], version: int, msg: Message, w: Writer) -> None:
    """Write a tagged-field section: known fields present in ``msg`` plus unknown ones."""
    items: list[tuple[int, bytes]] = []
    for fld in tagged:
        if fld.name not in msg:
            continue
        sub = Writer()
        _encode_value(fld, fld.type, version, True, msg[fld.name], sub)
        items.append((fld.tag or 0, sub.getvalue()))
    unknown: dict[int, bytes] = msg.get(UNKNOWN_TAGS) or {}
    items.extend(unknown.items())
    items.sort(key=lambda item: item[0])
    w.uvarint(len(items))
    for tag, payload in items:
        w.uvarint(tag)
        w.uvarint(len(payload))
        w.raw(payload)


def _encode_value(fld: Field, t: FieldType, version: int, flexible: bool, v: Any,
                  w: Writer) -> None:
    if isinstance(v, Opaque):
        w.raw(v.raw)
        return
    if isinstance(t, ArrayOf):
        if v is None:
            if version not in fld.nullable:
                raise CodecError("null array in a non-nullable field")
            w.array_length(None, flexible)
            return
        w.array_length(len(v), flexible)
        for item in v:
            _encode_value(fld, t.item, version, flexible, item, w)
        return
    if isinstance(t, Struct):
        if t is fld.type and version in fld.nullable:  # a nullable struct, not an item
            w.int8(-1 if v is None else 1)
            if v is None:
                return
        _encode_struct(t, version, flexible, v, w)
        return
    if t == "string":
        if v is None and version not in fld.nullable:
            raise CodecError("null string in a non-nullable field")
        w.string(v, flexible)
    elif t in ("bytes", "records"):
        if v is None and t != "records" and version not in fld.nullable:
            raise CodecError("null bytes in a non-nullable field")
        w.bytes_(v, flexible)
    elif t == "uuid":
        w.uuid(v if isinstance(v, uuid.UUID) else uuid.UUID(str(v)))
    else:
        getattr(w, "boolean" if t == "bool" else t)(v)
