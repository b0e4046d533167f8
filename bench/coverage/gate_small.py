"""Gate every KernelBench problem the coverage table matches, at small sizes, on the CPU.

A match (``coverage.py``) says that a template applies; this says whether its candidate is
right. Each problem's module-level sizes are shrunk in a copy of the file (batch 2, channels and
features at most ``--features``, spatial sizes at most ``--spatial``; kernel sizes, strides,
paddings, groups and values up to ``--spatial`` as they are), the template
proposer's candidate is generated at those sizes, and the real gate checks it against the
float64 oracle in Triton's interpreter, as CI's proposer tests do. A problem whose reference
does not build at the shrunk sizes (a group count that no longer divides the channels) is
reported as such, not failed.

    python3 bench/coverage/gate_small.py --out DIR [--only NAME ...] [--level 2]
    python3 bench/coverage/gate_small.py --out DIR --report A/gate.jsonl B/gate.jsonl   # one table of both
    python3 bench/coverage/gate_small.py --out DIR --proposer inductor   # the problems no template matches
    python3 bench/coverage/gate_small.py --out DIR --level 3 --only 50_ReLUSelfAttention --set max_seqlen=40

``--proposer inductor`` gates the problems the coverage table matches no template to: their only
port is TorchInductor's Triton (the ``inductor`` proposer, on the CPU through Inductor's Triton
CPU backend, as CI's proposer tests run it).

Writes ``DIR/gate.jsonl`` (a row a problem, as each ends) and ``DIR/gate.md``; exit 1 when a
candidate fails the gate.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kernelabd.harness.check import run_check  # noqa: E402
from kernelabd.propose.template.proposer import attempt  # noqa: E402

KEEP = ("kernel", "stride", "pad", "dilation", "group", "pool")
"""Words in a constant's name that mark a geometry: kept as written (a group count must still
divide the channels, a window fit the input)."""
SPATIAL = ("height", "width", "depth", "length", "seq")
SMALL = "reference does not build small"
"""The outcome of a problem whose reference fails at the shrunk sizes (a window wider than the
input, a group count that no longer divides the channels): nothing said about its template."""
SPATIAL_NAMES = {"h", "w", "d", "l", "n", "size"}


def _int_constants(source: str) -> list[tuple[str, int, ast.expr]]:
    """Module-level ``name = int`` bindings with their value's node, also chained (``h = w =
    256``), unpacked (``depth, height, width = 24, 48, 48``) and in a tuple (``input_shape =
    (32768,)``: ``input_shape[0]``)."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(target.elts) == len(node.value.elts):
                pairs = list(zip(target.elts, node.value.elts, strict=True))
            found += [(t.id, n, v) for t, v in pairs
                      if isinstance(t, ast.Name) and (n := _arithmetic(v)) is not None]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Tuple | ast.List):
                found += [(f"{target.id}[{i}]", n, v) for i, v in enumerate(node.value.elts)
                          if (n := _arithmetic(v)) is not None]
    return found


def _arithmetic(node: ast.expr) -> int | None:
    """An int written as numbers and arithmetic (``1024 * 2``, ``2 ** 12``), else None."""
    if not all(isinstance(n, ast.Constant | ast.BinOp | ast.UnaryOp | ast.operator | ast.unaryop)
               for n in ast.walk(node)):
        return None
    try:
        value = eval(compile(ast.Expression(node), "<size>", "eval"), {"__builtins__": {}})
    except (ArithmeticError, TypeError, ValueError):
        return None
    return value if type(value) is int else None


def shrink(source: str, spatial: int, features: int,
           sizes: dict[str, int] | None = None) -> tuple[str, dict[str, int]]:
    """The source with its integer constants shrunk (batch to 2, spatial sizes to ``spatial``,
    other sizes such as channels and features to ``features``; geometry and values up to
    ``spatial`` kept; a constant named in ``sizes`` to its value there), and what changed. The
    values are rewritten in the source, so that sizes derived from them at import (``bias_shape
    = (out_channels, 1, 1)``) follow."""
    edits: list[tuple[ast.expr, int]] = []
    changed: dict[str, int] = {}
    for name, n, node in _int_constants(source):
        low = name.lower()
        if sizes and name in sizes:
            new = sizes[name]
        elif low.startswith("batch"):
            new = min(n, 2)
        elif n <= spatial or any(word in low for word in KEEP):
            continue
        elif low in SPATIAL_NAMES or any(word in low for word in SPATIAL):
            new = spatial
        else:
            new = min(n, features)
        if new != n:
            edits.append((node, new))
            changed[name] = new
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = {(node.lineno, node.col_offset): (node, new) for node, new in edits}   # ``h = w = 256``: one value
    for _, (node, new) in sorted(spans.items(), reverse=True):
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        data = data[:begin] + str(new).encode() + data[end:]
    return data.decode(), changed


def miss(reason: str) -> str:
    """A problem the template proposer declined at the small sizes: because its reference does
    not run there, or for a reason of the graph."""
    return SMALL if "running forward on" in reason or "building the model" in reason else "no match"


