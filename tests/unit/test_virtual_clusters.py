"""Virtual clusters without sockets: the translation round-trips, hides, and fails closed.

The property tests cover every API and version in ``policies.tenancy.rules.RULES``:
prefixing then stripping gives back what the client sent, every name the backend sees
carries the prefix, and names without it never reach the tenant. The schemas are checked
against an independent codec (kio, generated from Kafka's message definitions).
"""

from __future__ import annotations

import copy
import importlib
import re
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys, interpreter
from kproxy.codecs.peek import peek_request
from kproxy.codecs.schema import MessageSpec
from kproxy.policies.connection import Close, Forward
from kproxy.policies.tenancy.rules import RULES, NamePath
from kproxy.policies.tenancy.translate import prefix_names, strip_names
from kproxy.policies.tenancy.virtual_cluster import VirtualClusterFilter, virtual_cluster_id

from ..schema_strategies import message_strategy

PREFIX = "tenant-a."
# One test per API, its versions drawn by hypothesis (all of them across the examples):
# a test per version would multiply the suite's time for little more coverage.
APIS = sorted(RULES)


def _names(node: Any, path: NamePath, depth: int = 0) -> list[str | None]:
    """Every name a path reaches in a message (the ``when`` condition honoured)."""
    if not isinstance(node, dict) or path.fields[depth] not in node:
        return []
    value = node[path.fields[depth]]
    if depth == len(path.fields) - 1:
        if path.when is not None and not path.when(node):
            return []
        return list(value) if isinstance(value, list) else [value]
    children = value if isinstance(value, list) else [value]
    return [n for child in children for n in _names(child, path, depth + 1)]


def _api_id(api_key: int) -> str:
    return api_keys.api_name(api_key)


def _version(data: st.DataObject, api_key: int) -> int:
    versions = RULES[api_key].versions
    return data.draw(st.integers(versions.lo, versions.hi), label="version")


@pytest.mark.parametrize("api_key", APIS, ids=_api_id)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_prefix_then_strip_round_trips(api_key: int, data: st.DataObject) -> None:
    rule = RULES[api_key]
    version = _version(data, api_key)
    specs = [(rule.request, rule.request_names)]
    if rule.response is not None:
        specs.append((rule.response, rule.response_names))
    for spec, paths in specs:
        msg = data.draw(message_strategy(spec, version))
        sent = copy.deepcopy(msg)
        prefix_names(sent, paths, PREFIX)
        for path in paths:  # the backend sees only prefixed names
            assert all(n is None or n.startswith(PREFIX) for n in _names(sent, path))
        # ... and the message still encodes at its version
        wire = interpreter.encode(spec, version, sent)
        back = interpreter.decode(spec, version, wire)
        strip_names(back, paths, PREFIX)
        assert back == msg


@pytest.mark.parametrize("api_key", [k for k in APIS if RULES[k].response is not None],
                         ids=_api_id)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_names_of_others_never_reach_the_tenant(api_key: int, data: st.DataObject) -> None:
    rule = RULES[api_key]
    assert rule.response is not None
    msg = data.draw(message_strategy(rule.response, _version(data, api_key)))
    other = copy.deepcopy(msg)
    prefix_names(other, rule.response_names, "tenant-b.")
    strip_names(other, rule.response_names, PREFIX)
    for path in rule.response_names:
        assert [n for n in _names(other, path) if n is not None] == []


def _frame(api_key: int, version: int, spec: MessageSpec, msg: dict[str, Any],
           correlation_id: int = 7) -> bytes:
    flexible = api_keys.is_flexible(api_key, version)
    head = struct.pack(">hhih", api_key, version, correlation_id, 3) + b"cli"
    if flexible:
        head += b"\x00"
    return head + interpreter.encode(spec, version, msg)


@pytest.mark.parametrize("api_key", APIS, ids=_api_id)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_filter_forwards_prefixed_requests(api_key: int, data: st.DataObject) -> None:
    rule = RULES[api_key]
    version = _version(data, api_key)
    flt = VirtualClusterFilter("a", PREFIX)
    msg = data.draw(message_strategy(rule.request, version))
    frame = _frame(api_key, version, rule.request, msg)
    decision = flt.on_request(None, peek_request(memoryview(frame)),  # type: ignore[arg-type]
                              memoryview(frame))
    if not rule.request_names:
        assert decision is None
        return
    assert isinstance(decision, Forward) and decision.upstream_version == version
    head = len(frame) - len(interpreter.encode(rule.request, version, msg))
    assert decision.body[:head] == frame[:head]  # the header travels unchanged
    sent = interpreter.decode(rule.request, version, decision.body[head:])
    expected = copy.deepcopy(msg)
    prefix_names(expected, rule.request_names, PREFIX)
    assert sent == expected


