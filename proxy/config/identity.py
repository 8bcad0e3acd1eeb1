"""The identity options: SASL at the proxy, the audit log, the HTTP port's token.

Declared apart from ``options`` (which holds the relay's) and merged into the one
option table by ``settings``. The users file and the admin token file are read when
the configuration is (start and reload), so a bad one stops start-up, or a reload
keeps the running configuration, with one line naming it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any

from kproxy.config.options import (
    ConfigError,
    HostPort,
    Option,
    parse_bool,
    parse_choice,
    parse_non_negative_seconds,
    parse_positive_int,
    parse_seconds,
    parse_url,
)
from kproxy.policies.auth.quotas import QuotaEntry, QuotaError, parse_quotas
from kproxy.policies.auth.sasl import MECHANISMS, OAUTHBEARER
from kproxy.policies.auth.upstream import UpstreamCredentials
from kproxy.policies.auth.users import UsersError, UserStore, parse_users

MAX_TOKEN_FILE_BYTES = 4096
MIN_ADMIN_TOKEN_CHARS = 16


def parse_mechanisms(text: str | list[str]) -> tuple[str, ...]:
    names = text if isinstance(text, list) else str(text).split(",")
    out = tuple(str(n).strip().upper() for n in names if str(n).strip())
    for name in out:
        if name not in MECHANISMS:
            raise ValueError(f"unknown SASL mechanism {name!r} ({', '.join(MECHANISMS)})")
    if not out:
        raise ValueError("at least one mechanism is needed")
    return out


def _sasl(name: str, parse: Any, default: Any, help_: str, metavar: str = "",
          restart: bool = False) -> Option:
    return Option(name, parse, default, help_, metavar, ("sasl", name.removeprefix("sasl_")),
                  restart)


IDENTITY_OPTIONS: tuple[Option, ...] = (
    _sasl("sasl_terminate", parse_bool, False,
          "log clients in at the proxy (SaslHandshake/SaslAuthenticate answered here) "
          "instead of passing SASL through to the brokers", "on|off", restart=True),
    _sasl("sasl_mechanisms", parse_mechanisms, "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
          "mechanisms offered when terminating SASL", "LIST"),
    _sasl("sasl_users_file", str, None,
          "TOML file of [users.NAME] (password, or stored SCRAM credentials) for PLAIN and "
          "SCRAM; read again at each reload (SIGHUP)", "FILE"),
    _sasl("sasl_failed_login_delay", parse_non_negative_seconds, 1.0,
          "a failed login is answered after this delay, then the connection is closed",
          "SECONDS"),
    _sasl("sasl_session_lifetime", parse_non_negative_seconds, 0.0,
          "PLAIN/SCRAM session lifetime told to clients (KIP-368); a client must log in "
          "again on its connection before it ends; 0: no limit", "SECONDS"),
    Option("sasl_oauthbearer_jwks_url", parse_url, None,
           "OAUTHBEARER: the issuer's JWKS (RS256/ES256 keys), fetched at start, refreshed, "
           "and again when a token names an unknown key", "URL",
           ("sasl", "oauthbearer", "jwks_url"), restart=True),
    Option("sasl_oauthbearer_issuer", str, None,
           "OAUTHBEARER: the iss a token must carry", "ISSUER", ("sasl", "oauthbearer", "issuer")),
    Option("sasl_oauthbearer_audience", str, None,
           "OAUTHBEARER: the aud a token must carry", "AUDIENCE",
           ("sasl", "oauthbearer", "audience")),
    Option("sasl_oauthbearer_principal_claim", str, "sub",
           "OAUTHBEARER: the claim that names the principal", "CLAIM",
           ("sasl", "oauthbearer", "principal_claim")),
    Option("sasl_oauthbearer_jwks_refresh", parse_seconds, 300.0,
           "OAUTHBEARER: how often the JWKS is fetched again (also the longest backoff)",
           "SECONDS", ("sasl", "oauthbearer", "jwks_refresh"), restart=True),
    Option("sasl_oauthbearer_clock_skew", parse_non_negative_seconds, 30.0,
           "OAUTHBEARER: leeway on exp and nbf", "SECONDS",
           ("sasl", "oauthbearer", "clock_skew")),
    Option("sasl_upstream_mechanism", parse_choice("none", "PLAIN", "SCRAM-SHA-256",
                                                   "SCRAM-SHA-512"), "none",
           "with sasl.terminate: how the proxy itself logs in to the brokers (none: no "
           "authentication)", "none|PLAIN|SCRAM-SHA-256|SCRAM-SHA-512",
           ("sasl", "upstream", "mechanism")),
    Option("sasl_upstream_username", str, None, "the proxy's user name at the brokers",
           "NAME", ("sasl", "upstream", "username")),
    Option("sasl_upstream_password", str, None,
           "the proxy's password at the brokers (prefer the environment variable or "
           "password_file to the config file)", "PASSWORD", ("sasl", "upstream", "password")),
    Option("sasl_upstream_password_file", str, None,
           "file holding the proxy's password at the brokers (read at start and reload)",
           "FILE", ("sasl", "upstream", "password_file")),
    Option("tls_principal", parse_choice("dn", "cn"), "dn",
           "a verified client certificate's principal: its subject DN as Kafka names it "
           "(CN=app,OU=team,O=corp), or only its CN", "dn|cn"),
    Option("audit_log", str, None,
           "append a JSON line per login (ok or failed), denied request, config reload and "
           "admin call to FILE; never a secret", "FILE"),
    Option("audit_log_max_bytes", parse_positive_int, 10 * 1024 * 1024,
           "the audit file is rotated when it reaches this size", "BYTES"),
    Option("audit_log_backups", parse_positive_int, 5,
           "rotated audit files kept (FILE.1 ... FILE.N); older ones are deleted", "N"),
    Option("admin_token_file", str, None,
           "file holding the bearer token that /admin/* (and, with status_auth, the status "
           "page) require; needed for --admin on when the HTTP port is not on loopback; "
           "the path is read at start, the token again whenever the file changes (a "
           "rotation needs no restart)", "FILE", restart=True),
    Option("status_auth", parse_bool, False,
           "the status page, /status.json and /internal/* require the admin token too "
           "(/metrics, /healthz and /readyz stay open)", "on|off", restart=True),
    Option("quota_window_samples", parse_positive_int, 11,
           "[[quotas]]: a principal's rate is measured over this many samples (as Kafka's "
           "quota.window.num); the longest throttle is samples x seconds", "N"),
    Option("quota_window_seconds", parse_seconds, 1.0,
           "[[quotas]]: the length of one sample (as Kafka's quota.window.size.seconds)",
           "SECONDS"),
)


@dataclass(frozen=True)
class Identity:
    """What the identity options make, read from their files."""

    users: UserStore | None = None
    admin_token: str | None = None
    upstream_login: UpstreamCredentials | None = None


def read_identity(v: dict[str, Any], http: HostPort, admin: bool) -> Identity:
    """The users and the admin token; ``ConfigError`` for a bad or missing one."""
    users = None
    if v["sasl_users_file"]:
        users = _read_users(v["sasl_users_file"])
    if v["sasl_terminate"]:
        needs_users = set(v["sasl_mechanisms"]) - {OAUTHBEARER}
        if needs_users and users is None:
            raise ConfigError(f"sasl.users_file: needed for {', '.join(sorted(needs_users))}")
        if OAUTHBEARER in v["sasl_mechanisms"]:
            for key in ("jwks_url", "issuer", "audience"):
                if not v[f"sasl_oauthbearer_{key}"]:
                    raise ConfigError(f"sasl.oauthbearer.{key}: needed for OAUTHBEARER")
    token = read_token(v["admin_token_file"]) if v["admin_token_file"] else None
    login = _upstream_login(v)
    if admin and token is None and not _loopback(http[0]):
        raise ConfigError("admin: --admin on with the HTTP port on "
                          f"{http[0]} (beyond loopback) needs admin_token_file")
    if v["status_auth"] and token is None:
        raise ConfigError("status_auth: needs admin_token_file")
    return Identity(users, token, login)


def read_quotas(extra: dict[str, Any], path: str | None) -> tuple[QuotaEntry, ...]:
    """The ``[[quotas]]`` tables; ``ConfigError`` names the first bad key."""
    if "quotas" not in extra:
        return ()
    try:
        return parse_quotas(extra["quotas"])
    except QuotaError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None


def _upstream_login(v: dict[str, Any]) -> UpstreamCredentials | None:
    mechanism = v["sasl_upstream_mechanism"]
    if mechanism == "none":
        return None
    if not v["sasl_terminate"]:
        raise ConfigError("sasl.upstream.mechanism: the proxy logs in as itself only when "
                          "it terminates the clients' SASL (sasl.terminate = true); without "
                          "it, the clients' own SASL passes through")
    if not v["sasl_upstream_username"]:
        raise ConfigError(f"sasl.upstream.username: needed for {mechanism}")
    password = v["sasl_upstream_password"]
    if v["sasl_upstream_password_file"]:
        path = v["sasl_upstream_password_file"]
        try:
            with open(path, "rb") as fh:
                password = fh.read(MAX_TOKEN_FILE_BYTES).decode().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"sasl.upstream.password_file {path}: {exc}") from None
    if not password:
        raise ConfigError(f"sasl.upstream.password: needed for {mechanism} (or password_file)")
    return UpstreamCredentials(mechanism, v["sasl_upstream_username"], password)


def _read_users(path: str) -> UserStore:
    try:
        with open(path, "rb") as fh:
            data = fh.read(2 * 1024 * 1024)
    except OSError as exc:
        raise ConfigError(f"sasl.users_file {path}: {exc.strerror or exc}") from None
    try:
        return parse_users(data, path)
    except UsersError as exc:
        raise ConfigError(f"sasl.users_file: {exc}") from None


def read_token(path: str) -> str:
    """The token in ``path``; ``ConfigError`` for a file that cannot serve as one."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"admin_token_file {path}: {exc.strerror or exc}") from None
    token = raw.decode("ascii", "replace").strip()
    if len(raw) > MAX_TOKEN_FILE_BYTES or len(token) < MIN_ADMIN_TOKEN_CHARS or any(
            c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"admin_token_file {path}: one line of {MIN_ADMIN_TOKEN_CHARS} to "
                          f"{MAX_TOKEN_FILE_BYTES} printable characters, no spaces, is needed")
    if os.stat(path).st_mode & 0o004:
        raise ConfigError(f"admin_token_file {path}: readable by every user; chmod o-r it")
    return token


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
