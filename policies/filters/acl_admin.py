"""APIs the ACL filter checks entry by entry, and responses it filters, as data.

Its own module because these APIs share one mechanism (and ``acl`` and ``acl_apis``
are near the size limit). An ``EntryApi`` says where a request's entries are, what
names one, which operation on which resource one needs, where the response's results
are and what result a refused entry gets. ``refuse`` takes the refused entries out of
the request and returns their results; the filter (``acl.AclFilter``) forwards the
rest and ``merge``s those results into the broker's response, or answers alone when
nothing is left. A ``Listing`` is a response the broker builds whole and the filter
thins out (``keep``).

Kafka's broker checks (KafkaApis, ConfigHelper, ControllerApis):

- CreateTopics CREATE topic (or cluster), DeleteTopics DELETE topic, CreatePartitions
  ALTER topic: 29 per topic. DeleteRecords DELETE topic: 29 per partition.
- FindCoordinator v4+ DESCRIBE group or transactional id: 30 or 53 per key.
- DescribeGroups DESCRIBE group, DeleteGroups DELETE group: 30 per group.
- OffsetDelete DELETE group (the whole request: 30), then READ topic (29 per partition).
- DescribeConfigs DESCRIBE_CONFIGS, AlterConfigs and IncrementalAlterConfigs
  ALTER_CONFIGS, per resource: a TOPIC (2) on the topic (29), a GROUP (32) on the
  group (30), BROKER (4), BROKER_LOGGER (8) and CLIENT_METRICS (16) on the cluster
  (31). A type Kafka does not know is checked on the cluster here (fail closed); the
  broker then refuses it.
- ListGroups: every group with DESCRIBE cluster, otherwise only the groups the
  principal may DESCRIBE (not audited: Kafka does not log these checks either).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import MessageSpec, Versions
from kproxy.codecs.schemas import alter_configs as ac
from kproxy.codecs.schemas import tenancy_groups as tg
from kproxy.codecs.schemas import tenancy_topics as tt
from kproxy.policies.filters.acl_apis import CLUSTER, Need
from kproxy.policies.filters.acl_apis import offered as whole_offered
from kproxy.policies.filters.acl_partitions import Layout

Msg = dict[str, Any]
Entry = Any  # a struct of the request's array, or a plain name
Refused = Callable[[Entry, int], Msg]  # (entry, error) -> its result

# Config resource types (ConfigResource.Type) and the ACL resource each is checked on.
CONFIG_RESOURCES = {2: "topic", 4: "cluster", 8: "cluster", 16: "cluster", 32: "group"}


@dataclass(frozen=True)
class EntryApi:
    """One API refused entry by entry."""

    api_key: int
    versions: Versions  # the versions checked this way (and offered)
    request: MessageSpec
    response: MessageSpec
    field: str  # the request's array of entries
    key: str | None  # the field naming an entry; None: the entries are names
    operation: str
    resource: str | Callable[[Msg, Entry], str]  # or from (request, entry)
    out_field: str  # the response's array of results
    refused: Refused
    first: Callable[[Msg], list[Need]] | None = None  # checked on the whole request first

    def need(self, msg: Msg, entry: Entry) -> Need:
        name = entry if self.key is None else entry[self.key]
        kind = self.resource if isinstance(self.resource, str) else self.resource(msg, entry)
        return Need(self.operation, kind, CLUSTER if kind == "cluster" else name)


@dataclass(frozen=True)
class Listing:
    """A response listing resources: kept whole with ``unless`` allowed, otherwise
    only the entries the principal may ``operation``."""

    api_key: int
    versions: Versions
    response: MessageSpec
    field: str
    key: str
    operation: str
    resource: str
    unless: Need | None = None


def refuse(api: EntryApi, msg: Msg, denied: Callable[[list[Need]], list[Need]]) -> list[Msg]:
    """Take the entries ``denied`` refuses out of ``msg`` (in place); their results."""
    entries = list(msg.get(api.field) or [])
    needs = [api.need(msg, e) for e in entries]
    bad = set(denied(list(dict.fromkeys(needs))))
    if not bad:
        return []
    msg[api.field] = [e for e, n in zip(entries, needs, strict=True) if n not in bad]
    return [api.refused(e, n.error) for e, n in zip(entries, needs, strict=True) if n in bad]


def merge(api: EntryApi, response: Msg, results: list[Msg]) -> None:
    """The broker's results and the refused ones, each requested entry once."""
    response[api.out_field] = list(response.get(api.out_field) or []) + results


def keep(listing: Listing, response: Msg, allowed: Callable[[Need], bool]) -> None:
    response[listing.field] = [
        e for e in response.get(listing.field) or []
        if allowed(Need(listing.operation, listing.resource, e[listing.key]))]


# ---------------------------------------------------------------------- results


def _result(*keys: str, **extra: Any) -> Refused:
    """A result copying ``keys`` from the entry (the first takes a plain name)."""
    def build(entry: Entry, error: int) -> Msg:
        named = ({k: entry[k] for k in keys} if isinstance(entry, dict)
                 else {keys[0]: entry})
        return {**named, "error_code": error, **extra}
    return build


