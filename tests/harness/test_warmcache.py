"""A screened winner's compiled kernels carried into the sandbox that gates it: real sm_90
compiles on CPU (Triton's stand-in driver, as screening does them), and the copy's refusals of
whatever the untrusted sandbox could have planted in its cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernelabd.harness.sandbox import Sandbox, SandboxSpec
from kernelabd.harness.screen import Options, Screener
from kernelabd.harness.warmcache import carry
from kernelabd.propose.tune import with_params

HERE = Path(__file__).parent / "screen"
REFERENCE = HERE / "wide_softmax.py"
CANDIDATE = (HERE / "wide_softmax.new.py").read_text()

COMPILE = """
import sys
from kernelabd.harness.child.screen import compile_variant, compiler_init
compiler_init("sm_90", sys.argv[1], {})
print(compile_variant(0, sys.argv[2])["status"])
"""


def snapshot(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}


def compile_for_sm90(source: Path, cache: Path) -> None:
    """The kernels of ``source`` compiled for sm_90 in a process of their own, with ``cache``
    as Triton's cache (what a gate sandbox's first call does, with no GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE, str(REFERENCE), str(source)], capture_output=True,
                          text=True, env={**env, "TRITON_CACHE_DIR": str(cache)}, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_screened_winner_loads_its_kernels_from_the_carried_cache_without_compiling(tmp_path):
    winner = {"num_warps": 8, "SCALE": 1}
    source = with_params(CANDIDATE, winner)
    with Screener(REFERENCE, SandboxSpec(device="cpu"), Options(screen_ms=1.0, workers=1, arch="sm_90")) as screener:
        [screened] = screener.screen([(winner, source)])
        assert screened.status == "timed"
        gate_box = Sandbox(SandboxSpec(device="cpu"))
        try:
            carried = gate_box.carry_triton_cache(screener.box)
            assert carried.entries >= 1 and carried.bytes > 0
            groups = list(gate_box.triton_cache.glob("*/__grp__*.json"))
            assert groups and all(Path(p).parent == g.parent for g in groups
                                  for p in json.loads(g.read_text())["child_paths"].values()), \
                "group files point at the copy, not at the screening sandbox"
            (tmp_path / "winner.py").write_text(source)
            before = snapshot(gate_box.triton_cache)
            compile_for_sm90(tmp_path / "winner.py", gate_box.triton_cache)
            assert snapshot(gate_box.triton_cache) == before, "every kernel was a cache hit: nothing compiled"
        finally:
            gate_box.close()

    fresh = tmp_path / "fresh-cache"
    compile_for_sm90(tmp_path / "winner.py", fresh)
    assert snapshot(fresh), "without the carried cache the same compile writes its kernels"


def entry(cache: Path, name: str, files: dict[str, bytes]) -> Path:
    where = cache / name
    where.mkdir(parents=True)
    for child, data in files.items():
        (where / child).write_bytes(data)
    return where


def group(where: Path, names: list[str]) -> bytes:
    return json.dumps({"child_paths": {n: str(where / n) for n in names}}).encode()


def test_the_copy_takes_plain_files_only_and_never_follows_what_the_sandbox_planted(tmp_path):
    src, dest, secret = tmp_path / "src", tmp_path / "dest", tmp_path / "secret.txt"
    secret.write_text("token")
    good = entry(src, "GOOD", {"k.cubin": b"\x7fELF", "k.json": b"{}"})
    (good / "__grp__k.json").write_bytes(group(good, ["k.cubin", "k.json"]))
    linked = entry(src, "LINKED", {"k.json": b"{}"})
    (linked / "k.cubin").symlink_to(secret)
    fifo = entry(src, "FIFO", {"k.json": b"{}"})
    os.mkfifo(fifo / "k.cubin")
    escaping = entry(src, "ESCAPING", {"k.cubin": b"x", "k.json": b"{}"})
    (escaping / "__grp__k.json").write_bytes(group(tmp_path, ["secret.txt"]))
    (src / "DIRLINK").symlink_to(tmp_path, target_is_directory=True)
    entry(src, "tmp.pid_1_2", {"k.cubin": b"partial"})

    carried = carry(src, dest)

    assert sorted(p.name for p in dest.iterdir()) == ["ESCAPING", "GOOD"]
    moved = json.loads((dest / "GOOD" / "__grp__k.json").read_text())["child_paths"]
    assert moved == {"k.cubin": str(dest / "GOOD" / "k.cubin"), "k.json": str(dest / "GOOD" / "k.json")}
    assert sorted(p.name for p in (dest / "ESCAPING").iterdir()) == ["k.cubin", "k.json"], \
        "a group naming a file outside its entry is dropped (Triton then compiles again)"
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert all(b"token" not in p.read_bytes() for p in dest.rglob("*") if p.is_file())
    assert (carried.entries, carried.skipped) == (2, 2)


def test_newest_kernels_go_first_and_the_copy_stops_at_its_size_cap(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    for age, name in enumerate(["NEWEST", "MIDDLE", "OLDEST"]):
        where = entry(src, name, {"k.cubin": bytes(400)})
        os.utime(where, (1e9 - age * 100, 1e9 - age * 100))
    carried = carry(src, dest, limit=1000)
    assert sorted(p.name for p in dest.iterdir()) == ["MIDDLE", "NEWEST"]
    assert (carried.entries, carried.bytes, carried.skipped) == (2, 800, 1)


def test_nothing_is_written_through_a_link_in_place_of_the_new_cache(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    entry(src, "GOOD", {"k.cubin": b"x"})
    elsewhere.mkdir()
    (tmp_path / "dest").symlink_to(elsewhere, target_is_directory=True)
    assert carry(src, tmp_path / "dest").entries == 0
    assert not any(elsewhere.iterdir())


def test_an_entry_the_new_sandbox_already_has_is_left_as_it_is(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    entry(src, "SAME", {"k.cubin": b"screened"})
    entry(dest, "SAME", {"k.cubin": b"its own"})
    assert carry(src, dest).entries == 0
    assert (dest / "SAME" / "k.cubin").read_bytes() == b"its own"
