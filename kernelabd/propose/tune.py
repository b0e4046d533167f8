"""The ``tune`` proposer: coordinate descent over a candidate's declared tunables, one
parameter per edit.

A candidate declares ``TUNABLES = {"BLOCK_SIZE": [128, 256, 512], "num_warps": [2, 4, 8]}`` and
holds each current value as a module-level assignment (``BLOCK_SIZE = 256``). Each proposal
rewrites exactly one of those assignments in the incumbent's source, leaving every other byte
alone, so each accepted gain has exactly one cause. Neighbouring values come first (the
descent step); once every neighbour of the incumbent has been tried, the remaining values of
each parameter are tried (a restart from further away); configurations already evaluated in
this job, from any parent, are never proposed twice.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from kernelabd.propose.base import Decline, JobContext, Proposal
from kernelabd.pysource import parse

MAX_WARPS = 32  # Triton launches at most 32 warps (1024 threads) per program
SMEM_PER_PROGRAM = 232_448
"""Shared memory one program may use on Hopper (sm_90: 227 KiB); more fails to launch."""
MAX_ACC_REGS = 128
"""fp32 accumulator registers per thread beyond which a tile spills to local memory (of 255;
the rest hold addresses, operands and the pipeline), when the dots run on tensor cores."""
MAX_ACC_REGS_FMA = 64
"""The same for fp32 dots without TF32 (``RESOURCES["dots"]`` ``"ieee"`` or ``"tf32x3"`` on an
fp32 job): IEEE dots run on the FMA units with both operand fragments in registers too, 3xTF32
dots hold each operand's head and tail. In ``bench/port/sm90.py`` runs, every fp32 matmul
configuration with 128 accumulator registers a thread spilled, IEEE (Triton 3.6 and 3.9) and
3xTF32 (Triton 3.9: 128×128×32 at 4 warps, 616–968 bytes a thread), sm_90."""


class TunablesError(ValueError):
    """The candidate's ``TUNABLES`` declaration cannot be used; the message says why."""


@dataclass(frozen=True)
class Tunable:
    """One declared parameter: its allowed values, its current value and where it is set."""

    name: str
    values: tuple[Any, ...]
    current: Any
    line: int          # 1-based line of ``NAME = value``
    col: int           # value expression's span on that line
    end_col: int


def _module_assignments(tree: ast.Module) -> dict[str, ast.Assign]:
    found: dict[str, ast.Assign] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            found[node.targets[0].id] = node
    return found


def parse_tunables(source: str) -> list[Tunable]:
    """The declared tunables of ``source``, in declaration order; [] when none are declared."""
    try:
        tree = parse(source)
    except SyntaxError as exc:
        raise TunablesError(f"candidate does not parse: {exc.msg} (line {exc.lineno})") from exc
    assigns = _module_assignments(tree)
    decl = assigns.get("TUNABLES")
    if decl is None:
        return []
    try:
        spaces = ast.literal_eval(decl.value)
    except ValueError as exc:
        raise TunablesError("TUNABLES must be a literal dict of lists") from exc
    if not isinstance(spaces, dict):
        raise TunablesError("TUNABLES must be a dict {name: [values]}")
    out = []
    for name, values in spaces.items():
        node = assigns.get(name)
        if node is None:
            raise TunablesError(f"tunable {name} has no module-level assignment `{name} = …`")
        if node.value.lineno != node.value.end_lineno:
            raise TunablesError(f"tunable {name}'s value must fit on one line")
        try:
            current = ast.literal_eval(node.value)
        except ValueError as exc:
            raise TunablesError(f"tunable {name} must be assigned a literal") from exc
        if not isinstance(values, list | tuple) or not values:
            raise TunablesError(f"TUNABLES[{name!r}] must be a non-empty list")
        out.append(Tunable(name, tuple(values), current, node.value.lineno,
                           node.value.col_offset, int(node.value.end_col_offset or 0)))
    return out


def apply_edit(source: str, tunable: Tunable, value: Any) -> str:
    """``source`` with ``tunable`` set to ``value``; every other byte is unchanged.

    AST columns are UTF-8 byte offsets, so the line is edited as bytes.
    """
    lines = source.splitlines(keepends=True)
    raw = lines[tunable.line - 1].encode()
    lines[tunable.line - 1] = (raw[:tunable.col] + repr(value).encode()
                               + raw[tunable.end_col:]).decode()
    return "".join(lines)


