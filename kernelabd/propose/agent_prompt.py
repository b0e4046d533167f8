"""What an agent is shown, and how its answer is read back into one single-edit candidate.

The agent sees what a kernel engineer would: the reference, the contract a candidate must meet,
the incumbent with its timings and capture, and the last gate failures with their evidence.
It never sees an expected output (evidence keys that hold one are dropped), so it cannot learn
the answer instead of computing it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from kernelabd.propose.base import Candidate, JobContext
from kernelabd.propose.tune import params_of

FAILURES_SHOWN = 3          # most recent gate failures in a prompt
ATTEMPTS_SHOWN = 12         # most recent edits (with verdicts) listed so none is repeated
HIDDEN_EVIDENCE = ("expected",)   # evidence keys that would leak the oracle's values

CONTRACT = """\
You port and tune GPU kernels for kernelab. The harness, not you, decides what is correct and
what is faster: your file is run in a sandbox, checked against a float64 oracle on inputs you
never see, and timed against the incumbent.

The contract of a candidate file:
- It defines `class ModelNew(nn.Module)` taking the same constructor arguments as the
  reference's `Model` and loading the same `state_dict` (same parameter and buffer names).
- Its forward computes with {target} kernels that it launches itself; PyTorch may allocate
  outputs (`torch.empty`, `torch.empty_like`) but may not compute (no torch math outside the
  kernels, no calling the reference).
- Outputs have the reference's shapes, dtypes and strides; inputs are never modified; all work
  is finished when forward returns (no side streams); the same inputs give the same outputs.
- No file, network, environment or process access.
- It may declare its tunable parameters as `TUNABLES = {{"BLOCK_SIZE": [128, 256, 512], ...}}`
  with each current value as a module-level assignment (`BLOCK_SIZE = 256`).

How to change it:
- ONE change per edit: one parameter, or one rewrite with one reason. Parameters before
  rewrites.
