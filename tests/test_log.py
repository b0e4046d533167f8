"""Structured logging: one parseable line per event, journald-aware, on real streams."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kernelabd.log import log_level_option, quote, setup_logging

TS = r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture(autouse=True)
def restore_logger() -> Iterator[None]:
    logger = logging.getLogger("kernelab")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


@pytest.fixture
def out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.TextIOWrapper]:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    with (tmp_path / "log.txt").open("w+") as stream:
        yield stream


def lines(stream: io.TextIOWrapper) -> list[str]:
    stream.flush()
    stream.seek(0)
    return stream.read().splitlines()


def test_one_line_per_event_with_fields(out: io.TextIOWrapper) -> None:
    setup_logging("info", out)
    logging.getLogger("kernelab.daemon").info("job.started", extra={"job": 3, "device": "cuda:0"})
    [line] = lines(out)
    assert re.fullmatch(
        TS + r" level=info logger=kernelab.daemon event=job.started job=3 device=cuda:0", line)


def test_awkward_values_stay_on_one_line(out: io.TextIOWrapper) -> None:
    setup_logging("debug", out)
    log = logging.getLogger("kernelab.gate")
    log.warning("candidate.rejected", extra={"reason": 'NaN in "out"\nat 3', "empty": ""})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("worker.crashed")
    first, second = lines(out)
    assert first.endswith(r'reason="NaN in \"out\"\nat 3" empty=""')
    assert "event=worker.crashed" in second
    assert 'exc="Traceback' in second
    assert second.endswith(r'ValueError: boom"')


def test_level_filters_and_unknown_level_is_an_error(out: io.TextIOWrapper) -> None:
    setup_logging("WARNING", out)
    log = logging.getLogger("kernelab")
    log.info("hidden")
    log.error("shown")
    assert [line.split(" event=")[1] for line in lines(out)] == ["shown"]
    with pytest.raises(ValueError, match="verbose"):
        setup_logging("verbose", out)


def test_setting_up_twice_does_not_duplicate_lines(out: io.TextIOWrapper) -> None:
    setup_logging("info", out)
    setup_logging("info", out)
    logging.getLogger("kernelab").info("once")
    assert len(lines(out)) == 1


def test_journald_stream_gets_priority_prefix_and_no_timestamp(
        out: io.TextIOWrapper, monkeypatch: pytest.MonkeyPatch) -> None:
    st = os.fstat(out.fileno())
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    setup_logging("info", out)
    logging.getLogger("kernelab").warning("gpu.throttled", extra={"gpu": 0})
    assert lines(out) == ["<4>level=warning logger=kernelab event=gpu.throttled gpu=0"]


def test_inherited_journal_stream_of_another_file_is_ignored(
        out: io.TextIOWrapper, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOURNAL_STREAM", "1:1")
    setup_logging("info", out)
    logging.getLogger("kernelab").info("x")
    assert re.match(TS, lines(out)[0])


def test_quote() -> None:
    assert quote("cuda:0") == "cuda:0"
    assert quote("a b") == '"a b"'
    assert quote("k=v") == '"k=v"'
    assert quote("") == '""'


def test_stdout_of_a_real_process_is_one_line_per_event() -> None:
    code = ("import logging; from kernelabd.log import setup_logging; setup_logging('info'); "
            "log = logging.getLogger('kernelab.daemon'); "
            "log.info('daemon.ready', extra={'gpus': 0}); log.debug('hidden')")
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True, timeout=60)
    [line] = proc.stdout.splitlines()
    assert re.fullmatch(TS + " level=info logger=kernelab.daemon event=daemon.ready gpus=0",
                        line)
    assert proc.stderr == ""


@click.command()
@log_level_option
def show(log_level: str | None) -> None:
    click.echo(repr(log_level))


def test_log_level_option() -> None:
    runner = CliRunner()
    assert runner.invoke(show, []).output.strip() == "None"
    assert runner.invoke(show, ["--log-level", "DEBUG"]).output.strip() == "'debug'"
    assert runner.invoke(show, [], env={"KERNELAB_LOG_LEVEL": "error"}).output.strip() == "'error'"
    assert runner.invoke(show, ["--log-level", "loud"]).exit_code == 2
