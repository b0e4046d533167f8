"""The ``tune`` proposer: a model-based search over a candidate's declared tunables, screened
in batches, and one parameter per edit where screening is not possible.

A candidate declares ``TUNABLES = {"BLOCK_SIZE": [128, 256, 512], "num_warps": [2, 4, 8]}`` and
holds each current value as a module-level assignment (``BLOCK_SIZE = 256``); every variant
rewrites only those assignments in the incumbent's source, leaving every other byte alone.

Where the job can screen (``JobContext.screen_batch``), each call returns a ``Batch`` of
configurations of the incumbent: first those known to be good (the per-device cache's best for
this kernel at these sizes, then for its family; the candidate's own ``STARTS``), then every
single-parameter neighbour of the incumbent, then what a TPE model (Optuna) fitted to the
job's screened times suggests. The loop screens them and gates only the best few, so what is
accepted is still one named change to the incumbent. The proposer keeps no state: the study is
rebuilt from the job's screened rows on each call, so a job resumed after ``kill -9`` continues
the same search.

Elsewhere (a CUDA C++ target, a caller with no screening sandbox, a kernel whose every screened
configuration failed), it is coordinate descent: each proposal changes exactly one tunable,
neighbouring values first, then the remaining values of each parameter (a restart from further
away); configurations already evaluated in this job, from any parent, are never proposed twice.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import random
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kernelabd.harness.fit import SMEM_PER_PROGRAM
from kernelabd.propose.base import Batch, Candidate, Decline, JobContext, Proposal, Screened
from kernelabd.pysource import parse

MAX_WARPS = 32  # Triton launches at most 32 warps (1024 threads) per program
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
        return cls.on(ctx.device, ctx.capture)

    @classmethod
    def on(cls, device: str, capture: dict[str, Any] | None) -> Target:
        """A job's target on ``device``, its tiles' elements of the captured main dtype."""
        dtype = (capture or {}).get("dtype") or ""
        half = dtype in ("torch.float16", "torch.bfloat16")
        return cls(gpu=device.startswith("cuda"), elem_bytes=2 if half else 4)


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


def fits(params: dict[str, Any], resources: dict[str, Any] | list[dict[str, Any]] | None = None,
         target: Target = Target()) -> bool:
    """Prune configurations that cannot launch, or would spill, before spending an evaluation
    on them: launch limits always; on a GPU, the shared memory and registers of the tiles the
    candidate declares in ``RESOURCES`` — ``smem`` (per pipeline stage), ``acc`` (fp32
    accumulators), ``regs`` (other per-element state a program keeps in registers, such as a
    gathered tile's addresses) and ``dots`` (the dots' input precision). A candidate of several
    kernels declares a list, one such dict a kernel, each naming the tunables of its own launch
    (``warps``, ``stages``; default ``num_warps`` and ``num_stages``): every kernel must fit."""
    for name, value in params.items():
        if not isinstance(value, int):
            continue
        if name.startswith("num_warps") and (value < 1 or value > MAX_WARPS or value & (value - 1)):
            return False
        if name.startswith("num_stages") and value < 1:
            return False
    if not (target.gpu and resources):
        return True
    return all(_kernel_fits(params, r, target) for r in (resources if isinstance(resources, list) else [resources]))


def _kernel_fits(params: dict[str, Any], resources: dict[str, Any], target: Target) -> bool:
    """One kernel's declared tiles against one program's shared memory and registers."""
    warps, stages = params.get(resources.get("warps", "num_warps")), params.get(resources.get("stages", "num_stages"))
    smem = _tiles(resources.get("smem"), params)
    if smem is not None and max(1, stages if isinstance(stages, int) else 1) * smem * target.elem_bytes \
            > SMEM_PER_PROGRAM:
        return False
    acc = _tiles(resources.get("acc"), params)
    if acc is None or not isinstance(warps, int):
        return True
    held = acc + (_tiles(resources.get("regs"), params) or 0)
    fp32_dots = target.elem_bytes == 4 and resources.get("dots") in ("ieee", "tf32x3")
    return held / (32 * warps) <= (MAX_ACC_REGS_FMA if fp32_dots else MAX_ACC_REGS)


def resources_of(source: str) -> dict[str, Any] | list[dict[str, Any]] | None:
    """The candidate's ``RESOURCES`` literal, if it declares one that reads as a dict (or a
    list of them, one a kernel)."""
    try:
        decl = _module_assignments(parse(source)).get("RESOURCES")
        value = ast.literal_eval(decl.value) if decl is not None else None
    except (SyntaxError, ValueError):
        return None
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return value
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


STALL_BATCHES = 4
"""Batches screened from one incumbent without a gain before the tuner leaves it: each batch
is fitted to every earlier one, so by then the model has seen the neighbourhood."""
SUGGEST_ATTEMPTS = 8
"""Suggestions asked of the model per configuration wanted (one already screened is skipped)."""
FAILED_PENALTY = math.log(4.0)
"""A configuration that spilled, failed or was wrong counts, for the model, as 4× slower than
the slowest one timed: it steers the search away without hiding the timed times' spread."""
PRIMITIVE = (bool, int, float, str, type(None))


