"""``kernelab doctor``: find out why nothing is happening, one check per function.

Every check is read-only: it never creates the home, migrates the database or touches a GPU
setting. Each returns ``ok``, ``warn`` (kernelab works, but less well than it could) or
``fail`` (something the user must fix), with what it saw and how to fix it.
"""

from __future__ import annotations

import grp
import importlib.metadata
import json
import os
import pwd
import socket
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernelabd.config import Config, ConfigError, load
from kernelabd.harness import nvml as nvml_lib
from kernelabd.service.ceilings import describe
from kernelabd.service.security import inbox_problem
from store.db import SCHEMA_VERSION, StoreError, connect
from store.home import Home
from store.status import HEARTBEAT_STALE_S, pid_alive

OK, WARN, FAIL = "ok", "warn", "fail"

PACKAGES = ("torch", "triton", "textual", "cuda-python", "nvidia-ml-py")
# The WAL-reset corruption bug is fixed from this SQLite on (research: tui-daemon-ecosystem §5).
SQLITE_FIXED = (3, 51, 3)
VOLTA_MAJOR = 7   # locked clocks need compute capability 7.0 or newer


@dataclass
class Check:
    name: str
    status: str   # ok | warn | fail
    detail: str
    hint: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def check_python() -> Check:
    """Which interpreter runs kernelab: the one whose packages the checks below describe."""
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("python", OK, f"Python {version} at {sys.executable}")


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_package(dist: str) -> Check:
    """Installed version of ``dist``; a CPU-only torch build cannot time GPU kernels."""
    name = f"package:{dist}"
    version = _installed(dist)
    if version is None and dist == "cuda-python":
        # The cuda-python metapackage only pulls cuda-bindings, which is what gets imported.
        bindings = _installed("cuda-bindings")
        if bindings is not None:
            return Check(name, OK, f"cuda-bindings {bindings} (without the cuda-python "
                         "metapackage)")
    if version is None:
        return Check(name, FAIL, f"{dist} is not installed",
                     f"install it into kernelab's environment: pip install '{dist}' "
                     "(or reinstall kernelab, which depends on it)")
    if dist == "torch" and version.endswith("+cpu"):
        return Check(name, WARN, f"torch {version} is a CPU-only build",
                     "on a GPU box install a CUDA build of torch (pytorch.org, 'Get started')")
    return Check(name, OK, f"{dist} {version}")


def check_sqlite() -> Check:
    version = sqlite3.sqlite_version
    if sqlite3.sqlite_version_info < SQLITE_FIXED:
        return Check("sqlite", WARN,
                     f"SQLite {version} predates 3.51.3, which fixed a rare WAL-reset "
                     "corruption with several writers",
                     "kernelab keeps a single writer, which avoids it; a newer Python or OS "
                     "SQLite removes the risk")
    return Check("sqlite", OK, f"SQLite {version}")


def check_config(home: Home) -> Check:
    if not home.config.exists():
        return Check("config", OK, f"no {home.config}: all defaults")
    try:
        cfg = load(home.config)
    except ConfigError as exc:
        return Check("config", FAIL, str(exc), "fix the key it names (systemd/"
                     "kernelab.toml.example documents every key); the daemon will not start")
    return Check("config", OK, f"{home.config} (lock_clocks = {cfg.timing.lock_clocks})")


def _config_or_default(home: Home) -> Config:
    try:
        return load(home.config)
    except ConfigError:
        return Config()


class NoDriver(Exception):
    """NVML is not usable here: no driver library, or no kernel module."""


@contextmanager
def nvml() -> Iterator[Any]:
    """``pynvml`` initialised for the block; ``NoDriver`` when this machine has no driver."""
    try:
        with nvml_lib.opened() as pynvml:
            yield pynvml
    except nvml_lib.NvmlUnavailable as exc:
        if exc.no_driver:
            raise NoDriver(str(exc)) from exc
        raise


NO_GPU_HINT = ("kernelab still runs on the CPU (Triton interpreter) for trying it out, but "
               "times nothing on a GPU; on a GPU box install the NVIDIA driver "
               "(nvidia-smi must work)")