- Answer with one line `EDIT: <the single change, in one line>` and then the WHOLE new file in
  one ```python code block. Nothing else is read."""


@dataclass(frozen=True)
class Parsed:
    """An answer read back: the new file and its one-line edit, or why it is unusable."""

    source: str | None
    edit: str | None
    error: str | None = None


def system_message(ctx: JobContext) -> str:
    return CONTRACT.format(target=ctx.sidecar.target.capitalize())


def user_message(ctx: JobContext, in_flight: Candidate | None = None) -> str:
    """The job as the agent needs it, most useful first."""
    sections = [f"# Problem `{ctx.problem}` on {ctx.device}",
                _block("The reference (KernelBench convention)", ctx.reference_source)]
    sidecar = {k: v for k, v in dataclasses.asdict(ctx.sidecar).items() if v}
    sections.append(_block("Its sidecar (sizes, tolerances)", json.dumps(sidecar, indent=1), "json"))
    sections.append(_capture(ctx.capture))
    incumbent = ctx.incumbent
    if incumbent is not None:
        sections.append(_block(f"The incumbent (candidate #{incumbent.id}, by {incumbent.proposer}; "
                               f"edit it)", incumbent.source))
        sections.append(_timings(ctx, incumbent))
    elif ctx.start_source:
        sections.append(_block("A starting candidate (not yet verified)", ctx.start_source))
    else:
        sections.append("No candidate has passed the gate yet: write the first port.")
    sections.append(_failures(ctx.history))
    sections.append(_attempts(ctx.history, in_flight))
    sections.append("Propose the next candidate: one change, the whole file, as described.")
    return "\n\n".join(s for s in sections if s)


def _block(title: str, text: str, lang: str = "python") -> str:
    return f"## {title}\n```{lang}\n{text.rstrip()}\n```"


def _capture(capture: dict[str, Any] | None) -> str:
    if not capture or "error" in capture:
        return ""
    lines = ["## The reference's work (captured)"]
    if capture.get("flops") is not None:
        lines.append(f"- FLOPs: {capture['flops']:,}")
    if capture.get("min_bytes") is not None:
        lines.append(f"- bytes moved at least: {capture['min_bytes']:,}")
    sol = capture.get("sol")
    if sol:
        lines.append(f"- speed-of-light floor on this device: {sol['ms']:.4g} ms ({sol.get('bound')}-bound)")
    launches = [x for x in capture.get("launches") or [] if isinstance(x, dict)]
    if launches:
        names = "; ".join(f"{x.get('name')} ×{x.get('count', 1)}, {x.get('device_us', '?')} µs"
                          for x in launches[:8])
        lines.append(f"- the reference's launches: {names}")
    return "\n".join(lines) if len(lines) > 1 else ""


def _timings(ctx: JobContext, incumbent: Candidate) -> str:
    lines = ["## Timings"]
    if incumbent.candidate_ms is not None:
        lines.append(f"- incumbent: {incumbent.candidate_ms:.4g} ms")
    timed = [c for c in ctx.history if c.verdict == "pass" and c.candidate_ms]
    best = min(timed, key=lambda c: c.candidate_ms or 0.0, default=None)
    if best is not None and incumbent.candidate_ms and best.id != incumbent.id:
        lines.append(f"- fastest passing candidate so far: #{best.id} ({best.proposer}) "
                     f"{best.candidate_ms:.4g} ms, a gap of {incumbent.candidate_ms / best.candidate_ms:.3f}x "
                     "(not kept: not faster than noise)")
    sol = (ctx.capture or {}).get("sol")
    if sol and incumbent.candidate_ms:
        lines.append(f"- gap to the speed-of-light floor: {incumbent.candidate_ms / sol['ms']:.2f}x")
    return "\n".join(lines) if len(lines) > 1 else ""


def visible_evidence(evidence: dict[str, Any] | None) -> dict[str, Any]:
    """A failure's evidence without the oracle's values."""
    return {k: v for k, v in (evidence or {}).items()
            if not any(k.startswith(h) for h in HIDDEN_EVIDENCE)}


def _failures(history: tuple[Candidate, ...]) -> str:
    failed = [c for c in history if c.verdict in ("fail", "error")][-FAILURES_SHOWN:]
    if not failed:
        return ""
    lines = ["## The last gate failures"]
    for c in failed:
        lines.append(f"- #{c.id} ({c.proposer}, edit: {c.edit}): {c.rule}: {c.reason}")
        evidence = visible_evidence(c.evidence)
        if evidence:
            lines.append(f"  evidence: {json.dumps(evidence, default=str)[:1500]}")
    return "\n".join(lines)


def _attempts(history: tuple[Candidate, ...], in_flight: Candidate | None) -> str:
    done = [c for c in history if c.state == "done"][-ATTEMPTS_SHOWN:]
    lines = [f"- #{c.id} {c.proposer}: {c.edit} → {_verdict(c)}" for c in done]
    if in_flight is not None:
        lines.append(f"- (your last proposal) {in_flight.edit} → being checked now")
    return "## Edits tried so far (do not repeat one)\n" + "\n".join(lines) if lines else ""


def _verdict(c: Candidate) -> str:
    if c.verdict != "pass":
        return f"{c.verdict} ({c.rule})"
    speed = f"{c.speedup:.3f}x" if c.speedup is not None else "untimed"
    return f"accepted, {speed}" if c.accepted else f"passed, not faster than noise ({speed})"


FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
EDIT_LINE = re.compile(r"^\s*\**EDIT\**\s*:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)


def parse_answer(text: str, parent: Candidate | None) -> Parsed:
    """The answer's new file and edit, or the reason it is not one usable single edit."""
    files = [body for _, body in FENCE.findall(text) if "class ModelNew" in body]
    if not files and "class ModelNew" in text and "```" not in text:
        files = [text]              # a bare file (a command agent's candidate.py)
    if not files:
        return Parsed(None, None, "no usable code: no code block defines class ModelNew")
    if len(files) > 1:
        return Parsed(None, None, f"not a single edit: the answer holds {len(files)} files")
    prose = FENCE.sub("", text)
    edits = EDIT_LINE.findall(prose)
    if len(edits) > 1:
        return Parsed(None, None, f"not a single edit: {len(edits)} EDIT lines")
    source = files[0].rstrip() + "\n"
    edit = " ".join(edits[0].split())[:200] if edits else "rewrite (no EDIT line given)"
    if parent is not None:
        if source.strip() == parent.source.strip():
            return Parsed(None, None, f"no edit: the file is candidate #{parent.id} unchanged")
        changed = _changed_params(parent.source, source)
        if len(changed) > 1:
            return Parsed(None, None, f"not a single edit: {len(changed)} tunables changed at once "
                                      f"({', '.join(changed)})")
    return Parsed(source, edit)


def _changed_params(old: str, new: str) -> list[str]:
    before, after = params_of(old) or {}, params_of(new) or {}
    return sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
