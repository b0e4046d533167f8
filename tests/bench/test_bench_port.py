"""The port benchmark (bench/port): its problems load as strict references, and its script runs
end to end on CPU in smoke mode (default sizes, Triton interpreter, a two-candidate budget)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from kernelabd.harness.problem import load_problem
from kernelabd.service.capture import load_reference

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "port"
PROBLEMS = sorted((BENCH / "problems").glob("*.py"))


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_port_run", BENCH / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_has_its_problems_and_the_groups_cover_each_once():
    run = bench_module()
    names = [p.stem for p in PROBLEMS]
    assert len(names) >= 13 and run.FFN in names
    grouped = [n for group in run.GROUPS.values() for n in group]
    assert sorted(grouped) == sorted(names), "every problem in exactly one --group"


@pytest.mark.parametrize("path", PROBLEMS, ids=[p.stem for p in PROBLEMS])
def test_problem_loads_strictly_and_runs_at_its_default_sizes(path):
    problem = load_problem(path)                       # strict sidecar: unknown keys are errors
    assert problem.sidecar_path is not None, "every problem has a sidecar with GPU sizes"
    cuda = problem.sidecar.constants_for("cuda")
    assert cuda, "[sizes.cuda] sets realistic sizes"
    module, model, inputs = load_reference(problem.source)
    names = set(vars(module))
    for consts in [cuda, *problem.sidecar.extra_shapes]:
        assert set(consts) <= names, f"sidecar names a constant the module lacks: {set(consts) - names}"
    assert all(isinstance(t, torch.Tensor) for t in inputs)
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and out.numel() > 0 and bool(torch.isfinite(out).all())


def test_goal_checks_from_synthetic_rows():
    """Issue 15's goals: the best peer is this benchmark's torch.compile timing where it timed
    one, else the job's own A/B against its peers (a ``--no-compile`` run)."""
    run = bench_module()

    def row(name, eager, compiled, kernelab, active_s=60.0, bound="memory", sol=None, failure=None, job_peer=None):
        job = {"best_candidate": None if failure else 1, "active_s": active_s, "bound": bound,
               "sol_ms": sol, "candidates": 3, "accepted": 1, "lineage": [], "speedup_vs_best_peer": job_peer}
        ms = {"eager": eager, **({"compile_default": compiled} if compiled else {})}
        if kernelab is not None:
            ms["kernelab"] = kernelab
        return {"problem": name, "ms": ms, "job": job, "port": {"wall_s": active_s + 20},
                "failure": failure, "errors": {}}

    rows = [row("softmax", 2.0, 1.0, 0.6, sol=0.55),                         # 1.667× compile, 92 % of SOL
            row(run.FFN, 10.0, 9.0, 8.0, bound="compute"),                   # 1.25× eager, 1.125× compile
            row("gemm_bias_gelu_bf16", 1.0, None, 0.8, bound="compute", job_peer=1.5),
            row("sdpa", 1.0, 1.0, None, failure="failed: no candidate")]
    checks = run.goals([run.derive(r) for r in rows], expected=4)
    assert checks[0].startswith("PASS") and "unported (1) at 1.00×" in checks[0] and "bench, job" in checks[0]
    assert checks[1].startswith("PASS") and f"{run.FFN} 1.125×" in checks[1]
    assert checks[2].startswith("PASS") and "softmax 92%" in checks[2]
    assert checks[3].startswith("PASS") and "gemm_bias_gelu_bf16 1.250×" in checks[3]
    assert checks[4].startswith("PASS") and "1.250×" in checks[4]
    assert checks[5].startswith("PASS") and "of 4 problems" in checks[5]
    slow = run.goals([run.derive(row("gelu", 1.0, 0.9, 1.0, active_s=200.0, sol=0.85)),
                      run.derive(row("gemm_bias_gelu_bf16", 1.0, None, 1.05, bound="compute", job_peer=0.96))],
                     expected=13)
    assert slow[0].startswith("FAIL")
    assert slow[1].startswith("FAIL") and "gelu 0.900×" in slow[1] and "below: gelu, gemm_bias_gelu_bf16" in slow[1]
    assert slow[2].startswith("FAIL") and "gelu 85%" in slow[2]
    assert slow[3].startswith("FAIL") and "0.952×" in slow[3]
    assert slow[5].startswith("FAIL") and "max 3.33 (gelu)" in slow[5]


