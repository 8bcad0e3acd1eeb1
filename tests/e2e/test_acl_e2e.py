"""ACLs enforced at a running `kproxy run` (two workers) in front of tansu: users log in
with SASL PLAIN, and confluent-kafka sees allow and deny for produce, consume (fetch and
group), the Metadata listing and creating and deleting topics, per-partition answers
for a consumer of an allowed and a denied topic (fetch, commit, committed offsets);
denials reach the audit log; SIGHUP applies new ACLs, keeps the old ones on a bad
entry, and a bad entry stops start-up with exit 2 and one line naming the key.

The admin APIs, with confluent_kafka.admin.AdminClient: DescribeConfigs, DeleteRecords,
ListGroups, DescribeGroups and DeleteGroups, each allowed and denied. tansu's limits:
it does not offer CreatePartitions (so no client sends one: the denied path is sent as
frames), and it drops the connection on a DeleteRecords (the allowed path shows the
request went to the broker, not what the broker did with it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.embedded_broker import TansuBroker

from ..support import KproxyProcess, audit_records, kproxy_process, value_of, wait_until

pytestmark = pytest.mark.broker
RUN = uuid.uuid4().hex[:6]
USERS = """
[users.alice]
password = "alice-secret"
[users.bob]
password = "bob-secret"
[users.carol]
password = "carol-secret"
[users.dave]
password = "dave-secret"
"""
ACLS = f"""
[[acls]]
principal = "User:alice"
operations = ["READ", "WRITE", "CREATE", "DELETE"]
resource = "topic"
pattern = "ok-{RUN}-*"
permission = "allow"
[[acls]]
principal = "User:*"
operations = ["READ"]
resource = "group"
pattern = "app-*"
permission = "allow"
[[acls]]
principal = "User:alice"
operations = ["WRITE"]
resource = "transactional_id"
pattern = "tx-{RUN}-*"
permission = "allow"
[[acls]]
principal = "User:bob"
operations = ["READ"]
resource = "topic"
pattern = "ok-{RUN}-*"
permission = "allow"
[[acls]]
principal = "User:alice"
operations = ["DESCRIBE_CONFIGS"]
resource = "topic"
pattern = "ok-{RUN}-*"
permission = "allow"
[[acls]]
principal = "User:alice"
operations = ["DESCRIBE", "DELETE"]
resource = "group"
pattern = "adm-{RUN}-*"
permission = "allow"
[[acls]]
principal = "User:carol"
operations = ["DESCRIBE"]
resource = "cluster"
pattern = "kafka-cluster"
permission = "allow"
[[acls]]
principal = "User:bob"
operations = ["DESCRIBE"]
resource = "topic"
pattern = "ro-{RUN}-*"
permission = "allow"
[[acls]]
principal = "User:dave"
operations = ["WRITE", "CREATE"]
resource = "topic"
pattern = "ro-{RUN}-*"
permission = "allow"
"""


def _config(tmp: Path, acls: str) -> str:
    return f"""
