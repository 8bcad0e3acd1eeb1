"""ACL decisions for principals logged in at the proxy: the rules and the verdict.

This module decides; ``policies.filters.acl`` enforces it on every API. Each rule has
``principal`` (a glob over the principal the login named), ``operations``, ``resource``
(topic, group, transactional_id or cluster), ``pattern`` (a glob over the resource's
name; ``kafka-cluster`` for the cluster) and ``permission`` (allow or deny).

As a broker's authorizer does: once any rule is set, whatever no rule allows is
denied, and a matching deny wins over any allow. An allowed READ, WRITE, DELETE or
ALTER implies DESCRIBE of the same resource, and an allowed ALTER_CONFIGS implies
DESCRIBE_CONFIGS (Kafka's implications), so a producer allowed to write a topic sees
it in Metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

RESOURCES = ("topic", "group", "transactional_id", "cluster")
OPERATIONS = ("all", "read", "write", "create", "delete", "alter", "describe",
              "cluster_action", "describe_configs", "alter_configs", "idempotent_write")
IMPLY_DESCRIBE = frozenset({"read", "write", "delete", "alter"})
# Allowed operations that imply another one on the same resource (allow rules only).
IMPLIED_BY = {"describe": IMPLY_DESCRIBE, "describe_configs": frozenset({"alter_configs"})}
MAX_RULES = 10_000


class AclError(ValueError):
    """A bad ``[[acls]]`` entry; the message names it and its key."""


@dataclass(frozen=True, slots=True)
class AclRule:
    principal: str
    operations: frozenset[str]
    resource: str
    pattern: str
    allow: bool

    def matches(self, principal: str, operation: str, resource: str, name: str) -> bool:
        return (resource == self.resource
                and ("all" in self.operations or operation in self.operations)
                and fnmatchcase(principal, self.principal) and fnmatchcase(name, self.pattern))


class Acls:
    """The rules in force; ``allowed`` is the verdict for one operation on one resource."""

    def __init__(self, rules: Sequence[AclRule] = ()) -> None:
        self.rules = tuple(rules)

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def allowed(self, principal: str | None, operation: str, resource: str, name: str) -> bool:
        if not self.rules:
            return True
        who = principal or ""
        allowed = False
        for rule in self.rules:
            if rule.matches(who, operation, resource, name):
                if not rule.allow:
                    return False
                allowed = True
        implied_by = IMPLIED_BY.get(operation)
        if allowed or implied_by is None:
            return allowed
        # DESCRIBE (DESCRIBE_CONFIGS) is implied by an allowed READ, WRITE, DELETE or
        # ALTER (ALTER_CONFIGS), unless denied above.
        return any(rule.allow and rule.matches(who, op, resource, name)
                   for op in implied_by for rule in self.rules)


def parse_acls(entries: Any) -> Acls:
    """The ``[[acls]]`` tables as rules; ``AclError`` names the first bad one."""
    if not isinstance(entries, list):
        raise AclError("acls: must be an array of tables ([[acls]])")
    if len(entries) > MAX_RULES:
        raise AclError(f"acls: at most {MAX_RULES} rules")
    return Acls([_rule(i, entry) for i, entry in enumerate(entries)])


def _rule(i: int, entry: Any) -> AclRule:
    where = f"acls[{i}]"
    if not isinstance(entry, dict):
        raise AclError(f"{where}: must be a table")
    unknown = set(entry) - {"principal", "operations", "resource", "pattern", "permission"}
    if unknown:
        raise AclError(f"{where}.{sorted(unknown)[0]}: unknown key")
    for key in ("principal", "operations", "resource", "pattern", "permission"):
        if key not in entry:
            raise AclError(f"{where}.{key}: missing")
    principal, pattern = entry["principal"], entry["pattern"]
    if not isinstance(principal, str) or not principal:
        raise AclError(f"{where}.principal: a principal name or glob is needed")
    if not isinstance(pattern, str) or not pattern:
        raise AclError(f"{where}.pattern: a resource name or glob is needed")
    ops = entry["operations"]
    if isinstance(ops, str):
        ops = [ops]
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
        raise AclError(f"{where}.operations: a list of operations is needed")
    operations = frozenset(o.strip().lower() for o in ops)
    bad = sorted(operations - set(OPERATIONS))
    if bad:
        raise AclError(f"{where}.operations: unknown {bad[0]!r} ({', '.join(OPERATIONS)})")
    resource = str(entry["resource"]).lower()
    if resource not in RESOURCES:
        raise AclError(f"{where}.resource: one of {', '.join(RESOURCES)}")
    permission = str(entry["permission"]).lower()
    if permission not in ("allow", "deny"):
        raise AclError(f"{where}.permission: allow or deny")
    return AclRule(principal, operations, resource, pattern, permission == "allow")
