"""The TUI's read queries, change detection and command writes, on a real SQLite file."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from store import connect
from tests.tui import tuidb
from tui import data


def test_overview_reads_daemon_devices_and_jobs(db_path: Path) -> None:
    conn = connect(db_path, readonly=True)
    overview = data.load_overview(conn)
    assert overview.daemon is not None and overview.daemon.host == "gpubox"
    assert overview.daemon.is_up(tuidb.NOW) and not overview.daemon.is_up(tuidb.NOW + 60)
    assert [d.id for d in overview.devices] == ["cuda:0", "cuda:1"]
    assert len(overview.devices[0].samples) == data.DEVICE_HISTORY
    assert overview.devices[0].samples[0].ts < overview.devices[0].samples[-1].ts
    softmax = next(j for j in overview.jobs if j.problem == "softmax")
    assert (softmax.candidates, softmax.failures, softmax.best_ms) == (12, 4, 0.331)
    assert softmax.speedup == pytest.approx(0.42 / 0.331)


def test_series_orders_candidates_and_lists_failures_newest_first(db_path: Path) -> None:
    conn = connect(db_path, readonly=True)
    series = data.load_series(conn, 1)
    assert series is not None
    assert [c.ordinal for c in series.candidates] == list(range(1, 13))
    assert [c.ordinal for c in series.failures] == [10, 7, 6, 4]
    assert data.load_series(conn, 999) is None


def test_incumbent_is_a_step_line_carried_to_the_last_candidate(db_path: Path) -> None:
    series = data.load_series(connect(db_path, readonly=True), 1)
    assert series is not None
    xs, ys = data.incumbent_steps(series)
    assert xs == [1, 2, 2, 5, 5, 9, 9, 12, 12]
    assert ys == [0.481, 0.481, 0.452, 0.452, 0.401, 0.401, 0.362, 0.362, 0.331]


def test_evidence_names_the_error_where_and_which_input_set() -> None:
    text = data.format_evidence(json.dumps(
        {"max_rel_error": 0.031, "tolerance": 0.001, "index": [3, 517], "input_set": 2,
         "dtype": "float16"}))
    assert text == "err 0.031 > tol 0.001, at [3, 517], input set 2, dtype=float16"
    assert data.format_evidence("not json") == "not json"
    assert data.format_evidence(None) == ""


def test_diff_against_parent_and_timing_summary(db_path: Path) -> None:
    conn = connect(db_path, readonly=True)
    diff = data.parent_diff(data.load_source(conn, 1), data.load_source(conn, 2) or "", 1, 2)
    assert "-        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=1024" in diff
    assert "+        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=2048" in diff
    summary = data.timing_summary(data.load_blocks(conn, 12))
    assert summary["A"][0] == summary["B"][0] == 40
    assert summary["B"][1] == pytest.approx(0.331, rel=0.02)


def test_sort_and_filter_jobs(db_path: Path) -> None:
    jobs = data.load_jobs(connect(db_path, readonly=True))
    assert [j.problem for j in data.sort_jobs(jobs, "state")][:3] == [
        "layernorm", "softmax", "gelu"]
    assert data.sort_jobs(jobs, "priority")[0].problem == "matmul_bias"
    assert [j.problem for j in data.filter_jobs(jobs, "running cuda:1")] == ["layernorm"]
    assert data.filter_jobs(jobs, "nothing-like-this") == []


def test_poll_sees_another_connections_commit_and_nothing_else(
        db_path: Path, writer: sqlite3.Connection) -> None:
    reader = data.Reader(db_path)
    assert reader.poll() is True
    assert reader.poll() is False
    reader.read(data.load_overview)
    assert reader.poll() is False
    with writer:
        tuidb.add_candidate(writer, 1, edit="live", verdict="pass", ms=0.3)
    assert reader.poll() is True
    assert reader.poll() is False


def test_poll_waits_for_a_database_that_does_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "kernelab.db"
    reader = data.Reader(path)
    assert reader.poll() is True and reader.error and "no database yet" in reader.error
    assert reader.poll() is False
    tuidb.build(path)
    assert reader.poll() is True and reader.error is None
    assert len(reader.read(data.load_jobs)) == 6


def test_send_command_queues_a_pending_tui_command(db_path: Path) -> None:
    command_id = data.send_command(db_path, "priority", 3, "4", now=lambda: 123.0)
    row = connect(db_path, readonly=True).execute(
        "SELECT ts, job_id, verb, arg, source, status FROM commands WHERE id = ?",
        (command_id,)).fetchone()
    assert tuple(row) == (123.0, 3, "priority", "4", "tui", "pending")
    with pytest.raises(ValueError):
        data.send_command(db_path, "explode", 3)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write a read-only file")
def test_controls_are_off_when_the_database_is_not_writable(db_path: Path) -> None:
    assert data.controls_available(db_path)
    db_path.chmod(0o444)
    try:
        assert not data.controls_available(db_path)
    finally:
        db_path.chmod(0o644)


def test_devices_show_their_node_unless_the_id_names_it(tmp_path: Path) -> None:
    path = tuidb.build(tmp_path / "kernelab.db")
    conn = connect(path)
    with conn:
        conn.execute("UPDATE devices SET node = 'gpubox' WHERE id = 'cuda:0'")
        conn.execute("INSERT INTO devices (id, name, node, updated_at) "
                     "VALUES ('gpubox2/cuda:0', 'NVIDIA H200', 'gpubox2', 0)")
    conn.close()
    devices = data.load_devices(connect(path, readonly=True))
    assert [d.label for d in devices] == ["cuda:0 @ gpubox", "cuda:1", "gpubox2/cuda:0"]
    assert devices[2].node == "gpubox2"
