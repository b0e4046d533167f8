"""A candidate cannot touch the trusted side (issue 20): the hostile candidates of
``candidates/`` that kill every kernelab process, read kernelab's database through /proc or the
home path, connect to a loopback server, or leave a process behind, run through ``kernelab
check`` and through a real daemon. Each is stopped (their attack reaches nothing, so they are
judged on their kernel, an honest softmax) and recorded, and the daemon keeps serving.

``test_adversarial.py`` checks their verdicts with every other case; here, what their attack
would have reached is set up beside them and looked at afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelabd.harness.isolation import probe
from store.db import connect
from tests.loopback import Listener

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOFTMAX = ROOT / "examples" / "softmax.py"
HOSTILE = ("kill_everything", "snoop_secrets", "connect_loopback", "fork_survivor")
SURVIVOR = "fork_survivor-sleeper"
pytestmark = pytest.mark.skipif(not probe("namespaces", "").namespaced,
                                reason="no namespaces here: candidates would reach the trusted side")


def survivors(scratch: Path) -> list[int]:
    """Processes the fork_survivor candidate left, started from sandboxes under ``scratch``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if SURVIVOR.encode() in cmdline and str(scratch).encode() in cmdline:
            found.append(int(entry))
    return found


def kernelab_check(candidate: str, home: Path, scratch: Path) -> tuple[int, dict]:
    """``kernelab check`` as a user runs it, with its sandboxes' directories under ``scratch``."""
    home.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "kernelabd", "check", str(SOFTMAX),
                           str(HERE / "candidates" / f"{candidate}.py"), "--json", "--no-timing",
                           "--home", str(home)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(scratch)})
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"one JSON line on stdout, got:\n{proc.stdout}\n{proc.stderr[-2000:]}"
    return proc.returncode, json.loads(lines[0])


def seeded_home(path: Path) -> Path:
    """A home with what a snooping candidate looks for: the database and the configuration."""
    path.mkdir()
    (path / "kernelab.db").write_bytes(b"SQLite format 3\x00")
    (path / "kernelab.toml").write_text("[gate]\n")
    return path


def test_a_candidate_that_kills_every_kernelab_process_leaves_check_standing(tmp_path: Path) -> None:
    code, result = kernelab_check("kill_everything", tmp_path / "home", tmp_path)
    assert (code, result["verdict"]) == (0, "pass"), result


def test_a_candidate_finds_no_database_or_configuration_through_proc_or_the_home(tmp_path: Path) -> None:
    code, result = kernelab_check("snoop_secrets", seeded_home(tmp_path / "home"), tmp_path)
    assert (code, result["verdict"]) == (0, "pass"), f"it found them: {result}"


def test_a_candidate_reaches_no_loopback_server(tmp_path: Path) -> None:
    listener = Listener()
    try:
        code, result = kernelab_check("connect_loopback", tmp_path / "home", tmp_path)
    finally:
        listener.sock.close()
    assert listener.accepted == 0, "the candidate connected to the test's server"
    assert (code, result["verdict"]) == (0, "pass"), result


def test_a_process_a_candidate_leaves_behind_is_gone_when_check_returns(tmp_path: Path) -> None:
    code, result = kernelab_check("fork_survivor", tmp_path / "home", tmp_path)
    assert not survivors(tmp_path), "the candidate's detached process outlived its sandbox"
    assert (code, result["verdict"]) == (0, "pass"), result


CONFIG = """\
[daemon]
stable_s = 0.5
rescan_s = 5.0
[jobs]
max_candidates = 1
proposers = []
[timing]
budget_s = 0.5
min_pairs = 2
"""


@pytest.mark.slow
def test_every_hostile_candidate_is_recorded_and_the_daemon_keeps_serving(kit, tmp_path: Path) -> None:
    kit.home.config.write_text(CONFIG)
    listener = Listener()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    daemon = kit.daemon(env={"TMPDIR": str(scratch)})
    kit.wait_for(lambda: kit.home.db.exists() and kit.status()["devices"], 60, "the daemon")
    files = []
    for name in HOSTILE:
        files += [tmp_path / f"{name}.py", tmp_path / f"{name}.new.py"]
        shutil.copyfile(SOFTMAX, files[-2])
        shutil.copyfile(HERE / "candidates" / f"{name}.py", files[-1])
    kit.cli("submit", *map(str, files))
    try:
        jobs = kit.wait_for(lambda: (js := kit.status()["jobs"]) and len(js) == len(HOSTILE)
                            and all(j["state"] not in ("queued", "running") for j in js) and js,
                            900, "every hostile job to end")
    finally:
        listener.sock.close()
    assert daemon.proc.poll() is None, "the daemon is still serving"
    for job in jobs:
        assert job["state"] == "done" and job["candidates"] == 1 and job["accepted"] == 1, job
    assert listener.accepted == 0, "no candidate reached the loopback server"
    assert not survivors(scratch), "no candidate's process outlived its evaluation"
    conn = connect(kit.home.db, readonly=True)
    try:
        beat = conn.execute("SELECT heartbeat_at FROM daemon").fetchone()[0]
        verdicts = [r[0] for r in conn.execute("SELECT verdict FROM candidates")]
    finally:
        conn.close()
    assert time.time() - beat < 5 and verdicts == ["pass"] * len(HOSTILE)
    assert daemon.stop() == 0
