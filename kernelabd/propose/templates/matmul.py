"""Matmul with a fused epilogue, and the gated MLP as two kernels.

A tiled ``tl.dot`` kernel with grouped tile order; the epilogue (bias, activation, residual,
scaling — any elementwise chain on the product) runs on the fp32 accumulator before the only
store, where eager writes the product and reads it back once per op. fp32 inputs use IEEE dots
unless the problem allows TF32, because the gate holds a port to the reference's precision.

The gated MLP ``(silu(x W1ᵀ) * (x W3ᵀ)) W2ᵀ`` computes both up-projections in the same K loop
(one read of each ``x`` tile for two products) with the silu-mul in the epilogue, then the
down-projection with the plain kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common, rowwise

TUNE_VALUES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [16, 32, 64],
               "GROUP_M": [1, 4, 8], "num_warps": [4, 8], "num_stages": [2, 3, 4], "PACK": [0, 1]}


def start(precision: str, half: bool) -> dict[str, int]:
    """The seed configuration: Hopper-sized tiles, where every edit the tuner accepted from a
    smaller seed led (figures: bench/port/README.md, "Template seeds")."""
    if half:
        return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
                "PACK": 0}
    if precision == "ieee":
        return {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
                "PACK": 0}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
            "PACK": 1}


PACK_HELPER = '''

def _k_major(t: torch.Tensor, k_padded: int) -> torch.Tensor:
    """``t`` (rows, K) as a contiguous copy with K padded with zeros to ``k_padded`` (a multiple
    of 16), or ``t`` itself when it is so already: TF32 tensor-core dots take both operands
    K-major, and padded rows are 16-byte aligned, so the loads need no transpose and vectorise.
    Zeros in K add nothing to the product."""
    k = t.shape[1]
    if k == k_padded and t.is_contiguous():
        return t
    out = t.new_empty((t.shape[0], k_padded))
    out[:, :k] = t
    if k_padded > k:
        out[:, k:].zero_()
    return out
'''
"""``PACK = 1``: both operands go through ``_k_major`` first, since TF32 dots run far faster on
K-major operands than the copy costs (figures: bench/port/README.md, "Template seeds")."""

RESOURCES = {"smem": [["BLOCK_M", "BLOCK_K"], ["BLOCK_K", "BLOCK_N"]], "acc": [["BLOCK_M", "BLOCK_N"]]}
MLP_RESOURCES = {"smem": [["BLOCK_M", "BLOCK_K"], ["BLOCK_K", "BLOCK_N"], ["BLOCK_K", "BLOCK_N"]],
                 "acc": [["BLOCK_M", "BLOCK_N"], ["BLOCK_M", "BLOCK_N"]]}
"""Per stage, an A and a B tile in shared memory; the gate/up kernel of the gated MLP streams
two B tiles and keeps two accumulators (it is the larger of the MLP's two kernels). Rendered
with the dots' precision (``common.resources``), which decides the register limit."""

TILE_ORDER = """\
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % size_m)
    pid_n = (pid % (GROUP_M * grid_n)) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    ra = rm % M
    rb = rn % N
    cmask = (rm[:, None] < M) & (rn[None, :] < N)
"""
"""Loads read rows ``ra``/``rb``, the tile's rows wrapped into range (Triton's matmul tutorial
does the same): an edge tile re-reads valid rows instead of masking, and only its store is
masked, so the K loop carries no M/N bounds checks."""
CONSTEXPRS = ("BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, "
              "EVEN_K: tl.constexpr")


def launch(k: str, block_n: str = "BLOCK_N") -> str:
    """The launch's keyword arguments, the tile width from the tunable ``block_n``; ``EVEN_K``
    (K in whole ``BLOCK_K`` steps) drops the K loop's last bounds check too."""
    return (f"BLOCK_M=BLOCK_M, BLOCK_N={block_n}, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, EVEN_K={k} % BLOCK_K == 0, "
            "num_warps=num_warps, num_stages=num_stages")


@dataclass
class Matmul:
    """``a @ b`` (``b`` given as ``(K, N)``, or ``(N, K)`` when ``transposed``) plus epilogue."""

    a: str
    b: str
    transposed: bool
    epilogue: common.Chain      # ``acc`` is the product; ``result`` what is stored
    precision: str              # "ieee", "tf32" or "tf32x3"
    half: bool = False          # fp16/bf16 operands


def _loads(targets: list[tuple[str, str, str, str]]) -> str:
    """K-loop loads of ``name = ptr[...]`` for ``(name, ptr, stride_k, stride_other)``; the first
    is the A tile (rows × K), the rest B tiles (K × columns); unmasked when ``EVEN_K``."""
    def load(name: str, ptr: str, sk: str, so: str, is_a: bool, masked: bool) -> str:
        offs = f"ra[:, None] * {so} + kk[None, :] * {sk}" if is_a else f"kk[:, None] * {sk} + rb[None, :] * {so}"
        mask = f", mask={'kk[None, :]' if is_a else 'kk[:, None]'} < K, other=0.0" if masked else ""
        return f"{name} = tl.load({ptr} + {offs}{mask})"

    def block(masked: bool) -> str:
        return "".join(f"            {load(*t, i == 0, masked)}\n" for i, t in enumerate(targets))
    return f"        if EVEN_K:\n{block(False)}        else:\n{block(True)}"


def matmul_kernel(name: str, epilogue: common.Chain, precision: str) -> str:
    loads = "".join(f"    {line}\n" for line in epilogue.loads("rm[:, None] * N + rn[None, :]", "cmask"))
    lines = "".join(f"    {line}\n" for line in epilogue.lines)
    return f'''

@triton.jit
def {name}(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn{epilogue.kernel_args()},
{" " * (len(name) + 5)}{CONSTEXPRS}):
{TILE_ORDER}    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
{_loads([("a", "a_ptr", "sak", "sam"), ("b", "b_ptr", "sbk", "sbn")])}        acc += _dot(a, b, "{precision}")
{loads}{lines}    tl.store(c_ptr + rm[:, None] * N + rn[None, :], {epilogue.result or "acc"}, mask=cmask)
'''


GATE_UP_LOADS = [("a", "a_ptr", "sak", "sam"), ("b1", "w1_ptr", "s1k", "s1n"), ("b3", "w3_ptr", "s3k", "s3n")]


def gate_up_kernel(precision: str) -> str:
    return f'''

@triton.jit
def gate_up_kernel(a_ptr, w1_ptr, w3_ptr, h_ptr, M, N, K, sam, sak, s1k, s1n, s3k, s3n,
                   {CONSTEXPRS}):
{TILE_ORDER}    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
{_loads(GATE_UP_LOADS)}        acc1 += _dot(a, b1, "{precision}")
        acc3 += _dot(a, b3, "{precision}")
    h = acc1 / (1.0 + tl.exp(-acc1)) * acc3
    tl.store(h_ptr + rm[:, None] * N + rn[None, :], h, mask=cmask)
'''


def _strides(b: str, transposed: bool) -> str:
    return f"{b}.stride(1), {b}.stride(0)" if transposed else f"{b}.stride(0), {b}.stride(1)"


def forward(op: Matmul, signature: str, name: str = "forward") -> str:
    n = f"{op.b}.shape[0]" if op.transposed else f"{op.b}.shape[1]"
    b_nk = op.b if op.transposed else f"{op.b}.t()"
    return f'''
def {name}(self, {signature}):
    a = {op.a}.reshape(-1, {op.a}.shape[-1])
    M, K = a.shape
    N = {n}
    shape = torch.Size((*{op.a}.shape[:-1], N))
    b, sbk, sbn = {op.b}, {_strides(op.b, op.transposed)}
    if PACK:
        K = triton.cdiv(K, 16) * 16
        a, b = _k_major(a, K), _k_major({b_nk}, K)
        sbk, sbn = b.stride(1), b.stride(0)
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), sbk, sbn{op.epilogue.call_args("shape")},
                        {launch("K")})
    return c.reshape(shape)
'''


def render(op: Matmul, signature: str, imports: list[str], init: str, what: str) -> tuple[str, str]:
    helper = common.OPERAND_HELPER if op.epilogue.tensors else ""
    source = (common.header(f"Template: tiled matmul ({what}) with the epilogue fused before the "
                            f"store; {op.precision} dots.", imports)
              + common.tunables(TUNE_VALUES, start(op.precision, op.half),
                                common.resources(RESOURCES, op.precision)) + helper + PACK_HELPER
              + common.DOT_HELPER
              + matmul_kernel("matmul_kernel", op.epilogue, op.precision)
              + common.model_class(init, forward(op, signature)))
    return source, f"template: matmul ({what}) with fused epilogue"


def render_then_rowwise(op: Matmul, row: rowwise.Rowwise, signature: str, imports: list[str], init: str,
                        what: str) -> tuple[str, str]:
    """A matmul with its fused epilogue, then a row operation over the last dim of its result
    (``softmax(gelu(x Wᵀ + b))``): two kernels, since a row spans many output tiles. The row
    kernel's elements per thread tune separately (``ROW_PER_THREAD``)."""
    helper = common.OPERAND_HELPER if op.epilogue.tensors else ""
    values = {**TUNE_VALUES, "ROW_PER_THREAD": rowwise.PER_THREAD, "ROW_STAGES": rowwise.STAGES,
              "ROW_PER_SM": rowwise.PER_SM, "ROW_EVICT": rowwise.EVICT,
              **({"TILE": rowwise.TILES} if row.inner else {})}
    seed = {**start(op.precision, op.half), "ROW_PER_THREAD": 16, "ROW_PER_SM": 8, "ROW_STAGES": 1,
            "ROW_EVICT": 0, "TILE": 4096}
    methods = (forward(op, signature, "_matmul")
               + rowwise.forward(row, "y", "_rowwise", "ROW_PER_THREAD", "ROW_PER_SM", "ROW_STAGES",
                                 "ROW_EVICT")
               + f"\ndef forward(self, {signature}):\n    return self._rowwise(self._matmul({signature}))\n")
    source = (common.header(f"Template: tiled matmul ({what}) with the epilogue fused before the "
                            f"store, then {rowwise.TITLES[row.kind]} over each row; {op.precision} dots.",
                            imports)
              + common.tunables(values, seed, common.resources(RESOURCES, op.precision))
              + ("" if row.inner else "TILE = 4096\n")
              + helper + PACK_HELPER + common.DOT_HELPER
              + matmul_kernel("matmul_kernel", op.epilogue, op.precision) + rowwise.kernel(row)
              + common.model_class(init, methods))
    return source, f"template: matmul ({what}) with fused epilogue, then {rowwise.TITLES[row.kind]}"


@dataclass
class GatedMLP:
    x: str
    w1: str            # (H, D) like nn.Linear weights
    w3: str
    w2: str            # (D, H)
    precision: str
    half: bool = False


def mlp_forward(op: GatedMLP, signature: str) -> str:
    return f'''
def forward(self, {signature}):
    a = {op.x}.reshape(-1, {op.x}.shape[-1])
    M, K = a.shape
    H = {op.w1}.shape[0]
    h = torch.empty((M, H), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(H, BLOCK_N),)
    gate_up_kernel[grid](a, {op.w1}, {op.w3}, h, M, H, K, a.stride(0), a.stride(1),
                         {_strides(op.w1, True)}, {_strides(op.w3, True)}, {launch("K")})
    N = {op.w2}.shape[0]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, DOWN_BLOCK_N),)
    matmul_kernel[grid](h, {op.w2}, c, M, N, H, h.stride(0), h.stride(1), {_strides(op.w2, True)},
                        {launch("H", "DOWN_BLOCK_N")})
    return c.reshape(*{op.x}.shape[:-1], N)
'''


MLP_VALUES = {**{k: v for k, v in TUNE_VALUES.items() if k != "PACK"}, "DOWN_BLOCK_N": [64, 128, 256]}
"""The gated MLP's weights are ``nn.Linear`` ones, K-major already: nothing to pack. The down
projection's tile width tunes apart from the gate/up kernel's, whose two accumulators make its
``BLOCK_N`` count twice: a 128×256 tile is the widest a plain 8-warp matmul holds, the gate/up
kernel's equivalent is 128×128."""


def render_mlp(op: GatedMLP, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    source = (common.header("Template: gated MLP as two kernels: fused gate/up projections with the "
                            f"silu-mul epilogue, then the down projection; {op.precision} dots.",
                            imports)
              + common.tunables(MLP_VALUES, {**start(op.precision, op.half), "DOWN_BLOCK_N": 128},
                                common.resources(MLP_RESOURCES, op.precision))
              + common.DOT_HELPER
              + gate_up_kernel(op.precision)
              + matmul_kernel("matmul_kernel", common.Chain(), op.precision)
              + common.model_class(init, mlp_forward(op, signature)))
    return source, "template: gated MLP (fused gate/up + silu-mul, then down)"