def check_driver() -> Check:
    try:
        with nvml() as pynvml:
            driver = nvml_lib.text(pynvml.nvmlSystemGetDriverVersion())
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    except NoDriver as exc:
        return Check("nvidia-driver", WARN, f"no NVIDIA driver (NVML: {exc}): no GPU here",
                     NO_GPU_HINT)
    except Exception as exc:
        return Check("nvidia-driver", FAIL, f"NVML failed: {exc}",
                     "check nvidia-smi; reload the driver or reboot after a driver update")
    return Check("nvidia-driver", OK,
                 f"driver {driver}, CUDA {cuda // 1000}.{cuda % 1000 // 10}")


def check_gpus() -> Check:
    try:
        with nvml() as pynvml:
            names = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
                names.append(f"{index}: {nvml_lib.text(pynvml.nvmlDeviceGetName(handle))} "
                             f"({memory:.0f} GiB)")
    except NoDriver:
        return Check("gpus", WARN, "no GPU found: kernelab will run on the CPU only",
                     "see nvidia-driver")
    except Exception as exc:
        return Check("gpus", FAIL, f"NVML could not list GPUs: {exc}", "check nvidia-smi -L")
    if not names:
        return Check("gpus", WARN, "the driver is loaded but NVML sees no GPU",
                     "check nvidia-smi -L; inside a container, pass the GPUs in")
    if not Path("/dev/nvidia-uvm").exists():
        return Check("gpus", WARN, f"{'; '.join(names)}; but /dev/nvidia-uvm is missing",
                     "CUDA needs it, and the hardened service cannot create it: "
                     "sudo nvidia-modprobe -u -c=0, or load nvidia-uvm at boot")
    return Check("gpus", OK, "; ".join(names))


def _lock_capability(pynvml: Any) -> tuple[bool, str]:
    """Whether this process could lock SM clocks on every GPU, asking only (nothing is set)."""
    if os.geteuid() != 0:
        return False, "not root (NVML lets only root lock clocks)"
    notes = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        if major < VOLTA_MAJOR:
            return False, f"GPU {index} is compute capability {major}.{minor} (needs Volta+)"
        mem = max(pynvml.nvmlDeviceGetSupportedMemoryClocks(handle))
        graphics = pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem)
        notes.append(f"GPU {index}: {min(graphics)}-{max(graphics)} MHz")
    return True, "root; " + "; ".join(notes)


