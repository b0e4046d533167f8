"""Inductor's kernels as seeds (issue 15, item 5): the inductor proposer's ports in both compile
modes against eager and torch.compile, on the problems of ``bench/port/problems``.

    python3 bench/inductor/run.py --out DIR                          # on the H200: every problem
    python3 bench/inductor/run.py --out DIR --only softmax gemm_add_relu ffn_llama3_8b
    python3 bench/inductor/run.py --device cpu --out DIR --only softmax gelu   # logic check on a CPU

For each problem, in this process:

1. The proposer's code generation, exactly as a job runs it (``run_codegen``: a fresh subprocess,
   scrubbed environment, the device's sizes and every gate shape), once in mode ``default`` and
   once in ``max-autotune`` (torch.compile's "max-autotune-no-cudagraphs" with Triton-only GEMM
   and convolution backends, run once on the GPU so that Inductor benchmarks its choices, which
   the port takes as its TUNABLES' starting values). Generation seconds are recorded; a decline
   is a row with its reason.
2. Each port through the real gate (``run_check``, no timing): only a passing port is timed.
3. Eager, torch.compile (default and "max-autotune-no-cudagraphs") and the passing ports, timed
   with ``bench/port``'s timer (cold L2, device time, interleaved rounds, medians).

Rows go to ``OUT/results.jsonl`` as each problem ends, the ports to ``OUT/ports/``, the table to
``OUT/table.md``, printed last. The goal: the max-autotune port at or above the better of the
two compile modes on every problem it ports (``port_ma / best_compile`` ≤ 1 in ms), which is
what makes kernelab's result never below torch.compile before tuning starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROBLEMS = ROOT / "bench" / "port" / "problems"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("default", "max-autotune")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def generate(problem: Any, device: str, out: Path, timeout: float) -> dict[str, Any]:
    """Both modes' ports of one problem, each gated: ``{mode: {"s", "declined" | "path",
    "verdict", "reason", "tunables"}}``."""
    from kernelabd.harness.check import gate_shapes, run_check
    from kernelabd.propose.inductor.proposer import run_codegen
    from kernelabd.propose.tune import params_of

    found: dict[str, Any] = {}
    for mode in MODES:
        t0 = time.monotonic()
        answer = run_codegen(problem.source, device, gate_shapes(problem.sidecar, device), timeout, mode)
        row: dict[str, Any] = {"s": round(time.monotonic() - t0, 1)}
        if "declined" in answer:
            row["declined"] = answer["declined"]
            log(f"{problem.name} {mode}: declined in {row['s']} s: {answer['declined'][:200]}")
        else:
            path = out / "ports" / f"{problem.name}.{mode}.py"
            path.write_text(answer["source"])
            result = run_check(problem.path, path, device=device, time_it=False).to_json()
            row.update(path=str(path), edit=answer["edit"], tunables=params_of(answer["source"]),
                       verdict=result["verdict"], reason=result["reason"], max_rel_error=result["max_rel_error"])
            log(f"{problem.name} {mode}: {result['verdict']} in {row['s']} s ({answer['edit'][:120]})")
        found[mode] = row
    return found


def measure(problem: Any, device: str, ports: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Median ms of eager, both compile modes and each passing port, timed together."""
    import torch

    from bench.port.run import Timer, compiled_call, load_best, rel_error, time_interleaved
    from kernelabd.service.capture import load_reference

    torch.backends.cuda.matmul.allow_tf32 = problem.sidecar.tf32
    torch.backends.cudnn.allow_tf32 = problem.sidecar.tf32
    module, model, inputs = load_reference(problem.source, problem.sidecar.constants_for(device))
    model = model.to(device).eval()
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        expected = model(*inputs)
    variants: dict[str, Any] = {"eager": lambda: model(*inputs)}
    errors: dict[str, str] = {}
    compile_s: dict[str, float] = {}
    for mode in COMPILE_MODES:
        key = f"compile_{mode}"
        try:
            fn = compiled_call(model, inputs, mode)
            t0 = time.monotonic()
            with torch.no_grad():
                fn()
            compile_s[key] = round(time.monotonic() - t0, 1)
            variants[key] = fn
        except Exception as exc:   # a mode that fails is reported, the others timed
            errors[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    check: dict[str, float | None] = {}
    for mode, row in ports.items():
        if row.get("verdict") == "pass":
            call = load_best(Path(row["path"]), module, model, device)
            variants[f"port_{mode}"] = (lambda call=call: call(*inputs))
            with torch.no_grad():
                check[f"port_{mode}"] = rel_error(variants[f"port_{mode}"](), expected)
    with torch.no_grad():
        timed, failed = time_interleaved(variants, Timer(device), args.rounds, args.reps, args.warmup,
                                         args.max_timing_s)
    torch._dynamo.reset()
    return {"ms": {k: v["ms"] for k, v in timed.items()}, "timing": timed, "errors": {**errors, **failed},
            "compile_s": compile_s, "rel_error_vs_eager": check}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "—"


def table(rows: list[dict[str, Any]]) -> str:
    """One line a problem: times, each port's verdict or decline, the max-autotune port's time
    over the better compile mode's (≤ 1: at least as fast as torch.compile)."""
    lines = ["| problem | eager ms | compile ms | compile max-autotune ms | port default ms | "
             "port max-autotune ms | MA port / best compile | default port | max-autotune port |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r.get("ms", {})
        best = min((ms[k] for k in ms if k.startswith("compile_")), default=None)

        def state(mode: str, r: dict[str, Any] = r) -> str:
            p = r["ports"].get(mode)
            if not p:
                return "; ".join(r.get("errors", {}).values()) or "—"
            text = p.get("declined") or ": ".join(filter(None, [p.get("verdict"), p.get("reason")]))
            return text.replace("|", "\\|")[:90] + f" ({p.get('s')} s)"

        cells = [r["problem"], *(f"{ms[k]:.4g}" if k in ms else "—" for k in
                                 ("eager", "compile_default", "compile_max-autotune-no-cudagraphs",
                                  "port_default", "port_max-autotune")),
                 ratio(ms.get("port_max-autotune"), best), state("default"), state("max-autotune")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="+", help="problem names (file stems) to run")
    parser.add_argument("--problems", type=Path, default=PROBLEMS)
    parser.add_argument("--codegen-timeout-s", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-timing-s", type=float, default=10.0)
    parser.add_argument("--deadline-s", type=float, default=540.0,
                        help="start no problem after this many seconds (the table is still printed)")
    args = parser.parse_args()
    start = time.monotonic()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"      # the ports run under Triton's interpreter here
    from kernelabd.harness.problem import load_problem

    (args.out / "ports").mkdir(parents=True, exist_ok=True)
    names = args.only or sorted(p.stem for p in args.problems.glob("*.py"))
    rows = []
    for name in names:
        if time.monotonic() - start > args.deadline_s:
            log(f"{name}: not started, past --deadline-s {args.deadline_s:.0f}")
            rows.append({"problem": name, "ports": {}, "errors": {"run": "not started: past --deadline-s"}})
            continue
        problem = load_problem(args.problems / f"{name}.py")
        log(f"{name}: generating ports ({', '.join(MODES)})")
        row: dict[str, Any] = {"problem": name, "device": args.device, "ports": generate(
            problem, args.device, args.out, args.codegen_timeout_s)}
        try:
            row.update(measure(problem, args.device, row["ports"], args))
        except Exception as exc:   # one problem that cannot be measured is a row, not the end
            row["errors"] = {"measure": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        with (args.out / "results.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
    text = table(rows)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
