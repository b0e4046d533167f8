"""What isolation costs: `kernelab check` of the examples, and a sandbox's start, with
`[sandbox] isolation = "none"` (as before issue 20) and with the default namespaces,
interleaved run by run so that both see the same machine.

    python3 bench/isolation/check_cost.py OUT [--device cuda] [--runs 2] [--examples softmax,layernorm]
                                              [--before TREE]

``--before TREE`` adds a column: the same checks run by another checkout of kernelab (one from
before issue 20), with its own sandboxes. Writes OUT/isolation.json (what `kernelab doctor`
reports), OUT/startup.jsonl and OUT/checks.jsonl (one object a measurement) and prints a table
last. The goal (issue 20): a check with namespaces takes at most 1 s longer than without.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kernelabd.config import SandboxConfig  # noqa: E402
from kernelabd.harness import shared  # noqa: E402
from kernelabd.harness.isolation import probe  # noqa: E402
from kernelabd.harness.sandbox import Sandbox, SandboxSpec  # noqa: E402

MODES = ("none", "namespaces")
GOAL_S = 1.0
TRIVIAL = "import torch\nModelNew = object\n"


def homes(out: Path) -> dict[str, Path]:
    """One kernelab home per mode, its kernelab.toml choosing the isolation (none for the other
    checkout, which may not know the key)."""
    found = {"before": out / "home-before"}
    found["before"].mkdir(parents=True, exist_ok=True)
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
        with shared.Arena.allocate(device, shared.ALIGN) as state:     # no weights: an empty arena
            box.request({"cmd": "load_candidate", "path": staged, "device": device, "shapes": [],
                         "timing_sets": [], "arenas": [state.nbytes]}, fds=[state.fd],
                        deadline=time.monotonic() + 300, what="starting")
        return time.monotonic() - t0


def check(example: str, device: str, home: Path, timing: bool, tree: Path = ROOT) -> dict:
    """One `kernelab check` as a user runs it (kernelab from ``tree``); its wall time from outside."""
    cmd = [sys.executable, "-m", "kernelabd", "check", f"{ROOT}/examples/{example}.py",
           f"{ROOT}/examples/{example}.new.py", "--device", device, "--json", "--home", str(home),
           *([] if timing else ["--no-timing"])]
    path = [str(tree), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=900, env=env)
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
    """Median wall seconds per measurement and mode; the delta is namespaces less the best of
    the others (none on this tree, and the other tree's when measured)."""
    lines = [f"{'what':<22}{'before s':>10}{'none s':>10}{'namespaces s':>14}{'delta s':>10}  verdicts"]
    by: dict[tuple[str, str], list[dict]] = {}
    for r in startup + checks:
        by.setdefault((r["what"], r["mode"]), []).append(r)
    worst = 0.0
    for what in dict.fromkeys(r["what"] for r in startup + checks):
        cols = {mode: median(by.get((what, mode), []), "wall_s") for mode in ("before", *MODES)}
        delta = cols["namespaces"] - min(v for k, v in cols.items() if k != "namespaces" and v == v)
        worst = max(worst, delta) if what != "sandbox start" else worst
        verdicts = " / ".join(",".join(str(r.get("verdict", "-")) for r in by.get((what, mode), []))
                              for mode in ("before", *MODES) if (what, mode) in by)
        lines.append(f"{what:<22}{cols['before']:>10.2f}{cols['none']:>10.2f}{cols['namespaces']:>14.2f}"
                     f"{delta:>+10.2f}  {verdicts}")
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
    parser.add_argument("--before", type=Path, default=None, help="another kernelab checkout to time too")
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
            for mode in (*order, *(["before"] if args.before else [])):
                tree = args.before if mode == "before" else ROOT
                row = {"what": f"check {example}", "mode": mode, "run": run,
                       **check(example, args.device, where[mode], not args.no_timing, tree)}
                checks.append(row)
                print(json.dumps(row), flush=True)
    for name, rows in (("startup.jsonl", startup), ("checks.jsonl", checks)):
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(startup, checks))


if __name__ == "__main__":
    main()
