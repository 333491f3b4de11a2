"""The toolkit's logging: progress as plain lines on the stderr of the moment, warnings marked,
debug records only with -v."""

from __future__ import annotations

import logging

import pytest

from tools.cli import main
from tools.logs import ROOT_LOGGER, configure


@pytest.fixture(autouse=True)
def _default_level():
    yield
    configure(verbose=False)


def test_records_read_as_plain_lines_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("tools.example")
    log.info("applying 3 patch(es)")
    log.warning("series lists nothing twice")
    log.debug("git status")
    captured = capsys.readouterr()
    assert captured.err == "applying 3 patch(es)\nwarning: series lists nothing twice\n"
    assert captured.out == ""


def test_verbose_shows_debug_records(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-v", "tree"]) == 0
    assert logging.getLogger(ROOT_LOGGER).level == logging.DEBUG
    logging.getLogger("tools.gitutil").debug("git rev-parse HEAD")
    assert "debug: git rev-parse HEAD\n" in capsys.readouterr().err
    assert main(["tree"]) == 0
    assert logging.getLogger(ROOT_LOGGER).level == logging.INFO


def test_one_handler_however_often_configured(capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(3):
        configure()
    logging.getLogger("tools.example").info("once")
    assert capsys.readouterr().err == "once\n"
