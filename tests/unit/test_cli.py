"""The command line's shape: every command registered once, in order, with help; `python -m compaction.cli` runs."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction.cli import build_parser, main

COMMANDS = ["generate", "dump", "tier", "wal", "segments", "read", "plan", "compact", "expire", "gc", "verify", "table"]
ROOT = Path(__file__).resolve().parents[2]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_in_order_with_a_summary_and_a_function() -> None:
    parser = build_parser()
    assert list(_subcommands(parser)) == COMMANDS
    top = parser.format_help()
    for name, sub in _subcommands(parser).items():
        assert f"    {name} " in top  # listed with its one-line summary
        assert sub.description and sub.get_default("func") is not None, name


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: kcompact {command} ")


def test_generate_help_documents_the_clock(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[--now MS | --start-ms START_MS]" in text
    assert "the last record of a partition is stamped with it" in text and "(default: the wall clock)" in text


def test_usage_error_exits_2_naming_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(ROOT / "conf" / "kcompact.yaml")
    assert main(["plan", "--store", str(tmp_path), "--config", config, "--partition", "0"]) == 2
    assert "kcompact plan: ConfigError: --partition needs --topic" in capsys.readouterr().err


def test_python_dash_m_runs_the_console_script() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "compaction.cli", "--help"], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False)
    assert done.returncode == 0 and "exit codes:" in done.stdout


@pytest.mark.parametrize(("argv", "refused"), [
    (["read", "--topic", "t", "--partition", "-1"], "argument --partition: -1 is below 0"),
    (["read", "--topic", "t", "--partition", "0", "--from-offset", "-5"], "argument --from-offset: -5 is below 0"),
    (["segments", "--topic", "t", "--partition", "0", "--version", "-2"], "argument --version: -2 is below 0"),
    (["verify", "--topic", "t", "--partition", "0", "--before", "-1"], "argument --before: -1 is below 0"),
    (["wal", "list", "--partition", "x"], "argument --partition: 'x' is not a whole number"),
    (["generate", "--logdir", "g", "--keys", "0"], "argument --keys: 0 is below 1"),
    (["compact", "--config", "c.yaml", "--partition", "-3"], "argument --partition: -3 is below 0"),
])
def test_a_number_out_of_its_options_range_is_a_usage_error(
        argv: list[str], refused: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative offsets, versions and partitions mean nothing to Kafka: exit 2 naming the option, before any store
    or file is touched (a negative version reached delta-rs and exited 1 with a traceback; zero keys crashed
    `generate`)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert refused in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
