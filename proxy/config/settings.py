"""Configuration: one table of options, read from a TOML file, KPROXY_* variables and flags.

Precedence is flags > environment > file > defaults. Every option has a flag
(``--broker-port-base``), a file key (``broker_port_base``) and an environment
variable (``KPROXY_BROKER_PORT_BASE``), all derived from its name here, so they
cannot drift apart. Any bad value raises ``ConfigError`` naming the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.config.filters import TOP_LEVEL_KEYS, FilterSettings, filter_settings
from kproxy.config.identity import IDENTITY_OPTIONS, Identity, read_identity, read_quotas
from kproxy.config.options import (
    OPTIONS as RELAY_OPTIONS,
)
from kproxy.config.options import (
    ConfigError,
    HostPort,
    Option,
    parse_host_port,
)
from kproxy.config.telemetry_options import OTLP_OPTIONS, TELEMETRY_OPTIONS
from kproxy.config.virtual_clusters import VirtualClusterSettings, virtual_clusters
from kproxy.policies.addressing import PortMap, SniNames
from kproxy.policies.auth.quotas import QuotaEntry
from kproxy.policies.telemetry.subscriptions import (
    ALL_METRICS,
    PolicyError,
    TelemetrySettings,
    parse_subscriptions,
)

OPTIONS = RELAY_OPTIONS + TELEMETRY_OPTIONS + OTLP_OPTIONS + IDENTITY_OPTIONS
OPTIONS_BY_NAME = {o.name: o for o in OPTIONS}
# What a reload cannot change on a running proxy (listeners, ports, what is served).
RESTART_ONLY = tuple(o.name for o in OPTIONS if o.restart)

__all__ = ["OPTIONS", "OPTIONS_BY_NAME", "RESTART_ONLY", "Config", "ConfigError", "HostPort",
           "Option", "TelemetryConfig", "add_arguments", "load", "load_or_explain",
           "option_value", "parse_host_port"]


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: bool
    settings: TelemetrySettings
    metric_prefix: str
    max_series: int
    prometheus: bool = True
    max_series_bytes: int = 32 * 1024 * 1024


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
    upstream_dns_ttl: float
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
    max_buffered_bytes: int = 256 * 1024 * 1024
    workers: int = 0  # 0: one per usable CPU
    max_fetch_version: int | None = None
    splice_from: int = 64 * 1024
    express_lane: bool = True
    huge_pages: bool = True
    gc_sweep_interval: float = 600.0
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
    telemetry_otlp_endpoint: str | None = None
    telemetry_otlp_headers: tuple[tuple[str, str], ...] | None = None
    telemetry_otlp_timeout: float = 10.0
    telemetry_otlp_compression: str = "gzip"
    telemetry_otlp_tls_ca: str | None = None
    telemetry_otlp_tls_cert: str | None = None
    telemetry_otlp_tls_key: str | None = None
    telemetry_otlp_max_batch_bytes: int = 1024 * 1024
    telemetry_otlp_max_batch_age: float = 2.0
    telemetry_otlp_max_queue_bytes: int = 16 * 1024 * 1024
    telemetry_otlp_max_retry_time: float = 60.0
    group_tracking: bool = True
    group_max_groups: int = 1_000
    group_max_members: int = 1_000
    filters: FilterSettings = field(default_factory=FilterSettings)
    virtual_clusters: tuple[VirtualClusterSettings, ...] = ()
    sasl_terminate: bool = False
    sasl_mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    sasl_users_file: str | None = None
    sasl_failed_login_delay: float = 1.0
    sasl_session_lifetime: float = 0.0
    sasl_oauthbearer_jwks_url: str | None = None
    sasl_oauthbearer_issuer: str | None = None
    sasl_oauthbearer_audience: str | None = None
    sasl_oauthbearer_principal_claim: str = "sub"
    sasl_oauthbearer_jwks_refresh: float = 300.0
    sasl_oauthbearer_clock_skew: float = 30.0
    sasl_upstream_mechanism: str = "none"
    sasl_upstream_username: str | None = None
    sasl_upstream_password: str | None = field(default=None, repr=False)
    sasl_upstream_password_file: str | None = None
    tls_principal: str = "dn"
    audit_log: str | None = None
    audit_log_max_bytes: int = 10 * 1024 * 1024
    audit_log_backups: int = 5
    admin_token_file: str | None = None
    status_auth: bool = False
    quota_window_samples: int = 11
    quota_window_seconds: float = 1.0
    quotas: tuple[QuotaEntry, ...] = ()  # the [[quotas]] tables
    identity: Identity = field(default_factory=Identity)  # the users and token, as read
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
        if key in TOP_LEVEL_KEYS or key == "quotas":  # [[filters]], [[acls]], [[quotas]]...
            tables[key] = value
        elif isinstance(value, dict):
            tables[key] = value
            _read_table(path, (key,), value, known, values)
        elif (key,) in known:
            values[(key,)] = value
        else:
            raise ConfigError(f"{path}: {key}: unknown key")
    return values, tables


def _read_table(path: str, at: tuple[str, ...], table: dict[str, Any],
                known: set[tuple[str, ...]], values: dict[tuple[str, ...], Any]) -> None:
    """Option values of a table, and of the tables inside it (e.g. [telemetry.otlp])."""
    for sub, subvalue in table.items():
        key = (*at, sub)
        if key in known:
            values[key] = subvalue
        elif isinstance(subvalue, dict) and any(k[:len(key)] == key for k in known):
            _read_table(path, key, subvalue, known, values)
        elif key not in KNOWN_TABLE_ENTRIES:
            raise ConfigError(f"{path}: {'.'.join(key)}: unknown key")


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
        max_instances=v["telemetry_max_instances"],
        max_instance_bytes=v["telemetry_max_instance_bytes"],
        refused_push_hold_ms=v["telemetry_refused_push_hold_ms"])
    return TelemetryConfig(v["telemetry"], settings, v["telemetry_metric_prefix"],
                           v["telemetry_max_series"], v["telemetry_prometheus"],
                           v["telemetry_max_series_bytes"])


def _derive(v: dict[str, Any], path: str | None, extra: dict[str, Any]) -> Config:
    listen_host, listen_port = v["listen"]
    advertised = v["advertised_host"]
    if not advertised:
        advertised = socket.getfqdn() if listen_host in ("0.0.0.0", "::", "") else listen_host
    base = v["broker_port_base"] or listen_port + 1
    bind_base = v["broker_bind_port_base"] or base
    # Every option that is a field of its own comes straight from the table; the
    # telemetry_* options make up the telemetry field. Only derived defaults are named.
    fields = {f.name for f in dataclasses.fields(Config)}
    cfg = Config(**{o.name: v[o.name] for o in OPTIONS if o.name in fields} | {
        "advertised_host": advertised, "broker_port_base": base,
        "broker_bind_host": v["broker_bind_host"] or listen_host,
        "broker_bind_port_base": bind_base, "archive": v["archive"] or None,
        "telemetry": _telemetry_config(v, extra, path), "source": path, "extra": extra,
        "filters": filter_settings(extra, path), "quotas": read_quotas(extra, path),
        "identity": read_identity(v, v["http"], v["admin"])})
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
    vcs = virtual_clusters(extra, path, set(cfg.filters.defined), cfg.listen, cfg.http,
                           range(first_port, last_port + 1), cfg.advertised_host,
                           cfg.node_id_range, pm.sni is not None)
    return dataclasses.replace(cfg, virtual_clusters=vcs) if vcs else cfg


def _check_security(cfg: Config) -> None:
    """Options that only make sense together; the files themselves are read at start."""
    pairs = (("tls_cert", "tls_key"), ("upstream_tls_cert", "upstream_tls_key"),
             ("telemetry_otlp_tls_cert", "telemetry_otlp_tls_key"))
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


def option_value(cfg: Config, name: str) -> Any:
    """The running value of option ``name`` (telemetry's switch sits in its table)."""
    return cfg.telemetry.enabled if name == "telemetry" else getattr(cfg, name)
