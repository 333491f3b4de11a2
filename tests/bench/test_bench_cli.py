"""bench.cli: the commands, the default one, and the one place errors become exit codes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bench import cli


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert all(name in out for name in ("run", "report", "boundaries", "fixtures"))


def test_options_without_a_command_are_the_sweeps() -> None:
    ap = cli.parser()
    implicit = ap.parse_args(cli.with_command(["--quick", "--configs", "nospec"]))
    assert implicit.command == "run" and implicit.quick and implicit.configs == "nospec"
    assert cli.with_command([]) == ["run"]
    assert cli.with_command(["report", "x.json"]) == ["report", "x.json"]
    with pytest.raises(SystemExit):  # each command has its own options
        ap.parse_args(["report", "--quick"])


def test_an_unknown_command_is_named_with_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["boundary", "docs/bench/x"]) == 2
    assert "bench: usage: no command 'boundary'; the commands: run, report, boundaries, fixtures" in (
        capsys.readouterr().err
    )


def test_a_missing_input_is_a_usage_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "nowhere.json")]) == 2
    assert f"bench: usage: report: no results at {tmp_path / 'nowhere.json'}" in capsys.readouterr().err


def test_verbose_shows_debug_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cli.main(["report", "-v", str(tmp_path / "nowhere.json")])
    logging.getLogger("bench.run.sweep").debug("a debug line")
    assert "debug: a debug line" in capsys.readouterr().err
    cli.main(["report", str(tmp_path / "nowhere.json")])
    logging.getLogger("bench.run.sweep").debug("another")
    assert "another" not in capsys.readouterr().err
