"""Walking past a value without building it: the skip half of the interpreter.

Used where the proxy needs the position after a value, not the value: fields kept
``Opaque``, the regular fields before a tagged section or a tail it rewrites, and
the partitions of a Fetch response it reads watermarks from. The Produce response,
walked for every one relayed, also has a walk by hand (``produce_tags_at``).
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Any

from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import Reader
from kproxy.codecs.schema import ArrayOf, Field, FieldType, MessageSpec, Struct
from kproxy.codecs.struct_plan import is_null_struct, plan_of


def skip(spec: MessageSpec, version: int, r: Reader, *, stop_before_tags: bool = False) -> None:
    """Advance over a body without building it (records are skipped, never copied).

    With ``stop_before_tags`` the cursor stops at the top-level tagged-field section,
    which is where KIP-951's NodeEndpoints live.
    """
    flexible = spec.is_flexible(version)
    program = skip_program(spec.body, version, flexible)
    if flexible and stop_before_tags:
        program = program[:-1]  # the tag section is always the last step
    try:
        run_skip(program, flexible, r)
    except CodecError as exc:
        raise exc.within(spec.name) from None


def skip_tags(r: Reader) -> None:
    """Advance over a tagged-field section, known tags and unknown alike."""
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
        return (_STRUCT, skip_program(t, version, flexible))
    size = _FIXED_SIZES.get(t)
    if size is not None:
        return (_FIXED, size)
    if t in ("string", "bytes", "records"):
        return (_SIZED, t == "string")
    raise CodecError(f"no way to skip type {t}")  # pragma: no cover - schema bug


@lru_cache(maxsize=4096)
def skip_program(st: Struct, version: int, flexible: bool) -> SkipProgram:
    """``st``'s regular fields at ``version`` as steps, then its tag section if flexible."""
    steps: list[Step] = []
    for fld in plan_of(st, version, flexible).regular:
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


def skip_value(fld: Field, version: int, flexible: bool, r: Reader) -> None:
    """Skip one field's value, of any type."""
    run_skip((_field_step(fld, version, flexible),), flexible, r)


def run_skip(program: SkipProgram, flexible: bool, r: Reader) -> None:
    """Advance ``r`` over what ``program`` describes."""
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
            pos = r.pos if is_null_struct(r) else _skip_at(arg, flexible, r, r.pos)
        else:  # _TAGS
            r.pos = pos
            skip_tags(r)
            pos = r.pos
        if pos > end:
            raise CodecError(f"needs {pos - at} bytes, {end - at} left", offset=at)
    return pos


def skip_struct_at(st: Struct, version: int, flexible: bool, r: Reader, pos: int) -> int:
    """Where one ``st`` value starting at ``pos`` ends (compiled, nothing built): for
    walkers that read a few leading fields of each element of a large array."""
    end = _skip_at(skip_program(st, version, flexible), flexible, r, pos)
    if end > r.end:
        raise CodecError(f"{st.name} runs past the end", what=st.name, offset=pos)
    return end


# ----------------------------------------------------------------------------- Produce
#
# Every Produce response from v10 on is read for KIP-951's NodeEndpoints (top-level tag
# 0), and nearly none carries them: a broker adds them only when a leader moved. The
# program walk above costs about as much as the rest of the response's trip through the
# proxy's own code, so the one layout is also walked by hand. ``None`` means "cannot tell
# cheaply" (a malformed body, another version): the caller takes the general path, which
# gives the precise error.

_PRODUCE_FIRST, _PRODUCE_LAST = 10, 13  # the versions that carry NodeEndpoints
_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8  # index, error_code, base_offset, append time, log start


def uvarint_at(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """An unsigned LEB128 (at most 5 bytes) at ``pos`` and the position after it;
    (-1, end + 1) when it runs past ``end`` or is too long."""
    value = shift = 0
    while pos < end and shift <= 28:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, end + 1


def _count_at(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """``uvarint_at`` for an array's count or a compact string's length, which nearly
    always fit in one byte."""
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    return uvarint_at(buf, pos, end)


def _tags_end(buf: bytes | memoryview, pos: int, end: int) -> int:
    """Past a tagged section; ``end + 1`` when it does not fit."""
    if pos < end and buf[pos] == 0:  # no tags: nearly every section
        return pos + 1
    count, pos = uvarint_at(buf, pos, end)
    for _ in range(max(count, 0)):
        _, pos = uvarint_at(buf, pos, end)
        size, pos = uvarint_at(buf, pos, end)
        if size < 0 or pos > end:
            return end + 1
        pos += size
    return pos


def _sized_end(buf: bytes | memoryview, pos: int, end: int) -> int:
    """Past a compact (nullable) string; ``end + 1`` when it does not fit."""
    size, pos = _count_at(buf, pos, end)
    return end + 1 if size < 0 else pos + max(size - 1, 0)


def produce_tags_at(frame: bytes | memoryview, version: int) -> int | None:
    """Where the top-level tagged section of a Produce response frame body (correlation
    id first) starts, or ``None`` when this walk cannot tell."""
    if not _PRODUCE_FIRST <= version <= _PRODUCE_LAST:
        return None
    end = len(frame)
    pos = _tags_end(frame, 4, end)  # correlation id, then the header's tags
    topics, pos = _count_at(frame, pos, end)
    topics -= 1
    if topics < 0 or topics > end - pos:
        return None  # a null or oversized array: the general walk says why
    for _ in range(topics):
        pos = pos + 16 if version >= 13 else _sized_end(frame, pos, end)  # id or name
        partitions, pos = _count_at(frame, pos, end)
        partitions -= 1
        if partitions < 0 or partitions > end - pos:
            return None
        for _ in range(partitions):
            pos += _PARTITION_FIXED
            errors, pos = _count_at(frame, pos, end)
            errors -= 1
            if errors < -1 or errors > end - pos:
                return None
            for _ in range(errors):
                pos = _tags_end(frame, _sized_end(frame, pos + 4, end), end)
                if pos > end:
                    return None
            pos = _tags_end(frame, _sized_end(frame, pos, end), end)  # message, tags
            if pos > end:
                return None
        pos = _tags_end(frame, pos, end)
        if pos > end:
            return None
    pos += 4  # throttle_time_ms
    return pos if pos <= end else None


def produce_names_no_broker(frame: bytes | memoryview, version: int) -> bool:
    """True when the response's top-level tagged section is empty (one zero byte at the
    end): no NodeEndpoints, nothing to rewrite. False means "look closer"."""
    at = produce_tags_at(frame, version)
    return at is not None and at == len(frame) - 1 and frame[at] == 0
