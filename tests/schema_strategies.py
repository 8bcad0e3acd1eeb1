"""Hypothesis strategies that build any message a schema allows, at any version."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kproxy.codecs.interpreter import UNKNOWN_TAGS
from kproxy.codecs.schema import ArrayOf, Field, FieldType, MessageSpec, Struct

_INTS = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
}
_TEXT = st.text(max_size=12)
_BYTES = st.binary(max_size=24)

# For tests that build bodies field by field.
INT32 = _INTS["int32"]
INT64 = _INTS["int64"]
# A KIP-951 NodeEndpoint, its node in or out of a test's node-id range.
NODE_ENDPOINT = st.fixed_dictionaries({"node_id": st.integers(0, 5),
                                       "host": st.text(max_size=40),
                                       "port": st.integers(1, 65535),
                                       "rack": st.none() | st.text(max_size=40)})


def _value(fld: Field, t: FieldType, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    nullable = version in fld.nullable
    if isinstance(t, ArrayOf):
        items = st.lists(_value(fld, t.item, version, flexible), max_size=3)
        return st.none() | items if nullable else items
    if isinstance(t, Struct):
        inner = struct_strategy(t, version, flexible)
        return st.none() | inner if nullable and t is fld.type else inner
    if t in _INTS:
        return _INTS[t]
    if t == "bool":
        return st.booleans()
    if t == "uuid":
        return st.uuids()
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "string":
        return st.none() | _TEXT if nullable else _TEXT
    if t == "records":
        return st.none() | _BYTES
    return st.none() | _BYTES if nullable else _BYTES


def struct_strategy(s: Struct, version: int, flexible: bool) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for fld in s.fields:
        if version not in fld.versions:
            continue
        strat = _value(fld, fld.type, version, flexible)
        if flexible and version in fld.tagged:
            optional[fld.name] = strat  # a tagged field may be absent from the wire
        else:
            required[fld.name] = strat
    if flexible:
        # Tags this schema does not know must survive decode -> encode untouched.
        optional[UNKNOWN_TAGS] = st.dictionaries(st.integers(1000, 1010), _BYTES, min_size=1,
                                                 max_size=2)
    return st.fixed_dictionaries(required, optional=optional)


def message_strategy(spec: MessageSpec, version: int) -> st.SearchStrategy[dict[str, Any]]:
    return struct_strategy(spec.body, version, spec.is_flexible(version))