def test_untranslated_apis_close_the_connection_and_leave_api_versions() -> None:
    from kproxy.codecs.messages import decode_response, encode_response_parts

    flt = VirtualClusterFilter("a", PREFIX)
    frame = struct.pack(">hhih", 29, 1, 5, 0)  # DescribeAcls v1
    decision = flt.on_request(None, peek_request(memoryview(frame)),  # type: ignore[arg-type]
                              memoryview(frame))
    assert isinstance(decision, Close) and "DescribeAcls" in decision.message
    entries = [{"api_key": k, "min_version": 0, "max_version": hi}
               for k, hi in ((0, 13), (1, 18), (3, 13), (8, 10), (18, 4), (20, 6), (29, 3),
                             (68, 1), (75, 0))]
    body = encode_response_parts(18, 3, 9, {"error_code": 0, "api_keys": entries,
                                            "throttle_time_ms": 0})
    out = flt.on_response(None, 18, 3, memoryview(body))  # type: ignore[arg-type]
    assert out is not None
    got = {e["api_key"]: e["max_version"] for e in decode_response(out, 18, 3).body["api_keys"]}
    assert got == {0: 12, 1: 12, 3: 13, 8: 9, 18: 4, 20: 5}


def test_metadata_hides_other_tenants_and_has_its_own_cluster_id() -> None:
    from kproxy.codecs.messages import decode_response, encode_response_parts

    flt = VirtualClusterFilter("a", PREFIX)
    topics = [{"error_code": 0, "name": n, "topic_id": __import__("uuid").UUID(int=i),
               "is_internal": False, "partitions": [], "topic_authorized_operations": 0}
              for i, n in enumerate(["tenant-a.orders", "tenant-b.orders", "__consumer_offsets"])]
    body = encode_response_parts(3, 12, 1, {"throttle_time_ms": 0, "brokers": [],
                                            "cluster_id": "backend", "controller_id": 111,
                                            "topics": topics})
    out = flt.on_response(None, 3, 12, memoryview(body))  # type: ignore[arg-type]
    assert out is not None
    resp = decode_response(out, 3, 12).body
    assert [t["name"] for t in resp["topics"]] == ["orders"]
    assert resp["cluster_id"] == virtual_cluster_id("backend", "a") != "backend"
    assert len(resp["cluster_id"]) == 22
    assert virtual_cluster_id("backend", "b") != resp["cluster_id"]


def _kio_class(spec: MessageSpec, version: int) -> Any:
    base = re.sub(r"(Request|Response)$", "", spec.name)
    module = re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()
    try:
        mod = importlib.import_module(f"kio.schema.{module}.v{version}.{spec.kind}")
    except ModuleNotFoundError:
        return None  # a version Kafka no longer has (kio follows Kafka 4)
    return getattr(mod, spec.name)


