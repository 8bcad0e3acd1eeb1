"""Deployment artefacts: the image check, Kubernetes manifests, monitoring objects,
the example configurations and the documented port mapping, validated offline."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kproxy.config import settings as config_mod
from kproxy.policies.addressing import PortMap

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
SCHEMAS = json.loads((ROOT / "tests" / "schemas" / "monitoring-coreos-v1.json").read_text())
MANIFESTS = sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")
OVERLAYS = sorted(p.parent for p in KUBE.rglob("kustomization.yaml"))


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.relative_to(ROOT)}:{doc['kind']}/{doc['metadata']['name']}",
                            doc))
    return out


DOCS = documents()


def test_every_pattern_is_shipped() -> None:
    kinds = {doc["kind"] for _, doc in DOCS}
    assert {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor",
            "PodMonitor", "PrometheusRule"} <= kinds


def monitoring_schema(kind: str) -> dict[str, Any]:
    return {**SCHEMAS[kind], "definitions": SCHEMAS["definitions"]}


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[n for n, _ in DOCS])
def test_manifest_validates(name: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(doc, monitoring_schema(doc["kind"]))
    else:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


def kubectl() -> str:
    binary = shutil.which("kubectl")
    assert binary, "kubectl (Debian package kubernetes-client) is installed by `make test`"
    return binary


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[p.name for p in OVERLAYS])
def test_kustomize_renders_a_valid_overlay(overlay: Path) -> None:
    proc = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = {d["kind"] for d in rendered}
    assert {"ConfigMap", "Deployment", "PodDisruptionBudget"} <= kinds
    for doc in rendered:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    pods = [d["spec"]["template"]["spec"] for d in rendered if d["kind"] == "Deployment"]
    kproxy = [c for p in pods for c in p.get("initContainers", []) + p["containers"]
              if "kproxy" in c["image"]]
    assert len(kproxy) == 1
    # The image's user, and its configuration file mounted where `--config` reads it.
    assert kproxy[0]["securityContext"]["runAsUser"] == 10001
    assert "/etc/kproxy/kproxy.toml" in kproxy[0]["args"]
    assert {"readinessProbe", "livenessProbe"} <= set(kproxy[0])


def test_grace_period_covers_the_pre_stop_and_the_drain(tmp_path: Path) -> None:
    for name, doc in DOCS:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        assert doc["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0,
                                                            "maxSurge": 1}, name
        for c in pod.get("initContainers", []) + pod["containers"]:
            if "kproxy" not in c["image"]:
                continue
            pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {})
            wait = float(pre_stop["command"][1]) if pre_stop else 0.0
            cfg = next(d for n, d in DOCS if d["kind"] == "ConfigMap" and n.split(":")[0]
                       == name.split(":")[0])
            drain = load_toml_config(cfg["data"]["kproxy.toml"], tmp_path).drain_timeout
            assert pod["terminationGracePeriodSeconds"] > wait + drain, name


def image_environment() -> dict[str, str]:
    """The KPROXY_* defaults the Dockerfile's runtime stage sets."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    final = text[text.rindex("\nFROM "):]
    pairs = [w.split("=", 1) for ln in final.splitlines() if ln.startswith("ENV ")
             for w in ln.split()[1:]]
    return {k: v for k, v in pairs if k.startswith("KPROXY_")}


@pytest.mark.parametrize("name", [n for n, d in DOCS if d["kind"] == "Deployment"])
def test_deployments_run_the_documented_config_in_the_image(name: str,
                                                             tmp_path: Path) -> None:
    """What the proxy really runs with: the image's environment, the container's, the file
    (the environment beats the file). A sidecar stays on loopback."""
    path = name.split(":")[0]
    cfg_doc = next(d for n, d in DOCS if d["kind"] == "ConfigMap" and n.startswith(path))
    pod = dict(DOCS)[name]["spec"]["template"]["spec"]
    container = next(c for c in pod.get("initContainers", []) + pod["containers"]
                     if "kproxy" in c["image"])
    env = {**image_environment(), **{e["name"]: e["value"] for e in container.get("env", [])}}
    assert set(image_environment()) >= {"KPROXY_LISTEN", "KPROXY_HTTP"}
    file = tmp_path / "kproxy.toml"
    file.write_text(cfg_doc["data"]["kproxy.toml"])
    cfg = config_mod.load(path=str(file), env=env)
    if "sidecar" in path:
        assert cfg.listen == ("127.0.0.1", 9092)
    else:
        assert cfg.listen == ("0.0.0.0", 9092)
    ports = {p["containerPort"] for p in container["ports"]}
    assert cfg.http[1] in ports