def signature(source: str) -> str:
    """``FAMILY@HASH``: the tunables' names, and a hash of the source with their values blanked,
    so that every configuration of one kernel has one signature (the tuning cache's key)."""
    tunables = parse_tunables(source)
    blanked = source
    for t in sorted(tunables, key=lambda t: t.line, reverse=True):
        blanked = apply_edit(blanked, t, None)
    digest = hashlib.sha256(blanked.encode()).hexdigest()[:16]
    return f"{family(tunables)}@{digest}"


def family(tunables: list[Tunable]) -> str:
    """A kernel family, as the tuning cache matches it across sources: its tunables' names."""
    return ",".join(sorted(t.name for t in tunables))


def choices(t: Tunable) -> tuple[Any, ...]:
    """The values a search may give one tunable: the declared ones, and the current one."""
    return t.values if t.current in t.values else (*t.values, t.current)


def known_good(source: str) -> list[dict[str, Any]]:
    """The candidate's ``STARTS``: configurations known to be good on this device and kernel
    family (a template's measured starting points), best first; [] when it declares none."""
    try:
        decl = _module_assignments(parse(source)).get("STARTS")
        value = ast.literal_eval(decl.value) if decl is not None else []
    except (SyntaxError, ValueError):
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def starts(ctx: JobContext, tunables: list[Tunable]) -> list[dict[str, Any]]:
    """Where a search begins, best bets first: the cache's configurations (exact matches
    first), the candidate's known-good ones, then each single-parameter neighbour."""
    current = {t.name: t.current for t in tunables}
    source = ctx.incumbent.source if ctx.incumbent else ""
    partial = [entry["params"] for entry in ctx.cached] + known_good(source)
    found = [{**current, **{k: v for k, v in p.items() if k in current}} for p in partial]
    found += [{**current, t.name: value} for t in tunables for distance, value in moves(t) if distance == 1]
    return found


def observations(ctx: JobContext, kernel: str) -> list[Screened]:
    """The job's screened rows of this kernel (any parent with this signature)."""
    parents = {c.id: c for c in ctx.history}
    same: dict[int, bool] = {}
    for row in ctx.screened:
        if row.parent_id in parents and row.parent_id not in same:
            same[row.parent_id] = _signature_or_none(parents[row.parent_id].source) == kernel
    return [row for row in ctx.screened if same.get(row.parent_id)]


def _signature_or_none(source: str) -> str | None:
    try:
        return signature(source)
    except TunablesError:
        return None


def scores(rows: list[Screened]) -> list[float]:
    """What the model minimises for each row: log screened time, or a penalty past the slowest
    timed row for one that could not be timed (0 for all while none was)."""
    timed = [math.log(r.ms) for r in rows if r.status == "timed" and r.ms and r.ms > 0]
    worst = max(timed, default=0.0) + FAILED_PENALTY
    return [math.log(r.ms) if r.status == "timed" and r.ms and r.ms > 0 else worst for r in rows]


def suggest(rows: list[Screened], tunables: list[Tunable], n: int, wanted: Callable[[dict[str, Any]], bool],
            seed: int) -> list[dict[str, Any]]:
    """Up to ``n`` configurations a TPE model fitted to ``rows`` expects to be fast, then random
    ones if the model keeps suggesting what ``wanted`` refuses (screened already, cannot fit)."""
    space = {t.name: choices(t) for t in tunables}
    out: list[dict[str, Any]] = []
    if _model_available() and all(isinstance(v, PRIMITIVE) for values in space.values() for v in values):
        out = _take(_tpe(rows, space, seed), n, wanted)
    return out + _take(_random(space, seed), n - len(out), wanted)


def _model_available() -> bool:
    """Whether Optuna is installed: a box set up without it still searches (randomly, after the
    known-good starts and the neighbours) instead of failing its jobs."""
    return importlib.util.find_spec("optuna") is not None


