"""Drop generated malformed inputs into a real CPU daemon and judge what it made of each.

    python bench/fuzz/run.py OUT [--cases 1000] [--seed 1] [--wave 30]

One ``python -m kernelabd daemon --device cpu`` runs on a fresh home under ``OUT/run/`` with
short limits (``LIMITS``), its ``HOME`` and ``TMPDIR`` pointed at empty folders beside the
kernelab home, so that anything the daemon or the code it runs leaves outside the home is seen.
Cases (``generate.py``) are dropped in waves; each must end within its deadline in a terminal
state whose reason is non-empty and names its file (and the cause, where its kind says):

- a job: ``done``, ``failed`` or ``invalid`` within ``job_deadline_s`` of its start (a job
  still running then is cancelled, and counted past its deadline), recorded within
  ``record_s`` of the drop;
- an odd entry (a link, a FIFO, a bad name, a lone sidecar): an inbox event naming it, within
  ``record_s``.

The daemon must stay up (a death is counted and it is restarted, so the run still finishes)
and exit 0 on SIGTERM. ``OUT/results.jsonl`` has one line per case, ``OUT/summary.json`` the
totals; the table printed last groups the kinds by family.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from store.db import NotCreatedYet, StoreError, connect  # noqa: E402
from store.home import Home  # noqa: E402


def _sibling(name: str) -> ModuleType:
    """A module of this folder (bench/ is no package), registered so dataclasses resolve."""
    spec = importlib.util.spec_from_file_location(f"kernelab_fuzz_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _sibling("generate")

TERMINAL = ("done", "failed", "invalid", "cancelled")
POLL_S = 0.5


@dataclass
class Limits:
    """The daemon's limits and the deadlines they imply."""

    gate_timeout_s: float = 60.0      # [gate] timeout_s: one evaluation's deadline (2 loaded cores)
    max_minutes: float = 0.5          # [jobs] max_minutes
    grace_s: float = 45.0             # starting a worker (torch's import) and capturing the reference
    record_s: float = 60.0            # from a drop to its job or event

    @property
    def job_deadline_s(self) -> float:
        """A job's wall time from its start: its budget, one evaluation past it, the grace."""
        return self.max_minutes * 60 + self.gate_timeout_s + self.grace_s

    def toml(self) -> str:
        return (f"[daemon]\nstable_s = 0.5\nrescan_s = 2.0\n[jobs]\nmax_candidates = 2\n"
                f"max_minutes = {self.max_minutes}\nproposers = [\"tune\"]\n"
                f"[gate]\ntimeout_s = {self.gate_timeout_s}\n[timing]\nbudget_s = 0.2\nmin_pairs = 2\n")


@dataclass
class Result:
    """What became of one case."""

    kind: str
    cost: str
    name: str
    expect: str
    dropped_at: float
    state: str | None = None          # the job's state, or the event's kind
    reason: str | None = None
    recorded_s: float | None = None   # drop → job or event recorded
    took_s: float | None = None       # job start → end
    cancelled: bool = False           # past its deadline: cancelled by this script
    problems: list[str] = field(default_factory=list)


@dataclass
class Report:
    results: list[Result]
    daemon_deaths: list[str]          # exit status and log tail of each unexpected death
    outside: list[str]                # paths written outside the home
    stop_status: int | None           # the daemon's exit status on SIGTERM
    log_bytes: int
    longest_log_line: int
    wall_s: float

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.problems]


