"""The systemd units, the example configuration and ``kernelab service``, with real files,
the real ``systemd-analyze`` and the real CLI in subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from kernelabd.commands.service import (
    DEFAULT_BINDIR,
    SYSUSERS,
    Run,
    example_toml,
    render_unit,
    unreachable_by_others,
    user_plan,
)
from kernelabd.config import Config, parse
from kernelabd.service.security import check_inbox_permissions
from tests.gpu import nvml_works

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
BINDIR = Path(sys.executable).parent
KERNELAB = str(BINDIR / "kernelab")
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def directives(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_shipped_files_are_what_install_writes() -> None:
    assert (SYSTEMD / "kernelabd.service").read_text() == render_unit(user=False,
                                                                    bindir=DEFAULT_BINDIR)
    assert (SYSTEMD / "kernelabd-user.service").read_text() == render_unit(user=True,
                                                                          bindir=DEFAULT_BINDIR)
    assert (SYSTEMD / "kernelab.toml.example").read_text() == example_toml()
    assert (SYSTEMD / "kernelab-sysusers.conf").read_text() == SYSUSERS


def test_example_config_documents_every_key_with_its_default() -> None:
    text = example_toml()
    assert parse(text, "kernelab.toml.example") == Config()
    for section in fields(Config):
        if not is_dataclass(getattr(Config(), section.name)):
            assert f"[{section.name}." in text, f"[{section.name}.NAME] tables undocumented"
            continue
        body = text.split(f"[{section.name}]\n", 1)[1].split("\n[", 1)[0]
        for key in fields(getattr(Config(), section.name)):
            assert f"\n{key.name} = " in f"\n{body}", f"[{section.name}] {key.name} undocumented"
    assert "root" in text and "lock_clocks" in text


def test_system_unit_has_the_lifecycle_and_keeps_gpus_and_jit_usable() -> None:
    d = directives(render_unit(user=False, bindir=BINDIR))
    assert d["Type"] == ["notify"]
    assert d["User"] == ["kernelab"] and d["Group"] == ["kernelab"]
    assert d["StateDirectory"] == ["kernelab"] and d["ConfigurationDirectory"] == ["kernelab"]
    assert d["Restart"] == ["on-failure"] and d["KillMode"] == ["mixed"]
    assert d["WatchdogSec"] == ["30s"]
    assert d["ExecStart"] == [f"{BINDIR}/kernelabd"]
    assert d["ExecStopPost"] == [f"-+{BINDIR}/kernelab service release-clocks"]
    assert "-m 2770" in d["ExecStartPre"][0] and "%S/kernelab/inbox" in d["ExecStartPre"][0]
    assert d["PrivateDevices"] == ["no"]
    assert "MemoryDenyWriteExecute" not in d
    assert {"char-nvidia rw", "char-nvidia-uvm rw", "char-nvidiactl rw"} <= set(d["DeviceAllow"])


def verify(unit_text: str, name: str, tmp_path: Path, *, user: bool) -> list[str]:
    """``systemd-analyze verify`` on ``unit_text``; the lines of its output about our unit."""
    unit = tmp_path / name
    unit.write_text(unit_text)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    cmd = [ANALYZE, *(["--user"] if user else []), "verify", str(unit)]
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    output = (proc.stdout + proc.stderr).splitlines()
    ours = [line for line in output if name in line]
    assert proc.returncode == 0 or ours, proc.stdout + proc.stderr
    return ours


@needs_analyze
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_units_verify_cleanly(tmp_path: Path, user: bool) -> None:
    name = "kernelabd-user.service" if user else "kernelabd.service"
    assert verify(render_unit(user=user, bindir=BINDIR), name, tmp_path, user=user) == []


@needs_analyze
def test_verify_does_catch_a_bad_directive_here(tmp_path: Path) -> None:
    """Guards the test above: systemd-analyze on this machine really reports unit errors."""
    text = render_unit(user=False, bindir=BINDIR).replace("KillMode=mixed", "KilMode=mixed")
    problems = verify(text, "kernelabd.service", tmp_path, user=False)
    assert any("KilMode" in line for line in problems)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KERNELAB, *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "userhome"
    home.mkdir()
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_STATE_HOME": str(home / ".local/state")}


def tree(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


def test_dry_run_prints_the_units_and_changes_nothing(user_env: dict[str, str]) -> None:
    system_unit = Path("/etc/systemd/system/kernelabd.service")
    existed = system_unit.exists()
    proc = run_cli("service", "install", "--dry-run", env=user_env)
    assert proc.returncode == 0, proc.stderr
    assert render_unit(user=False, bindir=BINDIR) in proc.stdout
    assert "run systemctl enable --now kernelabd.service" in proc.stdout
    assert "nothing was changed" in proc.stdout
    assert system_unit.exists() == existed

    proc = run_cli("service", "install", "--user", "--dry-run", env=user_env)
    assert proc.returncode == 0, proc.stderr
    assert render_unit(user=True, bindir=BINDIR) in proc.stdout
    assert "run systemctl --user enable --now kernelabd.service" in proc.stdout
    assert tree(Path(user_env["HOME"])) == []


def test_user_install_files(user_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                            tmp_path: Path) -> None:
    """Apply every step of the user install except the systemctl calls."""
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(key, user_env[key])
    for step in user_plan(BINDIR):
        if not isinstance(step, Run):
            step.apply()
    home = Path(user_env["HOME"])
    unit = home / ".config/systemd/user/kernelabd.service"
    assert unit.read_text() == render_unit(user=True, bindir=BINDIR)
    state = home / ".local/state/kernelab"
    assert (state / "kernelab.toml").resolve() == home / ".config/kernelab/kernelab.toml"
    assert parse((state / "kernelab.toml").read_text()) == Config()
    assert check_inbox_permissions(state / "inbox") is None
    assert (state / "inbox").stat().st_mode & 0o777 == 0o700
    if ANALYZE:
        assert verify(unit.read_text(), "kernelabd.service", tmp_path, user=True) == []


def test_an_edited_config_is_never_overwritten(user_env: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(key, user_env[key])
    config = Path(user_env["XDG_CONFIG_HOME"]) / "kernelab/kernelab.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[timing]\nlock_clocks = "base"\n')
    for step in user_plan(BINDIR):
        if not isinstance(step, Run):
            step.apply()
    assert config.read_text() == '[timing]\nlock_clocks = "base"\n'


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A 0755 folder whose every parent other users can enter (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kernelab-test-"))
    path.chmod(0o755)
    if unreachable_by_others(path) is not None:
        shutil.rmtree(path)
        pytest.skip("the temporary folder is closed to other users here")
    yield path
    shutil.rmtree(path)


def test_unreachable_bindir_is_found(open_dir: Path) -> None:
    closed = open_dir / "closed"
    bindir = closed / "venv/bin"
    bindir.mkdir(parents=True, mode=0o755)
    closed.chmod(0o700)
    assert unreachable_by_others(bindir) == closed
    closed.chmod(0o755)
    bindir.chmod(0o755)
    (closed / "venv").chmod(0o755)
    assert unreachable_by_others(bindir) is None


def test_release_clocks_is_a_no_op_when_lock_clocks_is_off(tmp_path: Path) -> None:
    env = {**os.environ, "KERNELAB_HOME": str(tmp_path)}
    proc = run_cli("service", "release-clocks", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "lock_clocks is off" in proc.stdout
    assert sorted(tmp_path.iterdir()) == [], "it must not create the home"


def test_release_clocks_refuses_a_broken_config(tmp_path: Path) -> None:
    (tmp_path / "kernelab.toml").write_text('[timing]\nlock_clocks = "turbo"\n')
    proc = run_cli("service", "release-clocks", "--home", str(tmp_path), env=dict(os.environ))
    assert proc.returncode == 1
    assert "lock_clocks must be" in proc.stderr


@pytest.mark.skipif(nvml_works(), reason="would reset real GPU clocks")
def test_release_clocks_without_a_driver_has_nothing_to_release(tmp_path: Path) -> None:
    (tmp_path / "kernelab.toml").write_text('[timing]\nlock_clocks = "max"\n')
    proc = run_cli("service", "release-clocks", "--home", str(tmp_path), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA driver" in proc.stdout
