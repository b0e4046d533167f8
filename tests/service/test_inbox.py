"""The inbox: complete files only, rescans, dedupe, revisions, naming conventions."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kernelabd.service.inbox import Inbox, classify, take_ready
from store.db import connect
from store.records import Store

REF = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"


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


def test_renamed_file_is_taken_at_once(inbox, store):
    rename_in(inbox.folder, "a.py", REF)
    start = time.monotonic()
    while not take_ready(inbox, store):
        assert time.monotonic() - start < 0.45, "a renamed file needs no stability wait"
        time.sleep(0.02)


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
