"""Time kernelab's Hopper templates against eager PyTorch and cuBLAS at LLM shapes: bf16/fp16
GEMMs (persistent, TMA descriptor loads, split-K), the fused gated MLPs, the 3xTF32 fp32 GEMM,
and the row and reduction kernels at the copy rate, each template seed beside every known-good
start it declares (``STARTS``), in one command.

    python3 bench/port/hopper.py --out DIR [--only CASE ...] [--deadline-s 280] [--profile N]
    python3 bench/port/hopper.py --device cpu --out DIR --only linear_bf16_4k   # logic check

For each case: the reference at the case's sizes (a bench problem of ``problems/``, or a plain
``nn.Linear`` product written for this script), built on the device; eager's output; the
template proposer's candidate (``sm90.seed``) and one copy per further entry of its ``STARTS``
(``start1``, ``start2``, …); for the gated MLPs also ``cublas``, the three products alone (what
fusing the elementwise work can at best remove from eager). All are timed together with
``run.py``'s timer (interleaved rounds, cold L2, device time only); for the GEMM cases eager *is*
cuBLAS. Rows go to ``DIR/hopper.jsonl`` as each case ends; the table is printed last and written
to ``DIR/hopper.md``. ``--deadline-s`` starts no case after that many seconds (the rows so far
are kept), so the command ends inside one device call.

Developer tooling: the candidates are kernelab's own proposer's output, run in this process.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import seeds  # bench/port/seeds.py: chooses the interpreter for --device cpu before Triton loads
import sm90
from seeds import port_run

LINEAR = '''"""x Wᵀ through a bias-free nn.Linear in {dtype}: the product at the heart of every LLM layer."""

import torch
import torch.nn as nn

M = 64
N = 48
K = 96


class Model(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=False, dtype=torch.{dtype})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.{dtype})]


def get_init_inputs():
    return [K, N]
'''


@dataclass(frozen=True)
class Case:
    """One timed shape: ``problem`` names a file of ``problems/`` or ``linear_<dtype>``."""

    name: str
    problem: str
    sizes: dict[str, int] = field(default_factory=dict)     # on a GPU; the problem's own when empty
    gemms: bool = False                                     # a gated MLP: time its products alone too


def _mnk(m: int, n: int, k: int) -> dict[str, int]:
    return {"M": m, "N": n, "K": k}


CASES = [
    Case("ffn_llama3_8b", "ffn_llama3_8b", gemms=True),
    Case("linear_bf16_4k", "linear_bfloat16", _mnk(4096, 4096, 4096)),
    Case("linear_bf16_8k", "linear_bfloat16", _mnk(8192, 8192, 8192)),
    Case("linear_bf16_ffn_up", "linear_bfloat16", _mnk(4096, 14336, 4096)),
    Case("linear_bf16_ffn_down", "linear_bfloat16", _mnk(4096, 4096, 14336)),
    Case("softmax", "softmax"),
    Case("softmax_wide_rows", "softmax_wide_rows"),
    Case("layernorm", "layernorm"),
    Case("layernorm_wide", "layernorm_wide"),
    Case("sum_reduction", "sum_reduction"),
    Case("rmsnorm_llama", "rmsnorm_llama"),
    Case("matmul_bf16_large_k", "matmul_bf16_large_k"),
    Case("linear_bf16_m128", "linear_bfloat16", _mnk(128, 4096, 14336)),
    Case("linear_fp16_8k", "linear_float16", _mnk(8192, 8192, 8192)),
    Case("swiglu_fp16", "swiglu_fp16", gemms=True),
    Case("gemm_bias_gelu_bf16", "gemm_bias_gelu_bf16"),
    Case("linear_residual_fp16_odd", "linear_residual_fp16_odd"),
    Case("matmul_square_fp32", "matmul_square"),
    Case("mean_dim0_bf16", "mean_dim0_bf16"),
]
"""The goals first (the FFN, bf16 GEMMs at cuBLAS, the memory-bound kernels at the copy rate),
so that a deadline drops the least; the bf16 linear cases share one candidate source, so Triton
compiles each of its configurations once for all of them."""


def problem_file(case: Case, work: Path) -> Path:
    """The case's reference file: a bench problem, or the plain linear written into ``work``."""
    if not case.problem.startswith("linear_"):
        return sm90.PROBLEMS / f"{case.problem}.py"
    path = work / "cases" / f"{case.problem}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LINEAR.format(dtype=case.problem.removeprefix("linear_")))
    return path


