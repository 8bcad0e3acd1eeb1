"""Prefixing names in decoded requests and stripping them from decoded responses.

Both walk the paths of ``rules`` over a message as the interpreter decodes it (dicts,
lists, strings). Prefixing is total: every name on a path gets the prefix. Stripping
takes the prefix off and leaves out what is not the tenant's: an array entry whose
name lacks the prefix is removed from its array (a topic, a group, a config resource),
so a tenant never learns another tenant's names. A null name is left as it is (a
broker's "unknown topic id" answer names nothing). Pure functions, changing the
message in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kproxy.policies.tenancy.rules import NamePath


def prefix_names(msg: dict[str, Any], paths: Iterable[NamePath], prefix: str) -> None:
    for path in paths:
        _prefix(msg, path, 0, prefix)


def strip_names(msg: dict[str, Any], paths: Iterable[NamePath], prefix: str) -> None:
    for path in paths:
        _strip(msg, path, 0, prefix)


def _prefix(node: dict[str, Any], path: NamePath, depth: int, prefix: str) -> None:
    name = path.fields[depth]
    if name not in node:
        return  # a field this version does not have
    value = node[name]
    if depth == len(path.fields) - 1:
        if path.when is not None and not path.when(node):
            return
        if isinstance(value, str):
            node[name] = prefix + value
        elif isinstance(value, list):
            node[name] = [prefix + v if isinstance(v, str) else v for v in value]
        return
    for child in (value if isinstance(value, list) else [value]):
        if isinstance(child, dict):
            _prefix(child, path, depth + 1, prefix)


def _strip(node: dict[str, Any], path: NamePath, depth: int, prefix: str) -> bool:
    """Strip below ``node``; False when ``node`` itself is not the tenant's."""
    name = path.fields[depth]
    if name not in node:
        return True
    value = node[name]
    if depth == len(path.fields) - 1:
        if path.when is not None and not path.when(node):
            return True
        if isinstance(value, str):
            if not value.startswith(prefix):
                return False
            node[name] = value[len(prefix):]
        elif isinstance(value, list):
            node[name] = [v[len(prefix):] if isinstance(v, str) else v for v in value
                          if not isinstance(v, str) or v.startswith(prefix)]
        return True
    if isinstance(value, list):
        node[name] = [child for child in value
                      if not isinstance(child, dict) or _strip(child, path, depth + 1, prefix)]
        return True
    if isinstance(value, dict):
        return _strip(value, path, depth + 1, prefix)
    return True
