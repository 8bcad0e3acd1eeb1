"""Configuration: one table of options, read from a TOML file, KPROXY_* variables and flags.

Precedence is flags > environment > file > defaults. Every option has a flag
(``--broker-port-base``), a file key (``broker_port_base``) and an environment
variable (``KPROXY_BROKER_PORT_BASE``), all derived from its name here, so they
cannot drift apart. Any bad value raises ``ConfigError`` naming the key.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.codecs.framing import DEFAULT_MAX_FRAME_BYTES
from kproxy.policies.addressing import PortMap, SniNames
from kproxy.policies.telemetry import (
    ALL_METRICS,
    COMPRESSION_NAMES,
    PolicyError,
    TelemetrySettings,
    parse_subscriptions,
)


class ConfigError(Exception):
    """A bad configuration value; the message names the key and what was wrong."""


HostPort = tuple[str, int]


def parse_host_port(text: str) -> HostPort:
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def parse_servers(text: str | list[str]) -> list[HostPort]:
    items = text if isinstance(text, list) else text.split(",")
    servers = [parse_host_port(s) for s in items if str(s).strip()]
    if not servers:
        raise ValueError("at least one HOST:PORT is needed")
    return servers


def parse_range(text: str) -> tuple[int, int]:
    lo, sep, hi = str(text).partition("-")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise ValueError(f"expected FIRST-LAST, got {text!r}")
    first, last = int(lo), int(hi)
    if first > last:
        raise ValueError(f"FIRST must not exceed LAST in {text!r}")
    return first, last


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def parse_positive_int(text: str | int) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value


def parse_seconds(text: str | float) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    return value


def parse_non_negative_seconds(text: str | float) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must be zero (off) or a positive number of seconds, got {text!r}")
    return value


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise ValueError(f"expected on or off, got {text!r}")


def parse_compression_list(text: str | list[str]) -> tuple[int, ...]:
    names = text if isinstance(text, list) else str(text).split(",")
    out = []
    for name in (str(n).strip().lower() for n in names if str(n).strip()):
        if name not in COMPRESSION_NAMES or name == "none":
            raise ValueError(f"unknown compression type {name!r} (zstd, lz4, gzip, snappy)")
        out.append(COMPRESSION_NAMES[name])
    if not out:
        raise ValueError("at least one compression type is needed")
    return tuple(out)


def parse_prefix(text: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_:]?[a-zA-Z0-9_:]*", str(text)):
        raise ValueError(f"not a valid Prometheus name prefix: {text!r}")
    return str(text)


@dataclass(frozen=True)
class Option:
    name: str  # the flag and variable are derived from it
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str = ""
    file_key: tuple[str, ...] = ()  # where it sits in the TOML file; default (name,)

    @property
    def path(self) -> tuple[str, ...]:
        return self.file_key or (self.name,)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "KPROXY_" + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("upstream", parse_servers, "127.0.0.1:19092",
           "bootstrap servers of the backend cluster, comma-separated", "HOST:PORT[,...]"),
    Option("listen", parse_host_port, "127.0.0.1:9092",
           "bootstrap listener that clients are given as bootstrap.servers", "HOST:PORT"),
    Option("advertised_host", str, None,
           "host written into rewritten responses (default: the listen host, or this "
           "machine's name when listening on a wildcard address)", "HOST"),
    Option("broker_port_base", parse_positive_int, None,
           "advertised port of the first broker in --node-id-range (default: listen port "
           "+ 1); broker N gets base + N - FIRST", "PORT"),
    Option("broker_bind_host", str, None,
           "address the per-broker listeners bind (default: the listen host)", "HOST"),
    Option("broker_bind_port_base", parse_positive_int, None,
           "port the first broker's listener binds, when it differs from the advertised "
           "base (NodePort, port-forward); default: --broker-port-base", "PORT"),
    Option("node_id_range", parse_range, "0-1023",
           "backend node ids this proxy maps to ports; nodes outside are left out of "
           "responses and counted", "FIRST-LAST"),
    Option("http", parse_host_port, "127.0.0.1:9080",
           "HTTP endpoint for /healthz, /readyz and /metrics", "HOST:PORT"),
    Option("reuse_port", parse_bool, False,
           "open the bootstrap and broker listeners with SO_REUSEPORT, so several kproxy "
           "processes on one host share the ports and the kernel spreads connections "
           "over them (one process per core); each needs its own --http port", "on|off"),
    Option("log_format", parse_choice("text", "json"), "text", "log line format",
           "text|json"),
    Option("log_level", parse_choice("debug", "info", "warning", "error"), "info",
           "minimum level logged", "LEVEL"),
    Option("max_frame_bytes", parse_positive_int, DEFAULT_MAX_FRAME_BYTES,
           "largest frame accepted from either side (Kafka's socket.request.max.bytes)",
           "BYTES"),
    Option("max_inflight", parse_positive_int, 1000,
           "requests in flight per client connection before the proxy stops reading "
           "from that client", "N"),
    Option("connect_timeout", parse_seconds, 10.0, "upstream connect timeout", "SECONDS"),
    Option("write_timeout", parse_seconds, 60.0,
           "longest a single write to a peer may take before the connection is dropped",
           "SECONDS"),
    Option("discovery_interval", parse_seconds, 10.0,
           "how often the backend's broker set is read with a Metadata request", "SECONDS"),
    Option("config_watch_interval", parse_non_negative_seconds, 5.0,
           "how often the --config file is checked for changes (a ConfigMap update); a "
           "change is applied like SIGHUP; 0 turns the watch off", "SECONDS"),
    Option("archive", str, None,
           "write accepted telemetry pushes and a record per client connection as JSON "
           "lines under this folder, for the fleet pipeline (off when unset)", "DIR"),
    Option("archive_max_file_bytes", parse_positive_int, 64 * 1024 * 1024,
           "an archive file is completed (renamed into place) at this size", "BYTES"),
    Option("archive_max_file_seconds", parse_seconds, 300.0,
           "an archive file is completed at this age", "SECONDS"),
    Option("archive_max_total_bytes", parse_positive_int, 1024 * 1024 * 1024,
           "completed archive files are deleted, oldest first, beyond this total", "BYTES"),
    Option("archive_queue_records", parse_positive_int, 10_000,
           "records waiting for the archive writer; beyond this they are dropped and "
           "counted (a slow or full disk never slows the relay)", "N"),
    Option("legacy_clients", parse_choice("close", "ignore"), "close",
           "when the backend changes, what to do with clients whose Metadata version is "
           "below v13 and so cannot read REBOOTSTRAP_REQUIRED: close their connections (they "
           "reconnect through the bootstrap listener) or leave them", "close|ignore"),
    Option("admin", parse_bool, False,
           "enable operator actions on the HTTP port (POST /admin/rebootstrap)", "on|off"),
    Option("drain_timeout", parse_seconds, 30.0,
           "on SIGTERM, how long in-flight requests may take to finish", "SECONDS"),
)

# Limits: each hit is counted in kproxy_limit_hits{limit=NAME} and logged at most once
# per interval. Defaults follow the broker's own where it has one.
LIMIT_OPTIONS: tuple[Option, ...] = (
    Option("max_connections", parse_positive_int, 10_000,
           "client connections open at once, over all listeners; more are closed at accept "
           "(Kafka's max.connections); lowered at start to what the open-file limit holds "
           "at two descriptors per connection", "N"),
    Option("max_connections_per_source", parse_positive_int, 1_000,
           "client connections open at once from one source address "
           "(Kafka's max.connections.per.ip)", "N"),
    Option("idle_timeout", parse_non_negative_seconds, 600.0,
           "close a client connection with no request in flight and no complete frame either "
           "way for this long (Kafka's connections.max.idle.ms); 0 turns it off", "SECONDS"),
    Option("first_request_timeout", parse_seconds, 10.0,
           "a new connection must deliver its first complete request within this time "
           "(after the TLS handshake), or it is closed: a slowloris guard", "SECONDS"),
    Option("tls_handshake_timeout", parse_seconds, 10.0,
           "longest a client's TLS handshake may take", "SECONDS"),
)

# TLS towards clients (terminate) and towards brokers (originate), SNI routing, SASL.
SECURITY_OPTIONS: tuple[Option, ...] = (
    Option("tls_cert", str, None,
           "PEM certificate chain the client-facing listeners present; setting it turns "
           "TLS on for every client listener", "FILE"),
    Option("tls_key", str, None, "PEM private key of --tls-cert", "FILE"),
    Option("tls_client_ca", str, None,
           "PEM bundle of the CAs whose client certificates are accepted (mTLS)", "FILE"),
    Option("tls_client_auth", parse_choice("none", "optional", "required"), "none",
           "client certificate check: none, optional (verified when sent) or required",
           "none|optional|required"),
    Option("sni_host_pattern", str, None,
           "route by TLS SNI instead of a port per broker: one TLS port (--listen); a "
           "client reaching host name PATTERN with {node_id} filled in reaches that broker, "
           "any other name the bootstrap servers; e.g. broker-{node_id}.kafka.example.com",
           "PATTERN"),
    Option("sni_advertised_port", parse_positive_int, None,
           "with --sni-host-pattern, the port written into rewritten responses (default: "
           "the listen port)", "PORT"),
    Option("upstream_tls", parse_bool, False, "connect to the brokers with TLS", "on|off"),
    Option("upstream_tls_ca", str, None,
           "PEM bundle that verifies the brokers' certificates (default: the system's)",
           "FILE"),
    Option("upstream_tls_verify_hostname", parse_bool, True,
           "check that a broker's certificate names the host the proxy connected to",
           "on|off"),
    Option("upstream_tls_cert", str, None,
           "PEM client certificate the proxy presents to brokers that require mTLS", "FILE"),
    Option("upstream_tls_key", str, None, "PEM private key of --upstream-tls-cert", "FILE"),
    Option("require_sasl", parse_bool, False,
           "the brokers require SASL: requests the proxy answers itself (telemetry) on a "
           "connection that has not authenticated are refused as a broker refuses them, by "
           "closing the connection", "on|off"),
)
OPTIONS = OPTIONS + LIMIT_OPTIONS + SECURITY_OPTIONS

def _telemetry(name: str, parse: Callable[[Any], Any], default: Any, help_: str,
               metavar: str = "") -> Option:
    key = name.removeprefix("telemetry_") if name != "telemetry" else "enabled"
    return Option(name, parse, default, help_, metavar, ("telemetry", key))


TELEMETRY_OPTIONS: tuple[Option, ...] = (
    _telemetry("telemetry", parse_bool, True,
               "answer KIP-714 telemetry requests in the proxy and export them on /metrics; "
               "off forwards them to the broker untouched", "on|off"),
    _telemetry("telemetry_default_interval_ms", parse_positive_int, 60_000,
               "push interval of the implicit all-metrics subscription used when the config "
               "file defines no [[telemetry.subscriptions]]", "MS"),
    _telemetry("telemetry_max_bytes", parse_positive_int, 1024 * 1024,
               "largest compressed push accepted (TelemetryMaxBytes)", "BYTES"),
    _telemetry("telemetry_max_decompressed_bytes", parse_positive_int, 16 * 1024 * 1024,
               "largest push after decompression; a larger one is rejected as INVALID_RECORD",
               "BYTES"),
    _telemetry("telemetry_delta_temporality", parse_bool, False,
               "ask clients for delta sums (accumulated by the proxy) instead of cumulative",
               "on|off"),
    _telemetry("telemetry_compression_types", parse_compression_list, "zstd,lz4,gzip,snappy",
               "accepted push compression, in the order clients should prefer", "LIST"),
    _telemetry("telemetry_metric_prefix", parse_prefix, "",
               "prefix for exported client metric names", "PREFIX"),
    _telemetry("telemetry_max_series", parse_positive_int, 50_000,
               "cap on exported client series; the excess is dropped and counted", "N"),
    _telemetry("telemetry_max_instances", parse_positive_int, 100_000,
               "client instances remembered before the least recently seen is forgotten", "N"),
)
OPTIONS = OPTIONS + TELEMETRY_OPTIONS
OPTIONS_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: bool
    settings: TelemetrySettings
    metric_prefix: str
    max_series: int


@dataclass(frozen=True)
class Config:
    upstream: list[HostPort]
    listen: HostPort
    advertised_host: str
    broker_port_base: int
    broker_bind_host: str
    broker_bind_port_base: int
    node_id_range: tuple[int, int]
    http: HostPort
    reuse_port: bool
    log_format: str
    log_level: str
    max_frame_bytes: int
    max_inflight: int
    connect_timeout: float
    write_timeout: float
    discovery_interval: float
    config_watch_interval: float
    archive: str | None
    archive_max_file_bytes: int
    archive_max_file_seconds: float
    archive_max_total_bytes: int
    archive_queue_records: int
    legacy_clients: str
    admin: bool
    drain_timeout: float
    telemetry: TelemetryConfig
    max_connections: int = 10_000
    max_connections_per_source: int = 1_000
    idle_timeout: float = 600.0
    first_request_timeout: float = 10.0
    tls_handshake_timeout: float = 10.0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tls_client_auth: str = "none"
    sni_host_pattern: str | None = None
    sni_advertised_port: int | None = None
    upstream_tls: bool = False
    upstream_tls_ca: str | None = None
    upstream_tls_verify_hostname: bool = True
    upstream_tls_cert: str | None = None
    upstream_tls_key: str | None = None
    require_sasl: bool = False
    source: str | None = None  # the config file, when there was one
    extra: dict[str, Any] = field(default_factory=dict)  # tables other layers own

    @property
    def port_map(self) -> PortMap:
        sni = None
        if self.sni_host_pattern:
            sni = SniNames(self.sni_host_pattern, self.sni_advertised_port or self.listen[1])
        return PortMap(self.advertised_host, self.broker_port_base, self.broker_bind_port_base,
                       *self.node_id_range, sni=sni)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=os.environ.get("KPROXY_CONFIG"),
                        help="TOML config file; keys are the flag names with underscores "
                        "(env: KPROXY_CONFIG)")
    for opt in OPTIONS:
        default = f" (default: {opt.default})" if opt.default is not None else ""
        parser.add_argument(opt.flag, dest=opt.name, metavar=opt.metavar or None,
                            default=None, help=f"{opt.help}{default} [env: {opt.env}]")


def load_or_explain(args: argparse.Namespace, prog: str) -> Config | None:
    """Load, or print the one-line error for the command line and return None."""
    try:
        return load(args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return None


def load(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None,
         path: str | None = None) -> Config:
    """Merge defaults, file, environment and flags into a validated Config."""
    env = os.environ if env is None else env
    path = path or (getattr(args, "config", None) if args else None)
    file_values: dict[tuple[str, ...], Any] = {}
    extra: dict[str, Any] = {}
    if path:
        file_values, extra = _read_file(path)
    raw: dict[str, Any] = {}
    for opt in OPTIONS:
        flag_value = getattr(args, opt.name, None) if args else None
        if flag_value is not None:
            raw[opt.name] = (flag_value, opt.flag)
        elif opt.env in env:
            raw[opt.name] = (env[opt.env], opt.env)
        elif opt.path in file_values:
            raw[opt.name] = (file_values[opt.path], f"{path}: {'.'.join(opt.path)}")
        else:
            raw[opt.name] = (opt.default, opt.name)
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        value, where = raw[opt.name]
        if value is None:
            values[opt.name] = None
            continue
        try:
            values[opt.name] = opt.parse(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return _derive(values, path, extra)


# Tables whose non-option content other layers read (e.g. telemetry.subscriptions).
KNOWN_TABLE_ENTRIES = {("telemetry", "subscriptions")}


def _read_file(path: str) -> tuple[dict[tuple[str, ...], Any], dict[str, Any]]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML ({exc})") from None
    known = {o.path for o in OPTIONS}
    values: dict[tuple[str, ...], Any] = {}
    tables: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            tables[key] = value
            for sub, subvalue in value.items():
                if (key, sub) in known:
                    values[(key, sub)] = subvalue
                elif (key, sub) not in KNOWN_TABLE_ENTRIES:
                    raise ConfigError(f"{path}: {key}.{sub}: unknown key")
        elif (key,) in known:
            values[(key,)] = value
        else:
            raise ConfigError(f"{path}: {key}: unknown key")
    return values, tables


def _telemetry_config(v: dict[str, Any], extra: dict[str, Any],
                      path: str | None) -> TelemetryConfig:
    entries = extra.get("telemetry", {}).get("subscriptions")
    if entries is None:
        entries = [{"name": "all-metrics (default)", "metrics": [ALL_METRICS],
                    "interval_ms": v["telemetry_default_interval_ms"]}]
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: telemetry.subscriptions: must be an array of tables "
                          "([[telemetry.subscriptions]])")
    try:
        subs = parse_subscriptions(entries)
    except PolicyError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    settings = TelemetrySettings(
        subscriptions=subs, max_bytes=v["telemetry_max_bytes"],
        max_decompressed_bytes=v["telemetry_max_decompressed_bytes"],
        delta_temporality=v["telemetry_delta_temporality"],
        compression_types=v["telemetry_compression_types"],
        max_instances=v["telemetry_max_instances"])
    return TelemetryConfig(v["telemetry"], settings, v["telemetry_metric_prefix"],
                           v["telemetry_max_series"])


def _derive(v: dict[str, Any], path: str | None, extra: dict[str, Any]) -> Config:
    listen_host, listen_port = v["listen"]
    advertised = v["advertised_host"]
    if not advertised:
        advertised = socket.getfqdn() if listen_host in ("0.0.0.0", "::", "") else listen_host
    base = v["broker_port_base"] or listen_port + 1
    bind_base = v["broker_bind_port_base"] or base
    cfg = Config(
        upstream=v["upstream"], listen=v["listen"], advertised_host=advertised,
        broker_port_base=base, broker_bind_host=v["broker_bind_host"] or listen_host,
        broker_bind_port_base=bind_base, node_id_range=v["node_id_range"], http=v["http"],
        reuse_port=v["reuse_port"], log_format=v["log_format"], log_level=v["log_level"],
        max_frame_bytes=v["max_frame_bytes"], max_inflight=v["max_inflight"],
        connect_timeout=v["connect_timeout"], write_timeout=v["write_timeout"],
        discovery_interval=v["discovery_interval"],
        config_watch_interval=v["config_watch_interval"], archive=v["archive"] or None,
        archive_max_file_bytes=v["archive_max_file_bytes"],
        archive_max_file_seconds=v["archive_max_file_seconds"],
        archive_max_total_bytes=v["archive_max_total_bytes"],
        archive_queue_records=v["archive_queue_records"], legacy_clients=v["legacy_clients"],
        admin=v["admin"], drain_timeout=v["drain_timeout"],
        telemetry=_telemetry_config(v, extra, path), source=path, extra=extra,
        **{o.name: v[o.name] for o in LIMIT_OPTIONS + SECURITY_OPTIONS},
    )
    _check_security(cfg)
    try:
        pm = cfg.port_map
    except ValueError as exc:
        raise ConfigError(f"broker_port_base/node_id_range: {exc}") from None
    first_port = pm.bind_port_base
    last_port = pm.bind_port_base + pm.last_node_id - pm.first_node_id
    for name, (host, port) in (("listen", cfg.listen), ("http", cfg.http)):
        if first_port <= port <= last_port and host in (cfg.broker_bind_host, "0.0.0.0"):
            raise ConfigError(f"{name}: port {port} falls inside the broker port range "
                              f"{first_port}-{last_port}")
    return cfg


def _check_security(cfg: Config) -> None:
    """Options that only make sense together; the files themselves are read at start."""
    pairs = (("tls_cert", "tls_key"), ("upstream_tls_cert", "upstream_tls_key"))
    for cert, key in pairs:
        if bool(getattr(cfg, cert)) != bool(getattr(cfg, key)):
            raise ConfigError(f"{cert} and {key}: set both or neither")
    if cfg.tls_client_auth != "none" and not (cfg.tls_cert and cfg.tls_client_ca):
        raise ConfigError("tls_client_auth: needs tls_cert and tls_client_ca")
    if cfg.upstream_tls_ca and not cfg.upstream_tls:
        raise ConfigError("upstream_tls_ca: set upstream_tls = on as well")
    if cfg.sni_host_pattern:
        if not cfg.tls_cert:
            raise ConfigError("sni_host_pattern: SNI routing needs TLS (tls_cert, tls_key)")
        try:
            SniNames(cfg.sni_host_pattern, 1)
        except ValueError as exc:
            raise ConfigError(f"sni_host_pattern: {exc}") from None
