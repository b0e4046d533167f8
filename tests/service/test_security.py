"""The inbox trust boundary, checked on real directories with real modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelabd.service.security import INBOX_MODE, check_inbox_permissions, inbox_problem


def make_dir(path: Path, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_dir(tmp_path / "home", 0o755)


def test_service_mode_inbox_is_accepted(home: Path) -> None:
    inbox = make_dir(home / "inbox", INBOX_MODE)
    assert check_inbox_permissions(inbox) is None


def test_missing_inbox_is_not_refused(home: Path) -> None:
    assert check_inbox_permissions(home / "inbox") is None


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o2773, 0o702])
def test_inbox_writable_by_others_is_refused(home: Path, mode: int) -> None:
    inbox = make_dir(home / "inbox", mode)
    refusal = check_inbox_permissions(inbox)
    assert refusal is not None
    assert "\n" not in refusal
    assert str(inbox) in refusal
    assert f"chmod o-rwx {inbox}" in refusal


def test_world_writable_parent_is_refused(tmp_path: Path) -> None:
    parent = make_dir(tmp_path / "shared", 0o777)
    inbox = make_dir(parent / "inbox", INBOX_MODE)
    refusal = check_inbox_permissions(inbox)
    assert refusal is not None
    assert f"parent {parent}" in refusal
    assert f"chmod o-w {parent}" in refusal


def test_sticky_world_writable_parent_is_accepted(tmp_path: Path) -> None:
    """Like /tmp: others may create entries but not rename or delete ours."""
    parent = make_dir(tmp_path / "sticky", 0o1777)
    inbox = make_dir(parent / "inbox", INBOX_MODE)
    assert check_inbox_permissions(inbox) is None


def test_symlinked_inbox_is_judged_where_it_really_lives(home: Path, tmp_path: Path) -> None:
    exposed = make_dir(tmp_path / "exposed", 0o777)
    target = make_dir(exposed / "inbox", INBOX_MODE)
    link = home / "inbox"
    link.symlink_to(target)
    refusal = check_inbox_permissions(link)
    assert refusal is not None
    assert str(exposed) in refusal


def test_a_file_is_not_an_inbox(home: Path) -> None:
    (home / "inbox").write_text("")
    problem = inbox_problem(home / "inbox")
    assert problem is not None
    assert "not a directory" in problem[0]
