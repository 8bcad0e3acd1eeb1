"""The users file: who may log in with PLAIN or SCRAM, parsed without I/O.

TOML, one ``[users.NAME]`` table per user, holding either a ``password`` or, per SCRAM
mechanism, stored credentials (``[users.NAME.scram_sha_256]`` with ``salt``,
``iterations``, ``stored_key``, ``server_key``; base64 as Kafka's ``kafka-configs``
prints them). Stored credentials keep passwords off the proxy's disk; PLAIN then
checks a password by deriving its key with the stored salt. SCRAM credentials for a
``password`` user are derived once and kept: by ``derive_password_keys`` before the
store serves a login (the proxy runs it in a thread), else at first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import scramp

MAX_USERS_FILE_BYTES = 1024 * 1024  # a users file larger than this is refused
MAX_NAME_BYTES = 256
MAX_PASSWORD_BYTES = 1024
SCRAM_MECHANISMS = {"SCRAM-SHA-256": "scram_sha_256", "SCRAM-SHA-512": "scram_sha_512"}
MIN_ITERATIONS = 4096  # Kafka's minimum, and scramp's
# The most SCRAM iterations the proxy derives a key with, its users' or a broker's: a
# derivation costs about 0.6 us per iteration (SHA-512), so this bounds one at 0.6 s.
MAX_ITERATIONS = 1_000_000


class UsersError(ValueError):
    """A bad users file; the message names the user and key."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


@dataclass(slots=True)
class User:
    name: str
    password: str | None = None
    scram: dict[str, ScramCredential] = field(default_factory=dict)  # by mechanism name


class UserStore:
    """Users by name. Lookups never say whether a name exists to a client; the
    mechanisms fail the same way for an unknown name and a wrong password."""

    def __init__(self, users: dict[str, User]) -> None:
        self.users = users
        self._decoy_key = _decoy_key(users)
        self._plain_decoy = _usual_stored_key(users)
        self._scram_shapes = {m: _usual_shape(users, m) for m in SCRAM_MECHANISMS}
        # Password users beside users with stored keys only: each PLAIN login derives.
        self.mixed = self._plain_decoy is not None and any(
            user.password is not None for user in users.values())

    def __len__(self) -> int:
        return len(self.users)

    def check_password(self, name: str, password: str) -> bool | Callable[[], bool]:
        """PLAIN: the password against the stored one (the answer), or against the
        stored SCRAM key: then the check to run, which derives the key from the
        password (PBKDF2 over the stored iterations: for the caller to run off its
        event loop). When some users have only stored keys, every check derives (an
        unknown name's and a password user's over a decoy), so that none is answered
        sooner than theirs."""
        user = self.users.get(name)
        if user is not None and user.password is None:
            for mechanism, cred in user.scram.items():
                return partial(_derives_stored_key, mechanism, cred, password)
        holds = user is not None and user.password is not None and hmac.compare_digest(
            user.password.encode(), password.encode())
        if self._plain_decoy is None:
            return holds
        # An unknown name or a password user beside stored-key users: the answer waits
        # for a derivation too, else a quick one tells the kinds apart.
        mechanism, shape = self._plain_decoy
        return partial(_derives_then, mechanism, self.decoy(name, mechanism, shape),
                       password, holds)

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential:
        """The user's credential for ``mechanism``, derived from a password once; for
        an unknown name, or a user with keys for the other mechanism only, a decoy
        nobody can match (see ``decoy``)."""
        user = self.users.get(name)
        cred = None if user is None else user.scram.get(mechanism)
        if cred is None and user is not None and user.password is not None:
            cred = self._derive(user, mechanism)
        if cred is None:
            return self.decoy(name, mechanism, self._scram_shapes[mechanism])
        return cred

    def derive_password_keys(self, mechanisms: Iterable[str],
                             previous: UserStore | None = None) -> int:
        """Derive every ``password`` user's credentials for ``mechanisms`` now (each a
        PBKDF2 of 1 to 3 ms), so that no SCRAM login derives: a first login that took
        a derivation longer than an unknown name's would tell the name is a user's.
        Keys ``previous`` (the store this one replaces) derived are taken as they are
        when they would come out the same: the same users' secrets (so the same salts)
        and the same password. Returns how many it derived. Safe in a thread before
        the store serves logins."""
        kept = (previous.users if previous is not None
                and hmac.compare_digest(previous._decoy_key, self._decoy_key) else {})
        derived = 0
        for mechanism in mechanisms:
            for user in self.users.values():
                if user.password is None or mechanism in user.scram:
                    continue
                before = kept.get(user.name)
                if (before is not None and before.password == user.password
                        and mechanism in before.scram):
                    user.scram[mechanism] = before.scram[mechanism]
                else:
                    self._derive(user, mechanism)
                    derived += 1
        return derived

    def _derive(self, user: User, mechanism: str) -> ScramCredential:
        # Salted as a decoy is: the same in every worker (a salt that changed from one
        # worker to the next would tell a password user from an unknown name).
        assert user.password is not None
        salt, stored, server, i = scramp.ScramMechanism(mechanism).make_auth_info(
            user.password, iteration_count=_DEFAULT_SHAPE[0],
            salt=self._decoy_salt(user.name, mechanism, _DEFAULT_SHAPE[1]))
        cred = user.scram[mechanism] = ScramCredential(salt, stored, server, i)
        return cred

    def decoy(self, name: str, mechanism: str, shape: tuple[int, int]) -> ScramCredential:
        """A credential nobody can match, shaped as the store's usual one (iterations,
        salt length) for ``mechanism``, its salt the same for a name in every worker and
        every login: an unknown name then looks like a known one to a client that
        watches the salt, the iteration count or the time a PLAIN check takes."""
        iterations, salt_length = shape
        return ScramCredential(self._decoy_salt(name, mechanism, salt_length),
                               os.urandom(64), os.urandom(64), iterations)

    def _decoy_salt(self, name: str, mechanism: str, length: int) -> bytes:
        return hmac.digest(self._decoy_key, f"{mechanism}\0{name}".encode(), "sha256")[:length]