def _take(draws: Iterable[dict[str, Any]], n: int, wanted: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for attempt, params in enumerate(draws):
        if len(out) >= n or attempt >= n * SUGGEST_ATTEMPTS:
            break
        if wanted(params):
            out.append(params)
    return out


def _tpe(rows: list[Screened], space: dict[str, tuple[Any, ...]], seed: int) -> Iterable[dict[str, Any]]:
    """Endless suggestions of Optuna's TPE sampler, fitted to the screened rows. Asked trials
    stay running, so that the constant liar spreads one batch's suggestions out."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {name: CategoricalDistribution(values) for name, values in space.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for row, value in zip(rows, scores(rows), strict=True):
        if all(row.params.get(name) in values for name, values in space.items()):
            study.add_trial(create_trial(params={k: row.params[k] for k in space},
                                         distributions=distributions, value=value))
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield study.ask(distributions).params


def _random(space: dict[str, tuple[Any, ...]], seed: int) -> Iterable[dict[str, Any]]:
    rng = random.Random(seed)
    while True:
        yield {name: rng.choice(values) for name, values in space.items()}


class TuneProposer:
    """Screened batches searched with a model where the job can screen; coordinate descent from
    the incumbent, one tunable per edit, elsewhere."""

    name = "tune"

    def propose(self, ctx: JobContext) -> Proposal | Batch | Decline:
        incumbent = ctx.incumbent
        if incumbent is None:
            return Decline()
        try:
            tunables = parse_tunables(incumbent.source)
        except TunablesError:
            return Decline()
        if not tunables:
            return Decline()
        own = [r for r in ctx.screened if r.parent_id == incumbent.id]
        screening_works = not own or any(r.status == "timed" for r in own)
        if ctx.screen_batch > 0 and incumbent.language == "triton" and screening_works:
            return self.batch(ctx, incumbent, tunables, own)
        return self.single_edit(ctx, incumbent, tunables)

    def batch(self, ctx: JobContext, incumbent: Candidate, tunables: list[Tunable],
              own: list[Screened]) -> Batch | Decline:
        """The next configurations to screen: the starting points not yet screened, then the
        model's suggestions; a ``Decline`` once this incumbent has had its batches."""
        current = {t.name: t.current for t in tunables}
        if sum(_key(r.params) == _key(current) for r in own) >= STALL_BATCHES:
            return Decline()
        rows = observations(ctx, signature(incumbent.source))
        done = {_key(r.params) for r in rows} | {_key(c.params) for c in ctx.history if c.params}
        done.add(_key(current))
        resources, target = resources_of(incumbent.source), Target.of(ctx)

        def wanted(params: dict[str, Any]) -> bool:
            key = _key(params)
            if key in done or not fits(params, resources, target):
                return False
            done.add(key)
            return True

        picked = [p for p in starts(ctx, tunables) if wanted(p)][:ctx.screen_batch]
        picked += suggest(rows, tunables, ctx.screen_batch - len(picked), wanted, ctx.job_id * 7919 + len(rows))
        if not picked:
            return Decline()
        return Batch(source=incumbent.source, configs=tuple(picked), parent_id=incumbent.id,
                     language=incumbent.language)

    def single_edit(self, ctx: JobContext, incumbent: Candidate, tunables: list[Tunable]) -> Proposal | Decline:
        """Coordinate descent: the nearest untried single-parameter change of the incumbent."""
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


def with_params(source: str, params: dict[str, Any]) -> str:
    """``source`` with each named tunable set to its value in ``params``; every other byte is
    unchanged (the edits go bottom-up, so earlier spans stay where they were)."""
    for t in sorted(parse_tunables(source), key=lambda t: (t.line, t.col), reverse=True):
        if t.name in params and params[t.name] != t.current:
            source = apply_edit(source, t, params[t.name])
    return source


def describe_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    """``BLOCK_M 128 → 64, num_warps 4 → 8``: what a configuration changes from another."""
    return ", ".join(f"{k} {before.get(k)!r} → {v!r}" for k, v in after.items() if before.get(k) != v)


def params_of(source: str) -> dict[str, Any] | None:
    """The current tunable values of ``source`` (None when it declares none or is malformed),
    recorded with every candidate so the tuner knows what has been tried."""
    try:
        tunables = parse_tunables(source)
    except TunablesError:
        return None
    return {t.name: t.current for t in tunables} or None