def _sane(value: Any) -> Any:
    """Values kio insists on: known error codes, non-negative durations."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == interpreter.UNKNOWN_TAGS or (k == "cluster_id" and v is None):
                continue  # kio skips unknown tags; an absent tag is its default (null)
            if "error_code" in k and isinstance(v, int):
                v = 0
            elif k.endswith("_ms") and isinstance(v, int):
                v = abs(v) % 2**31
            out[k] = _sane(v)
        return out
    if isinstance(value, list):  # Kafka's arrays of strings hold no nulls
        return [_sane("" if v is None else v) for v in value]
    return value


KIO_CASES = [(spec, rule.api_key) for rule in RULES.values()
             for spec in (rule.request, rule.response) if spec is not None]


@pytest.mark.parametrize(("spec", "api_key"), KIO_CASES,
                         ids=lambda x: getattr(x, "name", str(x)))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_schemas_agree_with_kio(spec: MessageSpec, api_key: int, data: st.DataObject) -> None:
    from kio.serial import entity_reader

    version = _version(data, api_key)
    cls = _kio_class(spec, version)
    if cls is None:
        return
    msg = _sane(data.draw(message_strategy(spec, version)))
    wire = interpreter.encode(spec, version, msg)
    _, end = entity_reader(cls)(wire, 0)
    assert end == len(wire)


# ----------------------------------------------------------------------------- config

VC = '[[virtual_clusters]]\nname = "{name}"\nlisten = "127.0.0.1:{listen}"\n' \
     'broker_port_base = {base}\nprefix = "{prefix}"\n'


def _load(tmp_path: Any, text: str) -> Any:
    from kproxy.config import settings

    path = tmp_path / "kproxy.toml"
    path.write_text(text)
    return settings.load(env={}, path=str(path))


def test_virtual_clusters_are_read_with_their_filters(tmp_path: Any) -> None:
    cfg = _load(tmp_path, 'node_id_range = "0-9"\n[[filters]]\nname = "j"\n'
                'type = "record-validation"\ntopics = ["*"]\nvalue_format = "json"\n'
                + VC.format(name="a", listen=30000, base=30010, prefix="a.")
                + 'filters = ["j"]\nadvertised_host = "kafka-a.example"\n'
                + VC.format(name="b", listen=30100, base=30110, prefix="b."))
    a, b = cfg.virtual_clusters
    assert (a.name, a.prefix, a.listen, a.filters) == ("a", "a.", ("127.0.0.1", 30000), ("j",))
    assert a.port_map(cfg.node_id_range).advertised(3) == ("kafka-a.example", 30013)
    assert b.port_map(cfg.node_id_range).advertised(0) == ("127.0.0.1", 30110)


@pytest.mark.parametrize(("text", "key"), [
    (VC.format(name="a", listen=30000, base=30010, prefix=""), "virtual_clusters.a.prefix:"),
    ('[[virtual_clusters]]\nname = "a b"\n', "virtual_clusters[0].name:"),
    (VC.format(name="a", listen=30000, base=30010, prefix="a.") + "colour = 1\n",
     "virtual_clusters.a.colour: unknown key"),
    (VC.format(name="a", listen=30000, base=30010, prefix="a.") + 'filters = ["x"]\n',
     "virtual_clusters.a.filters: no filter named 'x'"),
    ('[[virtual_clusters]]\nname = "a"\nprefix = "a."\nbroker_port_base = 1\n',
     "virtual_clusters.a.listen:"),
    (VC.format(name="a", listen=0, base=30010, prefix="a."), "virtual_clusters.a.listen: a port"),
    ('[[virtual_clusters]]\nname = "a"\nprefix = "a."\nlisten = "h:1"\n',
     "virtual_clusters.a.broker_port_base:"),
    (VC.format(name="a", listen=30000, base=30010, prefix="t.")
     + VC.format(name="b", listen=30100, base=30110, prefix="t.x"), "virtual_clusters.b.prefix:"),
    (VC.format(name="a", listen=30000, base=30010, prefix="a.")
     + VC.format(name="a", listen=30100, base=30110, prefix="b."), "virtual_clusters.a.name:"),
    (VC.format(name="a", listen=30000, base=30010, prefix="a.")
     + VC.format(name="b", listen=30012, base=30110, prefix="b."),
     "virtual_clusters.b.listen: ports 30012-30012 overlap"),
    ('listen = "127.0.0.1:30000"\n' + VC.format(name="a", listen=30000, base=30010, prefix="a."),
     "virtual_clusters.a.listen: ports 30000-30000 overlap listen"),
    ('sni_host_pattern = "b-{node_id}.x"\ntls_cert = "c"\ntls_key = "k"\n'
     + VC.format(name="a", listen=30000, base=30010, prefix="a."),
     "virtual_clusters: not available with SNI"),
])
def test_a_bad_virtual_cluster_names_the_key(tmp_path: Any, text: str, key: str) -> None:
    from kproxy.config import settings

    with pytest.raises(settings.ConfigError, match=re.escape(key)):
        _load(tmp_path, 'node_id_range = "0-9"\n' + text)


def test_a_reload_that_moves_listeners_or_prefixes_is_refused(tmp_path: Any) -> None:
    from kproxy.config.virtual_clusters import reload_change

    one = _load(tmp_path, VC.format(name="a", listen=30000, base=30010, prefix="a."))
    same = _load(tmp_path, '[[filters]]\nname = "j"\ntype = "record-validation"\n'
                 'topics = ["*"]\nvalue_format = "json"\n'
                 + VC.format(name="a", listen=30000, base=30010, prefix="a.")
                 + 'filters = ["j"]\n')
    moved = _load(tmp_path, VC.format(name="a", listen=30000, base=30010, prefix="z."))
    assert reload_change(one.virtual_clusters, same.virtual_clusters) is None
    why = reload_change(one.virtual_clusters, moved.virtual_clusters)
    assert why is not None and why.startswith("virtual_clusters:") and "restart" in why


def test_the_supervisor_sums_virtual_cluster_figures_over_workers() -> None:
    from kproxy.http.status_merge import merge_virtual_clusters
    from kproxy.http.status_page import _virtual_clusters

    row = {"name": "a", "prefix": "a.", "bootstrap": "127.0.0.1:1", "broker_ports": "2+",
           "advertised": "h:2", "filters": [], "connections": 1, "accepted": 2,
           "bytes_in": 10, "bytes_out": 20}
    merged = merge_virtual_clusters([[row], [dict(row, connections=3, bytes_in=5)]])
    assert merged == [dict(row, connections=4, accepted=4, bytes_in=15, bytes_out=40)]
    assert merge_virtual_clusters([]) == []
    html = _virtual_clusters([dict(row, prefix="<a>")])
    assert "Virtual clusters" in html and "&lt;a&gt;" in html and "<a>" not in html
    assert _virtual_clusters([]) == ""
