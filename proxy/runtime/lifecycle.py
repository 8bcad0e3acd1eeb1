"""A running proxy's life: signals, configuration reload (SIGHUP, file watch), drain.

A reload re-reads the configuration; a bad one is rejected and the running one kept.
Options marked restart-only in the option table are logged when they change and take
effect at the next start; everything else applies at once to new connections.
"""

from __future__ import annotations

import hashlib
import logging
import signal
from typing import TYPE_CHECKING

import trio

from kproxy.auth.logins import derive_password_keys
from kproxy.config.settings import RESTART_ONLY, Config, ConfigError, option_value
from kproxy.config.virtual_clusters import reload_change
from kproxy.runtime.tls import server_context, upstream_context
from kproxy.supervisor import worker_link

if TYPE_CHECKING:
    from kproxy.runtime.server import Proxy

log = logging.getLogger("kproxy")


async def handle_signals(proxy: Proxy) -> None:
    supervisor = worker_link.supervisor_pid()
    async with trio.open_nursery() as nursery:
        if supervisor is not None:
            nursery.start_soon(worker_link.watch_supervisor, supervisor, proxy.shutdown)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                       signal.SIGHUP) as signals:
            stopping = False
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    # In a task of its own: a reload may take seconds (a users file's
                    # keys derived first), and a SIGTERM meanwhile must not wait.
                    nursery.start_soon(_reload_once_started, proxy)
                    continue
                if stopping:  # a worker: an echo of the stop it is draining for
                    log.info("already draining; the supervisor decides when to stop now")
                    continue
                proxy.shutdown()
                if supervisor is None:  # one process: a second signal stops it now
                    nursery.cancel_scope.cancel()
                    return
                stopping = True


class ConfigFile:
    """The config file's content as the last reload read it, whatever started that
    reload: an edit followed by SIGHUP is read once, not again by the watch."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._read = _fingerprint(path)

    def reading(self) -> None:
        """A reload is about to read the file (taken before: a later edit still shows)."""
        self._read = _fingerprint(self.path)

    def changed(self) -> bool:
        return _fingerprint(self.path) != self._read


async def watch_config(proxy: Proxy, file: ConfigFile) -> None:
    """Reload when the file's content changes (a ConfigMap update swaps a symlink)."""
    while True:
        await trio.sleep(proxy.config.config_watch_interval or 5.0)
        if file.changed():
            log.info("config file changed; reloading", extra={"fields": {"path": file.path}})
            await reload(proxy)


async def _reload_once_started(proxy: Proxy) -> None:
    await proxy.started.wait()  # a reload needs what start-up opens
    await reload(proxy)


async def reload(proxy: Proxy) -> bool:
    """Re-read the configuration; a bad one is rejected and the running one kept.
    One at a time, in the order asked: a later file never applies before an earlier."""
    async with proxy.reload_lock:
        return await _reload(proxy)


async def _reload(proxy: Proxy) -> bool:
    if proxy.reload_config is None:
        log.warning("reload requested but this proxy was not started from a config")
        return False
    if proxy.config_file is not None:
        proxy.config_file.reading()
    try:
        new = proxy.reload_config()
        why = reload_change(proxy.config.virtual_clusters, new.virtual_clusters)
        if why is not None:
            raise ConfigError(why)
        # Certificates are read again, so a rotated certificate serves new connections.
        server_tls, upstream_tls = server_context(new), upstream_context(new)
    except ConfigError as exc:
        proxy.metrics.config_reloads.labels("rejected").inc()
        proxy.audit_record({"event": "config_reload", "outcome": "rejected",
                            "error": str(exc)})
        log.error("config reload rejected; keeping the running config",
                  extra={"fields": {"error": str(exc)}})
        return False
    # The new users' keys derived before the new file serves a login (the running
    # one serves meanwhile); unchanged users keep the keys already derived.
    await derive_password_keys(new, proxy.config)
    proxy.server_tls = server_tls
    proxy.rotation.tls = upstream_tls
    await apply(proxy, new)
    proxy.metrics.config_reloads.labels("applied").inc()
    users = new.identity.users
    proxy.audit_record({"event": "config_reload", "outcome": "applied", "source": new.source,
                        **({"users": len(users)} if users is not None else {})})
    return True


async def apply(proxy: Proxy, new: Config) -> None:
    old = proxy.config
    restart_only = [name for name in RESTART_ONLY
                    if option_value(old, name) != option_value(new, name)]
    if restart_only:
        log.warning("changed options that take effect only after a restart: %s",
                    ", ".join(restart_only))
    if proxy.telemetry is not None and old.telemetry != new.telemetry:
        proxy.telemetry.reconfigure(new.telemetry)
        log.info("telemetry subscriptions reloaded",
                 extra={"fields": {"subscriptions": len(new.telemetry.settings.subscriptions)}})
    proxy.set_config(new)
    if old.upstream != new.upstream:
        log.info("upstream bootstrap servers changed", extra={"fields": {
            "upstream": ",".join(f"{h}:{p}" for h, p in new.upstream)}})
        # One epoch bump for a new bootstrap list, whatever it leads to (see
        # BackendWatch.reconfigured): sessions on servers no longer listed are closed.
        await proxy.backend.reconfigured(new.connect_timeout, new.max_frame_bytes)


async def drain(proxy: Proxy) -> None:
    """Stop accepting, stop reading, and wait (bounded) for in-flight requests."""
    sessions = proxy.sessions
    log.info("draining: no new connections; waiting for in-flight requests",
             extra={"fields": {"sessions": len(sessions),
                               "timeout_s": proxy.config.drain_timeout}})
    proxy.close_listeners()
    for s in list(sessions):
        s.stop_reading()
    with trio.move_on_after(proxy.config.drain_timeout) as timeout:
        # Not a snapshot: a connection accepted while the listeners were closing
        # (with reuse_port the kernel still routes new ones here until then) starts
        # its session afterwards; it is drained too, not cut at the end.
        while sessions:
            s = next(iter(sessions))
            s.stop_reading()
            await s.wait_ended()
    if timeout.cancelled_caught:
        log.warning("drain timeout: closing connections with requests still in flight",
                    extra={"fields": {"sessions": len(sessions)}})


def _fingerprint(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).digest()
    except OSError:
        return None
