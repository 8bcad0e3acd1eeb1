"""The ``kproxy`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import sys

from kproxy import __version__
from kproxy.commands import decode as decode_command
from kproxy.commands import demo as demo_command
from kproxy.commands import embedded as embedded_command
from kproxy.commands import run as run_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kproxy",
        description="A Kafka-protocol-aware proxy: address rewriting, KIP-1102 rebootstrap "
        "and KIP-714 telemetry termination.",
    )
    parser.add_argument("--version", action="version", version=f"kproxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run_command.add_parser(sub)
    demo_command.add_parser(sub)
    decode_command.add_parser(sub)
    embedded_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
