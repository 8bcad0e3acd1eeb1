"""``[[virtual_clusters]]``: several client-facing clusters on one backend.

Each table names a cluster clients see: its own bootstrap listener (``listen``), its own
broker ports (``broker_port_base`` + node id - first node id, like the main ones), a
``prefix`` every topic, group and transactional id of it gets on the backend, and the
``filters`` (names from ``[[filters]]``) it runs before the translation. Checked when
the configuration is read: a bad table stops start-up (exit status 2) or a reload
(the running config kept) with one line naming the key.

Listeners, ports and prefixes are read at start only: a reload that changes them is
rejected whole (``reload_change``), since moving a tenant's prefix under its open
connections would hand it another tenant's names. Their filter lists do reload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kproxy.config.options import ConfigError, parse_host_port
from kproxy.policies.addressing import PortMap

HostPort = tuple[str, int]
KEYS = frozenset({"name", "listen", "broker_port_base", "advertised_host",
                  "advertised_port_base", "prefix", "filters"})
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
MAX_CLUSTERS = 64  # each has its own listeners and metric series


@dataclass(frozen=True)
class VirtualClusterSettings:
    name: str
    prefix: str
    listen: HostPort
    broker_bind_port_base: int
    advertised_host: str
    advertised_port_base: int
    filters: tuple[str, ...] = ()

    def port_map(self, node_id_range: tuple[int, int]) -> PortMap:
        return PortMap(self.advertised_host, self.advertised_port_base,
                       self.broker_bind_port_base, *node_id_range)

    def listeners_key(self) -> tuple[object, ...]:
        """What only a restart may change."""
        return (self.name, self.prefix, self.listen, self.broker_bind_port_base,
                self.advertised_host, self.advertised_port_base)


def virtual_clusters(extra: dict[str, Any], path: str | None, defined: set[str],
                     main_listen: HostPort, main_http: HostPort, main_broker_ports: range,
                     advertised_host: str, node_id_range: tuple[int, int],
                     sni: bool) -> tuple[VirtualClusterSettings, ...]:
    """Read and check the ``[[virtual_clusters]]`` tables of a configuration file."""
    where = f"{path}: " if path else ""
    tables = extra.get("virtual_clusters", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}virtual_clusters: must be an array of tables "
                          "([[virtual_clusters]])")
    if len(tables) > MAX_CLUSTERS:
        raise ConfigError(f"{where}virtual_clusters: at most {MAX_CLUSTERS}")
    if tables and sni:
        raise ConfigError(f"{where}virtual_clusters: not available with SNI routing "
                          "(sni_host_pattern); each virtual cluster needs its own ports")
    span = node_id_range[1] - node_id_range[0]
    taken: list[tuple[str, range]] = [("listen", range(main_listen[1], main_listen[1] + 1)),
                                      ("http", range(main_http[1], main_http[1] + 1)),
                                      ("broker_port_base", main_broker_ports)]
    out: list[VirtualClusterSettings] = []
    for i, table in enumerate(tables):
        vc = _one(table, i, where, defined, advertised_host, span)
        at = f"{where}virtual_clusters.{vc.name}"
        if any(o.name == vc.name for o in out):
            raise ConfigError(f"{at}.name: defined twice")
        for other in out:
            if vc.prefix.startswith(other.prefix) or other.prefix.startswith(vc.prefix):
                raise ConfigError(f"{at}.prefix: {vc.prefix!r} and {other.name}'s "
                                  f"{other.prefix!r}: neither may begin with the other, or "
                                  "one tenant would see the other's names")
        own = [("listen", range(vc.listen[1], vc.listen[1] + 1)),
               ("broker_port_base", range(vc.broker_bind_port_base,
                                          vc.broker_bind_port_base + span + 1))]
        for key, ports in own:
            for owner, used in taken:
                if ports.start < used.stop and used.start < ports.stop and used.start:
                    raise ConfigError(f"{at}.{key}: ports {ports.start}-{ports.stop - 1} "
                                      f"overlap {owner} ({used.start}-{used.stop - 1})")
        taken += [(f"virtual_clusters.{vc.name}.{key}", ports) for key, ports in own]
        out.append(vc)
    return tuple(out)


def _one(table: dict[str, Any], i: int, where: str, defined: set[str],
         advertised_host: str, span: int) -> VirtualClusterSettings:
    name = table.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}virtual_clusters[{i}].name: every virtual cluster needs a "
                          "name of letters, digits, '.', '_' or '-' (at most 63)")
    at = f"{where}virtual_clusters.{name}"
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"{at}.{unknown[0]}: unknown key (known: {', '.join(sorted(KEYS))})")
    prefix = table.get("prefix")
    if not isinstance(prefix, str) or not prefix or len(prefix) > 100:
        raise ConfigError(f"{at}.prefix: a non-empty string (at most 100 characters) is "
                          "needed, e.g. \"tenant-a.\"")
    listen = table.get("listen")
    if not isinstance(listen, str):
        raise ConfigError(f"{at}.listen: a \"host:port\" string is needed")
    try:
        listen_hp = parse_host_port(listen)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{at}.listen: {exc}") from None
    if listen_hp[1] == 0:
        raise ConfigError(f"{at}.listen: a port is needed (a port the OS picks would differ "
                          "between workers and replicas)")
    base = _port(table, "broker_port_base", at, required=True)
    advertised_base = _port(table, "advertised_port_base", at, required=False) or base
    for key, value in (("broker_port_base", base), ("advertised_port_base", advertised_base)):
        if value + span > 65535:
            raise ConfigError(f"{at}.{key}: ports {value}-{value + span} do not fit in 1-65535")
    host = table.get("advertised_host", advertised_host)
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{at}.advertised_host: a host name is needed")
    filters = table.get("filters", [])
    if not isinstance(filters, list) or not all(isinstance(n, str) for n in filters):
        raise ConfigError(f"{at}.filters: must be a list of filter names")
    for n in filters:
        if n not in defined:
            raise ConfigError(f"{at}.filters: no filter named {n!r} ([[filters]] name)")
    if len(set(filters)) != len(filters):
        raise ConfigError(f"{at}.filters: a filter is listed twice")
    return VirtualClusterSettings(name, prefix, listen_hp, base, host, advertised_base,
                                  tuple(filters))


def _port(table: dict[str, Any], key: str, at: str, required: bool) -> int:
    value = table.get(key)
    if value is None and not required:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ConfigError(f"{at}.{key}: a port number (1-65535) is needed")
    return value


def reload_change(old: tuple[VirtualClusterSettings, ...],
                  new: tuple[VirtualClusterSettings, ...]) -> str | None:
    """Why a reload cannot apply these virtual clusters (None: it can)."""
    if [vc.listeners_key() for vc in old] != [vc.listeners_key() for vc in new]:
        return ("virtual_clusters: names, prefixes, listeners and ports change only at a "
                "restart; reload rejected, the running config kept (filter lists reload)")
    return None
