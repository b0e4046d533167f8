"""Harness benchmark on a GPU: A/A false positives, sensitivity, noise reached, check wall time.

Run from the repository root on a CUDA machine:

    python3 bench/harness/gpu_bench.py --out DIR [--aa 50] [--sens 40] [--device cuda:0]

It drives the real harness pieces (sandboxes, timing, acceptance rule) directly so that many
comparisons can reuse the same two sandbox processes; each comparison is a full calibrate →
interleaved blocks → bootstrap decision, exactly as ``kernelab check`` runs it. Nothing on the
GPU is changed: clocks are measured as found.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kernelabd.config import Config  # noqa: E402
from kernelabd.harness.check import Check, plan_sets  # noqa: E402
from kernelabd.harness.clocks import ClockError, ClockSampler  # noqa: E402
from kernelabd.harness.problem import load_problem  # noqa: E402
from kernelabd.harness.sandbox import Sandbox  # noqa: E402
from kernelabd.harness.timing import Comparison  # noqa: E402

EX = ROOT / "examples"
HERE = ROOT / "bench" / "harness"


def pair_of_boxes(reference: Path, a: Path, b: Path, config: Config, stack: ExitStack,
                  device: str):
    """Two loaded sandboxes (A runs ``a``, B runs ``b``) sharing the reference's timing inputs."""
    check = Check(load_problem(reference), b, device, a, config, None)
    check.deadline = time.monotonic() + 3600
    shapes, sets, timing = plan_sets(check.problem, device)
    ref_box = stack.enter_context(Sandbox(check.spec("reference")))
    ref = check.load_reference_planned(ref_box, shapes, sets, timing)
    box_a = check.start_baseline(stack, ref, len(sets))
    check.baseline = b
    box_b = check.start_baseline(stack, ref, len(sets))
    ref_box.close()
    try:
        sampler = ClockSampler(str(ref.info.get("uuid", ""))) if device != "cpu" else None
    except ClockError:
        sampler = None
    return box_a, box_b, sampler, check.deadline


def block_summary(blk: dict) -> list:
    """Side, median, quartiles and wall time of one block: the raw material of any noise study."""
    q = statistics.quantiles(blk["samples_ms"], n=4) if len(blk["samples_ms"]) > 1 else [blk["median_ms"]] * 3
    return [blk["side"], round(blk["median_ms"], 5), round(q[0], 5), round(q[2], 5),
            round(blk["wall_ms"], 1), len(blk["samples_ms"])]


def comparisons(reference: Path, a: Path, b: Path, n: int, config: Config, device: str) -> list[dict]:
    out = []
    with ExitStack() as stack:
        box_a, box_b, sampler, deadline = pair_of_boxes(reference, a, b, config, stack, device)
        for _ in range(n):
            t0 = time.monotonic()
            m = Comparison(box_a, box_b, config.timing, device, sampler, deadline).run()
            d = m.decision
            out.append({"a_ms": m.a_ms, "b_ms": m.b_ms, "speedup": d.speedup, "ci": list(d.ci),
                        "aa_noise": d.aa_noise, "threshold": d.threshold, "faster": d.faster,
                        "rel_halfwidth": d.rel_halfwidth, "pairs": len(m.blocks) // 2,
                        "discarded": m.discarded, "wall_s": time.monotonic() - t0,
                        "sm_clock_mhz": [blk["clock"]["sm_clock_mhz"] for blk in m.blocks
                                         if blk.get("clock")][:4],
                        "mode": m.mode, "trusted_ms": m.trusted_ms,
                        "blocks": [block_summary(blk) for blk in m.blocks]})
    return out


def plus_three_percent(out: Path) -> Path:
    """``memcopy.new.py`` made to move 3 % more bytes: the slower side of the sensitivity test."""
    source, n = re.subn(r"(?m)^EXTRA = 0\.0\b.*$", "EXTRA = 0.03", (HERE / "memcopy.new.py").read_text())
    assert n == 1, "memcopy.new.py must have one module-level 'EXTRA = 0.0'"
    path = out / "memcopy_plus3.new.py"
    path.write_text(source)
    return path


def check_wall(reference: Path, candidate: Path, device: str) -> dict:
    """One ``kernelab check`` from a cold start, as a user runs it (compilation included)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kernelabd", "check", str(reference),
                           str(candidate), "--device", device, "--json"],
                          capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result = {"stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    result.pop("blocks", None)
    return {"wall_s": wall, "exit": proc.returncode, "result": result}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--aa", type=int, default=50)
    ap.add_argument("--sens", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=1.0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--skip-check-wall", action="store_true")
    ap.add_argument("--phases", default="check,sens,aa",
                    help="comma-separated subset of check, sens, aa (e.g. one per GPU in parallel)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = Config()
    config.timing.budget_s = args.budget_s
    results: dict = {"config": config.to_dict()["timing"]}

    phases = set(args.phases.split(","))
    if args.skip_check_wall:
        phases.discard("check")
    if "check" in phases:
        results["check_1ms"] = check_wall(EX / "matmul.py", EX / "matmul.new.py", args.device)
        print("check wall:", round(results["check_1ms"]["wall_s"], 1), "s", flush=True)
    sens = []
    if "sens" in phases:
        sens = comparisons(HERE / "memcopy.py", plus_three_percent(args.out),
                           HERE / "memcopy.new.py", args.sens, config, args.device)
        results["sensitivity"] = sens
        print("3 % more bytes detected:", sum(r["faster"] for r in sens), "/", len(sens), flush=True)
        (args.out / "harness_bench.json").write_text(json.dumps(results, indent=1))
    aa = {}
    for name in ("softmax", "layernorm", "gelu_gate") if "aa" in phases else ():
        cand = EX / f"{name}.new.py"
        aa[name] = comparisons(EX / f"{name}.py", cand, cand, args.aa, config, args.device)
        print(name, "A/A false faster:", sum(r["faster"] for r in aa[name]), flush=True)
        (args.out / "harness_bench.json").write_text(json.dumps(results | {"aa": aa}, indent=1))
    results["aa"] = aa
    (args.out / "harness_bench.json").write_text(json.dumps(results, indent=1))

    print("\n| measurement | value |\n|---|---|")
    for name, rows in aa.items():
        print(f"| A/A {name}: false faster / comparisons | {sum(r['faster'] for r in rows)} / {len(rows)} |")
        print(f"| A/A {name}: median kernel ms | {statistics.median(r['a_ms'] for r in rows):.4f} |")
        print(f"| A/A {name}: median rel CI half-width | {statistics.median(r['rel_halfwidth'] for r in rows):.4%} |")
    if sens:
        print(f"| 3 % more bytes detected | {sum(r['faster'] for r in sens)} / {len(sens)} |")
        print(f"| sensitivity: median measured speedup | {statistics.median(r['speedup'] for r in sens):.4f} |")
        print(f"| sensitivity: median rel CI half-width | {statistics.median(r['rel_halfwidth'] for r in sens):.4%} |")
    if "check_1ms" in results:
        c = results["check_1ms"]
        print(f"| check on ~1 ms matmul: wall s (exit) | {c['wall_s']:.1f} ({c['exit']}) |")
        print(f"| check on ~1 ms matmul: candidate ms | {c['result'].get('candidate_ms')} |")


if __name__ == "__main__":
    main()
