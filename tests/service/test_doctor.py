"""``kernelab doctor``: the real command in a subprocess on real homes, plus each store-backed
check on a real SQLite database."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelabd.service.doctor import (
    FAIL,
    HEARTBEAT_STALE_S,
    OK,
    WARN,
    check_ceilings,
    check_config,
    check_daemon,
    check_database,
    check_database_permissions,
    check_inbox,
)
from store.db import SCHEMA_VERSION, connect
from store.home import Home
from tests.gpu import nvml_works

KERNELAB = str(Path(sys.executable).parent / "kernelab")


def doctor(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELAB_HOME", "STATE_DIRECTORY")}
    return subprocess.run([KERNELAB, "doctor", "--home", str(home), *args], capture_output=True,
                          text=True, env=env, timeout=120)


def by_name(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    checks = json.loads(proc.stdout)["checks"]
    return {c["name"]: c for c in checks}


@pytest.fixture
def home(tmp_path: Path) -> Home:
    root = tmp_path / "home"
    root.mkdir(mode=0o750)
    return Home(root)


def make_db(home: Home) -> None:
    conn = connect(home.db)
    conn.close()


def test_fresh_home_json_shape_and_exit_zero(home: Home) -> None:
    proc = doctor(home.root, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"checks"}
    assert data["checks"], "no checks ran"
    for check in data["checks"]:
        assert set(check) == {"name", "status", "detail", "hint"}
        assert check["status"] in (OK, WARN, FAIL)
        assert check["detail"]
        if check["status"] != OK:
            assert check["hint"], f"{check['name']} has no fix hint"
    names = [c["name"] for c in data["checks"]]
    for expected in ("python", "package:torch", "package:triton", "package:textual",
                     "package:cuda-python", "package:nvidia-ml-py", "nvidia-driver", "gpus",
                     "clocks", "inbox", "database-permissions", "database", "daemon", "ceilings"):
        assert expected in names
    assert sorted(home.root.iterdir()) == [], "doctor must not create anything"


@pytest.mark.skipif(nvml_works(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_it_warns_clearly_and_exits_zero(home: Home) -> None:
    proc = doctor(home.root, "--json")
    assert proc.returncode == 0
    checks = by_name(proc)
    assert checks["gpus"]["status"] == WARN
    assert "no GPU" in checks["gpus"]["detail"]
    assert checks["nvidia-driver"]["status"] == WARN
    assert "CPU" in checks["nvidia-driver"]["hint"]


def test_human_output_is_a_table(home: Home) -> None:
    proc = doctor(home.root)
    assert proc.returncode == 0, proc.stderr
    assert "kernelab doctor" in proc.stdout
    assert "gpus" in proc.stdout and "ceilings" in proc.stdout
    assert " fail" in proc.stdout.splitlines()[-1]


def test_garbage_database_fails_with_a_hint(home: Home) -> None:
    home.db.write_bytes(b"this is not sqlite" * 100)
    proc = doctor(home.root, "--json")
    assert proc.returncode == 1
    check = by_name(proc)["database"]
    assert check["status"] == FAIL
    assert "not a database" in check["detail"]
    assert "move kernelab.db aside" in check["hint"]


def test_damaged_pages_fail_quick_check(home: Home) -> None:
    conn = connect(home.db)
    with conn:
        conn.executemany("INSERT INTO events (ts, kind, message) VALUES (?, 'x', ?)",
                         [(time.time(), "m" * 200) for _ in range(500)])
    conn.close()
    data = bytearray(home.db.read_bytes())
    page = 4096
    data[5 * page:8 * page] = b"\x5a" * (3 * page)
    home.db.write_bytes(bytes(data))
    check = check_database(home)
    assert check.status == FAIL
    assert "malformed" in check.detail or "quick_check" in check.detail
    assert check.hint


def test_newer_schema_fails(home: Home) -> None:
    make_db(home)
    conn = connect(home.db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    check = check_database(home)
    assert check.status == FAIL
    assert "upgrade" in check.hint


def test_healthy_database(home: Home) -> None:
    make_db(home)
    check = check_database(home)
    assert check.status == OK
    assert f"schema version {SCHEMA_VERSION}" in check.detail


def test_world_writable_inbox_fails_with_a_hint(home: Home) -> None:
    home.inbox.mkdir()
    home.inbox.chmod(0o777)
    proc = doctor(home.root, "--json")
    assert proc.returncode == 1
    check = by_name(proc)["inbox"]
    assert check["status"] == FAIL
    assert "refuses to watch" in check["detail"]
    assert check["hint"].startswith(f"chmod o-rwx {home.inbox}")


def test_service_inbox_is_ok(home: Home) -> None:
    home.inbox.mkdir()
    home.inbox.chmod(0o2770)
    check = check_inbox(home)
    assert check.status == OK
    assert "mode 2770" in check.detail


def test_world_writable_database_fails(home: Home) -> None:
    make_db(home)
    home.db.chmod(0o666)
    check = check_database_permissions(home)
    assert check.status == FAIL
    assert f"chmod o-w {home.db}" == check.hint
    home.db.chmod(0o660)
    assert check_database_permissions(home).status == OK


def test_bad_config_fails(home: Home) -> None:
    home.config.write_text("[timing]\nlock_clock = \"max\"\n")
    check = check_config(home)
    assert check.status == FAIL
    assert "lock_clock" in check.detail


def beat(home: Home, *, pid: int, age_s: float, status: str = "running",
         host: str | None = None) -> None:
    conn = connect(home.db)
    with conn:
        conn.execute("INSERT OR REPLACE INTO daemon (id, pid, host, version, started_at, "
                     "heartbeat_at, status) VALUES (1, ?, ?, '0.1.0', ?, ?, ?)",
                     (pid, host or socket.gethostname(), time.time() - 3600,
                      time.time() - age_s, status))
    conn.close()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_daemon_heartbeat(home: Home) -> None:
    assert check_daemon(home).status == WARN, "no database yet"
    make_db(home)
    assert check_daemon(home).status == WARN, "no heartbeat row yet"
    beat(home, pid=os.getpid(), age_s=2)
    check = check_daemon(home)
    assert check.status == OK
    assert f"pid {os.getpid()}" in check.detail
    beat(home, pid=os.getpid(), age_s=HEARTBEAT_STALE_S + 30)
    assert check_daemon(home).status == FAIL, "alive but wedged"
    beat(home, pid=dead_pid(), age_s=1)
    check = check_daemon(home)
    assert check.status == FAIL
    assert "gone" in check.detail
    beat(home, pid=dead_pid(), age_s=600, status="stopped")
    assert check_daemon(home).status == WARN, "a clean stop is not a failure"
    beat(home, pid=1, age_s=HEARTBEAT_STALE_S + 30, host="another-host")
    assert check_daemon(home).status == FAIL


def test_ceilings(home: Home) -> None:
    make_db(home)
    check = check_ceilings(home)
    assert check.status == WARN
    assert "not measured" in check.detail
    conn = connect(home.db)
    with conn:
        conn.execute("INSERT INTO devices (id, name, ceilings, updated_at) VALUES "
                     "('cuda:0', 'NVIDIA H200', ?, ?)",
                     (json.dumps({"device_name": "NVIDIA H200", "copy_gbps": 4012.3456,
                                  "bf16_tflops": 801.2, "fp32_tflops": 51.04}),
                      time.time()))
    conn.close()
    check = check_ceilings(home)
    assert check.status == OK
    assert check.detail == "cuda:0: NVIDIA H200: copy 4012 GB/s; TFLOP/s bf16 801.2, fp32 51.04"


@pytest.mark.gpu
@pytest.mark.skipif(not nvml_works(), reason="needs an NVIDIA driver")
def test_on_a_gpu_box_the_gpu_checks_pass(home: Home) -> None:
    """Only queries: doctor never changes a GPU setting."""
    checks = by_name(doctor(home.root, "--json"))
    assert checks["nvidia-driver"]["status"] == OK
    assert checks["gpus"]["status"] == OK
    assert "NVIDIA" in checks["gpus"]["detail"]
    assert checks["clocks"]["status"] == OK, checks["clocks"]
    assert checks["clocks"]["detail"].startswith("lock_clocks = off (default): not locked;")


def test_isolation_says_which_fences_sandboxes_get_here(home: Home) -> None:
    from kernelabd.harness.isolation import probe

    checks = by_name(doctor(home.root, "--json"))
    isolation = checks["isolation"]
    if not probe("namespaces", "").namespaced:
        assert isolation["status"] == FAIL and "user namespaces" in isolation["hint"]
        return
    assert isolation["status"] in (OK, WARN), isolation
    mode = "root" if os.geteuid() == 0 else "userns"
    assert isolation["detail"].startswith(f"{mode}: pid, mount, net, ipc, filesystem"), isolation
    assert ("as nobody" if mode == "root" else "user namespace") in isolation["detail"]


def test_isolation_none_is_a_warning_naming_what_it_gives_up(home: Home) -> None:
    home.config.write_text('[sandbox]\nisolation = "none"\nmemory_gb = 8\n')
    checks = by_name(doctor(home.root, "--json"))
    assert checks["isolation"]["status"] == WARN
    assert "can signal, trace or read" in checks["isolation"]["detail"]
    memory = checks["sandbox-memory"]
    assert memory["status"] == OK and memory["detail"].startswith("memory_gb = 8: CPU sandboxes: ")
    assert "GPU sandboxes: " in memory["detail"] and "RLIMIT_AS" not in memory["detail"].split("GPU")[1]
