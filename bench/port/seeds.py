"""Time kernelab's template seeds at GPU sizes, with variants of their tunables, against eager:
which starting configuration pays on this GPU, learnt in one short command instead of a whole
port per guess.

    python3 bench/port/seeds.py --out DIR [--only NAME ...] [--proposer template|inductor]
                                [--variant NAME:TUNABLE=VALUE,... ...] [--rounds 3] [--reps 30]
                                [--peers default max-autotune] [--profile N]
    python3 bench/port/seeds.py --device cpu --out DIR --only softmax   # logic check, default sizes

For each problem (``bench/port/problems``): the reference at its ``[sizes.cuda]`` sizes on the
GPU (TF32 as its sidecar says, as the gate runs it) and eager's output; the proposer's first
candidate (kernelab's own, as ``sm90.py`` builds it) as generated, and once per ``--variant``
with those tunables set (names the seed does not declare are ignored; a variant that changes
nothing is dropped). Each is built with the reference's ``state_dict``, its output compared with
eager's (normwise relative difference: a sanity check, not kernelab's gate), and all are timed
together with ``run.py``'s timer (interleaved rounds, cold L2, device time only), beside
torch.compile in each ``--peers`` mode. The floor is kernelab's speed of light from ceilings
measured here. ``--profile N`` then runs each of them N times under ``torch.profiler`` and lists
the kernels each spends its time in (device time a call, top kernels first; on a CPU, operators'
host time): where a port loses, whether to its product, a copy around it or a second kernel.
Rows go to ``DIR/seeds.jsonl`` as each problem ends; the table is printed last and written to ``DIR/seeds.md``.

Developer tooling: the seeds are kernelab's own proposers' output, run in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def device_arg(argv: list[str]) -> str | None:
    """``--device``'s value, read before argparse runs: the interpreter must be chosen before
    Triton is imported, or Triton's own jit helpers are built for the GPU."""
    for i, arg in enumerate(argv):
        if arg.startswith("--device="):
            return arg.partition("=")[2]
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
    return None


if device_arg(sys.argv) == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import run as port_run  # noqa: E402  (bench/port/run.py: the timer and its helpers)
import sm90  # noqa: E402  (bench/port/sm90.py: seeds and tunable edits)

from kernelabd.propose.tune import params_of  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    """``NAME:K=V,K=V`` → (NAME, {K: V})."""
    name, _, spec = text.partition(":")
    values: dict[str, int] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if not key or not value.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME:TUNABLE=INTEGER,...")
        values[key] = int(value)
    if not name or not values:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME:TUNABLE=INTEGER,...")
    return name, values


def sources(problem: Path, proposer: str, variants: list[tuple[str, dict[str, int]]]) -> dict[str, str]:
    """``{"seed": source, variant name: source}``, without variants identical to an earlier one."""
    chosen = sm90.TemplateProposer() if proposer == "template" else sm90.InductorProposer()
    found = sm90.seed(problem, chosen)
    if isinstance(found, str):
        raise RuntimeError(f"no seed: {found}")
    out = {"seed": found[0]}
    for name, values in variants:
        source = sm90.with_values(found[0], values)
        if source not in out.values():
            out[name] = source
    return out


def build(problem: Path, constants: dict[str, Any], device: str) -> tuple[Any, Any, list[Any]]:
    """The reference at ``constants``, its model and inputs made on ``device`` directly (a
    350 MB weight drawn on the host takes seconds), TF32 as its sidecar says (as the gate runs
    it)."""
    import torch

    from kernelabd.harness.problem import load_problem
    from kernelabd.service.capture import load_reference

    tf32 = load_problem(problem).sidecar.tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    with torch.device(device):
        module, model, inputs = load_reference(problem.read_text(), constants)
    return module, model.eval(), inputs


