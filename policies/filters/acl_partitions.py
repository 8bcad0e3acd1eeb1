"""Per-partition ACL answers for the data APIs: a denied topic's partitions are answered
here, the rest of the request is forwarded, and the two are merged in the response.

Fetch, ListOffsets, OffsetForLeaderEpoch, OffsetCommit, TxnOffsetCommit and OffsetFetch
all refuse a topic the way Kafka's broker (KafkaApis) does: every partition of it gets
TOPIC_AUTHORIZATION_FAILED (29) and the others are served. They differ only in where
their topics and partitions sit and in the shape of an error entry, so each is described
as data (``Layout``) and one mechanism (``split`` and ``Plan``) serves them all; it
lives apart from ``acl`` and ``acl_apis`` so that neither outgrows its size.

Fetch sessions (KIP-227): a denied partition is never sent to the broker, so it never
joins the broker's session; a later fetch naming it (or forgetting it) is stripped
again. A fetch in a session (``session_id`` set) is always forwarded, even when nothing
of it is left, so the broker's session epoch stays in step with the client's.
OffsetFetch for all topics (``topics`` null) drops from the response the topics the
principal may not describe; at v8+ this and the group check are per group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOPIC_DENIED = 29  # TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = 30  # GROUP_AUTHORIZATION_FAILED
GROUPS = "groups"
GROUP_ID = "group_id"

Msg = dict[str, Any]
# The layout's operation on a topic, not reported: for forgotten topics and all-topics answers.
Allowed = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Layout:
    """Where an API keeps its topics and partitions, in its request and its response."""

    operation: str  # the topic operation Kafka checks (READ or DESCRIBE)
    name: str = "name"  # a topic's name, in request and response
    topics: str = "topics"  # the request's topic array
    partitions: str = "partitions"  # a request topic's partitions
    index: str | None = "partition_index"  # a request partition's index; None: ints
    out_topics: str = "topics"  # the response's topic array
    out_index: str = "partition_index"  # a response partition's index
    entry: Msg = field(default_factory=dict)  # the rest of a refused partition's entry
    forgotten: str | None = None  # Fetch: topics to drop from the session
    session: str | None = None  # Fetch: a request in a session is always forwarded
    groups_from: int | None = None  # OffsetFetch v8+: topics per entry of ``groups``

    def batched(self, version: int) -> bool:
        return self.groups_from is not None and version >= self.groups_from

    def splits(self, resource: str, version: int) -> bool:
        """Whether a denial of this resource is answered per entry (else: whole)."""
        return resource == "topic" or (resource == "group" and self.batched(version))

    def refused(self, topic: Msg, error: int) -> Msg:
        """A request topic mirrored as a response topic whose partitions all get ``error``."""
        parts = []
        for p in topic.get(self.partitions) or []:
            index = p if self.index is None else p[self.index]
            parts.append({**self.entry, self.out_index: index, "error_code": error})
        return {self.name: topic[self.name], "partitions": parts}

    def whole(self, msg: Msg, error: int) -> Msg:
        """The response to a request refused as a whole: every partition gets ``error``."""
        return {self.out_topics: [self.refused(t, error) for t in msg.get(self.topics) or []]}


@dataclass(slots=True)
class Plan:
    """One request's refusals: what to add to (or hide from) the broker's response."""

    layout: Layout
    batched: bool
    refused: dict[str | None, list[Msg]]  # by group id (None: unbatched), topic entries
    groups: list[Msg]  # whole groups refused (batched)
    everything: set[str | None]  # containers asking for all topics: the answer filtered
    allowed: Allowed
    changed: bool = False  # the request lost something
    left: bool = False  # something is left to forward

    def merged(self, resp: Msg | None) -> Msg:
        """The broker's response (None: answered here) with the refused entries added."""
        layout = self.layout
        if resp is None:
            resp = {GROUPS: []} if self.batched else {layout.out_topics: []}
        if not self.batched:
            self._container(resp, None)
            return resp
        groups = list(resp.get(GROUPS) or [])
        ids = {g.get(GROUP_ID) for g in groups}
        for key in self.refused:
            if key not in ids:  # every topic of it refused: the broker was not asked
                groups.append({GROUP_ID: key, "topics": [], "error_code": 0})
        for group in groups:
            self._container(group, group.get(GROUP_ID))
        resp[GROUPS] = groups + self.groups
        return resp

    def _container(self, out: Msg, key: str | None) -> None:
        layout = self.layout
        if out.get("error_code"):  # the broker answered it as a whole: left as it is
            return
        topics = list(out.get(layout.out_topics) or [])
        if key in self.everything:
            topics = [t for t in topics if self.allowed(t[layout.name])]
        entries = self.refused.get(key)
        if entries:
            names = {e[layout.name] for e in entries}
            topics = [t for t in topics if t.get(layout.name) not in names] + entries
        out[layout.out_topics] = topics


def split(layout: Layout, msg: Msg, version: int, bad_topics: frozenset[str],
          bad_groups: frozenset[str], allowed: Allowed) -> Plan | None:
    """Strip the refused topics (and, batched, groups) from the decoded request ``msg`` in
    place; None when nothing is refused and no answer needs filtering."""
    batched = layout.batched(version)
    plan = Plan(layout, batched, {}, [], set(), allowed)
    containers: list[tuple[str | None, Msg]] = [(None, msg)]
    if batched:
        containers = []
        kept = []
        for group in msg.get(GROUPS) or []:
            if group[GROUP_ID] in bad_groups:
                plan.groups.append({GROUP_ID: group[GROUP_ID], "topics": [],
                                    "error_code": GROUP_DENIED})
            else:
                kept.append(group)
                containers.append((group[GROUP_ID], group))
        plan.changed = len(kept) != len(msg.get(GROUPS) or [])
        msg[GROUPS] = kept
    for key, container in containers:
        topics = container.get(layout.topics)
        if topics is None:
            plan.everything.add(key)
            plan.left = True
            continue
        if bad_topics:
            kept = [t for t in topics if t[layout.name] not in bad_topics]
            if len(kept) != len(topics):
                plan.refused[key] = [layout.refused(t, TOPIC_DENIED) for t in topics
                                     if t[layout.name] in bad_topics]
                container[layout.topics] = topics = kept
                plan.changed = True
        plan.left = plan.left or bool(topics)
    if layout.forgotten is not None and msg.get(layout.forgotten):
        forgotten = msg[layout.forgotten]
        kept = [t for t in forgotten if allowed(t[layout.name])]
        plan.changed = plan.changed or len(kept) != len(forgotten)
        msg[layout.forgotten] = kept
        plan.left = plan.left or bool(kept)
    if layout.session is not None and msg.get(layout.session):
        plan.left = True
    if not plan.changed and not plan.everything:
        return None
    return plan