def inductor_port(source: str) -> Any:
    """The inductor proposer's candidate for ``source`` on this CPU, or its ``Decline``."""
    from kernelabd.propose.base import Budget, JobContext
    from kernelabd.propose.inductor.proposer import InductorProposer

    context = JobContext(job_id=0, problem="p", reference_source=source, device="cpu", budget=Budget(1, 600.0))
    return InductorProposer(on_cpu=True).propose(context)


PROPOSERS = {"template": attempt, "inductor": inductor_port}
PROPOSING = threading.Lock()
"""Proposers trace the reference in this process, and torch.fx's tracer patches globals: two
threads tracing at once failed with ``CURRENT_PATCHER is None`` or a module "not installed as a
submodule". Only the gates, each in its own sandbox, run side by side."""


def gate_one(path: Path, spatial: int, features: int, work: Path, proposer: str = "template",
             given: dict[str, int] | None = None) -> dict[str, Any]:
    source, sizes = shrink(path.read_text(), spatial, features, given)
    row: dict[str, Any] = {"level": int(path.parent.name.removeprefix("level")), "problem": path.stem, "sizes": sizes}
    t0 = time.monotonic()
    with PROPOSING:
        found = PROPOSERS[proposer](source)
    if not hasattr(found, "source"):
        row.update(outcome=miss(found.reason), reason=found.reason[:300])
        return row
    ref, cand = work / f"{path.stem}.py", work / f"{path.stem}.new.py"
    ref.write_text(source)
    cand.write_text(found.source)
    result = run_check(ref, cand, device="cpu", time_it=False).to_json()
    rule, reason = result.get("rule"), (result.get("reason") or "")[:300]
    row.update(outcome=result["verdict"] if rule != "bad_reference" else SMALL,
               rule=rule, reason=reason, max_rel_error=result.get("max_rel_error"),
               tolerance=result.get("tolerance"), edit=found.edit, seconds=round(time.monotonic() - t0, 1))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    lines = ["| outcome | problems |", "|---|---:|", *(f"| {k} | {v} |" for k, v in sorted(counts.items())), "",
             "| level | problem | outcome | max rel. error / tolerance | template | why |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["level"], r["problem"])):
        err = f"{r['max_rel_error']:.2e} / {r['tolerance']:.2e}" if r.get("max_rel_error") is not None \
            and r.get("tolerance") else ""
        why = f"{r.get('rule') or ''}: {r.get('reason') or ''}" if r["outcome"] != "pass" else ""
        lines.append(f"| {r['level']} | {r['problem']} | {r['outcome']} | {err} | {(r.get('edit') or '')[:120]} | "
                     f"{why[:160].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--level", type=int, choices=[1, 2, 3], action="append", help="default: 1 and 2")
    ap.add_argument("--only", nargs="+", help="problem names (file stems)")
    ap.add_argument("--rows", default=str(ROOT / "bench/coverage/rows.json"), help="coverage rows: which match")
    ap.add_argument("--spatial", type=int, default=10)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--proposer", choices=sorted(PROPOSERS), default="template",
                    help="template: the problems a template matches; inductor: those none matches")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="module-level sizes to set as given (where the rules above break a reference)")
    ap.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--report", nargs="+", help="only rebuild OUT/gate.md from these gate.jsonl (a later row of a "
                                                 "problem, e.g. at larger sizes, supersedes an earlier one)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        latest = {(r["level"], r["problem"]): r for f in args.report for line in Path(f).read_text().splitlines()
                  if line.strip() and (r := json.loads(line))}
        rows = list(latest.values())
        for r in rows:
            r["outcome"] = miss(r.get("reason", "")) if r["outcome"] == "no match" else r["outcome"]
        (out / "gate.md").write_text(table(rows))
        return 0
    matched = {(r["level"], r["problem"]) for r in json.loads(Path(args.rows).read_text())["rows"] if r["template"]}
    levels = args.level or [1, 2]
    paths = [p for lv in levels for p in sorted((ROOT / f"bench/coverage/kernelbench/level{lv}").glob("*.py"))
             if ((lv, p.stem) in matched) == (args.proposer == "template") and (not args.only or p.stem in args.only)]
    work = Path(tempfile.mkdtemp(prefix="kernelab-gate-small-"))
    work.chmod(0o755)
    rows: list[dict[str, Any]] = []
    with ThreadPoolExecutor(args.parallel) as pool, open(out / "gate.jsonl", "w") as f:
        given = {k: int(v) for k, _, v in (item.partition("=") for item in args.set)}
        for row in pool.map(lambda p: gate_one(p, args.spatial, args.features, work, args.proposer, given), paths):
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{row['problem']:60s} {row['outcome']:10s} {row.get('rule') or ''} {row.get('reason', '')[:100]}",
                  flush=True)
    (out / "gate.md").write_text(table(rows))
    return 1 if any(r["outcome"] == "fail" or r["outcome"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