def time_sources(problem: Path, built: tuple[Any, Any, list[Any]], found: dict[str, str],
                 baselines: dict[str, Any], args: argparse.Namespace, ceilings: dict[str, Any],
                 work: Path) -> dict[str, Any]:
    """One row: each candidate source of ``found`` built with the reference's ``state_dict``,
    its output compared with eager's, and all timed together with ``baselines`` (name → a
    call; the first is what ``× eager`` divides by) in interleaved rounds."""
    import torch

    from kernelabd.harness.problem import load_problem
    from kernelabd.service.capture import work_of
    from kernelabd.service.ceilings import floor_ms

    device = args.device
    module, model, inputs = built
    with torch.no_grad():
        expected = model(*inputs)
    work_done = work_of(model, inputs)
    row: dict[str, Any] = {"problem": problem.stem, "errors": {}, "rel_error_vs_eager": {},
                           "flops": work_done["flops"], "min_bytes": work_done["min_bytes"],
                           "floor": floor_ms(work_done, ceilings, tf32=load_problem(problem).sidecar.tf32),
                           "values": {name: params_of(src) for name, src in found.items()},
                           "baselines": list(baselines)}
    variants: dict[str, Any] = dict(baselines)
    for name, source in found.items():
        try:
            t0 = time.monotonic()
            path = work / problem.stem / name / "best.py"       # Triton reads kernels from files
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
            fn = port_run.load_best(path, module, model, device)
            row["rel_error_vs_eager"][name] = port_run.rel_error(fn(*inputs), expected)
            port_run._sync(device)
            row.setdefault("compile_s", {})[name] = round(time.monotonic() - t0, 2)
            variants[name] = lambda fn=fn: fn(*inputs)
        except Exception as exc:  # one broken variant is a finding, the rest still get timed
            row["errors"][name] = port_run.one_line(exc)
    timed, errors = port_run.time_interleaved(variants, port_run.Timer(device), args.rounds, args.reps,
                                              3, args.max_timing_s)
    row["errors"].update(errors)
    row["ms"] = {k: v["ms"] for k, v in timed.items()}
    row["iqr_rel"] = {k: v["iqr_rel"] for k, v in timed.items()}
    if args.profile:
        row["kernels"] = profile({k: v for k, v in variants.items() if k not in row["errors"]},
                                 args.profile, device)
    variants.clear()                     # the GPU memory goes with the closures
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def measure(problem: Path, args: argparse.Namespace, ceilings: dict[str, Any], work: Path) -> dict[str, Any]:
    from kernelabd.harness.problem import load_problem

    built = build(problem, load_problem(problem).sidecar.constants_for(args.device), args.device)
    model, inputs = built[1], built[2]
    baselines: dict[str, Any] = {"eager": lambda: model(*inputs)}
    for mode in args.peers:
        baselines[PEER_NAMES[mode]] = port_run.compiled_call(model, inputs, mode)
    return time_sources(problem, built, sources(problem, args.proposer, args.variant), baselines,
                        args, ceilings, work)


PEER_NAMES = {"default": "compile", "max-autotune": "max-autotune"}
"""``--peers`` mode → the row's name for it (``run.py``'s column names)."""
PROFILE_TOP = 8
"""Kernels listed a variant: the rest are summed into one line."""


