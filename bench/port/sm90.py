"""Compile each port seed of the suite for the H200 (sm_90) on a machine without a GPU, and
report what ptxas made of every kernel: registers, stack (spills), shared memory.

    python3 bench/port/sm90.py [--only NAME ...] [--proposer template|inductor] [--out DIR]
                               [--set TUNABLE=VALUE ...] [--grid N]

The Triton interpreter, which gates candidates on CPU, accepts code the GPU compiler rejects and
says nothing of registers or spills; this closes that gap before any GPU time is spent. Each
seed's ``ModelNew`` is built at the problem's ``[sizes.cuda]`` sizes and called on CPU tensors
with every Triton launch replaced by a compile for sm_90 (a stand-in driver supplies the target;
nothing runs, the outputs are garbage and unused). Resource use is read from the cubin Triton
built (``cuobjdump --dump-resource-usage``, from Triton's wheel).

``--grid N`` also compiles up to N configurations of each seed's declared ``TUNABLES`` (a
seeded random sample of the grid) and compares the tune proposer's pruning (``fits``: an
estimate from the tiles a candidate declares in ``RESOURCES``) with what ptxas made of them.

The seeds are kernelab's own proposers' output, executed in this process: this is a developer's
check of the templates, not a gate for untrusted code.

Exit status: 0 when every seed compiled and fits (no spills under register pressure, no array
in local memory, shared memory and registers within one SM's limits), 1 otherwise; a problem the
proposer offers no seed for is listed as such (and in ``declined.json``), not failed: its
reference is not one the matchers recognise. The table is printed last.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import os
import random
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)   # compile for the GPU, never interpret

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from kernelabd.fingerprint.build import TritonCompileOnly  # noqa: E402
from kernelabd.harness import fit  # noqa: E402
from kernelabd.harness.problem import load_problem  # noqa: E402
from kernelabd.propose.base import Budget, JobContext, Proposal, Proposer  # noqa: E402
from kernelabd.propose.inductor.codegen import use_stand_in_driver  # noqa: E402
from kernelabd.propose.inductor.proposer import InductorProposer  # noqa: E402
from kernelabd.propose.template.proposer import TemplateProposer  # noqa: E402
from kernelabd.propose.tune import (  # noqa: E402
    Target,
    apply_edit,
    fits,
    parse_tunables,
    resources_of,
)
from kernelabd.service.capture import load_reference, main_dtype  # noqa: E402

PROBLEMS = ROOT / "bench" / "port" / "problems"
PROBLEMS_HELP = ("folder of references (default bench/port/problems), e.g. bench/coverage/kernelbench/level1 "
                 "for KernelBench's own files at their own sizes")
H200_SMS = 132
"""What the templates' launches size their persistent grids and splits by (``_sms``): compiled
here on CPU tensors, they would otherwise plan for the interpreter's few programs, and skip
kernels (a split-K sum) that the GPU runs."""


@dataclass
class KernelUse:
    """ptxas's account of one compiled kernel."""

    problem: str
    proposer: str
    kernel: str
    num_warps: int
    num_stages: int
    registers: int
    stack_bytes: int        # per thread, in local memory: spills, or values parked outside
                            # the hot loop with registers to spare (the fp32 matmul's 8 B)
    smem_bytes: int         # dynamic shared memory per program

    @property
    def problems(self) -> list[str]:
        """Why this kernel would run badly or not at all on an H100/H200; [] when it fits."""
        return fit.Usage(self.registers, self.stack_bytes, self.smem_bytes, self.num_warps).problems


def seed(problem: Path, proposer: Proposer) -> tuple[str, str] | str:
    """(source, edit) of the proposer's first candidate for ``problem``, or why there is none.
    An Inductor port's timed kernels are specialised to the shape it was captured at (other
    shapes run a copy), so it is captured at the GPU's sizes, the ones compiled here."""
    sidecar = load_problem(problem).sidecar
    device = "cpu"
    if isinstance(proposer, InductorProposer):
        sidecar = replace(sidecar, sizes={**sidecar.sizes, "cpu": sidecar.constants_for("cuda")})
        device = "cuda" if torch.cuda.is_available() else device    # Inductor's GPU code, on one
    ctx = JobContext(job_id=0, problem=problem.stem, reference_source=problem.read_text(),
                     device=device, budget=Budget(candidates_left=1, seconds_left=600.0), sidecar=sidecar)
    answer = proposer.propose(ctx)
    if not isinstance(answer, Proposal):
        return answer.reason or "no candidate"
    return answer.source, answer.edit


