"""The ``[[filters]]`` tables and ``default_filters``: filters built at load time.

Each table has a ``name``, a ``type`` (a built-in type, or ``"package.module:Class"``
for a user's filter, imported here) and the keys of that type. Building them when the
configuration is read makes a bad filter stop start-up (and a reload keep the running
config) with one line naming the key. ``default_filters`` lists, in order, the filters
that run on the main listeners; ``[[virtual_clusters]]`` name their own lists
(``kproxy.config.virtual_clusters``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.config.options import ConfigError
from kproxy.policies.auth.acl import AclError, AclRule, Acls, parse_acls
from kproxy.policies.filters.acl import AclFilter
from kproxy.policies.filters.api import Filter, FilterConfigError
from kproxy.policies.filters.record_validation import RecordValidation

# Keys the filter tables own at the top level of the file.
TOP_LEVEL_KEYS = frozenset({"filters", "default_filters", "virtual_clusters", "acls"})
BUILTIN_TYPES: dict[str, type[Filter]] = {"record-validation": RecordValidation}


@dataclass(frozen=True, eq=False)
class FilterSettings:
    """Every filter defined, by name, and the ones the main listeners run, in order."""

    defined: dict[str, Filter] = field(default_factory=dict)
    default: tuple[str, ...] = ()
    acl: AclFilter | None = None  # first in every chain once any [[acls]] is set

    def main_chain(self) -> list[Filter]:
        return self._acl() + [self.defined[name] for name in self.default]

    def chain_of(self, names: tuple[str, ...]) -> list[Filter]:
        """The filters a virtual cluster lists, in order."""
        return self._acl() + [self.defined[name] for name in names]

    def _acl(self) -> list[Filter]:
        return [self.acl] if self.acl is not None else []


def filter_settings(extra: dict[str, Any], path: str | None) -> FilterSettings:
    """Build the filters of a file's top-level ``filters`` and ``default_filters``."""
    where = f"{path}: " if path else ""
    tables = extra.get("filters", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}filters: must be an array of tables ([[filters]])")
    base = Path(path).resolve().parent if path else Path.cwd()
    defined: dict[str, Filter] = {}
    for i, table in enumerate(tables):
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}filters[{i}].name: every filter needs a name")
        if name in defined:
            raise ConfigError(f"{where}filters.{name}.name: defined twice")
        defined[name] = _build(name, table, base, where)
    default = extra.get("default_filters", [])
    if not isinstance(default, list) or not all(isinstance(n, str) for n in default):
        raise ConfigError(f"{where}default_filters: must be a list of filter names")
    for n in default:
        if n not in defined:
            raise ConfigError(f"{where}default_filters: no filter named {n!r} "
                              "([[filters]] name)")
    if len(set(default)) != len(default):
        raise ConfigError(f"{where}default_filters: a filter is listed twice")
    return FilterSettings(defined, tuple(default), acl_filter(extra, where))


def acl_filter(extra: dict[str, Any], where: str) -> AclFilter | None:
    """The ``[[acls]]`` tables as the ACL filter; None when there are none. A principal
    glob without a ``Type:`` part is a user's (``alice`` means ``User:alice``)."""
    if "acls" not in extra:
        return None
    try:
        acls = parse_acls(extra["acls"])
    except AclError as exc:
        raise ConfigError(f"{where}{exc}") from None
    if not acls.active:
        raise ConfigError(f"{where}acls: an empty list; remove it or add rules")
    rules = [r if ":" in r.principal or r.principal == "*" else AclRule(
        f"User:{r.principal}", r.operations, r.resource, r.pattern, r.allow)
        for r in acls.rules]
    return AclFilter(Acls(rules))


def _build(name: str, table: dict[str, Any], base: Path, where: str) -> Filter:
    at = f"{where}filters.{name}"
    kind = table.get("type")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{at}.type: a built-in type ({', '.join(BUILTIN_TYPES)}) or "
                          "\"package.module:Class\" is needed")
    cls = BUILTIN_TYPES.get(kind) or _import(kind, at)
    options = {k: v for k, v in table.items() if k not in ("name", "type")}
    try:
        flt = cls.from_config(options, base)
    except FilterConfigError as exc:
        raise ConfigError(f"{at}.{exc.key}: {exc.message}") from None
    except (TypeError, ValueError) as exc:  # e.g. an unexpected keyword argument
        raise ConfigError(f"{at}: {exc}") from None
    if not isinstance(flt, Filter):
        raise ConfigError(f"{at}.type: {kind} did not make a kproxy Filter")
    flt.name = name
    flt.kind = kind
    return flt


def _import(kind: str, at: str) -> type[Filter]:
    module_name, sep, attr = kind.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{at}.type: unknown type {kind!r}; a built-in type "
                          f"({', '.join(BUILTIN_TYPES)}) or \"package.module:Class\"")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attr)
    except Exception as exc:  # ImportError, AttributeError, or the module's own error
        raise ConfigError(f"{at}.type: cannot import {kind}: {type(exc).__name__}: "
                          f"{exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Filter)):
        raise ConfigError(f"{at}.type: {kind} is not a subclass of "
                          "kproxy.policies.filters.api.Filter")
    return cls
