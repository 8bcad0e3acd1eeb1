"""Walking past a value without building it: the skip half of the interpreter.

Used where the proxy needs the position after a value, not the value: fields kept
``Opaque``, the regular fields before a tagged section or a tail it rewrites, and
the partitions of a Fetch response it reads watermarks from.
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