@dataclass(frozen=True)
class Target:
    """What a configuration must fit: a GPU's limits, or none under the CPU interpreter.
    ``elem_bytes`` is the size of the tiles' elements (the job's main dtype)."""

    gpu: bool = False
    elem_bytes: int = 4

    @classmethod
    def of(cls, ctx: JobContext) -> Target:
        dtype = (ctx.capture or {}).get("dtype") or ""
        half = dtype in ("torch.float16", "torch.bfloat16")
        return cls(gpu=ctx.device.startswith("cuda"), elem_bytes=2 if half else 4)


def _tiles(tiles: Any, params: dict[str, Any]) -> int | None:
    """Elements in the named tiles (each a list of tunable names), None if one is not a number."""
    total = 0
    for tile in tiles or ():
        size = 1
        for name in tile:
            value = params.get(name)
            if not isinstance(value, int):
                return None
            size *= value
        total += size
    return total


def fits(params: dict[str, Any], resources: dict[str, Any] | None = None,
         target: Target = Target()) -> bool:
    """Prune configurations that cannot launch, or would spill, before spending an evaluation
    on them: launch limits always; on a GPU, the shared memory and registers of the tiles the
    candidate declares in ``RESOURCES`` — ``smem`` (per pipeline stage), ``acc`` (fp32
    accumulators), ``regs`` (other per-element state a program keeps in registers, such as a
    gathered tile's addresses) and ``dots`` (the dots' input precision)."""
    warps = params.get("num_warps")
    if isinstance(warps, int) and (warps < 1 or warps > MAX_WARPS or warps & (warps - 1)):
        return False
    stages = params.get("num_stages")
    if isinstance(stages, int) and stages < 1:
        return False
    if not (target.gpu and resources):
        return True
    smem = _tiles(resources.get("smem"), params)
    if smem is not None and max(1, stages or 1) * smem * target.elem_bytes > SMEM_PER_PROGRAM:
        return False
    acc = _tiles(resources.get("acc"), params)
    if acc is None or not isinstance(warps, int):
        return True
    held = acc + (_tiles(resources.get("regs"), params) or 0)
    fp32_dots = target.elem_bytes == 4 and resources.get("dots") in ("ieee", "tf32x3")
    return held / (32 * warps) <= (MAX_ACC_REGS_FMA if fp32_dots else MAX_ACC_REGS)


def resources_of(source: str) -> dict[str, Any] | None:
    """The candidate's ``RESOURCES`` literal, if it declares one that reads as a dict."""
    try:
        decl = _module_assignments(parse(source)).get("RESOURCES")
        value = ast.literal_eval(decl.value) if decl is not None else None
    except (SyntaxError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def moves(tunable: Tunable) -> list[tuple[int, Any]]:
    """(distance, value) pairs to try for one parameter, nearest first (larger value first on
    a tie); a current value outside the declared list is distance 1 from every value."""
    values = list(tunable.values)
    if tunable.current not in values:
        return [(1, v) for v in values]
    here = values.index(tunable.current)
    order = sorted(range(len(values)), key=lambda i: (abs(i - here), -i))
    return [(abs(i - here), values[i]) for i in order if i != here]


def _key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


class TuneProposer:
    """Coordinate descent from the incumbent over its declared tunables."""

    name = "tune"

    def propose(self, ctx: JobContext) -> Proposal | Decline:
        incumbent = ctx.incumbent
        if incumbent is None:
            return Decline()
        try:
            tunables = parse_tunables(incumbent.source)
        except TunablesError:
            return Decline()
        current = {t.name: t.current for t in tunables}
        resources, target = resources_of(incumbent.source), Target.of(ctx)
        tried = {_key(c.params) for c in ctx.history if c.params}
        tried.add(_key(current))
        for near in (True, False):   # neighbours of every parameter first, then the rest
            for t in tunables:
                for distance, value in moves(t):
                    if (distance == 1) != near:
                        continue
                    params = {**current, t.name: value}
                    if _key(params) in tried or not fits(params, resources, target):
                        continue
                    return Proposal(source=apply_edit(incumbent.source, t, value),
                                    edit=f"{t.name} {t.current!r} → {value!r}",
                                    parent_id=incumbent.id, params=params,
                                    language=incumbent.language)
        return Decline()


def params_of(source: str) -> dict[str, Any] | None:
    """The current tunable values of ``source`` (None when it declares none or is malformed),
    recorded with every candidate so the tuner knows what has been tried."""
    try:
        tunables = parse_tunables(source)
    except TunablesError:
        return None
    return {t.name: t.current for t in tunables} or None
