"""One interpreter that decodes, encodes and skips any message described in ``schema``.

Decoded messages are plain dicts keyed by field name. A tagged field that was not
on the wire is absent from the dict (so decode → encode reproduces the bytes
exactly), and tagged fields this schema does not know are kept as raw bytes under
``UNKNOWN_TAGS`` and written back unchanged.

A caller that needs only some of a message can name top-level fields to keep
``Opaque``: they are skipped rather than built, and encoded by copying their bytes.
"""

from __future__ import annotations

import struct
import uuid
from functools import lru_cache
from typing import Any

from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import ZERO_UUID, Reader, Writer
from kproxy.codecs.schema import ArrayOf, Field, FieldType, MessageSpec, Struct

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


class _Plan:
    """The fields of one struct that exist at one version, split by how they travel."""

    __slots__ = ("by_tag", "regular", "tagged")

    def __init__(self, regular: list[Field], tagged: list[Field]) -> None:
        self.regular = regular
        self.tagged = sorted(tagged, key=lambda fld: fld.tag or 0)
        self.by_tag = {fld.tag: fld for fld in tagged}


@lru_cache(maxsize=4096)
def _plan(st: Struct, version: int, flexible: bool) -> _Plan:
    regular: list[Field] = []
    tagged: list[Field] = []
    for fld in st.fields:
        if version not in fld.versions:
            continue
        if flexible and version in fld.tagged:
            tagged.append(fld)
        else:
            regular.append(fld)
    return _Plan(regular, tagged)


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
    plan = _plan(st, version, flexible)
    out: Message = {}
    for fld in plan.regular:
        start = r.pos
        try:
            if fld.name in opaque:
                _skip_value(fld, version, flexible, r)
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


def _decode_tags(plan: _Plan, version: int, r: Reader, out: Message) -> None:
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
        if t is fld.type and version in fld.nullable and _null_struct(r):
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


def _null_struct(r: Reader) -> bool:
    """A nullable struct starts with an int8: -1 for null, 1 for present."""
    at = r.pos
    marker = r.int8()
    if marker not in (-1, 1):
        raise CodecError(f"invalid nullable struct marker {marker}", offset=at)
    return marker == -1


# ----------------------------------------------------------------------------- skip


def skip(spec: MessageSpec, version: int, r: Reader, *, stop_before_tags: bool = False) -> None:
    """Advance over a body without building it (records are skipped, never copied).

    With ``stop_before_tags`` the cursor stops at the top-level tagged-field section,
    which is where KIP-951's NodeEndpoints live.
    """
    flexible = spec.is_flexible(version)
    program = _skip_program(spec.body, version, flexible)
    if flexible and stop_before_tags:
        program = program[:-1]  # the tag section is always the last step
    try:
        _run_skip(program, flexible, r)
    except CodecError as exc:
        raise exc.within(spec.name) from None


def _skip_tags(r: Reader) -> None:
    for _ in range(r.uvarint()):
        r.uvarint()
        r.skip(r.uvarint())


_FIXED_SIZES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8,
                "float64": 8, "uuid": 16}

# The steps of a skip program. Skipping walks large responses (every partition of a
# Fetch or Metadata response), so each struct at each version is compiled once into
# a short list of steps, with runs of fixed-width fields merged into one.
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_FIXED, _SIZED, _ARRAY, _STRUCT, _TAGS, _NULLABLE_STRUCT = range(6)
Step = tuple[int, Any]
SkipProgram = tuple[Step, ...]


def _step(t: FieldType, version: int, flexible: bool) -> Step:
    """How to skip one value of type ``t``."""
    if isinstance(t, ArrayOf):
        return (_ARRAY, _step(t.item, version, flexible))
    if isinstance(t, Struct):
        return (_STRUCT, _skip_program(t, version, flexible))
    size = _FIXED_SIZES.get(t)
    if size is not None:
        return (_FIXED, size)
    if t in ("string", "bytes", "records"):
        return (_SIZED, t == "string")
    raise CodecError(f"no way to skip type {t}")  # pragma: no cover - schema bug