class Daemon:
    """The daemon under test, restarted when it dies (each death recorded)."""

    def __init__(self, root: Path, limits: Limits) -> None:
        self.root = root
        self.home = Home(root / "home")
        self.user, self.tmp = root / "user", root / "tmp"
        for folder in (self.home.inbox, self.user, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        self.home.config.write_text(limits.toml())
        self.log = root / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.deaths: list[str] = []

    def start(self) -> None:
        env = {**os.environ, "HOME": str(self.user), "TMPDIR": str(self.tmp), "PYTHONPATH": str(ROOT)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelabd", "daemon", "--home", str(self.home.root), "--device", "cpu"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def check_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return
        tail = self.log.read_bytes()[-2000:].decode(errors="replace")
        self.deaths.append(f"exit status {code}: {tail}")
        self.start()

    def stop(self) -> int | None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


def drop(inbox: Path, case: generate.Case) -> float:
    """Put a case's entries into the inbox (files renamed in unless written in place); returns
    when it was done."""
    folder = os.fsencode(inbox)
    for entry in case.entries:
        path = folder + b"/" + entry.name
        if entry.kind == "symlink":
            os.symlink(entry.data, path)
        elif entry.kind == "fifo":
            os.mkfifo(path)
        elif entry.kind == "dir":
            os.mkdir(path)
        elif entry.in_place or len(entry.name) > 200:
            with open(path, "wb") as f:
                f.write(entry.data)
        else:
            temp = folder + b"/." + entry.name[:200] + b".tmp-fuzz"
            with open(temp, "wb") as f:
                f.write(entry.data)
            os.rename(temp, path)
    return time.time()


class Watch:
    """Reads the daemon's database (read-only) for jobs and inbox events."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.conn: sqlite3.Connection | None = None
        self.events: list[dict[str, Any]] = []
        self.last_event = 0

    def _conn(self) -> sqlite3.Connection | None:
        if self.conn is None and self.home.db.exists():
            try:
                self.conn = connect(self.home.db, readonly=True)
            except (NotCreatedYet, StoreError):
                return None
        return self.conn

    def refresh(self) -> dict[str, dict[str, Any]]:
        """Each problem's latest job; new inbox events are appended to ``events``."""
        conn = self._conn()
        if conn is None:
            return {}
        rows = conn.execute(
            "SELECT j.id, p.name, j.state, j.error, j.stop_reason, j.created_at, j.started_at, "
            "j.finished_at FROM jobs j JOIN problems p ON p.id = j.problem_id ORDER BY j.id").fetchall()
        for e in conn.execute("SELECT id, ts, kind, message FROM events WHERE id > ? AND kind LIKE 'inbox.%' "
                              "ORDER BY id", (self.last_event,)):
            self.events.append(dict(e))
            self.last_event = e["id"]
        return {r["name"]: dict(r) for r in rows}


def outcome(case: generate.Case, result: Result, jobs: dict[str, dict[str, Any]],
            events: list[dict[str, Any]], now: float, limits: Limits, home: Home) -> bool:
    """Update ``result`` from what the daemon recorded; True once the case is settled (ended,
    or past a deadline). A job running past its deadline is cancelled here."""
    if case.expect == "event":
        hit = next((e for e in events if case.culprit in e["message"]), None)
        if hit is not None:
            result.state, result.reason = hit["kind"], hit["message"]
            result.recorded_s = round(hit["ts"] - result.dropped_at, 3)
            return True
        return now - result.dropped_at > limits.record_s
    job = jobs.get(case.name)
    if job is None:
        return now - result.dropped_at > limits.record_s
    result.state = job["state"]
    result.reason = job["error"] or job["stop_reason"]
    result.recorded_s = round(job["created_at"] - result.dropped_at, 3)
    if job["state"] in TERMINAL:
        result.took_s = round(job["finished_at"] - (job["started_at"] or job["created_at"]), 3)
        return True
    if job["started_at"] and now - job["started_at"] > limits.job_deadline_s and not result.cancelled:
        from kernelabd.client import post

        post(home, "cancel", job["id"])
        result.cancelled = True
    return False


def judge(case: generate.Case, result: Result, limits: Limits) -> list[str]:
    """Why a settled case fails the contract (none: it passes)."""
    if result.state is None:
        return [f"no {'job' if case.expect == 'job' else 'event'} within {limits.record_s:g} s of the drop"]
    problems = []
    if result.recorded_s is not None and result.recorded_s > limits.record_s:
        problems.append(f"recorded {result.recorded_s:.0f} s after the drop")
    if result.cancelled or (result.took_s or 0) > limits.job_deadline_s:
        problems.append(f"past its deadline ({limits.job_deadline_s:g} s)")
    if case.expect == "job" and result.state not in TERMINAL:
        problems.append(f"still {result.state}")
    reason = result.reason or ""
    if not reason:
        problems.append("no reason")
    if result.state == "done":
        if not case.may_pass:
            problems.append("accepted: ended done")
        return problems
    names = [case.culprit] if not case.may_pass else [e.name.decode(errors="replace") for e in case.entries]
    if reason and not any(n in reason for n in names):
        problems.append(f"the reason does not name {' or '.join(names)}")
    words = reason.lower()
    for entry in case.entries:      # "exit" in f0042_reference_import_sys_exit.py is no cause
        words = words.replace(entry.name.decode(errors="replace").lower(), "")
    if reason and case.cause and not any(c.lower() in words for c in case.cause):
        problems.append(f"the reason does not say {' or '.join(case.cause)}")
    return problems


def written_outside(*folders: Path) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*"))


def run(cases: list[generate.Case], root: Path, limits: Limits, wave: int = 30,
        progress: Any = None) -> Report:
    """Every case through one daemon, ``wave`` at a time; the daemon is stopped at the end."""
    started = time.time()
    daemon = Daemon(root, limits)
    daemon.start()
    watch = Watch(daemon.home)
    results: list[Result] = []
    try:
        for first in range(0, len(cases), wave):
            batch = cases[first:first + wave]
            pending = {}
            for case in batch:
                result = Result(case.kind, generate.COST[case.kind], case.name, case.expect, 0.0)
                result.dropped_at = drop(daemon.home.inbox, case)
                results.append(result)
                pending[id(case)] = (case, result)
            while pending:
                time.sleep(POLL_S)
                daemon.check_alive()
                jobs, now = watch.refresh(), time.time()
                for key, (case, result) in list(pending.items()):
                    if outcome(case, result, jobs, watch.events, now, limits, daemon.home):
                        result.problems = judge(case, result, limits)
                        del pending[key]
            if progress is not None:
                progress(results)
    finally:
        status = daemon.stop()
        if watch.conn is not None:
            watch.conn.close()
    log = daemon.log.read_bytes()
    return Report(results=results, daemon_deaths=daemon.deaths,
                  outside=written_outside(daemon.user, daemon.tmp), stop_status=status,
                  log_bytes=len(log), longest_log_line=max((len(line) for line in log.split(b"\n")), default=0),
                  wall_s=round(time.time() - started, 1))


def family(kind: str) -> str:
    """``reference.import.loop`` → ``reference.import``."""
    return kind.rsplit(".", 1)[0] if kind.count(".") >= 2 else kind.split(".")[0]


def table(report: Report) -> str:
    by: dict[str, Counter[str]] = {}
    for r in report.results:
        c = by.setdefault(family(r.kind), Counter())
        c["cases"] += 1
        c["ok"] += not r.problems
        c["past deadline"] += any("deadline" in p for p in r.problems)
        c["no name/cause"] += any("does not" in p for p in r.problems)
    lines = [f"{'family':<22} {'cases':>6} {'ok':>6} {'past deadline':>14} {'no name/cause':>14}"]
    for fam in sorted(by):
        c = by[fam]
        lines.append(f"{fam:<22} {c['cases']:>6} {c['ok']:>6} {c['past deadline']:>14} {c['no name/cause']:>14}")
    total = len(report.results)
    lines.append(f"{'all':<22} {total:>6} {total - len(report.failed):>6}")
    lines.append(f"daemon deaths: {len(report.daemon_deaths)}; exit status on SIGTERM: {report.stop_status}; "
                 f"written outside the home: {len(report.outside)}; daemon log {report.log_bytes} bytes, "
                 f"longest line {report.longest_log_line}; wall {report.wall_s:.0f} s")
    return "\n".join(lines)


def summary(report: Report, seed: int, limits: Limits) -> dict[str, Any]:
    failed = Counter(p.replace(r.name, "NAME").split(" (")[0] for r in report.failed for p in r.problems)
    return {"seed": seed, "cases": len(report.results), "ok": len(report.results) - len(report.failed),
            "daemon_deaths": len(report.daemon_deaths), "past_deadline": sum(
                any("deadline" in p for p in r.problems) for r in report.results),
            "failures_by_problem": dict(failed), "outside_home": report.outside[:50],
            "stop_status": report.stop_status, "log_bytes": report.log_bytes,
            "longest_log_line": report.longest_log_line, "wall_s": report.wall_s,
            "limits": asdict(limits), "deaths": report.daemon_deaths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for results.jsonl, summary.json and the run")
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--mix", default="static=0.9,run=0.09,hang=0.01",
                        help="share of each cost class (generate.COST); 'kinds': in proportion to their kinds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wave", type=int, default=30, help="cases dropped at once")
    parser.add_argument("--gate-timeout-s", type=float, default=Limits.gate_timeout_s)
    parser.add_argument("--max-minutes", type=float, default=Limits.max_minutes)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # stop the daemon on the way out
    limits = Limits(gate_timeout_s=args.gate_timeout_s, max_minutes=args.max_minutes)
    root = args.out / "run"
    if root.exists():
        shutil.rmtree(root)
    weights = None if args.mix == "kinds" else {k: float(v) for k, v in
                                                 (part.split("=") for part in args.mix.split(","))}
    cases = generate.cases(args.seed, args.cases, weights)
    out = args.out / "results.jsonl"

    def progress(results: list[Result]) -> None:
        with open(out, "w") as f:
            f.writelines(json.dumps(asdict(r)) + "\n" for r in results)
        bad = sum(bool(r.problems) for r in results)
        print(f"{len(results)}/{len(cases)} cases, {bad} failing", flush=True)

    report = run(cases, root, limits, args.wave, progress)
    progress(report.results)
    (args.out / "summary.json").write_text(json.dumps(summary(report, args.seed, limits), indent=1) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