_DEFAULT_SHAPE = (MIN_ITERATIONS, 32)  # (iterations, salt bytes) a password user's keys get


def _usual_shape(users: dict[str, User], mechanism: str) -> tuple[int, int]:
    """The most common (iterations, salt length) among the users' ``mechanism``
    credentials, a password user's counting as derived (4,096, 32)."""
    shapes: Counter[tuple[int, int]] = Counter()
    for user in users.values():
        cred = user.scram.get(mechanism)
        if cred is not None:
            shapes[cred.iterations, len(cred.salt)] += 1
        elif user.password is not None:
            shapes[_DEFAULT_SHAPE] += 1
    return shapes.most_common(1)[0][0] if shapes else _DEFAULT_SHAPE


def _usual_stored_key(users: dict[str, User]) -> tuple[str, tuple[int, int]] | None:
    """The mechanism and shape a PLAIN check most often derives with, None when no
    user has only stored keys (then no check derives, and neither does a decoy)."""
    shapes = Counter((mechanism, (cred.iterations, len(cred.salt)))
                     for u in users.values() if u.password is None
                     for mechanism, cred in list(u.scram.items())[:1])
    return shapes.most_common(1)[0][0] if shapes else None


def _decoy_key(users: dict[str, User]) -> bytes:
    """The key of decoy salts: from the store's secrets, so the same in every worker
    and across restarts (a per-process key would give an unknown name a different salt
    on each worker, which tells it apart); it changes only when the users do."""
    digest = hashlib.sha256(b"kproxy decoy salts\0")
    for name in sorted(users):
        user = users[name]
        digest.update(name.encode() + b"\0" + (user.password or "").encode() + b"\0")
        for mechanism in sorted(user.scram):
            cred = user.scram[mechanism]
            digest.update(mechanism.encode() + cred.stored_key + cred.server_key)
    return digest.digest()


def _derives_stored_key(mechanism: str, cred: ScramCredential, password: str) -> bool:
    derived = scramp.ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=cred.iterations, salt=cred.salt)
    return hmac.compare_digest(derived[1], cred.stored_key)


def _derives_then(mechanism: str, decoy: ScramCredential, password: str,
                  holds: bool) -> bool:
    """A check that must take as long as a stored key's: the same derivation over a
    decoy, then the answer known before (an unknown name's is False)."""
    _derives_stored_key(mechanism, decoy, password)
    return holds


def parse_users(text: str | bytes, where: str = "users_file") -> UserStore:
    """A users file's content as a store; ``UsersError`` names what is wrong."""
    if len(text) > MAX_USERS_FILE_BYTES:
        raise UsersError(f"{where}: larger than {MAX_USERS_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(text.decode() if isinstance(text, bytes) else text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsersError(f"{where}: not valid TOML ({exc})") from None
    extra = set(data) - {"users"}
    if extra:
        raise UsersError(f"{where}: {sorted(extra)[0]}: unknown key (expected [users.NAME])")
    table = data.get("users", {})
    if not isinstance(table, dict):
        raise UsersError(f"{where}: users: must be a table of [users.NAME] tables")
    users = {}
    for name, entry in table.items():
        users[name] = _user(name, entry, f"{where}: users.{name}")
    return UserStore(users)


def _user(name: str, entry: Any, where: str) -> User:
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise UsersError(f"{where}: a name of 1 to {MAX_NAME_BYTES} bytes is needed")
    if not isinstance(entry, dict):
        raise UsersError(f"{where}: must be a table")
    user = User(name)
    for key, value in entry.items():
        if key == "password":
            if not isinstance(value, str) or not value or (
                    len(value.encode()) > MAX_PASSWORD_BYTES):
                raise UsersError(f"{where}.password: a string of 1 to {MAX_PASSWORD_BYTES} "
                                 "bytes is needed")
            user.password = value
        elif key in SCRAM_MECHANISMS.values():
            mechanism = next(m for m, k in SCRAM_MECHANISMS.items() if k == key)
            user.scram[mechanism] = _credential(value, f"{where}.{key}")
        else:
            raise UsersError(f"{where}.{key}: unknown key (password, scram_sha_256, "
                             "scram_sha_512)")
    if user.password is None and not user.scram:
        raise UsersError(f"{where}: needs a password or stored SCRAM credentials")
    return user


def _credential(value: Any, where: str) -> ScramCredential:
    if not isinstance(value, dict):
        raise UsersError(f"{where}: must be a table (salt, iterations, stored_key, server_key)")
    missing = {"salt", "iterations", "stored_key", "server_key"} - set(value)
    if missing:
        raise UsersError(f"{where}: missing {', '.join(sorted(missing))}")
    iterations = value["iterations"]
    if not isinstance(iterations, int) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise UsersError(f"{where}.iterations: an integer from {MIN_ITERATIONS} to "
                         f"{MAX_ITERATIONS}")
    keys = {}
    for key in ("salt", "stored_key", "server_key"):
        try:
            keys[key] = base64.b64decode(str(value[key]), validate=True)
        except (binascii.Error, ValueError):
            raise UsersError(f"{where}.{key}: not base64") from None
        if not keys[key]:
            raise UsersError(f"{where}.{key}: empty")
    return ScramCredential(keys["salt"], keys["stored_key"], keys["server_key"], iterations)