def starts_of(source: str) -> list[dict[str, Any]]:
    """The candidate's ``STARTS`` (known-good configurations, the seed's first), or []."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "STARTS"):
            return list(ast.literal_eval(node.value))
    return []


def candidate_sources(problem: Path) -> dict[str, str]:
    """The seed and one source per further known-good start (identical ones dropped)."""
    found = sm90.seed(problem, sm90.TemplateProposer())
    if isinstance(found, str):
        raise RuntimeError(f"no seed: {found}")
    out = {"seed": found[0]}
    for i, values in enumerate(starts_of(found[0])[1:], 1):
        source = sm90.with_values(found[0], values)
        if source not in out.values():
            out[f"start{i}"] = source
    return out


def gemms_alone(model: Any, inputs: list[Any]) -> Any:
    """The gated MLP's three products without its elementwise work (cuBLAS's share of eager)."""
    import torch.nn.functional as F

    x = inputs[0]
    w1, w3, w2 = model.w1.weight, model.w3.weight, model.w2.weight
    h = x.new_empty((*x.shape[:-1], w1.shape[0]))
    return lambda: (F.linear(x, w1), F.linear(x, w3), F.linear(h, w2))


def measure(case: Case, args: argparse.Namespace, ceilings: dict[str, Any], work: Path) -> dict[str, Any]:
    from kernelabd.harness.problem import load_problem

    problem = problem_file(case, work)
    sizes = case.sizes if args.device == "cuda" else {}
    built = seeds.build(problem, sizes or load_problem(problem).sidecar.constants_for(args.device), args.device)
    model, inputs = built[1], built[2]
    baselines = {"eager": lambda: model(*inputs)}
    if case.gemms:
        baselines["cublas"] = gemms_alone(model, inputs)
    row = seeds.time_sources(problem, built, candidate_sources(problem), baselines, args, ceilings, work)
    row["case"] = case.name
    row["shape"] = {k: v for k, v in vars(built[0]).items() if isinstance(v, int) and not k.startswith("_")}
    return row


def rate(row: dict[str, Any], ms: float | None) -> str:
    """TFLOP/s of a product, GB/s (the least bytes moved) of anything else."""
    if not ms:
        return "—"
    if row.get("flops"):
        return f"{row['flops'] / ms / 1e9:.3g} TFLOP/s"
    return f"{row['min_bytes'] / ms / 1e6:.3g} GB/s"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | variant | ms | rate | × eager | × cuBLAS | % SOL | rel. diff | values / note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        ms = row.get("ms", {})
        eager = ms.get("eager")
        cublas = ms.get("cublas", eager if row.get("flops") else None)
        floor = (row.get("floor") or {}).get("ms")
        for name in [*row.get("baselines", []), *row.get("values", {})]:
            t = ms.get(name)
            values = row.get("values", {}).get(name) or {}
            note = row.get("errors", {}).get(name) or ", ".join(f"{k}={v}" for k, v in values.items())
            lines.append(
                f"| {row['case']} | {name} | {port_run._f(t)} | {rate(row, t)} "
                f"| {port_run._f(eager / t if eager and t else None, '.3f', '×')} "
                f"| {port_run._f(cublas / t if cublas and t else None, '.3f', '×')} "
                f"| {port_run._f(100 * floor / t if floor and t else None, '.0f', '%')} "
                f"| {port_run._f(row.get('rel_error_vs_eager', {}).get(name), '.2g')} | {note} |")
        if row.get("errors", {}).get("case"):
            lines.append(f"| {row['case']} | — | | | | | | | {row['errors']['case']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the Triton interpreter at the problems' default sizes (a logic check)")
    ap.add_argument("--only", nargs="+", metavar="CASE", choices=[c.name for c in CASES], help="cases (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-timing-s", type=float, default=1.5, help="cap on one variant's timed samples")
    ap.add_argument("--deadline-s", type=float, default=280.0, help="start no case after this many seconds")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="list each variant's kernels over N calls under torch.profiler (as seeds.py does)")
    args = ap.parse_args(argv)
    import torch

    from kernelabd.service.ceilings import describe
    from kernelabd.service.ceilings import measure as measure_ceilings

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA GPU here (--device cpu runs a logic check)")
    began = time.monotonic()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    ceilings = measure_ceilings(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as work, (args.out / "hopper.jsonl").open("w") as jsonl:
        for i, case in enumerate(cases, 1):
            if time.monotonic() - began > args.deadline_s:
                print(f"deadline: {len(cases) - i + 1} case(s) not started", file=sys.stderr, flush=True)
                break
            t0 = time.monotonic()
            try:
                row = measure(case, args, ceilings, Path(work))
            except Exception as exc:
                row = {"case": case.name, "errors": {"case": port_run.one_line(exc)}}
            row["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            print(f"[{i}/{len(cases)}] {case.name} ({row['wall_s']} s): "
                  + ", ".join(f"{k} {v:.4g} ms" for k, v in row.get("ms", {}).items()), file=sys.stderr, flush=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (interpreter)"
    text = (f"{name}; torch {torch.__version__}, triton {port_run._version('triton')}; {describe(ceilings)}; "
            f"{time.monotonic() - began:.0f} s\n\n" + table(rows)
            + (f"\n\nKernels (torch.profiler, {args.profile} calls each):\n\n{seeds.kernel_table(rows)}"
               if args.profile else ""))
    (args.out / "hopper.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