def with_values(source: str, values: dict[str, int]) -> str:
    """``source`` with declared tunables set as the tuner would set them (``--set``); a name
    the seed does not declare is left alone, since seeds of different families differ."""
    for tunable in parse_tunables(source):
        if tunable.name in values:
            source = apply_edit(source, tunable, values[tunable.name])
    return source


@functools.lru_cache(maxsize=1)
def at_gpu_sizes(problem: Path) -> tuple[Any, torch.nn.Module, list[Any]]:
    """The reference built at its ``[sizes.cuda]`` sizes, once per problem: a grid compiles many
    configurations of one seed against it (the FFN's weights alone are 350 MB)."""
    sidecar = load_problem(problem).sidecar
    return load_reference(problem.read_text(), sidecar.constants_for("cuda"))


def compile_seed(problem: Path, source: str, work: Path) -> list[tuple[str, Any]]:
    """Build the seed's ModelNew at the GPU sizes and compile every kernel its forward launches.
    (Triton reads a kernel's source from its file, so the seed is written to ``work`` first.)"""
    path = work / f"{problem.stem}_seed.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    if hasattr(module, "_sms"):     # the templates' SM count: an H200's, not the CPU stand-in's few
        module._sms = lambda x: H200_SMS
    reference, model, inputs = at_gpu_sizes(problem)
    candidate = module.ModelNew(*reference.get_init_inputs())
    candidate.load_state_dict(model.state_dict())
    with torch.no_grad(), TritonCompileOnly() as compiled:
        candidate(*inputs)
    return [(kernel.metadata.name, kernel) for kernel, _ in compiled.kernels]


class Declined(Exception):
    """The proposer offers no seed for a problem: nothing to compile, which is no failure of the
    templates' code (the problem's reference is not one their matchers recognise yet)."""


def check(problem: Path, proposer_name: str, work: Path,
          values: dict[str, int]) -> tuple[list[KernelUse], str | None]:
    """The kernels of one problem's seed, or the reason it could not be compiled; ``Declined``
    when there is no seed."""
    proposer: Proposer = (TemplateProposer() if proposer_name == "template"
                          else InductorProposer(on_cpu=True))
    found = seed(problem, proposer)
    if isinstance(found, str):
        raise Declined(found)
    try:
        kernels = compile_seed(problem, with_values(found[0], values), work)
    except Exception as exc:  # a compile error is this check's finding, not its crash
        return [], f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    if not kernels:
        return [], "the seed launched no Triton kernel"
    return [_use(problem, proposer_name, name, kernel) for name, kernel in kernels], None


