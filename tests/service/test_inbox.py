"""The inbox: complete files only, rescans, dedupe, revisions, naming conventions."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from kernelabd.service.inbox import Inbox, classify, take_ready
from store.db import connect
from store.records import Store

REF = "n = 1\nclass Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(connect(tmp_path / "kernelab.db"))


@pytest.fixture
def inbox(tmp_path: Path):
    box = Inbox(tmp_path / "inbox", stable_s=0.5, rescan_s=60.0)
    box.start()
    yield box
    box.stop()


def settle(inbox: Inbox, store: Store, seconds: float = 2.0) -> list[int]:
    """Poll the inbox like the daemon's loop does, for a while."""
    jobs: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        jobs += take_ready(inbox, store)
        time.sleep(0.05)
    return jobs


def rename_in(folder: Path, name: str, text: str) -> None:
    tmp = folder / f".{name}.tmp-1"
    tmp.write_text(text)
    os.replace(tmp, folder / name)


@pytest.mark.parametrize("name, expected", [
    ("softmax.py", ("reference", "softmax")), ("softmax.toml", ("sidecar", "softmax")),
    ("softmax.new.py", ("start", "softmax")), ("notes.txt", ("ignored", "notes.txt")),
    (".softmax.py.tmp-12", None), ("softmax.py.part", None), ("softmax.py~", None),
])
def test_classify(name, expected):
    assert classify(name) == expected


def test_renamed_file_is_taken_at_once(tmp_path, store):
    """A rename is the writer saying the file is complete: taken without the stability wait,
    here 5 s so that a loaded CI machine's scheduling (half a second at worst seen) cannot
    pass for it."""
    box = Inbox(tmp_path / "renamed", stable_s=5.0, rescan_s=60.0)
    box.start()
    try:
        rename_in(box.folder, "a.py", REF)
        start = time.monotonic()
        while not take_ready(box, store):
            assert time.monotonic() - start < 2.5, "a renamed file needs no stability wait"
            time.sleep(0.02)
    finally:
        box.stop()


def test_file_written_in_place_is_taken_only_once_complete(inbox, store):
    path = inbox.folder / "slow.py"
    with open(path, "w") as f:
        for line in ["class Model: pass\n", "def get_inputs(): return []\n", "# …\n" * 3]:
            f.write(line)
            f.flush()
            assert settle(inbox, store, 0.3) == []   # still growing: not complete
        f.write("def get_init_inputs(): return []\n")
    (job,) = settle(inbox, store, 0.3)               # closed: taken without waiting
    assert store.job(job)["source"] == path.read_text()
    assert store.job(job)["state"] == "queued"


def test_files_present_before_start_are_found_by_the_first_scan(tmp_path, store):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "early.py").write_text(REF)
    old = time.time() - 60
    os.utime(folder / "early.py", (old, old))
    box = Inbox(folder, stable_s=30.0, rescan_s=60.0, polling=True)
    box.start()
    try:
        assert len(take_ready(box, store)) == 1      # old and untouched: complete already
    finally:
        box.stop()


def test_same_content_again_is_not_a_new_job_but_a_change_is(inbox, store):
    rename_in(inbox.folder, "a.py", REF)
    assert len(settle(inbox, store, 1.0)) == 1
    rename_in(inbox.folder, "a.py", REF)             # same bytes, new inode and mtime
    assert settle(inbox, store, 1.0) == []
    rename_in(inbox.folder, "a.py", REF + "# changed\n")
    (job,) = settle(inbox, store, 1.0)
    assert store.job(job)["revision"] == 2
    (inbox.folder / "a.py").unlink()                 # deleting loses nothing recorded
    settle(inbox, store, 0.6)
    assert store.conn.execute("SELECT COUNT(*) FROM problems").fetchone()[0] == 2


def test_sidecar_and_start_candidate_travel_with_their_reference(inbox, store):
    rename_in(inbox.folder, "k.toml", "[sizes.cuda]\nn = 4\n")
    rename_in(inbox.folder, "k.new.py", "class ModelNew: pass\n")
    assert settle(inbox, store, 0.8) == []           # no reference yet: nothing to queue
    rename_in(inbox.folder, "k.py", REF)
    (job,) = settle(inbox, store, 1.0)
    row = store.job(job)
    assert (row["sidecar"], row["start_source"], row["kind"]) == (
        "[sizes.cuda]\nn = 4\n", "class ModelNew: pass\n", "tune")


