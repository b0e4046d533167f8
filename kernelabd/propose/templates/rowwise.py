"""Softmax, log-softmax, LayerNorm and RMSNorm: each element crosses memory once each way, at
any slice width (eager runs these as several kernels, or one kernel with an extra pass).

The input is viewed as ``(outer, R, inner)`` with the normalised extent ``R`` in the middle, so
any ``dim`` works without a transposing copy. A *column* is one slice: an outer row when
``inner == 1`` (its ``R`` elements contiguous), else one ``(outer, inner)`` position (``R``
elements ``inner`` apart, neighbouring columns contiguous). Two kernels:

- **In registers** (``R`` up to ``MAX_SLICE``): a program holds a ``BLOCK_R × BLOCK_C`` tile,
  ``BLOCK_C`` whole slices side by side (several rows a program for narrow rows, so that a tile
  is ``TILE`` elements however narrow the row), reduces it and writes the result. Programs are
  persistent (``PER_SM`` an SM) and walk tiles with ``STAGES`` tiles' loads in flight.
- **Split** (wider slices, or too few slices to fill the GPU): a slice is cut into chunks of
  ``CHUNK`` elements. A *stats* item reads one chunk and writes its partial statistics (running
  max and sum of exponentials; Chan's mean and squared deviations; sum of squares); an *apply*
  item of the same chunk, once every stats item of its slice is done, combines the slice's
  partials, reads the chunk again and writes the result. Items are handed out in one order
  through an atomic ticket, with stats items running ``lead`` items ahead of the apply items,
  so that the second read of a chunk comes soon after the first and hits L2: the slice crosses
  memory about once each way, where a two-pass kernel reads it twice from memory. An apply item
  waits only on stats items with earlier tickets, which programs already running took and
  finish without waiting: no deadlock however many programs are resident, and in Triton's
  interpreter (programs run one after another) every wait is already satisfied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelabd.propose.templates import common

SHIFT = "shift = tl.load(x_ptr + base, mask=c < cols, other=0.0).to(tl.float32)"
"""LayerNorm's shift, the slice's first value (with a prologue, computed as the slice is)."""
BODIES: dict[str, list[str]] = {
    "softmax": [
        "x = tl.where(mask, x, -float('inf'))",
        "e = tl.exp(x - tl.max(x, axis=0)[None, :])",
        "y = e / tl.sum(e, axis=0)[None, :]",
    ],
    "log_softmax": [
        "x = tl.where(mask, x, -float('inf'))",
        "z = x - tl.max(x, axis=0)[None, :]",
        "y = z - tl.log(tl.sum(tl.exp(z), axis=0))[None, :]",
    ],
    "layer_norm": [
        SHIFT,
        "x = tl.where(mask, x - shift, 0.0)",
        "d = tl.where(mask, x - (tl.sum(x, axis=0) / R)[None, :], 0.0)",
        "y = d / tl.sqrt(tl.sum(d * d, axis=0) / R + eps)[None, :]",
    ],
    "rms_norm": [
        "y = x / tl.sqrt(tl.sum(x * x, axis=0) / R + eps)[None, :]",
    ],
    "l2_norm": [
        "y = x / tl.sqrt(tl.sum(x * x, axis=0) + eps)[None, :]",
    ],
    "normalize": [
        "y = x / tl.maximum(tl.sqrt(tl.sum(x * x, axis=0)), eps)[None, :]",
    ],
}
"""LayerNorm's statistics are taken of ``x - shift``, the slice's first element: the mean of
inputs far from zero (the gate's offset inputs, 100–200σ) then loses nothing to the size of the
sum, and the result is the same for any shift."""


@dataclass(frozen=True)
class Stats:
    """A row operation split into chunks: the partial statistics a stats item keeps for each
    column (``names``), how a tile updates them, how the apply item combines the slice's
    partials (loaded as ``p_<name>``, ``BLOCK_P × BLOCK_C``, with ``n_p`` the chunk lengths)
    into the final statistics, and the result from them."""

    names: tuple[str, ...]
    init: tuple[str, ...]           # one value a name, a [BLOCK_C] vector
    other: tuple[str, ...]          # the value of a partial beyond the last chunk
    update: tuple[str, ...]         # statements on the tile ``x`` (masked by ``mask``)
    combine: tuple[str, ...]        # statements leaving [BLOCK_C] vectors for ``apply``
    apply: tuple[str, ...]          # statements leaving ``y``
    prologue: tuple[str, ...] = ()  # statements once an item, both phases


_SOFTMAX = dict(
    names=("m", "s"), init=("tl.full([BLOCK_C], -float('inf'), tl.float32)", "tl.zeros([BLOCK_C], tl.float32)"),
    other=("-float('inf')", "0.0"),
    update=("x = tl.where(mask, x, -float('inf'))",
            "m_new = tl.maximum(m, tl.max(x, axis=0))",
            "s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[None, :]), axis=0)",
            "m = m_new"),
    combine=("m = tl.max(p_m, axis=0)",
             "s = tl.sum(p_s * tl.exp(p_m - m[None, :]), axis=0)"))
STATS: dict[str, Stats] = {
    "softmax": Stats(**_SOFTMAX, apply=("y = tl.exp(x - m[None, :]) * (1.0 / s)[None, :]",)),
    "log_softmax": Stats(**_SOFTMAX, apply=("y = x - (m + tl.log(s))[None, :]",)),
    "layer_norm": Stats(
        names=("mean", "m2"), init=("tl.zeros([BLOCK_C], tl.float32)", "tl.zeros([BLOCK_C], tl.float32)"),
        other=("0.0", "0.0"),
        prologue=(SHIFT,),
        update=("x = tl.where(mask, x - shift, 0.0)",
                "n = tl.minimum(tl.maximum(R - r0, 0), t * BLOCK_R).to(tl.float32)",
                "n_t = tl.minimum(tl.maximum(R - r_first, 0), BLOCK_R).to(tl.float32)",
                "t_mean = tl.sum(x, axis=0) / tl.maximum(n_t, 1.0)",
                "d = tl.where(mask, x - t_mean[None, :], 0.0)",
                "delta = t_mean - mean",
                "mean = mean + delta * (n_t / tl.maximum(n + n_t, 1.0))",
                "m2 = m2 + tl.sum(d * d, axis=0) + delta * delta * (n * n_t / tl.maximum(n + n_t, 1.0))"),
        combine=("mean = tl.sum(n_p * p_mean, axis=0) / R",
                 "dev = p_mean - mean[None, :]",
                 "rstd = 1.0 / tl.sqrt(tl.sum(p_m2 + n_p * dev * dev, axis=0) / R + eps)"),
        apply=("y = (x - shift - mean[None, :]) * rstd[None, :]",)),
    "rms_norm": Stats(
        names=("ss",), init=("tl.zeros([BLOCK_C], tl.float32)",), other=("0.0",),
        update=("ss = ss + tl.sum(x * x, axis=0)",),
        combine=("rstd = 1.0 / tl.sqrt(tl.sum(p_ss, axis=0) / R + eps)",),
        apply=("y = x * rstd[None, :]",)),
    "l2_norm": Stats(
        names=("ss",), init=("tl.zeros([BLOCK_C], tl.float32)",), other=("0.0",),
        update=("ss = ss + tl.sum(x * x, axis=0)",),
        combine=("rstd = 1.0 / tl.sqrt(tl.sum(p_ss, axis=0) + eps)",),
        apply=("y = x * rstd[None, :]",)),
    "normalize": Stats(
        names=("ss",), init=("tl.zeros([BLOCK_C], tl.float32)",), other=("0.0",),
        update=("ss = ss + tl.sum(x * x, axis=0)",),
        combine=("rstd = 1.0 / tl.maximum(tl.sqrt(tl.sum(p_ss, axis=0)), eps)",),
        apply=("y = x * rstd[None, :]",)),
}
"""Chan's pairwise update keeps LayerNorm's variance exact for inputs far from zero mean (the
gate's offset inputs, 100–200σ), where a sum of squares would cancel."""

TILES = [1024, 2048, 4096, 8192]
PER_THREAD = [4, 8, 16, 32]
"""Slice elements each thread holds: the warps follow from the tile's size at run time, so a
16384-wide softmax row gets 32 warps instead of spilling from 4; 64 elements always spilled, so
the tuner is not offered them (figures: bench/port/README.md, "Template seeds")."""
MAX_WARPS = 32
"""Triton's limit (1024 threads); each thread then has at most 64 registers."""
MAX_SLICE = MAX_WARPS * 32 * 16
"""The widest slice the in-register kernel holds: 32 warps at 16 fp32 elements a thread (the
most that spilled nowhere, ``PER_THREAD``). Wider slices take the split kernel."""
REGISTER_WARPS = 8
"""More than 16 elements a thread only up to this many warps, whose registers hold 32 fp32
elements and their statistics; wider slices fall back to 16 elements a thread, so the seed's 32
serves 4096-wide rows and 16384-wide ones alike (figures: bench/port/README.md, "Template
seeds")."""
PER_SM = [0, 1, 2, 4, 8, 16]
STAGES = [1, 2, 3]
EVICT = [0, 1]
"""A program walks tiles (``PER_SM`` programs an SM; 0: a program a tile, as Inductor launches
its reductions) with ``STAGES`` tiles' loads in flight (Triton's software pipelining), as
Triton's fused-softmax tutorial does; ``EVICT = 1`` marks the input, read once, first out of L2.
What pays depends on the slice, so all are tunable (figures: bench/port/README.md, "Template
seeds")."""
CHUNKS = [4096, 8192, 16384, 32768]
SPLIT = [0, 1, 2]
"""The split kernel's chunk (elements of a slice an item reads) and ``SPLIT = 1`` to take it
for every slice (0: for slices wider than ``MAX_SLICE``, or when slices are too few to give
every SM a tile); ``SPLIT = 2`` takes the looped kernel for every slice instead. A chunk is a
trade: the ticket is one atomic per item, and the lead that keeps the apply items from waiting
is ``chunks + programs`` items, all of whose data must stay in L2.
``SPLIT_STAGES`` is the split kernel's own ``STAGES``: what pays differs between the two.
``SPLIT_PER_SM``: split-kernel programs an SM, the same trade: more keep more loads in flight
and hide each item's start, fewer keep the lead in L2. On the H200 8 beat 2 by 1.39× (a
393216-wide fp32 softmax, 0.595 ms against 0.824), 1.15× (LayerNorm over 4194304, 0.303
against 0.349) and 2.47× (bf16 rows of 50257, 0.979 against 2.417); 1 lost 1.4-1.9×."""
SPLIT_PER_SM = [1, 2, 4, 8]
SEED = {"TILE": 4096, "PER_THREAD": 32, "PER_SM": 16, "STAGES": 1, "EVICT": 0, "CHUNK": 16384, "SPLIT": 0,
        "SPLIT_STAGES": 2, "SPLIT_PER_SM": 8}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [SEED,
            {**SEED, "PER_THREAD": 16, "PER_SM": 8},
            {**SEED, "PER_SM": 0},
            {**SEED, "STAGES": 2},
            {**SEED, "SPLIT_STAGES": 3, "SPLIT_PER_SM": 4},
            {**SEED, "CHUNK": 4096}],
}
"""Known-good starting configurations on sm_90 (the row kernels are the same for every dtype:
statistics are fp32), best first; the first is the seed (figures: bench/port/README.md,
"Template seeds"). On the H200 the split kernel ran 1.40× and 1.16× faster at two stages and
16384-element chunks than at one stage and 8192 (softmax_wide_rows, layernorm_wide), while two
stages in the in-register kernel cost softmax 10 % and gained LayerNorm 2 % (bench/port/README.md,
"H200, 2026-12-02"): the seed takes the split kernel's best and keeps one stage in registers.
The last two starts are the split kernel's runners-up in session 20's seeds run: 3 stages at 4
programs an SM (the 393216-wide softmax's best, 0.576 ms) and 4096-element chunks (the bf16
rows' best, 0.911 ms). Each dict sets every tunable."""
TITLES = {"softmax": "softmax", "log_softmax": "log-softmax", "layer_norm": "LayerNorm",
          "rms_norm": "RMSNorm", "l2_norm": "L2 normalisation",
          "normalize": "L2 normalisation (F.normalize)"}


def tunable_values(prefix: str = "") -> dict[str, list[int]]:
    """The row kernels' ``TUNABLES``, named with ``prefix`` when they share a file with
    another template's."""
    values = {"TILE": TILES, "PER_THREAD": PER_THREAD, "STAGES": STAGES, "PER_SM": PER_SM, "EVICT": EVICT,
              "CHUNK": CHUNKS, "SPLIT": SPLIT, "SPLIT_STAGES": STAGES, "SPLIT_PER_SM": SPLIT_PER_SM}
    return {prefix + k: v for k, v in values.items()}


def seed(prefix: str = "") -> dict[str, int]:
    return {prefix + k: v for k, v in SEED.items()}


@dataclass
class Rowwise:
    """One recognised row operation and how the forward reaches its operands."""

    kind: str                   # a key of BODIES
    arg: str                    # forward argument normalised
    first_dim: str              # expression: first dim of R
    end_dim: str                # expression: one past the last dim of R
    eps: str | None = None      # expression for eps (norms)
    weight: str | None = None   # expression for the scale
    bias: str | None = None     # expression for the shift
    inner: bool = False         # inner > 1 at the traced size (strided slices; the launch decides again)
    prologue: common.Chain | None = None   # elementwise ops whose result is normalised (``x + residual``)


def _args(op: Rowwise) -> str:
    named = "".join(f", {name}" for name, e in (("w_ptr", op.weight), ("b_ptr", op.bias), ("eps", op.eps)) if e)
    return named + (op.prologue.kernel_args() if op.prologue else "")


def _x(op: Rowwise, index: str, mask: str, evict: str | None, target: str = "x") -> list[str]:
    """Statements leaving the slice's values at ``index`` in ``target``: a load of the input,
    or with a prologue its operands' loads and its ops, zero where ``mask`` is off (the
    statistics read masked lanes as the input's zeros). A ``target`` other than ``x`` gets
    the prologue's names prefixed, so that a value computed before a loop is not reassigned
    inside it at another shape."""
    hint = f", eviction_policy='{evict}'" if evict else ""
    if op.prologue is None:
        return [f"{target} = tl.load(x_ptr + {index}, mask={mask}, other=0.0{hint}).to(tl.float32)"]
    chain = op.prologue
    lines = [line.replace(", other=0.0)", f", other=0.0{hint})") for line in chain.loads(index, mask)]
    lines += [*chain.lines, f"{target} = tl.where({mask}, {chain.result}, 0.0)"]
    if target == "x":
        return lines
    return [re.sub(r"\b(v\d+\w*|t\d+)\b(?!_ptr|_n\b|_d\b)", rf"{target}_\1", line) for line in lines]


def _affine(op: Rowwise) -> list[str]:
    """Scale and shift by the normalised position ``r`` (LayerNorm's and RMSNorm's weights)."""
    lines = []
    if op.weight:
        lines += ["w = tl.load(w_ptr + r, mask=r < R, other=0.0).to(tl.float32)", "y = y * w"]
    if op.bias:
        lines += ["b = tl.load(b_ptr + r, mask=r < R, other=0.0).to(tl.float32)", "y = y + b"]
    return lines


def _with_shift(op: Rowwise, lines: list[str] | tuple[str, ...]) -> list[str]:
    """``lines`` with LayerNorm's shift (the slice's first value) taken through ``_x``."""
    return [shifted for line in lines
            for shifted in (_x(op, "base", "c < cols", None, "shift") if line == SHIFT else [line])]


def _load(op: Rowwise, evict: str) -> list[str]:
    return ["if EVICT_FIRST:", *(f"    {line}" for line in _x(op, "offs", "mask", evict)),
            "else:", *(f"    {line}" for line in _x(op, "offs", "mask", None))]


def _indent(lines: list[str] | tuple[str, ...], depth: int) -> str:
    return "".join(f"{'    ' * depth}{line}\n" for line in lines)


GEOMETRY_ARGS = "slabs, cols, R, s_slab, s_col, s_r"
COLUMNS = ["c = (blk % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
           "base = (blk // col_blocks).to(tl.int64) * s_slab + c.to(tl.int64) * s_col"]
"""A block is ``BLOCK_C`` neighbouring columns of one slab; element ``r`` of column ``c`` is at
``base + r · s_r`` (64-bit: large tensors pass 2³¹ elements)."""


def kernel(op: Rowwise) -> str:
    """The in-register kernel: a tile of whole slices a step."""
    loop = [*COLUMNS,
            "mask = (r < R) & (c < cols)",
            "offs = base + r.to(tl.int64) * s_r",
            *_load(op, "evict_first"), *_with_shift(op, BODIES[op.kind]), *_affine(op),
            "tl.store(out_ptr + offs, y, mask=mask)"]
    pad = " " * (len(op.kind) + 12)
    return (f"\n\n@triton.jit\ndef {op.kind}_kernel(out_ptr, x_ptr, {GEOMETRY_ARGS}{_args(op)},\n"
            f"{pad}BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr, EVICT_FIRST: tl.constexpr):\n"
            "    r = tl.arange(0, BLOCK_R)[:, None]\n"
            "    col_blocks = tl.cdiv(cols, BLOCK_C)\n"
            "    for blk in tl.range(tl.program_id(0), slabs * col_blocks, tl.num_programs(0), num_stages=STAGES):\n"
            + _indent(loop, 2))


def split_kernel(op: Rowwise) -> str:
    """The split kernel: stats and apply items of slice chunks, in ticket order. A program takes
    its next ticket before working through the current one, so the atomic's round trip overlaps
    the work; the tickets a program holds only ever grow, so the smallest unfinished ticket is
    always one a program is working on, and its waits are on smaller, finished tickets."""
    st = STATS[op.kind]
    tile = ["r_first = r0 + t * BLOCK_R",
            "r = r_first + tl.arange(0, BLOCK_R)[:, None]",
            "mask = (r < R) & (c < cols)",
            "offs = base + r.to(tl.int64) * s_r"]
    stats = [*(f"{n} = {v}" for n, v in zip(st.names, st.init, strict=True)),
             "for t in tl.range(0, CHUNK_TILES, num_stages=STAGES):",
             *(f"    {line}" for line in [*tile, *_x(op, "offs", "mask", "evict_last"), *st.update]),
             *(f"tl.store(part + {i} * BLOCK_C, {n})" for i, n in enumerate(st.names)),
             "tl.debug_barrier()",
             "tl.atomic_add(count_ptr + 1 + blk, 1, sem='release')"]
    partials = [f"p_{n} = tl.load(prow + {i} * BLOCK_C, mask=pmask, other={o}, cache_modifier='.cg')"
                for i, (n, o) in enumerate(zip(st.names, st.other, strict=True))]
    apply = ["done = tl.atomic_add(count_ptr + 1 + blk, 0, sem='acquire')",
             "while done < chunks:",
             "    done = tl.atomic_add(count_ptr + 1 + blk, 0, sem='acquire')",
             "pp = tl.arange(0, BLOCK_P)[:, None]",
             "pmask = pp < chunks",
             "prow = part_ptr + (blk * chunks + pp).to(tl.int64) * (NSTAT * BLOCK_C) + tl.arange(0, BLOCK_C)[None, :]",
             "n_p = tl.minimum(tl.maximum(R - pp * (CHUNK_TILES * BLOCK_R), 0), CHUNK_TILES * BLOCK_R).to(tl.float32)",
             *partials, *st.combine,
             "for t in tl.range(0, CHUNK_TILES, num_stages=STAGES):",
             *(f"    {line}" for line in [*tile, *_x(op, "offs", "mask", "evict_first"),
                                           *st.apply, *_affine(op), "tl.store(out_ptr + offs, y, mask=mask)"])]
    item = ["q = p - lead",
            "in_lead = p < lead",
            "alternate = (p >= lead) & (q < 2 * (total - lead))",
            "stats = in_lead | (alternate & (q % 2 == 0))",
            "item = tl.where(in_lead, p, tl.where(alternate, tl.where(q % 2 == 0, lead + q // 2, q // 2), p - total))",
            "blk = item // chunks",
            *COLUMNS,
            "r0 = (item % chunks) * (CHUNK_TILES * BLOCK_R)",
            *_with_shift(op, st.prologue),
            "part = part_ptr + item.to(tl.int64) * (NSTAT * BLOCK_C) + tl.arange(0, BLOCK_C)",
            "if stats:", *(f"    {line}" for line in stats),
            "else:", *(f"    {line}" for line in apply)]
    head = ["col_blocks = tl.cdiv(cols, BLOCK_C)",
            "total = slabs * col_blocks * chunks",
            "lead = tl.minimum(lead, total)",
            "ticket = tl.atomic_add(count_ptr, 1)",
            "while ticket * ITEMS < 2 * total:",
            "    upcoming = tl.atomic_add(count_ptr, 1)",
            "    for p in range(ticket * ITEMS, tl.minimum(ticket * ITEMS + ITEMS, 2 * total)):",
            *(f"        {line}" for line in item),
            "    ticket = upcoming"]
    name = f"{op.kind}_split_kernel"
    return (f"\n\n@triton.jit\ndef {name}(out_ptr, x_ptr, part_ptr, count_ptr, {GEOMETRY_ARGS}{_args(op)}, "
            f"chunks, lead,\n{' ' * (len(name) + 5)}BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, "
            "BLOCK_P: tl.constexpr, CHUNK_TILES: tl.constexpr,\n"
            f"{' ' * (len(name) + 5)}NSTAT: tl.constexpr, ITEMS: tl.constexpr, STAGES: tl.constexpr):\n"
            + _indent(head, 1))


def loop_kernel(op: Rowwise) -> str:
    """The looped kernel: a program walks a block's slices in tiles twice, the statistics on
    the first pass and the result on the second, whose reads of a slice just read come from L2.
    It is what Inductor emits for wide rows (its online softmax), where a slice in registers
    leaves too few programs an SM to keep memory busy: at 16384-wide softmax rows on the H200,
    torch.compile's looped kernel ran at 0.2735 ms and the in-register one at 0.305 at best of 33
    screened configurations (bench/port, 2026-12-03). The statistics are the split kernel's
    (``STATS``), the whole slice one chunk, so its combine step runs on a single partial."""
    st = STATS[op.kind]
    tile = ["r_first = t * BLOCK_R",
            "r = r_first + tl.arange(0, BLOCK_R)[:, None]",
            "mask = (r < R) & (c < cols)",
            "offs = base + r.to(tl.int64) * s_r"]
    body = [*COLUMNS, "r0 = 0", *_with_shift(op, st.prologue),
            *(f"{n} = {v}" for n, v in zip(st.names, st.init, strict=True)),
            "for t in tl.range(0, tl.cdiv(R, BLOCK_R), num_stages=STAGES):",
            *(f"    {line}" for line in [*tile, *_x(op, "offs", "mask", "evict_last"), *st.update]),
            "n_p = R * 1.0",
            *(f"p_{n} = {n}[None, :]" for n in st.names),
            *st.combine,
            "for t in tl.range(0, tl.cdiv(R, BLOCK_R), num_stages=STAGES):",
            *(f"    {line}" for line in [*tile, *_load(op, "evict_first"), *st.apply, *_affine(op),
                                          "tl.store(out_ptr + offs, y, mask=mask)"])]
    name = f"{op.kind}_loop_kernel"
    pad = " " * (len(name) + 5)
    return (f"\n\n@triton.jit\ndef {name}(out_ptr, x_ptr, {GEOMETRY_ARGS}{_args(op)},\n"
            f"{pad}BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr, EVICT_FIRST: tl.constexpr):\n"
            "    col_blocks = tl.cdiv(cols, BLOCK_C)\n"
            "    for blk in tl.range(tl.program_id(0), slabs * col_blocks, tl.num_programs(0)):\n"
            + _indent(body, 2))


def kernels(op: Rowwise) -> str:
    return kernel(op) + split_kernel(op) + loop_kernel(op)


ITEMS = 2
"""Positions a ticket covers: a stats and an apply item in the steady state, so a ticket's work
is small beside the L2-resident lead, and tickets (atomics on one address) stay few."""

GEOMETRY_HELPER = '''

def _geometry(x: torch.Tensor, first: int, end: int) -> tuple[int, ...]:
    """(slabs, columns, R, slab stride, column stride, R stride) of ``x`` viewed as
    (outer, R, inner): plain rows when ``inner == 1``, else ``inner`` contiguous columns a slab."""
    outer, R, inner = math.prod(x.shape[:first]), math.prod(x.shape[first:end]), math.prod(x.shape[end:])
    if inner == 1:
        return 1, outer, R, 0, R, 1
    return outer, inner, R, R * inner, 1, inner
'''
"""Shared with the reduction template, which views its input the same way."""

HELPERS = GEOMETRY_HELPER + f'''

def _warps(elements: int, per_thread: int) -> int:
    """Warps for a tile of ``elements`` at ``per_thread`` elements a thread (16 beyond
    {REGISTER_WARPS} warps, where 32 spill)."""
    if elements > 32 * {REGISTER_WARPS} * per_thread:
        per_thread = min(per_thread, 16)
    return min({MAX_WARPS}, triton.next_power_of_2(triton.cdiv(elements, 32 * per_thread)))


def _row_launch(kernels, x, out, first, end, extra, tile, per_thread, per_sm, stages, evict, chunk, split,
                split_stages, split_per_sm):
    """One row operation over ``x`` into ``out``: ``kernels`` is (in-register kernel, split
    kernel, the split kernel's statistics a column, looped kernel); the first for slices it
    holds, the second for wider ones or too few to fill the GPU, the looped one when ``split``
    is 2."""
    slabs, cols, R, *strides = _geometry(x, first, end)
    sms = _sms(x)
    if split == 2:
        _loop_launch(kernels[3], x, out, slabs, cols, R, strides, extra, tile, per_thread, per_sm, stages, evict,
                     sms)
        return
    block_r = triton.next_power_of_2(R)
    block_c = max(1, min(triton.next_power_of_2(cols), tile // block_r))
    blocks = slabs * triton.cdiv(cols, block_c)
    if split or block_r * block_c > {MAX_SLICE} or (blocks < sms and R * block_c >= 2 * chunk):
        _split_launch(kernels[1], kernels[2], x, out, slabs, cols, R, strides, extra, tile, per_thread,
                      split_stages, chunk, split_per_sm * sms)
        return
    programs = per_sm * sms if per_sm else blocks
    kernels[0][(max(1, min(blocks, programs)),)](out, x, slabs, cols, R, *strides, *extra, BLOCK_R=block_r,
                                               BLOCK_C=block_c, STAGES=stages, EVICT_FIRST=evict == 1,
                                               num_warps=_warps(block_r * block_c, per_thread))


def _loop_launch(kernel, x, out, slabs, cols, R, strides, extra, tile, per_thread, per_sm, stages, evict, sms):
    """The looped kernel: a block of columns a program step (one row of contiguous slices,
    up to 64 strided columns), tiles of ``tile`` elements, ``per_sm`` programs an SM (0: one a
    block)."""
    block_c = 1 if strides[2] == 1 else max(1, min(triton.next_power_of_2(cols), 64, tile // 64))
    block_r = min(triton.next_power_of_2(R), max(1, tile // block_c))
    blocks = slabs * triton.cdiv(cols, block_c)
    programs = per_sm * sms if per_sm else blocks
    kernel[(max(1, min(blocks, programs)),)](out, x, slabs, cols, R, *strides, *extra, BLOCK_R=block_r,
                                             BLOCK_C=block_c, STAGES=stages, EVICT_FIRST=evict == 1,
                                             num_warps=_warps(block_r * block_c, per_thread))


def _split_launch(kernel, nstat, x, out, slabs, cols, R, strides, extra, tile, per_thread, stages, chunk,
                  programs):
    """The split kernel: chunks of about ``chunk`` elements (whole tiles of ``tile``) a block of
    columns, ``programs`` programs taking tickets, stats items ``chunks + programs`` ahead."""
    block_c = 1 if strides[2] == 1 else max(1, min(triton.next_power_of_2(cols), 64, tile // 64))
    block_r = min(triton.next_power_of_2(R), max(1, tile // block_c))
    tiles = max(1, chunk // (block_r * block_c))
    chunks = triton.cdiv(R, tiles * block_r)
    blocks = slabs * triton.cdiv(cols, block_c)
    part = torch.empty((blocks * chunks, nstat, block_c), device=x.device, dtype=torch.float32)
    count = torch.zeros(1 + blocks, device=x.device, dtype=torch.int32)
    kernel[(min(programs, triton.cdiv(2 * blocks * chunks, {ITEMS})),)](
        out, x, part, count, slabs, cols, R, *strides, *extra, chunks, chunks + programs,
        BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_P=triton.next_power_of_2(chunks), CHUNK_TILES=tiles,
        NSTAT=nstat, ITEMS={ITEMS}, STAGES=stages, num_warps=_warps(block_r * block_c, per_thread))
'''
"""The generated file's launch logic; the tunables reach it as arguments, so a composed
template (a matmul then a row operation) passes its own prefixed ones."""


def forward(op: Rowwise, signature: str, name: str = "forward", prefix: str = "") -> str:
    """The method launching the kernels; a composed template names it and prefixes its tunables."""
    extra = [e for e in (op.weight, op.bias, op.eps) if e]
    tunables = ", ".join(f"{prefix}{t}" for t in ("TILE", "PER_THREAD", "PER_SM", "STAGES", "EVICT", "CHUNK",
                                                   "SPLIT", "SPLIT_STAGES", "SPLIT_PER_SM"))
    first, end, x, out = op.first_dim, op.end_dim, "x", "out"
    if op.prologue is None:
        setup = f"    x = {op.arg}.contiguous()\n    out = torch.empty_like(x)\n"
    else:   # the kernels compute the slice from the operands; the result gives its shape (a
        chain = op.prologue         # name no forward argument has, which the operands may read)
        x = out = "_rows_out"
        extra += [f"*_operand({t}, shape)" for t in chain.tensors] + [f"float({v})" for v in chain.scalars]
        setup = (f"    shape = torch.broadcast_shapes({', '.join(f'{t}.shape' for t in chain.tensors)})\n"
                 f"    {out} = torch.empty(shape, device={op.arg}.device, dtype={op.arg}.dtype)\n")
        first, end = first.replace("x.dim()", f"{out}.dim()"), end.replace("x.dim()", f"{out}.dim()")
    args = ", ".join(extra) + ("," if extra else "")
    return f'''
def {name}(self, {signature}):
{setup}    kernels = ({op.kind}_kernel, {op.kind}_split_kernel, {len(STATS[op.kind].names)}, {op.kind}_loop_kernel)
    _row_launch(kernels, {x}, {out}, {first}, {end}, ({args}), {tunables})
    return {out}
'''


def render(op: Rowwise, signature: str, imports: list[str], init: str,
           ops: tuple[str, ...] = ()) -> tuple[str, str]:
    """(candidate source, one-line edit description); ``ops`` names the prologue's ops."""
    title = TITLES[op.kind]
    what = "strided slices" if op.inner else "rows"
    source = (common.header(f"Template: {title} over {what} (whole slices in registers, or split into "
                            "chunks chained through L2; fp32 statistics), persistent programs.", imports)
              + common.tunables(tunable_values(), seed()) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + common.SMS_HELPER + (common.OPERAND_HELPER if op.prologue else "") + HELPERS + kernels(op)
              + common.model_class(init, forward(op, signature)))
    if op.prologue is None:
        return source, f"template: {title} (fused, one pass)"
    return source, f"template: {title} of an elementwise prologue ({', '.join(ops)}), fused, one pass"
