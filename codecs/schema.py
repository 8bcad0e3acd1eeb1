"""The declarative schema language for Kafka messages.

A message is a tree of ``Field``s. Each field says which versions it exists in,
in which of those it may be null, and whether it travels as a tagged field (and
under which tag). ``interpreter`` reads and writes any version of any message
from this description alone; the per-API files in ``schemas/`` hold only data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

MAX_VERSION = 0x7FFF

# Primitive type names, as the Kafka message definitions spell them.
Primitive = Literal[
    "bool", "int8", "int16", "uint16", "int32", "int64", "float64", "uuid", "string", "bytes",
    "records",
]
PRIMITIVES: frozenset[str] = frozenset(Primitive.__args__)  # type: ignore[attr-defined]


class Versions(NamedTuple):
    """An inclusive version range; ``lo > hi`` means no version at all."""

    lo: int
    hi: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.lo <= version <= self.hi

    def __str__(self) -> str:
        if self.lo > self.hi:
            return "none"
        if self.hi == MAX_VERSION:
            return f"{self.lo}+"
        return f"{self.lo}-{self.hi}" if self.lo != self.hi else str(self.lo)


NEVER = Versions(1, 0)


def versions(spec: str) -> Versions:
    """Parse ``"3+"``, ``"0-12"``, ``"5"`` or ``"none"``."""
    spec = spec.strip()
    if spec == "none":
        return NEVER
    if spec.endswith("+"):
        return Versions(int(spec[:-1]), MAX_VERSION)
    if "-" in spec:
        lo, hi = spec.split("-", 1)
        return Versions(int(lo), int(hi))
    return Versions(int(spec), int(spec))


@dataclass(frozen=True)
class ArrayOf:
    item: FieldType


@dataclass(frozen=True, eq=False)
class Struct:
    """Compared and hashed by identity: each struct is defined once, and the interpreter
    looks up its per-version plan on every decode, where hashing the whole tree would
    cost more than the decode itself."""

    name: str
    fields: tuple[Field, ...]


FieldType = str | ArrayOf | Struct


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    versions: Versions
    nullable: Versions = NEVER
    tag: int | None = None
    tagged: Versions = NEVER
    default: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.type, str) and self.type not in PRIMITIVES:
            raise ValueError(f"unknown primitive type {self.type!r} for field {self.name}")
        if (self.tag is None) != (self.tagged == NEVER):
            raise ValueError(f"field {self.name}: tag and tagged versions go together")


def f(
    name: str,
    type_: FieldType,
    vers: str,
    *,
    nullable: str = "none",
    tag: int | None = None,
    tagged: str | None = None,
    default: Any = None,
) -> Field:
    """Shorthand used by the schema files: version ranges as strings."""
    tagged_versions = versions(tagged) if tagged is not None else (
        versions(vers) if tag is not None else NEVER
    )
    return Field(name, type_, versions(vers), versions(nullable), tag, tagged_versions, default)


def struct(name: str, *fields: Field) -> Struct:
    return Struct(name, tuple(fields))


def array(item: FieldType) -> ArrayOf:
    return ArrayOf(item)


@dataclass(frozen=True)
class MessageSpec:
    """One request or response body of one API, across its versions (or, with kind
    "data" and api key -1, a versioned format embedded in one, like the consumer
    protocol's subscription)."""

    name: str
    api_key: int
    kind: Literal["request", "response", "data"]
    valid: Versions
    flexible: Versions
    body: Struct = field(repr=False)

    def is_flexible(self, version: int) -> bool:
        return version in self.flexible