def profile(variants: dict[str, Any], calls: int, device: str) -> dict[str, list[list[Any]]]:
    """Each variant run ``calls`` times under ``torch.profiler`` (after one warm-up call):
    ``[name, launches a call, µs a call]`` of its kernels, the most time first, the tail summed
    as ``"(others)"``. Device time on a GPU; on a CPU, operators' own host time."""
    import torch
    from torch.profiler import ProfilerActivity

    cuda = device == "cuda"
    out: dict[str, list[list[Any]]] = {}
    for name, fn in variants.items():
        fn()
        port_run._sync(device)
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
            port_run._sync(device)
        rows = []
        for event in prof.key_averages():
            us = (event.self_device_time_total if cuda else event.self_cpu_time_total) / calls
            if us > 0 and (not cuda or event.device_type == torch.autograd.DeviceType.CUDA):
                rows.append([event.key, round(event.count / calls, 2), round(us, 2)])
        rows.sort(key=lambda r: -r[2])
        if len(rows) > PROFILE_TOP:
            rest = rows[PROFILE_TOP:]
            rows = [*rows[:PROFILE_TOP], ["(others)", round(sum(r[1] for r in rest), 2),
                                          round(sum(r[2] for r in rest), 2)]]
        out[name] = rows
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| problem | variant | values | ms | × eager | % SOL | rel. diff vs eager | note |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for row in rows:
        eager = row.get("ms", {}).get("eager")
        floor = (row.get("floor") or {}).get("ms")
        names = [*row.get("baselines", ["eager"]), *row.get("values", {})]
        for name in names:
            ms = row.get("ms", {}).get(name)
            values = row.get("values", {}).get(name) or {}
            diff = row.get("rel_error_vs_eager", {}).get(name)
            lines.append(
                f"| {row['problem']} | {name} | {', '.join(f'{k}={v}' for k, v in values.items())} "
                f"| {port_run._f(ms)} | {port_run._f(eager / ms if eager and ms else None, '.3f', '×')} "
                f"| {port_run._f(100 * floor / ms if floor and ms else None, '.0f', '%')} "
                f"| {port_run._f(diff, '.2g')} | {row.get('errors', {}).get(name, '')} |")
    return "\n".join(lines)


def kernel_table(rows: list[dict[str, Any]]) -> str:
    """``--profile``'s findings: each variant's kernels, µs a call (device time on a GPU)."""
    lines = ["| problem | variant | kernel | launches a call | µs a call |", "|---|---|---|---:|---:|"]
    for row in rows:
        for name, kernels in row.get("kernels", {}).items():
            lines += [f"| {row['problem']} | {name} | `{k[:90]}` | {n:g} | {us:.1f} |" for k, n, us in kernels]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the Triton interpreter at the problems' default sizes (a logic check)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="problems (default: all)")
    ap.add_argument("--problems", type=Path, help=sm90.PROBLEMS_HELP)
    ap.add_argument("--proposer", choices=["template", "inductor"], default="template")
    ap.add_argument("--variant", nargs="+", type=parse_variant, default=[], metavar="NAME:K=V,...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-timing-s", type=float, default=3.0, help="cap on one variant's timed samples")
    ap.add_argument("--peers", nargs="+", choices=list(PEER_NAMES), default=[],
                    help="also time torch.compile in these modes (max-autotune: mode max-autotune, "
                         "CUDA graphs included, as run.py times it)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="list each variant's kernels over N calls under torch.profiler")
    args = ap.parse_args(argv)
    import torch

    from kernelabd.service.ceilings import measure as measure_ceilings

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA GPU here (--device cpu runs a logic check; sm90.py checks the seeds' "
                 "resources without a GPU)")
    problems = sm90.select_problems(args.only, ap, args.problems)
    args.out.mkdir(parents=True, exist_ok=True)
    ceilings = measure_ceilings(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as work, (args.out / "seeds.jsonl").open("w") as jsonl:
        for i, problem in enumerate(problems, 1):
            t0 = time.monotonic()
            try:
                row = measure(problem, args, ceilings, Path(work))
            except Exception as exc:
                row = {"problem": problem.stem, "errors": {"seed": port_run.one_line(exc)}}
            row["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            print(f"[{i}/{len(problems)}] {problem.stem}: "
                  + ", ".join(f"{k} {v:.4g} ms" for k, v in row.get("ms", {}).items()), flush=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (interpreter)"
    text = (f"{name}; torch {torch.__version__}, "
            f"triton {port_run._version('triton')}; ceilings {json.dumps(ceilings)}\n\n" + table(rows)
            + (f"\n\nKernels (torch.profiler, {args.profile} calls each):\n\n{kernel_table(rows)}"
               if args.profile else ""))
    (args.out / "seeds.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