def test_malformed_reference_becomes_an_invalid_job_with_its_cause(inbox, store):
    rename_in(inbox.folder, "broken.py", "class Model(:\n")
    rename_in(inbox.folder, "nomodel.py", "def get_inputs(): return []\n")
    jobs = settle(inbox, store, 1.0)
    errors = sorted(store.job(j)["error"] for j in jobs)
    assert [store.job(j)["state"] for j in jobs] == ["invalid", "invalid"]
    assert "broken.py:1: syntax error" in errors[0]
    assert "nomodel.py" in errors[1] and "Model" in errors[1]


def test_other_files_are_ignored_with_one_event(inbox, store):
    rename_in(inbox.folder, "README.txt", "hello")
    settle(inbox, store, 1.0)
    events = store.conn.execute("SELECT kind, message FROM events").fetchall()
    assert [tuple(e) for e in events] == [
        ("inbox.ignored", "README.txt: not NAME.py, NAME.toml or NAME.new.py")]


def events(store: Store, kind: str | None = None) -> list[str]:
    rows = store.conn.execute("SELECT kind, message FROM events ORDER BY id").fetchall()
    return [r["message"] for r in rows if kind is None or r["kind"] == kind]


def test_a_name_too_long_for_its_sidecar_is_an_invalid_job_and_the_watcher_goes_on(inbox, store):
    """251 characters + .py: looking for NAME.toml (256 bytes) raised ENAMETOOLONG out of the
    watcher, and the daemon died on every restart."""
    long_name = "a" * 251
    (inbox.folder / f"{long_name}.py").write_text(REF)    # no room for a temporary name
    rename_in(inbox.folder, "fine.py", REF)
    jobs = settle(inbox, store, 1.0)
    states = {store.job(j)["problem_name"]: (store.job(j)["state"], store.job(j)["error"]) for j in jobs}
    assert states["fine"] == ("queued", None)
    state, error = states[long_name]
    assert state == "invalid" and f"{long_name}.py: the name is too long" in error
    assert "258 bytes, over the file system's limit of 255" in error


@pytest.mark.parametrize("make, what", [
    (lambda p: p.symlink_to("/etc/passwd"), "a symbolic link (to /etc/passwd)"),
    (lambda p: p.symlink_to(p.with_name("nowhere.py")), "a symbolic link (to "),
    (lambda p: p.symlink_to(p), "a symbolic link (to "),
    (os.mkfifo, "a FIFO"),
    (lambda p: p.mkdir(), "a directory"),
], ids=["etc_passwd", "dangling", "looping", "fifo", "directory"])
def test_only_regular_files_are_taken_the_rest_refused_with_an_event(inbox, store, make, what):
    make(inbox.folder / "x.py")
    started = time.monotonic()
    assert settle(inbox, store, 1.5) == []
    assert time.monotonic() - started < 3, "a FIFO must never block the watcher"
    (message,) = events(store, "inbox.refused")
    assert message.startswith(f"x.py: {what}") and message.endswith("; the inbox takes regular files only")
    assert store.conn.execute("SELECT COUNT(*) FROM problems").fetchone()[0] == 0
    settle(inbox, store, 0.6)
    assert len(events(store, "inbox.refused")) == 1, "refused once, not on every rescan"


def test_nothing_outside_the_inbox_is_read_through_a_link(inbox, store, tmp_path):
    secret = tmp_path / "secret.toml"
    secret.write_text('tolerance = 1e-3\n# SECRET-LINE\n')
    (inbox.folder / "k.toml").symlink_to(secret)
    rename_in(inbox.folder, "k.new.py", "class ModelNew: pass\n")
    rename_in(inbox.folder, "k.py", REF)
    (job,) = settle(inbox, store, 1.5)
    row = store.job(job)
    assert row["state"] == "invalid" and row["error"].startswith("k.toml: a symbolic link (to ")
    assert row["sidecar"] is None
    dump = "\n".join(store.conn.iterdump())
    assert "SECRET-LINE" not in dump


def test_a_name_that_is_not_printable_text_is_refused_with_its_escaped_name(inbox, store):
    raw = os.fsencode(inbox.folder) + b"/bad\xff\x1b[31m.py"
    with open(raw, "w") as f:
        f.write(REF)
    assert settle(inbox, store, 1.5) == []
    (message,) = events(store, "inbox.refused")
    assert message == "bad\\udcff\\x1b[31m.py: the name has control characters or is not UTF-8; rename it"


