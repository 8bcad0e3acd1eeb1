"""Where each API a virtual cluster translates carries a tenant's names.

A virtual cluster puts its prefix in front of every topic name, group id and
transactional id a request carries, and takes it off in responses, where an entry
without the prefix (another tenant's, or the backend's own) is left out. This table
says, per API, which versions are translated (the ones named here; every other API
and version is kept from the client) and where the names are: a path of field names
from the message's top, arrays crossed on the way. A path ending in an array of
strings means each string. ``when`` restricts a path to the entries it holds for
(DescribeConfigs names brokers too, which are nobody's).

Versions are those whose names travel as names: Produce v13, Fetch v13+, OffsetCommit
v10+, OffsetFetch v10+ and DeleteTopics v6 name topics by id and are capped away. The
consumer protocol's bytes inside JoinGroup and SyncGroup (subscriptions, assignments)
are not translated: clients write and read them, the broker keeps them opaque, so the
tenant's view of them stays its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import MessageSpec, Versions
from kproxy.codecs.schemas import tenancy_groups as tg
from kproxy.codecs.schemas import tenancy_topics as tt
from kproxy.policies.api_versions import NAMELESS

Entry = dict[str, Any]

# DescribeConfigs resource types that are a tenant's: TOPIC (2) and GROUP (32).
TENANT_RESOURCE_TYPES = frozenset({2, 32})


@dataclass(frozen=True)
class NamePath:
    """Field names from the top of a message to a name (or to an array of names)."""

    fields: tuple[str, ...]
    when: Callable[[Entry], bool] | None = None  # on the entry holding the last field

    def __str__(self) -> str:
        return ".".join(self.fields)


def p(path: str, when: Callable[[Entry], bool] | None = None) -> NamePath:
    return NamePath(tuple(path.split(".")), when)


def _tenant_resource(entry: Entry) -> bool:
    return entry.get("resource_type") in TENANT_RESOURCE_TYPES


@dataclass(frozen=True)
class ApiRule:
    """One API as a virtual cluster sees it: the versions translated, the schemas, and
    where the names are in requests and responses."""

    api_key: int
    versions: Versions
    request: MessageSpec
    request_names: tuple[NamePath, ...]
    response: MessageSpec | None = None
    response_names: tuple[NamePath, ...] = field(default=())

    @property
    def name(self) -> str:
        return api_keys.api_name(self.api_key)


def _decoded(key: int) -> tuple[MessageSpec, MessageSpec]:
    api = DECODED[key]
    assert api.request is not None
    return api.request, api.response


def _rules() -> dict[int, ApiRule]:
    metadata_req, metadata_resp = _decoded(api_keys.METADATA)
    coord_req, coord_resp = _decoded(api_keys.FIND_COORDINATOR)
    commit_req, commit_resp = _decoded(api_keys.OFFSET_COMMIT)
    fetch_off_req, fetch_off_resp = _decoded(api_keys.OFFSET_FETCH)
    produce_resp = DECODED[api_keys.PRODUCE].response
    fetch_resp = DECODED[api_keys.FETCH].response
    rules = [
        ApiRule(api_keys.METADATA, Versions(0, 13), metadata_req, (p("topics.name"),),
                metadata_resp, (p("topics.name"),)),
        ApiRule(api_keys.PRODUCE, Versions(3, 12), tt.PRODUCE_REQUEST,
                (p("transactional_id"), p("topic_data.name")),
                produce_resp, (p("responses.name"),)),
        ApiRule(api_keys.FETCH, Versions(4, 12), tt.FETCH_REQUEST,
                (p("topics.topic"), p("forgotten_topics_data.topic")),
                fetch_resp, (p("responses.topic"),)),
        ApiRule(api_keys.LIST_OFFSETS, Versions(0, 9), tt.LIST_OFFSETS_REQUEST,
                (p("topics.name"),), tt.LIST_OFFSETS_RESPONSE, (p("topics.name"),)),
        ApiRule(23, Versions(0, 4), tt.OFFSET_FOR_LEADER_EPOCH_REQUEST, (p("topics.topic"),),
                tt.OFFSET_FOR_LEADER_EPOCH_RESPONSE, (p("topics.topic"),)),
        ApiRule(api_keys.OFFSET_COMMIT, Versions(0, 9), commit_req,
                (p("group_id"), p("topics.name")), commit_resp, (p("topics.name"),)),
        ApiRule(api_keys.OFFSET_FETCH, Versions(0, 9), fetch_off_req,
                (p("group_id"), p("topics.name"), p("groups.group_id"),
                 p("groups.topics.name")),
                fetch_off_resp, (p("topics.name"), p("groups.group_id"),
                                 p("groups.topics.name"))),
        ApiRule(api_keys.FIND_COORDINATOR, Versions(0, 6), coord_req,
                (p("key"), p("coordinator_keys")), coord_resp, (p("coordinators.key"),)),
        ApiRule(api_keys.JOIN_GROUP, Versions(0, 9), _decoded(api_keys.JOIN_GROUP)[0],
                (p("group_id"),)),
        ApiRule(api_keys.SYNC_GROUP, Versions(0, 5), _decoded(api_keys.SYNC_GROUP)[0],
                (p("group_id"),)),
        ApiRule(api_keys.HEARTBEAT, Versions(0, 4), _decoded(api_keys.HEARTBEAT)[0],
                (p("group_id"),)),
        ApiRule(api_keys.LEAVE_GROUP, Versions(0, 5), _decoded(api_keys.LEAVE_GROUP)[0],
                (p("group_id"),)),
        ApiRule(15, Versions(0, 5), tg.DESCRIBE_GROUPS_REQUEST, (p("groups"),),
                tg.DESCRIBE_GROUPS_RESPONSE, (p("groups.group_id"),)),
        ApiRule(16, Versions(0, 5), tg.LIST_GROUPS_REQUEST, (),
                tg.LIST_GROUPS_RESPONSE, (p("groups.group_id"),)),
        ApiRule(42, Versions(0, 2), tg.DELETE_GROUPS_REQUEST, (p("groups_names"),),
                tg.DELETE_GROUPS_RESPONSE, (p("results.group_id"),)),
        ApiRule(47, Versions(0, 0), tg.OFFSET_DELETE_REQUEST,
                (p("group_id"), p("topics.name")),
                tg.OFFSET_DELETE_RESPONSE, (p("topics.name"),)),
        ApiRule(19, Versions(0, 7), tt.CREATE_TOPICS_REQUEST, (p("topics.name"),),
                tt.CREATE_TOPICS_RESPONSE, (p("topics.name"),)),
        ApiRule(20, Versions(0, 5), tt.DELETE_TOPICS_REQUEST, (p("topic_names"),),
                tt.DELETE_TOPICS_RESPONSE, (p("responses.name"),)),
        ApiRule(21, Versions(0, 2), tt.DELETE_RECORDS_REQUEST, (p("topics.name"),),
                tt.DELETE_RECORDS_RESPONSE, (p("topics.name"),)),
        ApiRule(37, Versions(0, 3), tt.CREATE_PARTITIONS_REQUEST, (p("topics.name"),),
                tt.CREATE_PARTITIONS_RESPONSE, (p("results.name"),)),
        ApiRule(32, Versions(0, 4), tt.DESCRIBE_CONFIGS_REQUEST,
                (p("resources.resource_name", _tenant_resource),),
                tt.DESCRIBE_CONFIGS_RESPONSE,
                (p("results.resource_name", _tenant_resource),)),
        ApiRule(22, Versions(0, 5), tg.INIT_PRODUCER_ID_REQUEST, (p("transactional_id"),)),
        ApiRule(24, Versions(0, 3), tg.ADD_PARTITIONS_TO_TXN_REQUEST,
                (p("transactional_id"), p("topics.name")),
                tg.ADD_PARTITIONS_TO_TXN_RESPONSE, (p("results.name"),)),
        ApiRule(25, Versions(0, 3), tg.ADD_OFFSETS_TO_TXN_REQUEST,
                (p("transactional_id"), p("group_id"))),
        ApiRule(26, Versions(0, 3), tg.END_TXN_REQUEST, (p("transactional_id"),)),
        ApiRule(28, Versions(0, 3), tg.TXN_OFFSET_COMMIT_REQUEST,
                (p("transactional_id"), p("group_id"), p("topics.name")),
                tg.TXN_OFFSET_COMMIT_RESPONSE, (p("topics.name"),)),
    ]
    return {rule.api_key: rule for rule in rules}


RULES: dict[int, ApiRule] = _rules()

# APIs that carry no tenant name and pass unchanged: the handshake, SASL, and the
# telemetry the proxy answers itself. DescribeCluster passes too, its cluster id
# replaced by the virtual cluster's.
PASSED = NAMELESS


def allowed_versions(api_key: int) -> Versions | None:
    """The versions a virtual cluster offers of an API; None: it is hidden."""
    rule = RULES.get(api_key)
    return rule.versions if rule is not None else PASSED.get(api_key)