def test_a_merged_report_takes_untimed_compile_modes_from_the_earlier_row(tmp_path):
    """``--report`` over several runs: the latest row of a problem wins, and a torch.compile mode
    it did not time (``--compile-modes default``) comes from the earlier row, said in the note."""
    run = bench_module()

    def row(kernelab, ms, errors=None):
        job = {"best_candidate": 1, "active_s": 60.0, "bound": "memory", "sol_ms": 0.5, "candidates": 2,
               "accepted": 1, "lineage": []}
        return {"problem": "softmax", "ms": {"kernelab": kernelab, **ms}, "job": job, "port": {"wall_s": 80.0},
                "failure": None, "errors": errors or {}}

    old = row(1.0, {"eager": 2.0, "compile_default": 1.5, "compile_max_autotune": 3.0})
    new = row(0.8, {"eager": 2.1, "compile_default": 1.6})
    text = run.report([old, new], tmp_path, [])
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| softmax")]
    cells = [c.strip() for c in line.split("|")]
    assert cells[3:7] == ["2.1", "1.6", "3", "0.8"], cells     # eager and compile new, max-autotune old
    assert "max-autotune ms from an earlier command" in cells[15]
    failed = row(0.8, {"eager": 2.1, "compile_default": 1.6}, errors={"compile_max_autotune": "OOM"})
    text = run.report([old, failed], tmp_path, [])
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| softmax")]
    assert "earlier command" not in line and "| — |" in line, "a mode that failed now is not papered over"


def test_speed_of_light_is_taken_at_the_fastest_rates_the_merged_rows_measured_on_that_gpu_model():
    """A ceiling measured low in one worker must not flatter that row's % of speed of light, and
    an H100 row's floor is never taken at an H200's rates."""
    run = bench_module()
    h200 = {"device_name": "NVIDIA H200", "copy_gbps": 4053.0, "bf16_tflops": 800.0}
    h100 = {"device_name": "NVIDIA H100", "copy_gbps": 2586.0, "bf16_tflops": 790.0}
    rows = [{"ceilings": h200}, {"ceilings": {**h200, "copy_gbps": 4255.0, "bf16_tflops": 780.0}}, {},
            {"ceilings": h100}, {"ceilings": {**h100, "copy_gbps": 3010.0}}]
    fastest = run.fastest_ceilings(rows)
    assert run.row_ceilings(rows[0], fastest) == {**h200, "copy_gbps": 4255.0, "bf16_tflops": 800.0}
    assert run.row_ceilings(rows[3], fastest) == {**h100, "copy_gbps": 3010.0}
    assert run.row_ceilings(rows[2], fastest) is None, "a row without ceilings keeps its own floor"


