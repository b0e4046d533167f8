"""GroupNorm (``nn.GroupNorm``, ``F.group_norm``) over ``(N, C, *spatial)``, its per-channel
affine map fused.

A group is ``C / G`` whole channel planes, contiguous in NCHW: one program owns one ``(n, g)``
group and walks it three times in ``BLOCK`` steps: the sum (for the mean), the sum of squared
deviations from that mean (two passes, not ``E[x²] − E[x]²``, whose cancellation an fp32 sum
of a large group cannot afford against the float64 oracle), then the normalised, scaled and
shifted store, the channel of an element being ``g · C/G + offset // spatial``. The second and
third reads of a group of KernelBench's sizes come from L2.
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
def group_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, G, CG, S, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0)
    g = row % G
    n_el = CG * S
    base = row.to(tl.int64) * n_el
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_el, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + base + offs, mask=offs < n_el, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / n_el
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_el, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n_el
        d = tl.where(m, tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_el + eps)
    for start in range(0, n_el, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n_el
        y = (tl.load(x_ptr + base + offs, mask=m, other=0.0).to(tl.float32) - mean) * rstd
        c = g * CG + offs // S
        if HAS_W:
            y = y * tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + offs, y, mask=m)
"""


def forward(op: GroupNorm, signature: str) -> str:
    """The launch; ``_``-prefixed locals, so that no forward argument is shadowed."""
    w, b = op.weight or "_x", op.bias or "_x"      # any tensor; never read without HAS_W / HAS_B
    return f"""
def forward(self, {signature}):
    _x = {op.x}.contiguous()
    _n, _c = _x.shape[0], _x.shape[1]
    _g = {op.groups}
    _y = torch.empty_like(_x)
    group_norm_kernel[(_n * _g,)](_x, {w}, {b}, _y, _g, _c // _g, _x.numel() // max(1, _n * _c), float({op.eps}),
                                  HAS_W={op.weight is not None}, HAS_B={op.bias is not None}, BLOCK=BLOCK,
                                  num_warps=num_warps)
    return _y
"""


def render(op: GroupNorm, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    source = (common.header("Template: GroupNorm, a program a group, two-pass statistics in fp32, the "
                            "per-channel affine map fused into the store.", imports)
              + common.tunables(TUNE_VALUES, SM90_STARTS["any"][0]) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + KERNEL + common.model_class(init, forward(op, signature)))
    return source, "template: GroupNorm (a program a group, affine fused)"
