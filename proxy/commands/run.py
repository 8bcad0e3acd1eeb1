"""``kproxy run``: the proxy itself."""

from __future__ import annotations

import argparse
import sys

import trio

from kproxy import logs
from kproxy.commands.collector import manage_full_collections
from kproxy.commands.heap import settle_heap
from kproxy.config import settings as config_mod
from kproxy.runtime.admission_control import AdmissionControl
from kproxy.runtime.server import Proxy
from kproxy.supervisor import workers
from kproxy.supervisor.admission_hub import CONTROL_FD_FLAG, WORKER_COUNT_FLAG


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", help="run the proxy",
        description="Run the Kafka proxy. Every option can also be set in the TOML file "
        "given by --config (same name, with underscores) or in a KPROXY_* environment "
        "variable; flags win over the environment, which wins over the file.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    config_mod.add_arguments(p)
    # Set by the supervisor for its workers only: their end of the admission channel.
    p.add_argument(CONTROL_FD_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument(WORKER_COUNT_FLAG, type=int, default=1, help=argparse.SUPPRESS)
    # ... and the HTTP listener it opened for them (kproxy.supervisor.workers).
    p.add_argument(workers.HTTP_FD_FLAG, dest="http_fd", type=int, default=None,
                   help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_mod.load_or_explain(args, "kproxy run")
    if cfg is None:
        return 2
    logs.setup(cfg.log_format, cfg.log_level)
    try:  # built before any worker starts: a bad certificate or URL stops start-up here
        proxy = Proxy(cfg, reload_config=lambda: config_mod.load(args))
    except config_mod.ConfigError as exc:  # e.g. a certificate that cannot be read
        print(f"kproxy run: error: {exc}", file=sys.stderr)
        return 2
    count = workers.worker_count(cfg)
    if count > 1:
        del proxy
        return workers.supervise(cfg, run_arguments(), count)
    proxy.http_fd = args.http_fd
    if args.control_fd is not None:
        proxy.admission.control = AdmissionControl.from_fd(
            args.control_fd, args.control_workers, proxy.metrics)
        # Each worker enforces its share of every quota (kproxy.policies.auth.quotas).
        proxy.services.quotas.share = max(1, args.control_workers)
    settle_heap(cfg.huge_pages)
    manage_full_collections(cfg.gc_sweep_interval, proxy.metrics.registry)
    try:
        trio.run(proxy.run)
    except OSError as exc:  # typically a port already in use
        print(f"kproxy run: error: {exc}", file=sys.stderr)
        return 1
    return 0


def run_arguments() -> list[str]:
    """What was given after ``run`` on the command line, for the workers to get the same."""
    argv = sys.argv[1:]
    return argv[argv.index("run") + 1:] if "run" in argv else []
