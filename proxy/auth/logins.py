"""What a login at the proxy reads, built from a (re)loaded configuration.

The handlers (``policies.auth.handlers``) ask for the current ``SaslSettings`` at each
login, so a reload (a new users file) applies to the next one; OAUTHBEARER reads the
JWKS as the process last fetched it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from kproxy.auth.derivations import derive
from kproxy.auth.jwks import JwksCache
from kproxy.config.settings import Config
from kproxy.policies.auth.handlers import SaslSettings
from kproxy.policies.auth.oauth import OAuthExchange, OAuthSettings
from kproxy.policies.auth.sasl import OAUTHBEARER, PLAIN, Exchange, exchange_factory
from kproxy.policies.auth.users import SCRAM_MECHANISMS

log = logging.getLogger("kproxy")


async def derive_password_keys(config: Config, running: Config | None = None) -> None:
    """Derive every ``password`` user's SCRAM keys before the users file serves a login
    (at start, and at a reload before it applies), in a thread: derived at a first
    login instead, on the loop, that login's answer came a derivation later than an
    unknown name's, which told the name was a user's. Each key is a PBKDF2 of 4,096
    iterations (1 to 3 ms); users with stored keys need none, and at a reload
    (``running``: the configuration it replaces) a file whose users did not change
    takes the keys already derived."""
    users = config.identity.users
    mechanisms = [m for m in config.sasl_mechanisms if m in SCRAM_MECHANISMS]
    if not config.sasl_terminate or users is None or not mechanisms:
        return
    previous = running.identity.users if running is not None else None
    began = time.monotonic()
    derived = await trio.to_thread.run_sync(users.derive_password_keys, mechanisms,
                                            previous)
    if derived:
        log.info("derived the SCRAM keys of the users file's password users",
                 extra={"fields": {"keys": derived,
                                   "seconds": round(time.monotonic() - began, 3)}})


def sasl_settings(config: Config, jwks: JwksCache | None) -> SaslSettings:
    """What a login reads, from a (re)loaded configuration: the users file as read, the
    OAUTHBEARER checks with the JWKS as last fetched."""
    users = config.identity.users
    if users is not None and users.mixed and PLAIN in config.sasl_mechanisms:
        log.warning("the users file holds password users beside users with stored SCRAM "
                    "keys only: every PLAIN login now derives a key (over a decoy for a "
                    "password user, so that no answer tells the two kinds apart); give "
                    "every user stored keys, or none", extra={"fields": {
                        "users_file": config.sasl_users_file}})
    others: dict[str, Callable[[], Exchange]] = {}
    if jwks is not None and config.sasl_oauthbearer_issuer and config.sasl_oauthbearer_audience:
        oauth = OAuthSettings(config.sasl_oauthbearer_issuer, config.sasl_oauthbearer_audience,
                              config.sasl_oauthbearer_principal_claim,
                              config.sasl_oauthbearer_clock_skew)
        others[OAUTHBEARER] = lambda: OAuthExchange(oauth, jwks.keys, time.time,
                                                    jwks.unknown_kid)
    make = exchange_factory(lambda: users, others) if users is not None else (
        lambda mechanism: others[mechanism]() if mechanism in others else None)
    return SaslSettings(
        config.sasl_mechanisms, make,
        config.sasl_failed_login_delay,
        session_lifetime_ms=int(config.sasl_session_lifetime * 1000),
        clock=time.monotonic, derive=derive)