def _coordinator_kind(msg: Msg, entry: Entry) -> str:
    return "transactional_id" if msg.get("key_type", 0) == 1 else "group"


def _config_kind(msg: Msg, entry: Entry) -> str:
    return CONFIG_RESOURCES.get(entry["resource_type"], "cluster")


def _offset_delete_group(msg: Msg) -> list[Need]:
    return [Need("delete", "group", msg["group_id"])]


def _config_api(key: int, versions: Versions, request: MessageSpec, response: MessageSpec,
                operation: str, out_field: str, **extra: Any) -> EntryApi:
    return EntryApi(key, versions, request, response, "resources", "resource_name",
                    operation, _config_kind, out_field,
                    _result("resource_type", "resource_name", error_message=None, **extra))


def _entry_apis() -> Iterable[EntryApi]:
    coord = DECODED[api_keys.FIND_COORDINATOR]
    assert coord.request is not None
    no_message = {"error_message": None}
    return (
        EntryApi(19, Versions(0, 7), tt.CREATE_TOPICS_REQUEST, tt.CREATE_TOPICS_RESPONSE,
                 "topics", "name", "create", "topic", "topics",
                 _result("name", num_partitions=-1, replication_factor=-1, **no_message)),
        EntryApi(20, Versions(0, 5), tt.DELETE_TOPICS_REQUEST, tt.DELETE_TOPICS_RESPONSE,
                 "topic_names", None, "delete", "topic", "responses",
                 _result("name", **no_message)),
        EntryApi(api_keys.FIND_COORDINATOR, Versions(4, 6), coord.request, coord.response,
                 "coordinator_keys", None, "describe", _coordinator_kind, "coordinators",
                 _result("key", node_id=-1, host="", port=-1, **no_message)),
        EntryApi(15, Versions(0, 5), tg.DESCRIBE_GROUPS_REQUEST, tg.DESCRIBE_GROUPS_RESPONSE,
                 "groups", None, "describe", "group", "groups",
                 _result("group_id", group_state="", protocol_type="", protocol_data="",
                         members=[])),
        EntryApi(42, Versions(0, 2), tg.DELETE_GROUPS_REQUEST, tg.DELETE_GROUPS_RESPONSE,
                 "groups_names", None, "delete", "group", "results", _result("group_id")),
        EntryApi(47, Versions(0, 0), tg.OFFSET_DELETE_REQUEST, tg.OFFSET_DELETE_RESPONSE,
                 "topics", "name", "read", "topic", "topics", Layout("read").refused,
                 first=_offset_delete_group),
        EntryApi(21, Versions(0, 2), tt.DELETE_RECORDS_REQUEST, tt.DELETE_RECORDS_RESPONSE,
                 "topics", "name", "delete", "topic", "topics",
                 Layout("delete", entry={"low_watermark": -1}).refused),
        EntryApi(37, Versions(0, 3), tt.CREATE_PARTITIONS_REQUEST,
                 tt.CREATE_PARTITIONS_RESPONSE, "topics", "name", "alter", "topic", "results",
                 _result("name", **no_message)),
        _config_api(32, Versions(0, 4), tt.DESCRIBE_CONFIGS_REQUEST,
                    tt.DESCRIBE_CONFIGS_RESPONSE, "describe_configs", "results", configs=[]),
        _config_api(33, Versions(0, 2), ac.ALTER_CONFIGS_REQUEST, ac.ALTER_CONFIGS_RESPONSE,
                    "alter_configs", "responses"),
        _config_api(44, Versions(0, 1), ac.INCREMENTAL_ALTER_CONFIGS_REQUEST,
                    ac.INCREMENTAL_ALTER_CONFIGS_RESPONSE, "alter_configs", "responses"),
    )


ENTRY_APIS: dict[int, EntryApi] = {api.api_key: api for api in _entry_apis()}

LISTINGS: dict[int, Listing] = {16: Listing(
    16, Versions(0, 5), tg.LIST_GROUPS_RESPONSE, "groups", "group_id", "describe", "group",
    unless=Need("describe", "cluster", CLUSTER))}


def entry_api(api_key: int, version: int) -> EntryApi | None:
    """The API's per-entry description when this version is checked per entry."""
    api = ENTRY_APIS.get(api_key)
    return api if api is not None and version in api.versions else None


def offered(api_key: int) -> Versions | None:
    """The versions a client is offered of an API while ACLs are set; None: hidden."""
    whole = whole_offered(api_key)
    if whole is not None:
        return whole
    return CHECKED.get(api_key)


def _checked_versions() -> dict[int, Versions]:
    out = {key: api.versions for key, api in ENTRY_APIS.items()}
    out.update((key, listing.versions) for key, listing in LISTINGS.items())
    return {key: versions for key, versions in out.items() if whole_offered(key) is None}


# The versions the filter reads of each API checked here (its request table).
CHECKED: dict[int, Versions] = _checked_versions()