@pytest.mark.slow
def test_smoke_run_ports_two_problems_and_prints_the_table_then_the_goals(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "run.py"), "--device", "cpu", "--smoke", "--only", "softmax", "gelu",
           "--max-candidates", "2", "--parallel", "2", "--out", str(out), "--work", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["problem"] for r in rows) == ["gelu", "softmax"]
    for r in rows:
        assert {"problem", "device", "ms", "port", "job", "work", "floor", "ceilings", "timing",
                "rel_error_vs_eager", "failure", "errors"} <= set(r)
        assert r["failure"] is None and r["device"] == "cpu" and r["smoke"]
        job = r["job"]
        assert job["state"] == "done" and job["accepted"] >= 1 and 1 <= job["candidates"] <= 2
        assert job["best_candidate"] is not None and job["active_s"] > 0
        assert job["lineage"][0]["proposer"] == "template" and job["lineage"][-1]["candidate"] == job["best_candidate"]
        assert {"eager", "kernelab"} <= set(r["ms"]), r["errors"]
        assert r["rel_error_vs_eager"]["kernelab"] < 1e-4
        assert r["floor"]["bound"] == "memory" and r["work"]["min_bytes"] > 0
    lines = proc.stdout.strip().splitlines()
    assert all(ln[:4] in ("PASS", "FAIL", "SKIP") for ln in lines[-6:]), "the goal checks come last"
    assert any(ln.startswith("| softmax | float32 |") for ln in lines)
    assert (out / "table.md").read_text().strip() == proc.stdout.strip()
    # what comes back from a lent GPU machine: a few files, no folders
    assert sorted(p.name for p in out.iterdir()) == ["artifacts.tar.gz", "results.jsonl", "run.json", "table.md"]
    with tarfile.open(out / "artifacts.tar.gz") as tar:
        packed = set(tar.getnames())
    assert {"homes/softmax/results/softmax/best.py", "homes/gelu/kernelab.db", "logs/gelu.log"} <= packed
    merged = subprocess.run([sys.executable, str(BENCH / "run.py"), "--report", str(out / "results.jsonl"),
                             "--out", str(tmp_path / "merged")], capture_output=True, text=True, timeout=60)
    assert merged.returncode == 0, merged.stderr
    assert [ln for ln in merged.stdout.splitlines() if ln.startswith("| gelu")] == \
        [ln for ln in lines if ln.startswith("| gelu")]
    with tarfile.open(out / "artifacts.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked")          # the archive this test's own run wrote
    homes = tmp_path / "unpacked" / "homes"
    speed = subprocess.run([sys.executable, str(ROOT / "bench" / "screen" / "run.py"), "--from-homes",
                            str(homes / "gelu"), str(homes / "softmax"), "--out", str(tmp_path / "speed")],
                           capture_output=True, text=True, timeout=60)
    assert speed.returncode == 0, speed.stderr
    figures = {r["problem"]: r["figures"] for r in map(json.loads, (tmp_path / "speed" / "screen.jsonl").open())}
    assert sorted(figures) == ["gelu", "softmax"], "one row a problem, read from each home's own database"
    for f in figures.values():
        assert 0 < f["first_verified_s"] < f["active_s"] + 240 and f["ceilings_measured"] == 1
        assert len(f["evaluation_wall_s"]) == f["gated"] >= 1 and all(w > 0 for w in f["evaluation_wall_s"])
    assert "- verified_per_min:" in speed.stdout and speed.stdout.startswith("| problem | GPU-min |")
    for name, f in figures.items():
        row = next(line for line in speed.stdout.splitlines() if line.startswith(f"| {name} |"))
        parts = re.search(r"\| (\d+\.\d) / (\d+\.\d) / (\d+\.\d) \|", row)
        assert parts, f"the charged seconds split into evaluations / screening / rest: {row}"
        assert abs(sum(map(float, parts.groups())) - f["active_s"]) < 0.2, "the parts add up to the charge"