def test_monitoring_schema_rejects_a_typo() -> None:
    bad = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
           "metadata": {"name": "x"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
                                               "endpoints": [{"prot": "http"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, monitoring_schema("ServiceMonitor"))


def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool (Debian package prometheus) is installed by `make test`"
    return binary


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    rule = next(doc for _, doc in DOCS if doc["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 10 rules found" in proc.stdout + proc.stderr


def test_plain_scrape_config_passes_promtool(tmp_path: Path) -> None:
    path = KUBE / "monitoring" / "prometheus-scrape.yml"
    proc = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True,
                          text=True, check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode and "field kubernetes_sd_configs not found" in out:
        # Debian's Prometheus is built without Kubernetes discovery. Check everything
        # else (job, paths, relabelling) with file discovery standing in for it.
        config = yaml.safe_load(path.read_text())
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True,
                              text=True, check=False)
        out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out


def load_toml_config(text: str, tmp_path: Path) -> config_mod.Config:
    path = tmp_path / "kproxy.toml"
    path.write_text(text)
    return config_mod.load(path=str(path), env={})


@pytest.mark.parametrize("name", [n for n, d in DOCS if d["kind"] == "ConfigMap"])
def test_configmaps_hold_a_valid_kproxy_config(name: str, tmp_path: Path) -> None:
    doc = dict(DOCS)[name]
    cfg = load_toml_config(doc["data"]["kproxy.toml"], tmp_path)
    assert cfg.node_id_range == (0, 5) and cfg.broker_port_base == 9093


def test_example_config_is_valid(tmp_path: Path) -> None:
    cfg = load_toml_config((ROOT / "deploy" / "kproxy.example.toml").read_text(), tmp_path)
    assert len(cfg.telemetry.settings.subscriptions) == 2


def _port(pm: PortMap, node: int) -> int:
    """The port ``pm`` advertises for ``node``, which must be in its range."""
    address = pm.advertised(node)
    assert address is not None, f"node {node} out of the port map's range"
    return address[1]


def test_shared_service_exposes_exactly_the_mapped_broker_ports(tmp_path: Path) -> None:
    shared = {d["kind"]: d for n, d in DOCS if "shared" in n}
    cfg = load_toml_config(shared["ConfigMap"]["data"]["kproxy.toml"], tmp_path)
    pm = cfg.port_map
    want = {f"broker-{n}": _port(pm, n) for n in range(cfg.node_id_range[0],
                                                      cfg.node_id_range[1] + 1)}
    service = {p["name"]: p["port"] for p in shared["Service"]["spec"]["ports"]}
    container = shared["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    pod = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {k: v for k, v in service.items() if k.startswith("broker-")} == want
    assert {k: v for k, v in pod.items() if k.startswith("broker-")} == want
    assert service["bootstrap"] == cfg.listen[1] and service["http"] == cfg.http[1]


def test_documented_port_tables_match_the_code() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for first, last in ((0, 5), (1001, 1003)):
        pm = PortMap("h", 9093, 9093, first, last)
        for node in range(first, last + 1):
            assert f"| {node} | {_port(pm, node)} |" in text


def test_dashboard_panels_have_queries() -> None:
    dash = json.loads((ROOT / "deploy" / "grafana" / "kproxy-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 12 and all(re.search(r"kproxy_|org_apache_kafka_", e) for e in exprs)
    # Every kproxy family a panel reads is one the code writes.
    code = "\n".join(p.read_text() for p in (ROOT / "proxy").rglob("*.py"))
    for name in {n for e in exprs for n in re.findall(r"\bkproxy_\w+", e)}:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert f'"{base}' in code or f"{base}_" in code or f"{base}{{" in code, name
    # Variables a query uses are defined, and panels do not overlap.
    defined = {v["name"] for v in dash["templating"]["list"]}
    for e in exprs:
        assert set(re.findall(r"\$(\w+)", e)) - {"__rate_interval"} <= defined, e
    cells = [(x, y) for p in dash["panels"] for g in [p["gridPos"]]
             for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])]
    assert len(cells) == len(set(cells))


def test_dashboard_has_the_consumer_group_panels() -> None:
    dash = json.loads((ROOT / "deploy" / "grafana" / "kproxy-dashboard.json").read_text())
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in dash["panels"]}
    lag = [e for title, es in by_title.items() if "lag by group" in title for e in es]
    assert lag and all("sum by (group)" in e and "kproxy_group_lag" in e for e in lag)
    rebalances = [e for title, es in by_title.items() if title.startswith("Rebalances by group")
                  for e in es]
    assert rebalances and "kproxy_group_rebalances_total" in rebalances[0]
    assert any("count by (protocol) (kproxy_group_info)" in e for es in by_title.values()
               for e in es)


def test_dockerfile_checker_catches_a_bad_image(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "deploy"))
    from image_check import dockerfile_problems

    assert dockerfile_problems((ROOT / "Dockerfile").read_text()) == []
    bad = "FROM python:3.11\nRUN pip install '.[dev]'\nENTRYPOINT [\"python\"]\n"
    problems = dockerfile_problems(bad)
    assert any("multi-stage" in p for p in problems)
    assert any("non-root" in p for p in problems)
    assert any("HEALTHCHECK" in p for p in problems)
    assert any("extras" in p for p in problems)
