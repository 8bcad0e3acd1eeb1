"""The relay's options, and what every option is: name, parser, default, help, restart.
Telemetry's are in ``telemetry_options``, identity's in ``identity``.

From each ``Option`` come its flag (``--broker-port-base``), its TOML key
(``broker_port_base``, or a key in a table), its environment variable
(``KPROXY_BROKER_PORT_BASE``) and whether a reload can apply it; ``kproxy.config.settings``
turns the merged values into a ``Config``.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kproxy.codecs.framing import DEFAULT_MAX_FRAME_BYTES
from kproxy.policies.telemetry.subscriptions import COMPRESSION_NAMES


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


def parse_non_negative_int(text: str | int) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be 0 or more, got {text!r}")
    return value


def parse_workers(text: str | int) -> int:
    """A worker count, or ``auto`` (0): as many as the CPUs the process may use."""
    if str(text).strip().lower() == "auto":
        return 0
    return parse_positive_int(text)


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


def parse_url(text: str) -> str:
    parts = urllib.parse.urlsplit(str(text).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    parts.port  # noqa: B018 -- raises ValueError on a bad port
    return str(text).strip()


def parse_headers(text: str | dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """NAME=VALUE,... (values URL-decoded, as OTEL_EXPORTER_OTLP_HEADERS) or a TOML table."""
    if isinstance(text, dict):
        pairs = [(str(k), str(v)) for k, v in text.items()]
    else:
        pairs = []
        for item in (i for i in str(text).split(",") if i.strip()):
            name, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"expected NAME=VALUE, got {item.strip()!r}")
            pairs.append((name.strip(), urllib.parse.unquote(value.strip())))
    for name, value in pairs:
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name) or re.search(r"[\r\n\0]",
                                                                                 value):
            raise ValueError(f"not a valid HTTP header: {name!r}")
    return tuple(pairs)


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
    restart: bool = False  # a reload logs a change to it; it applies at the next start

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
           "bootstrap listener that clients are given as bootstrap.servers",
           "HOST:PORT", restart=True),
    Option("advertised_host", str, None,
           "host written into rewritten responses (default: the listen host, or this "
           "machine's name when listening on a wildcard address)", "HOST", restart=True),
    Option("broker_port_base", parse_positive_int, None,
           "advertised port of the first broker in --node-id-range (default: listen port "
           "+ 1); broker N gets base + N - FIRST", "PORT", restart=True),
    Option("broker_bind_host", str, None,
           "address the per-broker listeners bind (default: the listen host)",
           "HOST", restart=True),
    Option("broker_bind_port_base", parse_positive_int, None,
           "port the first broker's listener binds, when it differs from the advertised "
           "base (NodePort, port-forward); default: --broker-port-base", "PORT", restart=True),
    Option("node_id_range", parse_range, "0-1023",
           "backend node ids this proxy maps to ports; nodes outside are left out of "
           "responses and counted", "FIRST-LAST", restart=True),
    Option("http", parse_host_port, "127.0.0.1:9080",
           "HTTP endpoint for the status page (/), /status.json, /healthz, /readyz and "
           "/metrics", "HOST:PORT", restart=True),
    Option("reuse_port", parse_bool, False,
           "open the bootstrap and broker listeners with SO_REUSEPORT, so several kproxy "
           "processes on one host share the ports and the kernel spreads connections "
           "over them (one process per core); each needs its own --http port",
           "on|off", restart=True),
    Option("workers", parse_workers, "auto",
           "proxy processes sharing the ports (SO_REUSEPORT) under one supervisor that "
           "restarts them and serves one combined /metrics; auto: one per CPU this process "
           "may use (its affinity, capped by a cgroup CPU limit)", "N|auto", restart=True),
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
    Option("splice_from", parse_non_negative_int, 64 * 1024,
           "frames at least this large (bytes) whose body nobody needs are relayed socket to "
           "socket with splice (Linux, plain TCP), never copied into the proxy; 0: off",
           "BYTES"),
    Option("express_lane", parse_bool, True,
           "relay the small frames of busy plain-TCP connections from one thread per "
           "worker, off the event loop's scheduling (less CPU per small request); off: "
           "every frame through the event loop", "on|off", restart=True),
    Option("huge_pages", parse_bool, True,
           "once started, rebuild each mostly used 2 MB stretch of the heap as one huge "
           "page (Linux 6.1+, MADV_COLLAPSE; less CPU where page walks are dear); off: "
           "ordinary pages", "on|off", restart=True),
    Option("gc_sweep_interval", parse_non_negative_seconds, 600.0,
           "how often a worker's garbage collector walks its whole heap; between such "
           "walks a full collection walks only what was made since the last one (the "
           "rest is frozen, still freed as soon as nothing refers to it); 0: every full "
           "collection walks everything", "SECONDS", restart=True),
    Option("connect_timeout", parse_seconds, 10.0, "upstream connect timeout", "SECONDS"),
    Option("upstream_dns_ttl", parse_non_negative_seconds, 30.0,
           "how long the addresses an upstream name (bootstrap server or broker host) "
           "resolved to are used for new connections; a kept address that fails is "
           "dropped at once; 0: resolve at every connection", "SECONDS"),
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
    Option("max_fetch_version", parse_positive_int, None,
           "advertise Fetch no higher than this; 15 keeps broker addresses out of every "
           "fetch response (v16+ ones may carry them; large ones are streamed and "
           "rewritten on the way), at the cost of KIP-951's leader hints", "VERSION",
           restart=True),
    Option("max_buffered_bytes", parse_positive_int, 256 * 1024 * 1024,
           "bytes the proxy holds for all connections together (frames received and not "
           "yet written, both ways); when reached it stops reading until writes free room "
           "(backpressure, never an error); see docs/security.md for sizing", "BYTES"),
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
           "PATTERN", restart=True),
    Option("sni_advertised_port", parse_positive_int, None,
           "with --sni-host-pattern, the port written into rewritten responses (default: "
           "the listen port)", "PORT", restart=True),
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

# Consumer-group observability (kproxy.metrics.groups): read from the traffic, never changed.
GROUP_OPTIONS: tuple[Option, ...] = (
    Option("group_tracking", parse_bool, True,
           "watch consumer groups in the traffic relayed (JoinGroup/SyncGroup/Heartbeat/"
           "LeaveGroup/OffsetCommit/ConsumerGroupHeartbeat, Fetch high watermarks) and export "
           "kproxy_group_* series; frames are relayed unchanged either way", "on|off",
           restart=True),
    Option("group_max_groups", parse_positive_int, 1_000,
           "consumer groups tracked at once; the least recently seen is forgotten", "N",
           restart=True),
    Option("group_max_members", parse_positive_int, 1_000,
           "members tracked per group (each may export an assigned-partitions series)", "N",
           restart=True),
)
OPTIONS = OPTIONS + LIMIT_OPTIONS + SECURITY_OPTIONS + GROUP_OPTIONS