def test_via_inbox_ports_through_the_daemon_as_a_user_would(tmp_path):
    """``--via inbox``: the reference and its sidecar are dropped into a fresh home's inbox and
    ``kernelab daemon --once`` ports it; the row and the table say so."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "run.py"), "--device", "cpu", "--smoke", "--only", "gelu", "--via", "inbox",
           "--max-candidates", "1", "--out", str(out), "--work", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["via"] == "inbox" and row["failure"] is None
    assert row["job"]["state"] == "done" and row["job"]["lineage"][0]["proposer"] == "template"
    assert "daemon" in row["port"]["command"] and "--once" in row["port"]["command"]
    assert "kernelab daemon --once on an inbox" in proc.stderr
    assert "- Ports run through: the daemon's inbox (`kernelab daemon --once`)" in proc.stdout
    assert (tmp_path / "work" / "homes" / "gelu" / "results" / "gelu" / "best.py").exists()


def sm90(tmp_path: Path, *args: str) -> tuple[int, list[dict]]:
    """bench/port/sm90.py in its own process (it installs a stand-in GPU driver), and its rows."""
    run = subprocess.run([sys.executable, str(BENCH / "sm90.py"), "--out", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=600)
    print(run.stdout[-3000:], run.stderr[-3000:])
    rows = [json.loads(line) for line in (tmp_path / "kernels.jsonl").read_text().splitlines()]
    return run.returncode, rows


def test_every_template_seed_compiles_for_the_h200_without_spilling(tmp_path):
    """What the interpreter cannot say: each seed compiles for sm_90 through ptxas, and no
    kernel spills under register pressure or overflows shared memory at the GPU sizes. A problem
    no template matches yet (a reference the matchers do not recognise) has no seed to compile."""
    code, rows = sm90(tmp_path)
    declined = json.loads((tmp_path / "declined.json").read_text())
    assert {r["problem"] for r in rows} | set(declined) == {p.stem for p in PROBLEMS}
    assert len({r["problem"] for r in rows}) >= 20, f"seeds for most of the suite; declined: {declined}"
    assert [r for r in rows if r["problems"]] == []
    assert code == 0
    assert all(r["registers"] > 0 for r in rows)


def test_the_sm90_check_catches_a_spilling_configuration(tmp_path):
    """The softmax seed made to hold 256 elements of its 16384-wide rows a thread (2 warps):
    more than 255 registers can. Triton 3.6 and 3.9 spill them, 3.8 keeps the row in local
    memory at 32 registers; either is flagged."""
    code, rows = sm90(tmp_path, "--only", "softmax", "--set", "PER_THREAD=256")
    assert code == 1
    (row,) = rows
    assert row["num_warps"] == 2 and row["stack_bytes"] >= 64
    assert any("spills" in p or "local memory" in p for p in row["problems"])


def test_the_grid_mode_sets_the_tuners_pruning_beside_ptxas(tmp_path):
    """--grid compiles sampled configurations of a seed's TUNABLES and records, for each, the
    tune proposer's verdict and the compiler's; 128×128 fp32 FMA tiles at 4 warps spill."""
    code, _ = sm90(tmp_path, "--only", "matmul_square", "--grid", "3",
                   "--set", "BLOCK_M=128", "BLOCK_N=128", "num_warps=4")
    verdicts = [json.loads(line) for line in (tmp_path / "pruning.jsonl").read_text().splitlines()]
    assert len(verdicts) == 3 and {v["problem"] for v in verdicts} == {"matmul_square"}
    assert all(isinstance(v["predicted_fit"], bool) and v["compiled_fit"] in (True, False, None)
               for v in verdicts)
    assert "The tuner's pruning against ptxas" in (tmp_path / "table.md").read_text()
    assert code == 1, "the seed forced to 128×128 at 4 warps spills"


def test_seeds_times_a_seed_and_its_variants_against_eager(tmp_path):
    """bench/port/seeds.py on CPU (interpreter, default sizes): the seed and each variant that
    changes something are built with the reference's weights, compared with eager and timed
    beside torch.compile; a variant naming no declared tunable is dropped, not timed twice;
    ``--profile`` lists what each of them spends its time in."""
    cmd = [sys.executable, str(BENCH / "seeds.py"), "--device", "cpu", "--out", str(tmp_path),
           "--only", "softmax", "--rounds", "1", "--reps", "2", "--variant", "one:STAGES=2",
           "nothing:BLOCK_M=64", "--peers", "default", "--profile", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "seeds.jsonl").read_text().splitlines()]
    assert row["problem"] == "softmax" and row["errors"] == {}
    assert set(row["ms"]) == {"eager", "compile", "seed", "one"} and all(v > 0 for v in row["ms"].values())
    assert set(row["kernels"]) == set(row["ms"])
    assert all(kernels and all(n > 0 and us > 0 for _, n, us in kernels) for kernels in row["kernels"].values())
    assert any(name == "aten::_softmax" for name, _, _ in row["kernels"]["eager"]), row["kernels"]["eager"]
    assert "| softmax | eager | `aten::_softmax` | 1 |" in proc.stdout
    assert row["values"]["one"] == {**row["values"]["seed"], "STAGES": 2}
    assert all(d < 1e-5 for d in row["rel_error_vs_eager"].values())
    assert row["floor"]["bound"] == "memory"
    assert ("| softmax | one | TILE=4096, PER_THREAD=32, STAGES=2, PER_SM=16, EVICT=0, CHUNK=16384, SPLIT=0, "
            "SPLIT_STAGES=2, SPLIT_PER_SM=8 |" in proc.stdout)


def test_hopper_times_each_seed_beside_its_known_good_starts(tmp_path):
    """bench/port/hopper.py on CPU (interpreter, default sizes): a linear case's template seed and
    every further start it declares are built, compared with eager and timed; the table says
    which is which and that eager is cuBLAS there."""
    cmd = [sys.executable, str(BENCH / "hopper.py"), "--device", "cpu", "--out", str(tmp_path),
           "--only", "linear_bf16_4k", "--rounds", "1", "--reps", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "hopper.jsonl").read_text().splitlines()]
    assert row["case"] == "linear_bf16_4k" and row["errors"] == {}
    starts = [name for name in row["values"] if name != "seed"]
    assert starts and set(row["ms"]) == {"eager", "seed", *starts} and all(v > 0 for v in row["ms"].values())
    assert all(d < 1e-2 for d in row["rel_error_vs_eager"].values()), "bf16 outputs agree with eager's"
    assert row["flops"] == 2 * 64 * 48 * 96 and row["floor"]["bound"] in ("compute", "memory")
    assert "| linear_bf16_4k | seed |" in proc.stdout and "TMA=1" in proc.stdout
