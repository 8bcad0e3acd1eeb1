"""ACL verdicts (not yet enforced by a filter): default deny once any rule is set,
deny wins, globs over principals and names, DESCRIBE implied, bad tables named."""

from __future__ import annotations

import pytest

from kproxy.policies.auth.acl import AclError, Acls, parse_acls

RULES = parse_acls([
    {"principal": "svc-*", "operations": ["write"], "resource": "topic",
     "pattern": "orders-*", "permission": "allow"},
    {"principal": "*", "operations": ["all"], "resource": "topic", "pattern": "orders-secret",
     "permission": "deny"},
    {"principal": "analyst", "operations": "read", "resource": "topic", "pattern": "*",
     "permission": "allow"},
    {"principal": "analyst", "operations": ["read"], "resource": "group",
     "pattern": "analytics-*", "permission": "allow"},
])


@pytest.mark.parametrize("principal, op, resource, name, allowed", [
    ("svc-a", "write", "topic", "orders-eu", True),
    ("svc-a", "read", "topic", "orders-eu", False),        # nothing allows it
    ("svc-a", "describe", "topic", "orders-eu", True),     # implied by write
    ("svc-a", "write", "topic", "orders-secret", False),   # deny wins
    ("svc-a", "describe", "topic", "orders-secret", False),
    ("analyst", "read", "topic", "orders-secret", False),
    ("analyst", "read", "topic", "payments", True),
    ("analyst", "read", "group", "analytics-1", True),
    ("analyst", "read", "group", "other", False),
    ("analyst", "create", "cluster", "kafka-cluster", False),
    (None, "describe", "topic", "payments", False),
])
def test_verdicts(principal: str | None, op: str, resource: str, name: str,
                  allowed: bool) -> None:
    assert RULES.allowed(principal, op, resource, name) is allowed


def test_no_rules_allow_everything() -> None:
    assert Acls().allowed("anyone", "write", "topic", "t") and not Acls().active


@pytest.mark.parametrize("entries, message", [
    ("x", "array of tables"),
    ([3], "must be a table"),
    ([{"principal": "a"}], "missing"),
    ([{"principal": "a", "operations": ["fly"], "resource": "topic", "pattern": "*",
       "permission": "allow"}], "unknown 'fly'"),
    ([{"principal": "a", "operations": ["read"], "resource": "queue", "pattern": "*",
       "permission": "allow"}], "resource"),
    ([{"principal": "a", "operations": ["read"], "resource": "topic", "pattern": "*",
       "permission": "maybe"}], "allow or deny"),
    ([{"principal": "a", "operations": ["read"], "resource": "topic", "pattern": "*",
       "permission": "allow", "host": "x"}], "unknown key"),
])
def test_bad_tables_are_named(entries: object, message: str) -> None:
    with pytest.raises(AclError, match=message):
        parse_acls(entries)


def test_alter_configs_implies_describe_configs_and_only_an_allow_implies() -> None:
    acls = parse_acls([
        {"principal": "ops", "operations": ["alter_configs"], "resource": "topic",
         "pattern": "*", "permission": "allow"},
        {"principal": "ops", "operations": ["describe_configs"], "resource": "topic",
         "pattern": "locked", "permission": "deny"},
        {"principal": "ops", "operations": ["alter_configs"], "resource": "topic",
         "pattern": "open", "permission": "deny"},
    ])
    assert acls.allowed("ops", "describe_configs", "topic", "t")
    assert not acls.allowed("ops", "describe_configs", "topic", "locked")  # deny wins
    # As Kafka: a DENY of ALTER_CONFIGS does not deny the DESCRIBE_CONFIGS it would imply.
    assert acls.allowed("ops", "describe_configs", "topic", "open")
    assert not acls.allowed("ops", "describe", "topic", "t")  # not DESCRIBE
    assert not acls.allowed("other", "describe_configs", "topic", "t")