audit_log = "{tmp / 'audit.log'}"
[sasl]
terminate = true
mechanisms = ["PLAIN"]
users_file = "{tmp / 'users.toml'}"
{acls}
"""


@pytest.fixture(scope="module")
def proxy(shared_tansu: TansuBroker,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KproxyProcess, Path]]:
    tmp = tmp_path_factory.mktemp("acl")
    (tmp / "users.toml").write_text(USERS)
    (tmp / "kproxy.toml").write_text(_config(tmp, ACLS))
    with kproxy_process(shared_tansu.bootstrap, tmp, "--config", str(tmp / "kproxy.toml"),
                        "--config-watch-interval", "0") as kp:
        yield kp, tmp


def _ck(kp: KproxyProcess, user: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": kp.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": f"{user}-secret", **extra}




def _produce(kp: KproxyProcess, user: str, topic: str, partition: int = -1) -> Any:
    from confluent_kafka import Producer
    producer = Producer(_ck(kp, user, **{"message.timeout.ms": 10000}))
    results: list[Any] = []
    producer.produce(topic, b'{"n": 1}', partition=partition,
                     on_delivery=lambda err, _m: results.append(err))
    producer.flush(15)
    return results[0] if results else "no delivery report"


def test_produce_allowed_and_denied(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError
    kp, tmp = proxy
    assert _produce(kp, "alice", f"ok-{RUN}-produce") is None
    err = _produce(kp, "alice", f"no-{RUN}-produce")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    wait_until(lambda: any(r.get("event") == "acl_denied" and r["principal"] == "User:alice"
                           and r["api"] in ("Produce", "Metadata")
                           and r["name"] == f"no-{RUN}-produce" for r in audit_records(tmp)))

    def denied_count() -> float:
        url = f"http://127.0.0.1:{kp.http_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kproxy_filter_decisions_total{")
                   and 'filter="acl"' in line and 'decision="denied"' in line)

    assert wait_until(lambda: denied_count() >= 1)


def test_consume_needs_topic_and_group(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import Consumer, KafkaError
    kp, _ = proxy
    topic = f"ok-{RUN}-consume"
    assert _produce(kp, "alice", topic) is None

    def consume(user: str, group: str) -> tuple[list[bytes], list[int]]:
        consumer = Consumer(_ck(kp, user, **{"group.id": group,
                                             "auto.offset.reset": "earliest",
                                             "session.timeout.ms": 6000,
                                             "enable.partition.eof": True}))
        consumer.subscribe([topic])
        values: list[bytes] = []
        errors: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not values and not errors:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if (error := msg.error()) is None:
                values.append(value_of(msg))
            elif error.code() != KafkaError._PARTITION_EOF:
                errors.append(error.code())
        consumer.close()
        return values, errors

    assert consume("bob", f"app-{RUN}")[0] == [b'{"n": 1}']
    _, errors = consume("bob", f"other-{RUN}")
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors


def test_a_denied_partition_does_not_stop_the_allowed_one(
        proxy: tuple[KproxyProcess, Path]) -> None:
    """bob may READ ok-*, only DESCRIBE ro-*: fetching both, the allowed partition keeps
    delivering while the denied one reports TOPIC_AUTHORIZATION_FAILED (per partition, as
    Kafka's broker answers); committing both commits the allowed one only."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as TP
    kp, _ = proxy
    ok, ro = f"ok-{RUN}-split", f"ro-{RUN}-split"
    assert _produce(kp, "alice", ok, partition=0) is None
    assert _produce(kp, "dave", ro, partition=0) is None
    consumer = Consumer(_ck(kp, "bob", **{"group.id": f"app-{RUN}-split",
                                          "enable.auto.commit": False,
                                          "session.timeout.ms": 6000}))
    consumer.assign([TP(ok, 0, OFFSET_BEGINNING), TP(ro, 0, OFFSET_BEGINNING)])
    values: list[tuple[str | None, bytes]] = []
    errors: set[int] = set()

    def poll_until(cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        for _ in range(600):
            if cond() or time.monotonic() > deadline:
                break
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if (error := msg.error()) is None:
                values.append((msg.topic(), value_of(msg)))
            else:
                errors.add(error.code())
        assert cond(), (values, errors)

    try:
        poll_until(lambda: len(values) == 1
                   and KafkaError.TOPIC_AUTHORIZATION_FAILED in errors)
        assert values == [(ok, b'{"n": 1}')]
        assert _produce(kp, "alice", ok, partition=0) is None  # and it keeps receiving
        poll_until(lambda: len(values) == 2)
        assert [t for t, _ in values] == [ok, ok]

        try:
            result = consumer.commit(offsets=[TP(ok, 0, 2), TP(ro, 0, 1)],
                                     asynchronous=False)
            codes = {tp.topic: tp.error.code() if tp.error else 0 for tp in result or []}
        except KafkaException as exc:  # a partition's error raised as the commit's
            codes = {ro: exc.args[0].code()}
        assert codes.get(ro) == KafkaError.TOPIC_AUTHORIZATION_FAILED, codes
        assert codes.get(ok, 0) == 0
        committed = {tp.topic: tp for tp in consumer.committed([TP(ok, 0), TP(ro, 0)],
                                                               timeout=15)}
        assert committed[ok].offset == 2 and committed[ok].error is None
        assert committed[ro].offset < 0  # never committed
        # OffsetFetch of a topic bob may not describe: 29 for its partition.
        hidden = consumer.committed([TP(f"no-{RUN}-hidden", 0)], timeout=15)[0]
        assert hidden.error is not None
        assert hidden.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()


def test_metadata_lists_only_describable_topics(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka.admin import AdminClient
    kp, _ = proxy
    assert _produce(kp, "alice", f"ok-{RUN}-listed") is None
    topics = AdminClient(_ck(kp, "alice")).list_topics(timeout=15).topics
    assert f"ok-{RUN}-listed" in topics
    assert all(name.startswith(f"ok-{RUN}-") for name in topics), sorted(topics)
    assert AdminClient(_ck(kp, "bob")).list_topics(
        timeout=15).topics.keys() >= {f"ok-{RUN}-listed"}


def test_create_and_delete_topics(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic
    kp, _ = proxy
    admin = AdminClient(_ck(kp, "alice"))
    ok, no = f"ok-{RUN}-created", f"no-{RUN}-created"
    futures = admin.create_topics([NewTopic(ok, 1, 1), NewTopic(no, 1, 1)])
    futures[ok].result(15)
    with pytest.raises(KafkaException) as caught:
        futures[no].result(15)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    bob = AdminClient(_ck(kp, "bob"))
    with pytest.raises(KafkaException) as caught:
        bob.delete_topics([ok])[ok].result(15)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin.delete_topics([ok])[ok].result(15)


def test_transactional_id_allowed_and_denied(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer
    kp, _ = proxy
    denied = Producer(_ck(kp, "alice", **{"transactional.id": f"other-{RUN}"}))
    with pytest.raises(KafkaException) as caught:
        denied.init_transactions(15)
    assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    producer = Producer(_ck(kp, "alice", **{"transactional.id": f"tx-{RUN}-1"}))
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce(f"ok-{RUN}-txn", b"in a transaction")
    producer.commit_transaction(15)


def test_sighup_applies_new_acls_and_keeps_them_on_a_bad_entry(
        proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError
    kp, tmp = proxy
    topic = f"late-{RUN}"
    err = _produce(kp, "alice", topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    bad = ACLS + '[[acls]]\nprincipal = "x"\noperations = ["FLY"]\nresource = "topic"\n' \
        'pattern = "*"\npermission = "allow"\n'
    (tmp / "kproxy.toml").write_text(_config(tmp, bad))
    kp.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "operations: unknown 'fly'" in kp.log())
    assert _produce(kp, "alice", f"ok-{RUN}-still") is None  # the old rules hold
    more = ACLS + f'[[acls]]\nprincipal = "User:alice"\noperations = ["WRITE", "CREATE"]\n' \
        f'resource = "topic"\npattern = "late-{RUN}"\npermission = "allow"\n'
    (tmp / "kproxy.toml").write_text(_config(tmp, more))
    kp.process.send_signal(signal.SIGHUP)
    wait_until(lambda: _produce(kp, "alice", topic) is None, timeout=30)


def test_a_bad_entry_stops_start_up(tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text(USERS)
    (tmp_path / "kproxy.toml").write_text(_config(
        tmp_path, '[[acls]]\nprincipal = "User:a"\noperations = ["READ"]\n'
        'resource = "topic"\npattern = "*"\npermission = "perhaps"\n'))
    done = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--upstream",
                           "127.0.0.1:1", "--config", str(tmp_path / "kproxy.toml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "acls[0].permission" in lines[0], done.stderr


# ---------------------------------------------------------------------- admin APIs


def _code(future: Any) -> int | None:
    """The error code a future from AdminClient fails with, None when it succeeds."""
    from confluent_kafka import KafkaException
    try:
        future.result(20)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


@pytest.fixture(scope="module")
def groups(shared_tansu: TansuBroker) -> dict[str, str]:
    """Groups made straight at the broker (committed offsets, no ACLs on the way): one
    every user may describe (READ implies DESCRIBE), one alice may delete, one hidden."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"ok-{RUN}-groups"
    backend: dict[str, str | int | float | bool] = {"bootstrap.servers": shared_tansu.bootstrap}
    admin = AdminClient(backend)  # held: a collected client fails its futures
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(20)
    names = {"listed": f"app-{RUN}-listed", "deletable": f"adm-{RUN}-del",
             "hidden": f"hidden-{RUN}"}
    for group in names.values():
        consumer = Consumer({**backend, "group.id": group, "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()
    return names


def test_describe_configs_per_resource(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    kp, _ = proxy
    assert _produce(kp, "alice", f"ok-{RUN}-configs") is None
    admin = AdminClient(_ck(kp, "alice"))

    def describe(kind: Any, name: str) -> int | None:
        (future,) = admin.describe_configs([ConfigResource(kind, name)]).values()
        return _code(future)

    assert describe(ResourceType.TOPIC, f"ok-{RUN}-configs") is None
    assert describe(ResourceType.TOPIC, f"no-{RUN}-configs") == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert describe(ResourceType.BROKER, "111") == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_delete_records_allowed_and_denied(proxy: tuple[KproxyProcess, Path]) -> None:
    from confluent_kafka import KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient
    kp, _ = proxy
    topic = f"ok-{RUN}-records"
    assert _produce(kp, "alice", topic) is None

    def delete(user: str) -> int | None:
        admin = AdminClient(_ck(kp, user, **{"socket.timeout.ms": 10000}))
        (future,) = admin.delete_records([TopicPartition(topic, 0, 1)],
                                         request_timeout=15).values()
        return _code(future)

    assert delete("bob") == KafkaError.TOPIC_AUTHORIZATION_FAILED  # READ only
    # alice may DELETE: forwarded. tansu drops the connection on DeleteRecords, so the
    # client sees a transport error (or, from a tansu that implements it, success).
    assert delete("alice") in (None, KafkaError._TRANSPORT, KafkaError._TIMED_OUT)


def test_list_consumer_groups_shows_only_describable_groups(
        proxy: tuple[KproxyProcess, Path], groups: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient
    kp, _ = proxy

    def listed(user: str) -> set[str]:
        admin = AdminClient(_ck(kp, user))
        result = admin.list_consumer_groups().result(20)
        return {g.group_id for g in result.valid}

    alice = listed("alice")
    assert {groups["listed"], groups["deletable"]} <= alice
    assert groups["hidden"] not in alice
    assert all(g.startswith(("app-", f"adm-{RUN}-")) for g in alice), sorted(alice)
    assert groups["hidden"] in listed("carol")  # DESCRIBE on the cluster: every group


def test_describe_consumer_groups_denied(proxy: tuple[KproxyProcess, Path],
                                        groups: dict[str, str]) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient
    kp, _ = proxy
    admin = AdminClient(_ck(kp, "alice"))
    futures = admin.describe_consumer_groups([groups["listed"], groups["hidden"]])
    assert futures[groups["listed"]].result(20).group_id == groups["listed"]
    assert _code(futures[groups["hidden"]]) == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_delete_consumer_groups_allowed_and_denied(proxy: tuple[KproxyProcess, Path],
                                                  groups: dict[str, str]) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient
    kp, _ = proxy

    def delete(user: str, group: str) -> int | None:
        admin = AdminClient(_ck(kp, user))
        return _code(admin.delete_consumer_groups([group])[group])

    assert delete("bob", groups["deletable"]) == KafkaError.GROUP_AUTHORIZATION_FAILED
    # alice may describe the group (READ) but not delete it: DeleteGroups itself refuses.
    assert delete("alice", groups["listed"]) == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert delete("alice", groups["deletable"]) is None
    admin = AdminClient(_ck(kp, "carol"))
    wait_until(lambda: groups["deletable"] not in {
        g.group_id for g in admin.list_consumer_groups().result(20).valid})


def _frames(port: int, frames: list[bytes], count: int) -> list[bytes]:
    """Send request frames on one connection; the first ``count`` response frames."""
    import socket

    from kproxy.codecs.framing import FrameReader
    reader = FrameReader()
    out: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"".join(frames))
        while len(out) < count:
            data = sock.recv(65536)
            assert data, "connection closed"
            reader.feed(data)
            while len(out) < count and (frame := reader.next_frame()) is not None:
                out.append(bytes(frame))
    return out


def _frame(spec: Any, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    import struct

    from kproxy.codecs.headers import RequestHeader, write_request_header
    from kproxy.codecs.interpreter import encode_into
    from kproxy.codecs.primitives import Writer
    w = Writer()
    write_request_header(w, RequestHeader(spec.api_key, version, correlation_id, "raw"))
    encode_into(spec, version, body, w)
    return struct.pack(">i", len(w.getvalue())) + w.getvalue()


def _body(spec: Any, version: int, frame: bytes) -> dict[str, Any]:
    from kproxy.codecs.headers import read_response_header
    from kproxy.codecs.interpreter import decode_from
    from kproxy.codecs.primitives import Reader
    r = Reader(frame)
    read_response_header(r, spec.api_key, version)
    return decode_from(spec, version, r)


def test_create_partitions_denied_and_describe_groups_merged_on_the_wire(
        proxy: tuple[KproxyProcess, Path], groups: dict[str, str]) -> None:
    """Frames, logged in as bob: CreatePartitions (tansu does not offer it, so no client
    sends it) is answered by the proxy, 29; a DescribeGroups naming a describable and
    a hidden group reaches tansu with the first only and comes back with both."""
    from kproxy.codecs.schemas import sasl
    from kproxy.codecs.schemas import tenancy_groups as tg
    from kproxy.codecs.schemas import tenancy_topics as tt
    kp, _ = proxy
    frames = _frames(kp.bootstrap_port, [
        _frame(sasl.HANDSHAKE_REQUEST, 1, 1, {"mechanism": "PLAIN"}),
        _frame(sasl.AUTHENTICATE_REQUEST, 2, 2, {"auth_bytes": b"\0bob\0bob-secret"}),
        _frame(tt.CREATE_PARTITIONS_REQUEST, 3, 3, {"topics": [
            {"name": f"ok-{RUN}-groups", "count": 2, "assignments": None}],
            "timeout_ms": 5000}),
        _frame(tg.DESCRIBE_GROUPS_REQUEST, 5, 4, {"groups": [groups["listed"],
                                                             groups["hidden"]]}),
    ], 4)
    assert _body(sasl.AUTHENTICATE_RESPONSE, 2, frames[1])["error_code"] == 0
    created = _body(tt.CREATE_PARTITIONS_RESPONSE, 3, frames[2])
    assert [(r["name"], r["error_code"]) for r in created["results"]] == [
        (f"ok-{RUN}-groups", 29)]
    described = _body(tg.DESCRIBE_GROUPS_RESPONSE, 5, frames[3])
    got = {g["group_id"]: (g["error_code"], g["group_state"]) for g in described["groups"]}
    assert got == {groups["listed"]: (0, got[groups["listed"]][1]),
                   groups["hidden"]: (30, "")}
    assert got[groups["listed"]][1] != ""  # the broker's answer: a state (Empty)