def grid(source: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Up to ``n`` configurations of the declared tunables: the whole grid when it is that
    small, else a seeded random sample of it."""
    tunables = parse_tunables(source)
    combos = list(itertools.product(*(t.values for t in tunables)))
    if len(combos) > n:
        combos = random.Random(seed).sample(combos, n)
    return [dict(zip((t.name for t in tunables), combo, strict=True)) for combo in combos]


def target_of(problem: Path) -> Target:
    """The tuner's view of a GPU job for ``problem``: its main dtype at the GPU sizes."""
    _, model, inputs = at_gpu_sizes(problem)
    dtype = main_dtype([*inputs, *model.parameters()]) or ""
    return Target(gpu=True, elem_bytes=2 if dtype in ("torch.float16", "torch.bfloat16") else 4)


@dataclass
class Pruning:
    """The tuner's verdict on one configuration next to ptxas's."""

    problem: str
    params: dict[str, Any]
    predicted_fit: bool
    compiled_fit: bool | None      # None: the configuration did not compile
    why: str

    @property
    def agrees(self) -> bool:
        return self.predicted_fit == bool(self.compiled_fit)


def check_grid(problem: Path, n: int, work: Path) -> list[Pruning]:
    """The tuner's pruning against ptxas over a sample of one template seed's grid."""
    found = seed(problem, TemplateProposer())
    if isinstance(found, str):
        return []
    source = found[0]
    resources, target = resources_of(source), target_of(problem)
    verdicts = []
    for params in grid(source, n):
        predicted = fits(params, resources, target)
        try:
            kernels = compile_seed(problem, with_values(source, params), work)
        except Exception as exc:  # an over-large tile that fails to compile is a finding
            verdicts.append(Pruning(problem.stem, params, predicted, None,
                                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"))
            continue
        found_problems = [p for name, k in kernels for p in _use(problem, "template", name, k).problems]
        verdicts.append(Pruning(problem.stem, params, predicted, not found_problems,
                                "; ".join(found_problems)))
    return verdicts


def _use(problem: Path, proposer: str, name: str, kernel: Any) -> KernelUse:
    """One compiled kernel as the table reports it, from its cubin and metadata."""
    usage = fit.usage_of(kernel)
    return KernelUse(problem.stem, proposer, name, usage.num_warps, kernel.metadata.num_stages,
                     usage.registers, usage.stack_bytes, usage.smem_bytes)


def grid_table(verdicts: list[Pruning]) -> str:
    lines = ["| problem | configs | tuner keeps | ptxas fits | agree | kept but spills/overflows "
             "| pruned but fits |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in sorted({v.problem for v in verdicts}):
        vs = [v for v in verdicts if v.problem == name]
        lines.append(f"| {name} | {len(vs)} | {sum(v.predicted_fit for v in vs)} "
                     f"| {sum(bool(v.compiled_fit) for v in vs)} | {sum(v.agrees for v in vs)} "
                     f"| {sum(v.predicted_fit and not v.compiled_fit for v in vs)} "
                     f"| {sum(not v.predicted_fit and bool(v.compiled_fit) for v in vs)} |")
    return "\n".join(lines)


def table(rows: list[KernelUse], failures: dict[str, str], declined: dict[str, str]) -> str:
    lines = ["| problem | kernel | warps | stages | registers | stack B | smem KiB | verdict |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        verdict = "; ".join(r.problems) or "fits"
        lines.append(f"| {r.problem} | {r.kernel} | {r.num_warps} | {r.num_stages} | {r.registers} "
                     f"| {r.stack_bytes} | {r.smem_bytes / 1024:.1f} | {verdict} |")
    lines += [f"| {name} | — | | | | | | FAILED: {why} |" for name, why in failures.items()]
    lines += [f"| {name} | — | | | | | | no seed: {why} |" for name, why in declined.items()]
    return "\n".join(lines)


def select_problems(only: list[str] | None, parser: argparse.ArgumentParser,
                    folder: Path | None = None) -> list[Path]:
    """The suite's problem files (or ``folder``'s, such as KernelBench's own), or those named by
    ``--only`` (an unknown name is a usage error)."""
    problems = sorted((folder or PROBLEMS).glob("*.py"))
    if only:
        unknown = set(only) - {p.stem for p in problems}
        if unknown:
            parser.error(f"unknown problem(s): {', '.join(sorted(unknown))}")
        problems = [p for p in problems if p.stem in only]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="problems to check (default: all)")
    parser.add_argument("--problems", type=Path, help=PROBLEMS_HELP)
    parser.add_argument("--proposer", choices=["template", "inductor"], default="template")
    parser.add_argument("--out", type=Path, help="also write kernels.jsonl and table.md here")
    parser.add_argument("--grid", type=int, default=0, metavar="N",
                        help="also compare the tuner's pruning with ptxas on up to N configurations a seed")
    parser.add_argument("--set", nargs="+", default=[], metavar="TUNABLE=VALUE",
                        help="compile with these tunables changed, as the tuner would change them")
    args = parser.parse_args(argv)
    values: dict[str, int] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if not name or not value.lstrip("-").isdigit():
            parser.error(f"--set {item!r}: expected TUNABLE=INTEGER")
        values[name] = int(value)
    if args.grid and args.proposer != "template":
        parser.error("--grid samples the templates' declared tunables: use it with --proposer template")
    problems = select_problems(args.only, parser, args.problems)
    use_stand_in_driver()
    rows: list[KernelUse] = []
    failures: dict[str, str] = {}
    declined: dict[str, str] = {}
    verdicts: list[Pruning] = []
    with tempfile.TemporaryDirectory() as work:
        for i, problem in enumerate(problems, 1):
            print(f"[{i}/{len(problems)}] {problem.stem}", file=sys.stderr, flush=True)
            try:
                uses, failure = check(problem, args.proposer, Path(work), values)
            except Declined as why:
                declined[problem.stem] = str(why)
                continue
            rows += uses
            if failure:
                failures[problem.stem] = failure
            if args.grid:
                verdicts += check_grid(problem, args.grid, Path(work))
    text = table(rows, failures, declined)
    if verdicts:
        text += "\n\nThe tuner's pruning against ptxas:\n\n" + grid_table(verdicts)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "kernels.jsonl").open("w") as f:
            for r in rows:
                f.write(json.dumps({**asdict(r), "problems": r.problems}) + "\n")
        if verdicts:
            with (args.out / "pruning.jsonl").open("w") as f:
                for v in verdicts:
                    f.write(json.dumps(asdict(v)) + "\n")
        (args.out / "declined.json").write_text(json.dumps(declined) + "\n")
        (args.out / "table.md").write_text(text + "\n")
    print(f"triton {triton.__version__}, target sm_90, proposer {args.proposer}")
    print(text)
    return 1 if failures or any(r.problems for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
