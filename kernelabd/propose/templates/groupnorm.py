"""GroupNorm (``nn.GroupNorm``, ``F.group_norm``) over ``(N, C, *spatial)``, its per-channel
affine map fused.

A group is ``C / G`` whole channel planes, contiguous in NCHW: one program owns one ``(n, g)``
group and reads it twice in ``BLOCK`` steps: once for the statistics, once for the normalised,
scaled and shifted store. The store walks the group a channel's plane at a time where whole
``BLOCK`` steps cover a plane with few idle lanes (``BY_CHANNEL``: a weight and a bias a plane,
two scalar loads), else in flat steps (an element's channel ``g · C/G + offset // S``, ``S`` a
compile-time size, so a multiply, and the affine map gathered an element).
The statistics are Welford's, one running mean and sum of squared deviations a lane, of the
values less one of them (a shift, so that the means are near the spread, not at the data's
offset), merged at the end about the group's mean (``Σ m2 + n·(mean_lane − mean)²``, summed
in a tree): as exact as two passes over the data (no
``E[x²] − E[x]²`` cancellation, which an fp32 sum of a group far from zero cannot afford against
the float64 oracle) for one read. A group of KernelBench's sizes (L1 #35: 8 MB) does not stay in
L2 between reads, so each read is HBM traffic: the two-pass form's three reads and a write ran
at 50 % of the copy rate (0.75× torch.compile, bench/port/results/2026-12-06-h100-s21).
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common

TUNE_VALUES = {"BLOCK": [512, 1024, 2048, 4096, 8192], "num_warps": [2, 4, 8, 16]}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [{"BLOCK": 2048, "num_warps": 8}, {"BLOCK": 4096, "num_warps": 8}, {"BLOCK": 1024, "num_warps": 4}],
}
"""Eight elements a thread a step at the seed, then sixteen, then eight over four warps; not yet
measured on a GPU. Each dict sets every tunable."""


@dataclass(frozen=True)
class GroupNorm:
    x: str                 # the normalised tensor's forward expression
    groups: str            # its expression (``self.gn.num_groups`` follows the instance)
    eps: str
    weight: str | None
    bias: str | None


KERNEL = """

@triton.jit
def group_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, G, CG, S: tl.constexpr, eps, HAS_W: tl.constexpr,
                      HAS_B: tl.constexpr, BY_CHANNEL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    g = row % G
    n_el = CG * S
    base = row.to(tl.int64) * n_el
    lanes = tl.arange(0, BLOCK)
    # statistics of x − shift, a value of the group: the running means stay near the spread,
    # where rounding at the size of a mean far from zero would swamp it
    shift = tl.load(x_ptr + base).to(tl.float32)
    mean = tl.zeros((BLOCK,), dtype=tl.float32)
    m2 = tl.zeros((BLOCK,), dtype=tl.float32)
    # every step but the last is whole, so a lane updated at step i has seen i values before it
    for start in range(0, n_el, BLOCK):
        offs = start + lanes
        m = offs < n_el
        x = tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32) - shift
        delta = tl.where(m, x - mean, 0.0)
        mean += delta * (1.0 / (start // BLOCK + 1))
        m2 += delta * (x - mean)
    count = (n_el // BLOCK + (lanes < n_el % BLOCK)).to(tl.float32)
    # the lanes merged at once about the group's mean, in trees: Chan's pairwise merge rounds
    # the mean at every step, and a mean of normalised values (L2 #23's) is that rounding
    mean_s = tl.sum(mean * count, axis=0) / n_el
    dev = mean - mean_s
    m2 = tl.sum(m2 + count * dev * dev, axis=0)
    rstd = 1.0 / tl.sqrt(m2 / n_el + eps)
    if BY_CHANNEL:
        # a channel's plane at a time: its weight and bias are two scalars, not a gather and an
        # integer division an element
        for ch in range(0, CG):
            c = g * CG + ch
            scale = rstd
            if HAS_W:
                scale = scale * tl.load(w_ptr + c).to(tl.float32)
            add = 0.0
            if HAS_B:
                add = tl.load(b_ptr + c).to(tl.float32)
            plane = base + ch * S
            for start in range(0, S, BLOCK):
                offs = start + lanes
                m = offs < S
                x = tl.load(x_ptr + plane + offs, mask=m, other=0.0).to(tl.float32)
                tl.store(y_ptr + plane + offs, (x - shift - mean_s) * scale + add, mask=m)
    else:
        for start in range(0, n_el, BLOCK):
            offs = start + lanes
            m = offs < n_el
            y = (tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32) - shift - mean_s) * rstd
            c = g * CG + offs // S
            if HAS_W:
                y = y * tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
            tl.store(y_ptr + base + offs, y, mask=m)
"""


def forward(op: GroupNorm, signature: str) -> str:
    """The launch; ``_``-prefixed locals, so that no forward argument is shadowed. A channel's
    plane is a compile-time size (``S``), so a flat step's channel index is a multiply, not a
    division; where whole ``BLOCK`` steps cover a plane with few idle lanes, the store walks
    plane by plane (``BY_CHANNEL``)."""
    w, b = op.weight or "_x", op.bias or "_x"      # any tensor; never read without HAS_W / HAS_B
    return f"""
def forward(self, {signature}):
    _x = {op.x}.contiguous()
    _n, _c = _x.shape[0], _x.shape[1]
    _g = {op.groups}
    _s = _x.numel() // max(1, _n * _c)
    _y = torch.empty_like(_x)
    group_norm_kernel[(_n * _g,)](_x, {w}, {b}, _y, _g, _c // _g, _s, float({op.eps}),
                                  HAS_W={op.weight is not None}, HAS_B={op.bias is not None},
                                  BY_CHANNEL=triton.cdiv(_s, BLOCK) * BLOCK <= (1 + {common.IDLE_SHARE}) * _s,
                                  BLOCK=BLOCK, num_warps=num_warps)
    return _y
"""


def render(op: GroupNorm, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    source = (common.header("Template: GroupNorm, a program a group, Welford statistics in fp32 (one read), "
                            "the per-channel affine map fused into the store.", imports)
              + common.tunables(TUNE_VALUES, SM90_STARTS["any"][0]) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + KERNEL + common.model_class(init, forward(op, signature)))
    return source, "template: GroupNorm (a program a group, affine fused)"
