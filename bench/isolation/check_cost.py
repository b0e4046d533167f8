"""What isolation costs: `kernelab check` of the examples, and a sandbox's start, with
`[sandbox] isolation = "none"` (as before issue 20) and with the default namespaces,
interleaved run by run so that both see the same machine.

    python3 bench/isolation/check_cost.py OUT [--device cuda] [--runs 2] [--examples softmax,layernorm]

Writes OUT/isolation.json (what `kernelab doctor` reports), OUT/startup.jsonl and OUT/checks.jsonl
(one object a measurement) and prints a table last. The goal (issue 20): a check with namespaces
takes at most 1 s longer than without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kernelabd.config import SandboxConfig  # noqa: E402
from kernelabd.harness.isolation import probe  # noqa: E402
from kernelabd.harness.sandbox import Sandbox, SandboxSpec  # noqa: E402

MODES = ("none", "namespaces")
GOAL_S = 1.0
TRIVIAL = "import torch\nModelNew = object\n"


def homes(out: Path) -> dict[str, Path]:
    """One kernelab home per mode, its kernelab.toml choosing the isolation."""
    found = {}
    for mode in MODES:
        home = out / f"home-{mode}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "kernelab.toml").write_text(f'[sandbox]\nisolation = "{mode}"\n')
        found[mode] = home
    return found


def startup_s(mode: str, device: str, source: Path) -> float:
    """Seconds from making a sandbox to its first answer (interpreter, fence, torch import)."""
    t0 = time.monotonic()
    with Sandbox(SandboxSpec.from_config(SandboxConfig(isolation=mode), device, "bench")) as box:
        staged = box.stage_file(source, "trivial.py")
        box.request({"cmd": "load_candidate", "path": staged, "device": device, "shapes": [], "sets": [],
                     "timing_sets": [], "gate": False}, deadline=time.monotonic() + 300, what="starting")
        return time.monotonic() - t0


def check(example: str, device: str, home: Path, timing: bool) -> dict:
    """One `kernelab check` as a user runs it; its wall time from outside."""
    cmd = [sys.executable, "-m", "kernelabd", "check", f"examples/{example}.py", f"examples/{example}.new.py",
           "--device", device, "--json", "--home", str(home), *([] if timing else ["--no-timing"])]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result = {"verdict": None, "reason": done.stderr.strip()[-300:]}
    return {"example": example, "rc": done.returncode, "wall_s": round(wall, 3), "verdict": result.get("verdict"),
            "reason": result.get("reason"), "check_wall_s": result.get("wall_s"), "stages": result.get("stages"),
            "speedup": result.get("speedup")}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def table(startup: list[dict], checks: list[dict]) -> str:
    lines = [f"{'what':<22}{'none s':>10}{'namespaces s':>14}{'delta s':>10}  verdicts (none / namespaces)"]
    by = {(r["what"], r["mode"]): [] for r in startup + checks}
    for r in startup + checks:
        by[(r["what"], r["mode"])].append(r)
    worst = 0.0
    for what in dict.fromkeys(r["what"] for r in startup + checks):
        a, b = by.get((what, "none"), []), by.get((what, "namespaces"), [])
        delta = median(b, "wall_s") - median(a, "wall_s")
        worst = max(worst, delta) if what != "sandbox start" else worst
        verdicts = " / ".join(",".join(str(r.get("verdict", "-")) for r in rows) for rows in (a, b))
        lines.append(f"{what:<22}{median(a, 'wall_s'):>10.2f}{median(b, 'wall_s'):>14.2f}{delta:>+10.2f}  {verdicts}")
    lines.append(f"worst check delta {worst:+.2f} s (goal: at most +{GOAL_S:.1f} s): "
                 + ("met" if worst <= GOAL_S else "NOT met"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--examples", default="softmax,layernorm,gelu_gate")
    parser.add_argument("--no-timing", action="store_true", help="gate only (checks without the A/B timing)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    isolation = {mode: vars(probe(mode, "")) for mode in MODES}
    (args.out / "isolation.json").write_text(json.dumps(isolation, indent=1, default=list))
    print("isolation:", isolation["namespaces"]["detail"], flush=True)
    source = args.out / "trivial.py"
    source.write_text(TRIVIAL)
    device = "cuda:0" if args.device == "cuda" else args.device
    where = homes(args.out)
    startup, checks = [], []
    for run in range(args.runs):
        order = MODES if run % 2 == 0 else MODES[::-1]
        for mode in order:
            row = {"what": "sandbox start", "mode": mode, "run": run,
                   "wall_s": round(startup_s(mode, device, source), 3)}
            startup.append(row)
            print(json.dumps(row), flush=True)
        for example in args.examples.split(","):
            for mode in order:
                row = {"what": f"check {example}", "mode": mode, "run": run,
                       **check(example, args.device, where[mode], not args.no_timing)}
                checks.append(row)
                print(json.dumps(row), flush=True)
    for name, rows in (("startup.jsonl", startup), ("checks.jsonl", checks)):
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(startup, checks))


if __name__ == "__main__":
    main()