def _clock_notes(pynvml: Any) -> str:
    """Facts that bear on locking, each skipped where this GPU does not report it: whether
    non-root users may set application clocks (not reported on Hopper), and persistence mode
    (without it the driver may unload and forget locked clocks between runs)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    notes = []
    try:
        restricted = pynvml.nvmlDeviceGetAPIRestriction(
            handle, pynvml.NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS)
        notes.append("application clocks: " + ("root only" if restricted else "any user"))
    except pynvml.NVMLError_NotSupported:
        pass
    try:
        persistent = pynvml.nvmlDeviceGetPersistenceMode(handle)
        notes.append("persistence mode " + ("on" if persistent else "off"))
    except pynvml.NVMLError_NotSupported:
        pass
    return "; ".join(notes)


def check_clocks(home: Home) -> Check:
    """Whether ``lock_clocks`` can work here, decided from queries only."""
    lock = _config_or_default(home).timing.lock_clocks
    try:
        with nvml() as pynvml:
            if pynvml.nvmlDeviceGetCount() == 0:
                raise NoDriver("no GPU")
            able, why = _lock_capability(pynvml)
            notes = _clock_notes(pynvml)
            why = f"{why}; {notes}" if notes else why
    except NoDriver:
        if lock == "off":
            return Check("clocks", OK, "lock_clocks = off; no GPU to lock")
        return Check("clocks", WARN, f"lock_clocks = {lock}, but there is no GPU here",
                     'set lock_clocks = "off"')
    except Exception as exc:
        return Check("clocks", WARN, f"could not query clock control: {exc}",
                     'keep lock_clocks = "off" until nvidia-smi -q -d CLOCK works')
    if lock == "off":
        could = "could be locked" if able else "could not be locked"
        return Check("clocks", OK, f"lock_clocks = off (default): not locked; {could} ({why})")
    if able:
        return Check("clocks", OK, f"lock_clocks = {lock}: can lock ({why})")
    if os.geteuid() != 0:
        return Check("clocks", WARN, f"lock_clocks = {lock}: {why}",
                     "run doctor with sudo to check for real; the daemon must run as root "
                     '(systemctl edit kernelabd: User=root) or set lock_clocks = "off"')
    return Check("clocks", FAIL, f"lock_clocks = {lock}: {why}", 'set lock_clocks = "off"')


def _mode(path: Path) -> str:
    st = path.stat()
    return f"mode {stat.S_IMODE(st.st_mode):04o}, owner {_user(st.st_uid)}:{_group(st.st_gid)}"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def check_inbox(home: Home) -> Check:
    if not home.inbox.exists():
        return Check("inbox", WARN, f"no inbox at {home.inbox} yet",
                     "kernelab service install (or the daemon's first start) creates it; "
                     "for the service, pass --home /var/lib/kernelab")
    problem = inbox_problem(home.inbox)
    if problem is not None:
        reason, fix = problem
        return Check("inbox", FAIL, f"{reason}; the daemon refuses to watch it", fix)
    return Check("inbox", OK, f"{home.inbox} ({_mode(home.inbox)})")


def check_database_permissions(home: Home) -> Check:
    name = "database-permissions"
    if not home.db.exists():
        return Check(name, WARN, f"no database at {home.db} yet",
                     "the daemon creates it on its first start")
    for path in (home.root, home.db):
        mode = path.stat().st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            return Check(name, FAIL, f"{path} is writable by every user ({_mode(path)}): "
                         "anyone could rewrite the results or the job queue",
                         f"chmod o-w {path}")
    if not os.access(home.db, os.R_OK):
        return Check(name, FAIL, f"cannot read {home.db} ({_mode(home.db)})",
                     "add yourself to its group (sudo usermod -aG kernelab $USER), then log "
                     "in again")
    return Check(name, OK, f"{home.db} ({_mode(home.db)})")


def _open_readonly(home: Home) -> sqlite3.Connection:
    return connect(home.db, readonly=True)


def check_database(home: Home) -> Check:
    """``PRAGMA quick_check`` and the schema version, through a read-only connection."""
    if not home.db.exists():
        return Check("database", WARN, f"no database at {home.db} yet",
                     "the daemon creates it on its first start")
    try:
        conn = _open_readonly(home)
        try:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.close()
    except StoreError as exc:
        return Check("database", FAIL, str(exc), "upgrade kernelab to the daemon's version")
    except sqlite3.DatabaseError as exc:
        return Check("database", FAIL, f"{home.db}: {exc}", _repair_hint(home))
    if problems != ["ok"]:
        return Check("database", FAIL, f"{home.db}: quick_check: {'; '.join(problems[:3])}",
                     _repair_hint(home))
    if version < SCHEMA_VERSION:
        return Check("database", WARN, f"schema version {version}, this kernelab writes "
                     f"{SCHEMA_VERSION}", "restart the daemon: it migrates on start")
    return Check("database", OK, f"{home.db}: quick_check ok, schema version {version}")


def _repair_hint(home: Home) -> str:
    return (f"stop the daemon, move {home.db.name} aside (keep it for the record), start the "
            f"daemon again: it creates a fresh database and requeues the inbox")


def _rows(home: Home, sql: str) -> list[sqlite3.Row]:
    """One read-only query, the connection closed at once (the daemon keeps writing)."""
    conn = _open_readonly(home)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def check_daemon(home: Home, now: float | None = None) -> Check:
    """Is a daemon alive on this home? Read from its heartbeat row (``daemon`` id 1)."""
    hint = ("sudo systemctl start kernelabd (journalctl -u kernelabd -e says why it stopped), "
            f"or run: kernelab daemon --home {home.root}")
    if not home.db.exists():
        return Check("daemon", WARN, "no daemon has run with this home yet (no database)", hint)
    try:
        row = next(iter(_rows(home, "SELECT * FROM daemon WHERE id = 1")), None)
    except (StoreError, sqlite3.Error) as exc:
        return Check("daemon", WARN, f"cannot read the heartbeat: {exc}", hint)
    if row is None or row["heartbeat_at"] is None:
        return Check("daemon", WARN, "no daemon has run with this home yet", hint)
    age = (now if now is not None else time.time()) - row["heartbeat_at"]
    who = f"pid {row['pid']} on {row['host']} (kernelab {row['version']})"
    status = str(row["status"] or "")
    if status.startswith("stop"):
        return Check("daemon", WARN, f"not running: {who} stopped {age:.0f} s ago", hint)
    if row["host"] == socket.gethostname() and row["pid"] and not pid_alive(row["pid"]):
        return Check("daemon", FAIL, f"{who} is gone without stopping cleanly "
                     f"(last heartbeat {age:.0f} s ago): it crashed or was killed", hint)
    if age > HEARTBEAT_STALE_S:
        return Check("daemon", FAIL, f"{who} last beat {age:.0f} s ago (status {status!r}): "
                     "hung or dead", hint)
    return Check("daemon", OK, f"{who}, {status or 'running'}, heartbeat {age:.0f} s ago")


USERNS_HINT = ("enable unprivileged user namespaces: sudo sysctl -w kernel.unprivileged_userns_clone=1 "
               "(Debian), user.max_user_namespaces=15000, or kernel.apparmor_restrict_unprivileged_userns=0 "
               "(Ubuntu 24.04); or run kernelab as root, with [sandbox] user")


def check_isolation(home: Home) -> Check:
    """Which isolation and fences sandboxes get on this machine, tried for real (``unshare``
    is run once), and whether user namespaces are disabled here."""
    from kernelabd.harness.isolation import probe, userns_switch

    sandbox = _config_or_default(home).sandbox
    iso = probe(sandbox.isolation, sandbox.user)
    switch = userns_switch()
    disabled = f"; user namespaces are disabled ({switch})" if switch else ""
    if iso.mode == "unavailable":
        return Check("isolation", FAIL, iso.detail, USERNS_HINT)
    if iso.mode == "none":
        return Check("isolation", WARN, iso.warning + disabled,
                     'remove [sandbox] isolation = "none" where namespaces work (this check then says ok)')
    if iso.mode == "user":
        return Check("isolation", WARN, iso.warning + disabled, "install util-linux (unshare)")
    if iso.warning:
        return Check("isolation", WARN, iso.detail + disabled, "install libseccomp2 (apt/dnf)")
    return Check("isolation", OK, iso.detail + disabled)


def check_sandbox_memory(home: Home) -> Check:
    """How ``[sandbox] memory_gb`` is enforced here, on CPU and on GPU sandboxes (looked up
    only: no cgroup is made or changed)."""
    from kernelabd.harness.containment import cgroup_offered, containment

    limit = _config_or_default(home).sandbox.memory_gb
    where = cgroup_offered()
    modes = {"cgroup": f"a cgroup v2 under {where}", "rlimit": "RLIMIT_AS",
             "watchdog": "a resident-memory watchdog"}
    how = f"CPU sandboxes: {modes[containment('cpu')]}; GPU sandboxes: {modes[containment('cuda')]}"
    hint = "" if where else ("for a cgroup per sandbox, run the daemon under systemd with Delegate=memory "
                             "(the shipped unit has it)")
    if limit <= 0:
        return Check("sandbox-memory", OK, f"memory_gb = 0: no limit; with one, {how}", hint)
    return Check("sandbox-memory", OK, f"memory_gb = {limit:g}: {how}", hint)


def check_ceilings(home: Home) -> Check:
    """The measured speed-of-light ceilings (copy bandwidth, matrix rate) per device."""
    hint = ("they are measured on a device's first job (a few seconds of copies and matrix "
            "products); until then no job there has a speed-of-light floor")
    if not home.db.exists():
        return Check("ceilings", WARN, "not measured yet (no database)", hint)
    try:
        rows = _rows(home, "SELECT id, ceilings FROM devices ORDER BY id")
    except (StoreError, sqlite3.Error) as exc:
        return Check("ceilings", WARN, f"cannot read devices: {exc}", hint)
    measured = []
    for row in rows:
        if row["ceilings"]:
            try:
                measured.append(f"{row['id']}: {describe(json.loads(row['ceilings']))}")
            except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
                return Check("ceilings", WARN, f"{row['id']}: unreadable ceilings JSON", hint)
    if not measured:
        return Check("ceilings", WARN, "not measured yet: no job has run on a device here", hint)
    return Check("ceilings", OK, "; ".join(measured))


def run_checks(home: Home) -> list[Check]:
    """Every check, in the order a person would fix things."""
    steps: list[Callable[[], Check]] = [
        check_python,
        *[lambda d=dist: check_package(d) for dist in PACKAGES],
        check_sqlite,
        lambda: check_config(home),
        check_driver,
        check_gpus,
        lambda: check_clocks(home),
        lambda: check_isolation(home),
        lambda: check_sandbox_memory(home),
        lambda: check_inbox(home),
        lambda: check_database_permissions(home),
        lambda: check_database(home),
        lambda: check_daemon(home),
        lambda: check_ceilings(home),
    ]
    return [step() for step in steps]
