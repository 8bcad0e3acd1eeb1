"""Configuration: file, environment and flags, their precedence, and clear errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.config import settings as config_mod


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config_mod.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_and_derived_values() -> None:
    cfg = config_mod.load(_args(), env={})
    assert cfg.listen == ("127.0.0.1", 9092)
    assert cfg.broker_port_base == 9093 and cfg.broker_bind_port_base == 9093
    assert cfg.advertised_host == "127.0.0.1" and cfg.node_id_range == (0, 1023)
    assert cfg.max_frame_bytes == 100 * 1024 * 1024


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    path = tmp_path / "kproxy.toml"
    path.write_text('upstream = "file:1"\nlisten = "0.0.0.0:7000"\nlog_level = "debug"\n'
                    'advertised_host = "kafka.example.com"\n[telemetry]\nenabled = true\n')
    env = {"KPROXY_UPSTREAM": "env:2", "KPROXY_LOG_LEVEL": "warning"}
    cfg = config_mod.load(_args("--config", str(path), "--upstream", "flag:3,flag:4"), env=env)
    assert cfg.upstream == [("flag", 3), ("flag", 4)]
    assert cfg.log_level == "warning"  # env over file
    assert cfg.listen == ("0.0.0.0", 7000)  # file over default
    assert cfg.advertised_host == "kafka.example.com"
    assert cfg.extra == {"telemetry": {"enabled": True}}


def test_bind_and_advertised_ports_can_differ() -> None:
    cfg = config_mod.load(_args("--broker-port-base", "31000", "--broker-bind-port-base",
                                "9100", "--node-id-range", "1001-1003"), env={})
    pm = cfg.port_map
    assert pm.advertised(1002) == (pm.advertised_host, 31001) and pm.bind_port(1002) == 9101


@pytest.mark.parametrize(("argv", "env", "file", "needle"), [
    (["--upstream", "nohost"], {}, None, "--upstream: expected HOST:PORT"),
    ([], {"KPROXY_NODE_ID_RANGE": "9-3"}, None, "KPROXY_NODE_ID_RANGE: FIRST must not exceed"),
    ([], {}, 'max_inflight = 0\n', "max_inflight: must be a positive integer"),
    ([], {}, 'no_such_key = 1\n', "no_such_key: unknown key"),
    ([], {}, 'listen = \n', "not valid TOML"),
    (["--log-format", "xml"], {}, None, "--log-format: expected one of text, json"),
    (["--http", "127.0.0.1:9100"], {}, None, "http: port 9100 falls inside the broker port"),
    (["--broker-port-base", "65000"], {}, None, "do not fit in 1..65535"),
])
def test_bad_values_name_the_key(tmp_path: Path, argv: list[str], env: dict[str, str],
                                 file: str | None, needle: str) -> None:
    if file is not None:
        path = tmp_path / "bad.toml"
        path.write_text(file)
        argv = [*argv, "--config", str(path)]
    with pytest.raises(config_mod.ConfigError, match=needle.replace(".", r"\.")):
        config_mod.load(_args(*argv), env=env)


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--node-id-range", "x"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "kproxy run: error: --node-id-range: expected FIRST-LAST, got 'x'"]
    missing = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--config",
                              str(tmp_path / "absent.toml")], capture_output=True, text=True,
                             timeout=60, check=False)
    assert missing.returncode == 2 and "No such file" in missing.stderr


def test_help_documents_every_option_with_its_variable() -> None:
    out = subprocess.run([sys.executable, "-m", "kproxy.cli", "run", "--help"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    flat = " ".join(out.split())
    for opt in config_mod.OPTIONS:
        assert opt.flag in flat and opt.env in flat


def test_every_option_is_a_config_field_and_every_field_an_option() -> None:
    """The option table is the one declaration: Config's typed fields mirror it exactly
    (the telemetry_* options, besides the OTLP ones, make up Config.telemetry; the
    [[filters]] and [[virtual_clusters]] tables, which are no options, make up
    Config.filters and Config.virtual_clusters; Config.identity holds what the identity
    options' files say: the users, the admin token)."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_mod.Config)}
    own = fields - {"telemetry", "source", "extra", "filters", "virtual_clusters", "identity",
                    "quotas"}
    options = {o.name for o in config_mod.OPTIONS}
    in_telemetry = {n for n in options if n == "telemetry" or (
        n.startswith("telemetry_") and not n.startswith("telemetry_otlp_"))}
    assert own == options - in_telemetry
