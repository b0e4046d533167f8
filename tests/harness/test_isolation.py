"""Which isolation a sandbox gets, decided on this machine for real, and what its filesystem
allow-list holds: kernelab's package and the Python environment, never the tree around them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernelabd
from kernelabd.harness.isolation import environment_paths, probe

ROOT = Path(__file__).resolve().parents[2]
ROOTED = os.geteuid() == 0


def test_the_allow_list_holds_kernelabs_packages_but_not_the_checkout_around_them() -> None:
    paths = environment_paths(dict(os.environ))
    package = Path(kernelabd.__file__).resolve().parent
    assert str(package) in paths and str(package.parent / "store") in paths
    assert not any(Path(p) in (package.parent, Path("/")) for p in paths), "homes and results live beside it"
    assert str(package.parent / "tui") not in paths
    assert any(Path(sys.prefix).is_relative_to(p) for p in paths), "the interpreter's environment"


def test_the_trusted_process_working_directory_is_not_in_the_allow_list(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])    # as `python -m` puts the cwd first
    assert str(tmp_path) not in environment_paths({})


def test_isolation_none_is_a_choice_and_warns_what_it_gives_up() -> None:
    iso = probe("none", "")
    assert iso.mode == "none" and not iso.namespaced and iso.fences == ()
    assert "can signal, trace or read kernelab" in iso.warning


@pytest.mark.skipif(not probe("namespaces", "").namespaced, reason="no namespaces on this machine")
def test_namespaces_by_default_as_root_drop_to_nobody_and_as_a_user_in_a_user_namespace() -> None:
    iso = probe("namespaces", "")
    assert iso.mode == ("root" if ROOTED else "userns")
    assert {"pid", "mount", "net", "ipc", "filesystem"} <= set(iso.fences)
    if ROOTED:
        assert iso.account is not None and iso.account[0] != 0 and "as nobody" in iso.detail


@pytest.mark.skipif(not ROOTED, reason="a sandbox user is only used by root")
def test_a_sandbox_user_that_does_not_exist_gives_no_sandbox() -> None:
    iso = probe("namespaces", "kernelab-no-such-user")
    assert iso.mode == "unavailable" and "kernelab-no-such-user" in iso.detail


@pytest.mark.skipif(not ROOTED, reason="a sandbox user is only used by root")
def test_isolation_none_as_root_with_a_sandbox_user_still_drops_to_it() -> None:
    iso = probe("none", "nobody")
    assert iso.mode == "user" and iso.account is not None and iso.account[0] != 0
    assert 'isolation = "none"' in iso.warning


def test_without_unshare_root_falls_back_to_a_separate_user_and_others_get_no_sandbox(tmp_path: Path) -> None:
    code = ("import json; from kernelabd.harness.isolation import probe; i = probe('namespaces', ''); "
            "print(json.dumps([i.mode, i.detail, i.warning]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PATH": str(tmp_path)})
    mode, detail, warning = json.loads(done.stdout)
    if ROOTED:
        assert mode == "user" and "unshare is not installed" in warning and "without PID" in warning
    else:
        assert mode == "unavailable" and "unshare is not installed" in detail and 'isolation = "none"' in detail