@lru_cache(maxsize=4096)
def _skip_program(st: Struct, version: int, flexible: bool) -> SkipProgram:
    steps: list[Step] = []
    for fld in _plan(st, version, flexible).regular:
        step = _field_step(fld, version, flexible)
        if step[0] == _FIXED and steps and steps[-1][0] == _FIXED:
            steps[-1] = (_FIXED, steps[-1][1] + step[1])
        else:
            steps.append(step)
    if flexible:
        steps.append((_TAGS, None))
    return tuple(steps)


def _field_step(fld: Field, version: int, flexible: bool) -> Step:
    """How to skip one field's value (a nullable struct carries a presence byte)."""
    step = _step(fld.type, version, flexible)
    if step[0] == _STRUCT and version in fld.nullable:
        return (_NULLABLE_STRUCT, step[1])
    return step


def _skip_value(fld: Field, version: int, flexible: bool, r: Reader) -> None:
    """Skip one field's value, of any type."""
    _run_skip((_field_step(fld, version, flexible),), flexible, r)


def _run_skip(program: SkipProgram, flexible: bool, r: Reader) -> None:
    r.pos = _skip_at(program, flexible, r, r.pos)


def _length(r: Reader, pos: int, flexible: bool, wide: bool) -> tuple[int, int]:
    """A length prefix at ``pos`` (compact: uvarint - 1; else int16/int32) and the next pos."""
    if flexible:
        if pos < r.end and r.buf[pos] < 0x80:  # one byte: nearly every length
            return r.buf[pos] - 1, pos + 1
        r.pos = pos
        return r.uvarint() - 1, r.pos
    size = 4 if wide else 2
    if pos + size > r.end:
        raise CodecError(f"need {size} bytes for a length, {r.end - pos} left", offset=pos)
    return (_I32 if wide else _I16).unpack_from(r.buf, pos)[0], pos + size


def _skip_at(program: SkipProgram, flexible: bool, r: Reader, pos: int) -> int:
    """Walk ``program`` from ``pos``; returns where it ends. Bounds are checked per step."""
    end = r.end
    for step, arg in program:
        at = pos
        if step == _FIXED:
            pos += arg
        elif step == _SIZED:
            n, pos = _length(r, pos, flexible, wide=not arg)
            if n < -1:
                raise CodecError(f"invalid length {n}", offset=at)
            if n > 0:
                pos += n
        elif step == _ARRAY:
            n, pos = _length(r, pos, flexible, wide=True)
            if n < -1 or n > end - pos:
                raise CodecError(f"invalid array length {n}", offset=at)
            item, inner = arg
            if item == _FIXED:
                pos += max(n, 0) * inner
            else:
                item_program = inner if item == _STRUCT else (arg,)
                for _ in range(n):
                    pos = _skip_at(item_program, flexible, r, pos)
        elif step == _STRUCT:
            pos = _skip_at(arg, flexible, r, pos)
        elif step == _NULLABLE_STRUCT:
            r.pos = pos
            pos = r.pos if _null_struct(r) else _skip_at(arg, flexible, r, r.pos)
        else:  # _TAGS
            r.pos = pos
            _skip_tags(r)
            pos = r.pos
        if pos > end:
            raise CodecError(f"needs {pos - at} bytes, {end - at} left", offset=at)
    return pos


def skip_struct_at(st: Struct, version: int, flexible: bool, r: Reader, pos: int) -> int:
    """Where one ``st`` value starting at ``pos`` ends (compiled, nothing built): for
    walkers that read a few leading fields of each element of a large array."""
    end = _skip_at(_skip_program(st, version, flexible), flexible, r, pos)
    if end > r.end:
        raise CodecError(f"{st.name} runs past the end", what=st.name, offset=pos)
    return end


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
    out: Message = {}
    try:
        _decode_tags(_plan(spec.body, version, True), version, r, out)
    except CodecError as exc:
        raise exc.within(spec.name) from None
    r.expect_end(spec.name)
    return start, out


def encode_top_level_tags(spec: MessageSpec, version: int, tags: Message) -> bytes:
    w = Writer()
    encode_tags(_plan(spec.body, version, True).tagged, version, tags, w)
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
    plan = _plan(st, version, flexible)
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