def test_a_file_over_the_size_limit_is_an_invalid_job(inbox, store):
    from kernelabd.service.inbox import MAX_FILE_BYTES

    rename_in(inbox.folder, "huge.py", REF + "#" * MAX_FILE_BYTES)
    (job,) = settle(inbox, store, 1.5)
    assert store.job(job)["state"] == "invalid"
    size = MAX_FILE_BYTES + len(REF)
    assert store.job(job)["error"] == f"huge.py: {size} bytes, over the inbox's limit of {MAX_FILE_BYTES}"


def test_bytes_that_are_not_utf8_make_an_invalid_reference_but_a_recorded_start(inbox, store):
    rename_in(inbox.folder, "k.new.py", "")
    (inbox.folder / "k.new.py").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (inbox.folder / "bin.py").write_bytes(b"class Model: pass\n\xff\n")
    rename_in(inbox.folder, "k.py", REF)
    jobs = {store.job(j)["problem_name"]: store.job(j) for j in settle(inbox, store, 1.5)}
    assert jobs["bin"]["state"] == "invalid"
    assert jobs["bin"]["error"] == "bin.py: not UTF-8 text (byte 0xff at offset 18)"
    assert jobs["k"]["state"] == "queued", "a malformed start is the gate's to refuse, as a candidate"
    assert jobs["k"]["start_source"] == "\ufffdPNG\r\n\x1a\n\ufffd\ufffd"


def test_a_sidecar_or_start_without_its_reference_is_said_to_wait(inbox, store):
    rename_in(inbox.folder, "softmx.toml", "tf32 = true\n")
    assert settle(inbox, store, 1.0) == []
    assert events(store, "inbox.waiting") == [
        "softmx.toml: kept for softmx.py, which is not in the inbox yet; they are taken together"]


def test_a_sidecar_renamed_in_just_before_its_reference_is_not_said_to_wait(inbox, store):
    """``kernelab submit``'s order: the watcher may run between the two renames."""
    rename_in(inbox.folder, "k.toml", "tf32 = true\n")
    time.sleep(0.2)
    assert take_ready(inbox, store) == []
    rename_in(inbox.folder, "k.py", REF)
    (job,) = settle(inbox, store, 1.0)
    assert store.job(job)["sidecar"] == "tf32 = true\n"
    assert events(store, "inbox.waiting") == []


def test_the_marker_names_the_files_only_while_they_are_read(inbox, store):
    """What the daemon's next start relies on (``quarantine``): the marker exists during the
    read of a problem and is gone after it, whatever the outcome."""
    rename_in(inbox.folder, "m.py", REF)
    rename_in(inbox.folder, "broken.py", "class Model(:\n")
    with inbox.taking([inbox.folder / "m.py"]):
        assert json.loads(inbox.marker.read_text())["files"] == ["m.py"]
    assert not inbox.marker.exists()
    assert len(settle(inbox, store, 1.0)) == 2 and not inbox.marker.exists()
    assert events(store, "inbox.refused") == [], "the marker itself is never an inbox file"


def test_quarantine_moves_what_the_last_daemon_died_on_with_a_reason(inbox, store):
    from kernelabd.service.inbox import quarantine

    rename_in(inbox.folder, "crash.py", REF)
    rename_in(inbox.folder, "crash.toml", "tf32 = true\n")
    inbox.marker.write_text(json.dumps({"pid": 4242, "since": time.time(),
                                        "files": ["crash.py", "crash.toml", "crash.new.py"]}))
    folder = quarantine(inbox, store)
    assert sorted(p.name for p in folder.iterdir()) == ["crash.py", "crash.toml", "reason.txt"]
    assert folder.parent == inbox.folder / ".rejected"
    reason = (folder / "reason.txt").read_text()
    assert reason.startswith("crash.py, crash.toml: the daemon (pid 4242) died while reading them at ")
    assert events(store, "inbox.quarantined") == [reason.strip()]
    assert not inbox.marker.exists() and not (inbox.folder / "crash.py").exists()
    assert settle(inbox, store, 1.0) == [], "a quarantined file is not taken"
    assert quarantine(inbox, store) is None, "no marker: nothing to do"


def test_an_inbox_removed_under_the_watcher_is_one_event_not_a_crash(tmp_path, store):
    box = Inbox(tmp_path / "inbox", stable_s=0.2, rescan_s=0.3)
    box.start()
    try:
        shutil.rmtree(box.folder)
        assert settle(box, store, 1.5) == []
        assert events(store, "inbox.error") == [
            f"{box.folder}: cannot scan the inbox: [Errno 2] No such file or directory: '{box.folder}'"]
        box.folder.mkdir()
        rename_in(box.folder, "back.py", REF)
        assert len(settle(box, store, 1.5)) == 1, "found again by the next rescan"
    finally:
        box.stop()
