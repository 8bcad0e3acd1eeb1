"""Which fields of a struct travel at one version, and how: shared by every walk.

Decoding, encoding and skipping all start from the same question (which fields exist
at this version, which of them are tagged), so it is answered once per struct and
version here, and cached.
"""

from __future__ import annotations

from functools import lru_cache

from kproxy.codecs.errors import CodecError
from kproxy.codecs.primitives import Reader
from kproxy.codecs.schema import Field, Struct


class Plan:
    """The fields of one struct that exist at one version, split by how they travel."""

    __slots__ = ("by_tag", "regular", "tagged")

    def __init__(self, regular: list[Field], tagged: list[Field]) -> None:
        self.regular = regular
        self.tagged = sorted(tagged, key=lambda fld: fld.tag or 0)
        self.by_tag = {fld.tag: fld for fld in tagged}


@lru_cache(maxsize=4096)
def plan_of(st: Struct, version: int, flexible: bool) -> Plan:
    regular: list[Field] = []
    tagged: list[Field] = []
    for fld in st.fields:
        if version not in fld.versions:
            continue
        if flexible and version in fld.tagged:
            tagged.append(fld)
        else:
            regular.append(fld)
    return Plan(regular, tagged)


def is_null_struct(r: Reader) -> bool:
    """A nullable struct starts with an int8: -1 for null, 1 for present."""
    at = r.pos
    marker = r.int8()
    if marker not in (-1, 1):
        raise CodecError(f"invalid nullable struct marker {marker}", offset=at)
    return marker == -1
