"""Scaled dot-product attention as one flash-attention style kernel.

Eager attention written out (``softmax(q @ kᵀ * scale) @ v``) writes the ``(S, S)`` score
matrix to memory and reads it back twice; even PyTorch's fused kernels are picked per dtype and
device. Here one program owns ``BLOCK_M`` query rows of one (batch, head) and walks the keys in
``BLOCK_N`` blocks with an online softmax (running max and sum, fp32 accumulators), so scores
never leave registers and each key/value block is read once per query block.

- The scale is folded with log2(e) into one factor, and ``exp2`` replaces ``exp``; the running
  max is subtracted before exponentiating, so large logits (the gate's shifted inputs) cannot
  overflow. When no key is masked and the scale is positive, the block's max is taken on the
  raw product and scaling and subtraction are one fused multiply-add an element, as in Triton's
  fused-attention tutorial.
- Sizes that divide into whole blocks (``EVEN_M``/``EVEN_N``/``EVEN_D``, decided at launch)
  load and store without masks: the common case (sequence lengths a multiple of 128, head dims
  a power of two) pays for no bounds checks inside the key loop.
- Causal attention (``is_causal=True``) is PyTorch's top-left aligned mask: query ``i`` sees keys
  ``j <= i``; key blocks wholly above the diagonal are not visited at all.
- With ``SPLIT_MASK`` the key loop runs in two stages, as Triton's fused-attention tutorial does:
  the key blocks every query of the block sees whole (below the causal diagonal, before a partial
  last block) without a mask, then the few that need one (the diagonal, the partial block); a
  causal program otherwise masks every block. ``SPLIT_MASK = 0`` is the single masked loop, kept
  as a tunable so a job screens both. Causal query blocks are launched longest first (the last
  rows see the most keys), so the short ones fill the tail of the grid.
- With ``TMA`` (a tunable, off at the measured starts) key and value blocks arrive through TMA
  tensor descriptors (``tl.make_tensor_descriptor``, one per (batch, head)), as in Triton's
  tutorial on Hopper: the copy engine fills shared memory and zero-fills rows past the sequence.
  Only where a descriptor can address them (unit last stride, 16-byte aligned base and strides)
  and a head fits a program whole; elsewhere the pointer loads.
- Any sequence lengths (masked), head dims padded to a power of two (masked), separate head dims
  for ``q``/``k`` and ``v``, heads wider than ``MAX_HEAD`` in chunks (``_attention``); inputs of
  2 to 4 dims are read through their strides as ``(Z, H, S, D)``, so transposed views cost no
  copy.
- fp32 inputs use IEEE dots unless the problem allows TF32, because the gate holds a port to the
  reference's precision; half inputs cast the probabilities to the input dtype for the second
  product, as PyTorch's flash kernel does.

Heads wider than ``MAX_HEAD`` at the traced size (KernelBench L1 #97: fp32, 1024-wide) take a
different candidate (``render`` decides, ``Attention.wide``): in one program a key block's scores
need the whole head, so a flash kernel either recomputes them once per slice of value columns
(eight times at 1024) or spills. There the scores are materialised instead, as eager's math path
does, but each step is one kernel that tunes apart: the batched product ``q kᵀ`` (scaled, causal
mask applied) into fp32 scores, the softmax along each row, and the batched product with ``v``
written straight into the output's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common, matmul

TUNE_VALUES = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [2, 4, 8],
               "num_stages": [1, 2, 3, 4], "SPLIT_MASK": [0, 1], "TMA": [0, 1]}
TUNE_START = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "SPLIT_MASK": 1, "TMA": 0}
HALF_START = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "SPLIT_MASK": 1, "TMA": 0}
"""fp16/bf16 operands start at 64×64 tiles on one warp group: on the H200 (session 20's seeds
run) the best or within 2 % of it on all three attention problems (0.551, 0.196 and 0.163 ms
against 0.577, 0.208 and 0.170 at the 128×64 tile on 8 warps that Triton's tutorial uses);
fp32 ones keep the smaller key block, whose dots hold more in registers."""
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "half": [HALF_START, {**HALF_START, "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "TMA": 1},
             {**HALF_START, "BLOCK_M": 128, "num_warps": 8},
             {**HALF_START, "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8}],
    "fp32": [TUNE_START, {**TUNE_START, "BLOCK_N": 64}],
}
"""Known-good starting configurations on sm_90, best first, the seed first: for half precision,
the H200's runners-up in session 20's seeds run: 128×128 tiles on 8 warps with descriptor loads
(non-causal SDPA's best, 0.542 ms), the tutorial's 128×64, and 128×128 without descriptors.
``SPLIT_MASK = 1`` throughout: causal attention ran 1.36× faster with the split loop (0.208 ms
against 0.283). Each dict sets every tunable."""
NARROW_FP32 = {**TUNE_START, "BLOCK_M": 32}
"""The fp32 start where the padded head is wider than 64: 3xTF32 dots keep each operand twice
(head and tail), and at 64 query rows a 96-wide head (KernelBench L3 #43, padded to 128) spilled
168 B a thread for sm_90 (Triton 3.6; 255 registers), at 32 rows 24 B; a 64-key block spilled
256 B even at 32 rows, so the neighbour tried is a third stage instead."""


def starts(op: Attention) -> list[dict[str, int]]:
    """The flash kernel's starts for ``op``, the seed first."""
    if op.half:
        return SM90_STARTS["half"]
    if max(16, 1 << (op.head - 1).bit_length()) > 64:
        return [NARROW_FP32, {**NARROW_FP32, "num_stages": 3}]
    return SM90_STARTS["fp32"]


AS_4D = '''

def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """A view of ``t`` with leading size-1 dims up to ``(Z, H, S, D)``; no copy."""
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _addressable(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor per (batch, head) can read ``t`` as ``(S, D)`` rows: a unit
    last stride, a 16-byte aligned base, and 16-byte aligned strides to each head and row
    (a dim of size 1 is never stepped over)."""
    size = t.element_size()
    return (t.stride(3) == 1 and t.data_ptr() % 16 == 0
            and all(s * size % 16 == 0 for s, n in zip(t.stride()[:3], t.shape[:3]) if n > 1))
'''
# The output's memory order matters: the gate compares strides with the reference's output.
# PyTorch's SDPA allocates it differently per backend; a written-out ``p @ v`` is contiguous.
SDPA_OUTPUT = '''

def _sdpa_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """An empty output in the memory order PyTorch's own SDPA returns for these inputs, so the
    strides match the reference's (without running any attention op to find out): its flash
    kernels (CPU and CUDA) allocate like the query, the memory-efficient CUDA kernel (fp32 on
    CUDA) in ``(B, S, H, D)`` order, the math path contiguously. CUDA backends are asked in
    PyTorch's default priority order (flash, memory-efficient, math)."""
    shape = (*q.shape[:-1], v.shape[-1])
    if q.dim() == 4 and q.is_cuda:
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, False)
        if torch.backends.cuda.can_use_flash_attention(params):
            return torch.empty_like(q)
        if torch.backends.cuda.can_use_efficient_attention(params):
            b, h, m, _ = q.shape
            return q.new_empty((b, m, h, v.shape[-1])).transpose(1, 2)
    elif (q.dim() == 4 and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-2] > 0
          and k.shape[-2] > 0 and all(t.stride(-1) == 1 for t in (q, k, v))
          and torch.backends.cuda.flash_sdp_enabled()):
        return torch.empty_like(q)
    return q.new_empty(shape)
'''


@dataclass
class Attention:
    """``softmax(q kᵀ · scale [+ causal mask]) v`` over the last two dims of ``q``/``k``/``v``."""

    q: str              # forward-side expressions of the operands (arguments or their views)
    k: str
    v: str
    scale: str          # forward-side expression of the softmax scale (a Python number)
    causal: bool
    sdpa: bool          # from F.scaled_dot_product_attention (its output layout), else p @ v
    precision: str      # "ieee", "tf32" or "tf32x3"
    half: bool = False  # fp16/bf16 operands
    wide: bool = False  # a head wider than MAX_HEAD at the traced size: the materialised form
    relu: bool = False  # ``relu(q kᵀ · scale [masked]) v``: scores through ReLU, no softmax
    head: int = 0       # the query/key head dim at the traced size


def kernel(precision: str) -> str:
    return f'''

@triton.jit
def _keep(cols, rm, N, IS_CAUSAL: tl.constexpr):
    """Which scores of a block count: keys below ``N`` and, causal, not after the query."""
    keep = cols[None, :] < N
    if IS_CAUSAL:
        keep = keep & (cols[None, :] <= rm[:, None])
    return keep


@triton.jit
def _attend(q, q_ptrs, k_src, v_src, m_i, l_i, acc, lo, hi, qk_scale, rm, rn, rd, re, M, N, D, DV,
            sqd, skn, skd, svn, svd, MASKED: tl.constexpr, IN_BOUNDS: tl.constexpr,
            IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            EVEN_D: tl.constexpr, POS_SCALE: tl.constexpr, D_CHUNKED: tl.constexpr, TMA: tl.constexpr,
            RELU: tl.constexpr):
    """Key blocks ``lo`` to ``hi`` of one query block into the online softmax. ``MASKED``: a
    block may hold keys past ``N`` or above the causal diagonal, so scores are masked;
    ``IN_BOUNDS``: every key is below ``N``, so key and value rows load without a mask.
    ``k_src``/``v_src``: this head's keys and values, pointers or (``TMA``) descriptors.
    ``RELU``: the scores pass through ReLU instead (a masked key weighs 0) and the products
    add up as they are, with no running max or sum."""
    for start in range(lo, hi, BLOCK_N):
        cols = start + rn
        if TMA:
            kt = k_src.load([start, 0]).T
            vb = v_src.load([start, 0])
            qk = _dot(q, kt, "{precision}")
        elif D_CHUNKED:
            qk = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                dd = d0 + rd
                qc = tl.load(q_ptrs + d0 * sqd, mask=(rm[:, None] < M) & (dd[None, :] < D), other=0.0)
                kc = tl.load(k_src + dd[:, None] * skd + cols[None, :] * skn,
                             mask=(dd[:, None] < D) & (cols[None, :] < N), other=0.0)
                qk = _dot_acc(qc, kc, qk, "{precision}")
            vb = tl.load(v_src + cols[:, None] * svn + re[None, :] * svd,
                         mask=(cols[:, None] < N) & (re[None, :] < DV), other=0.0)
        else:
            k_ptrs = k_src + rd[:, None] * skd + cols[None, :] * skn
            v_ptrs = v_src + cols[:, None] * svn + re[None, :] * svd
            if IN_BOUNDS and EVEN_D:
                kt = tl.load(k_ptrs)
                vb = tl.load(v_ptrs)
            else:
                kt = tl.load(k_ptrs, mask=(rd[:, None] < D) & (cols[None, :] < N), other=0.0)
                vb = tl.load(v_ptrs, mask=(cols[:, None] < N) & (re[None, :] < DV), other=0.0)
            qk = _dot(q, kt, "{precision}")
        if RELU:
            s = qk * qk_scale
            if MASKED:
                s = tl.where(_keep(cols, rm, N, IS_CAUSAL), s, 0.0)
            acc = acc + _dot(tl.maximum(s, 0.0).to(vb.dtype), vb, "{precision}")
        else:
            if MASKED or not POS_SCALE:
                s = qk * qk_scale
                if MASKED:
                    s = tl.where(_keep(cols, rm, N, IS_CAUSAL), s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                p = tl.exp2(s - m_new[:, None])
            else:
                m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
                p = tl.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + _dot(p.to(vb.dtype), vb, "{precision}")
            m_i = m_new
    return m_i, l_i, acc


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, H, M, N, D, DV,
                     sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, soz, soh, som, sod,
                     IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, EVEN_M: tl.constexpr,
                     EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, POS_SCALE: tl.constexpr,
                     D_CHUNKED: tl.constexpr, SPLIT_MASK: tl.constexpr, TMA: tl.constexpr,
                     RELU: tl.constexpr):
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    zh = pid // blocks_m
    pid_m = pid % blocks_m
    if IS_CAUSAL:
        pid_m = blocks_m - 1 - pid_m
    z = (zh // H).to(tl.int64)
    h = (zh % H).to(tl.int64)
    q_ptr += z * sqz + h * sqh
    k_ptr += z * skz + h * skh
    v_ptr += z * svz + h * svh
    o_ptr += z * soz + h * soh
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    re = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    q_ptrs = q_ptr + rm[:, None] * sqm + rd[None, :] * sqd
    k_src = k_ptr
    v_src = v_ptr
    if TMA:
        k_src = tl.make_tensor_descriptor(k_ptr, shape=[N, D], strides=[skn, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_ptr, shape=[N, DV], strides=[svn, 1], block_shape=[BLOCK_N, BLOCK_DV])
    q = q_ptrs
    if not D_CHUNKED:
        if EVEN_M and EVEN_D:
            q = tl.load(q_ptrs)
        else:
            q = tl.load(q_ptrs, mask=(rm[:, None] < M) & (rd[None, :] < D), other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    hi = N
    if IS_CAUSAL:
        hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    whole = 0
    if SPLIT_MASK:
        whole = N // BLOCK_N * BLOCK_N
        if IS_CAUSAL:
            whole = tl.minimum(pid_m * BLOCK_M, N) // BLOCK_N * BLOCK_N
        m_i, l_i, acc = _attend(q, q_ptrs, k_src, v_src, m_i, l_i, acc, 0, whole, qk_scale, rm, rn, rd,
                                re, M, N, D, DV, sqd, skn, skd, svn, svd, False, True, IS_CAUSAL,
                                BLOCK_M, BLOCK_N, BLOCK_D, EVEN_D, POS_SCALE, D_CHUNKED, TMA, RELU)
    if IS_CAUSAL or not EVEN_N or not SPLIT_MASK:      # else every key block was whole
        m_i, l_i, acc = _attend(q, q_ptrs, k_src, v_src, m_i, l_i, acc, whole, hi, qk_scale, rm, rn, rd,
                                re, M, N, D, DV, sqd, skn, skd, svn, svd, IS_CAUSAL or not EVEN_N, EVEN_N,
                                IS_CAUSAL, BLOCK_M, BLOCK_N, BLOCK_D, EVEN_D, POS_SCALE, D_CHUNKED, TMA, RELU)
    if not RELU:
        acc = acc / l_i[:, None]
    o_ptrs = o_ptr + rm[:, None] * som + re[None, :] * sod
    if EVEN_M and EVEN_D:
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty))
    else:
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (re[None, :] < DV))
'''


MAX_HEAD = 256
"""The widest head a program holds whole (Hopper flash-attention kernels stop at 256)."""


def launcher(sdpa: bool, relu: bool) -> str:
    out = "_sdpa_output(q, k, v, causal)" if sdpa else "q.new_empty((*q.shape[:-1], v.shape[-1]))"
    factor = "" if relu else " * 1.4426950408889634"      # exp2 of the softmax takes base-2 logits
    return f'''

def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               causal: bool) -> torch.Tensor:
    """One launch: a program per (batch·head, BLOCK_M query rows, value columns): heads wider
    than {MAX_HEAD} take their query-key products in {MAX_HEAD // 4}-wide chunks and split the
    value columns across programs {MAX_HEAD // 2} at a time, each recomputing the scores, so
    that no tile outgrows a program's registers and shared memory (a 1024-wide fp32 head wanted
    1 MiB of shared memory whole; 256 value columns a program spilled 512 bytes)."""
    out = {out}
    q4, k4, v4, o4 = (_as_4d(t) for t in (q, k, v, out))
    Z, H, M, D = q4.shape
    N, DV = k4.shape[2], v4.shape[3]
    block_d, block_dv = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(DV))
    chunked = block_d > {MAX_HEAD}
    if chunked:
        block_d, block_dv = {MAX_HEAD // 4}, min(block_dv, {MAX_HEAD // 2})
    tma = bool(TMA) and not chunked and _addressable(k4) and _addressable(v4)
    if tma and q.is_cuda:
        triton.set_allocator(_scratch)
    grid = (triton.cdiv(M, BLOCK_M) * Z * H, triton.cdiv(DV, block_dv))
    attention_kernel[grid](q4, k4, v4, o4, float(scale){factor}, H, M, N, D, DV,
                           *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
                           IS_CAUSAL=causal, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                           BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_M=M % BLOCK_M == 0,
                           EVEN_N=N % BLOCK_N == 0, EVEN_D=block_d == D and block_dv == DV,
                           POS_SCALE=scale > 0, D_CHUNKED=chunked, SPLIT_MASK=SPLIT_MASK, TMA=tma,
                           RELU={relu}, num_warps=num_warps, num_stages=num_stages)
    return out
'''


def forward(op: Attention, signature: str) -> str:
    return f'''
def forward(self, {signature}):
    return _attention({op.q}, {op.k}, {op.v}, {op.scale}, {op.causal})
'''


def render(op: Attention, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    """(candidate source, one-line edit description)."""
    score = "relu" if op.relu else "softmax"
    form = "scaled_dot_product_attention" if op.sdpa else f"written-out {score}(q @ k^T * scale) @ v"
    causal = ", causal" if op.causal else ""
    if op.wide:
        return render_wide(op, signature, imports, init, form + causal)
    source = (common.header(f"Template: attention ({form}{causal}) as one flash-style kernel: online "
                            f"softmax over key blocks, fp32 accumulators; {op.precision} dots.",
                            imports)
              + common.tunables(TUNE_VALUES, starts(op)[0])
              + f"STARTS = {starts(op)!r}\n"
              + common.DOT_HELPER + common.SCRATCH_HELPER + AS_4D
              + (SDPA_OUTPUT if op.sdpa else "")
              + kernel(op.precision) + launcher(op.sdpa, op.relu)
              + common.model_class(init, forward(op, signature)))
    blocks = "key blocks summed" if op.relu else "online softmax"
    return source, f"template: attention ({form}{causal}; flash-style, {blocks})"


WIDE_ROW_BLOCK = [1024, 2048, 4096]
"""Scores a softmax program reads at once (it walks a row twice: statistics, then the result)."""


def wide_start(precision: str, half: bool) -> dict[str, int]:
    """The materialised form's seed: the matmul template's pointer-load start for these dots
    (the products here read through any strides, as those do)."""
    pointer = next(s for s in matmul.SM90_STARTS[matmul.dots_kind(precision, half)] if not s["TMA"])
    return {"BLOCK_M": pointer["BLOCK_M"], "BLOCK_N": min(pointer["BLOCK_N"], 128), "BLOCK_K": pointer["BLOCK_K"],
            "num_warps": pointer["num_warps"], "num_stages": pointer["num_stages"], "ROW_BLOCK": 2048}


WIDE_VALUES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128], "BLOCK_K": [16, 32, 64], "num_warps": [4, 8],
               "num_stages": [2, 3, 4], "ROW_BLOCK": WIDE_ROW_BLOCK}
WIDE_RESOURCES = {"smem": [["BLOCK_M", "BLOCK_K"], ["BLOCK_K", "BLOCK_N"]], "acc": [["BLOCK_M", "BLOCK_N"]]}


def wide_kernels(precision: str) -> str:
    return f'''

@triton.jit
def bmm_kernel(a_ptr, b_ptr, c_ptr, alpha, H, M, N, K, saz, sah, sam, sak, sbz, sbh, sbk, sbn, scz, sch, scm, scn,
               CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr):
    """``c = alpha · a @ b`` for one (batch, head) a grid row, every operand through its strides;
    ``CAUSAL``: entries above the diagonal (column past row) are -inf (scores)."""
    zh = tl.program_id(1)
    z = (zh // H).to(tl.int64)
    h = (zh % H).to(tl.int64)
    a_ptr += z * saz + h * sah
    b_ptr += z * sbz + h * sbh
    c_ptr += z * scz + h * sch
    blocks_n = tl.cdiv(N, BLOCK_N)
    rm = tl.program_id(0) // blocks_n * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) % blocks_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ra = tl.minimum(rm, M - 1)          # edge rows re-read a valid row; only the store is masked
    rb = tl.minimum(rn, N - 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            a = tl.load(a_ptr + ra[:, None] * sam + kk[None, :] * sak)
            b = tl.load(b_ptr + kk[:, None] * sbk + rb[None, :] * sbn)
        else:
            a = tl.load(a_ptr + ra[:, None] * sam + kk[None, :] * sak, mask=kk[None, :] < K, other=0.0)
            b = tl.load(b_ptr + kk[:, None] * sbk + rb[None, :] * sbn, mask=kk[:, None] < K, other=0.0)
        acc = _dot_acc(a, b, acc, "{precision}")
    acc = acc * alpha
    if CAUSAL:
        acc = tl.where(rn[None, :] <= rm[:, None], acc, float("-inf"))
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def softmax2_kernel(s_ptr, p_ptr, N, BLOCK: tl.constexpr):
    """One row of base-2 scores (already scaled by log2 e) into probabilities: the row's max and
    sum of exponentials in one pass (online), the result in a second, which reads from L2."""
    row = tl.program_id(0).to(tl.int64) * N
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK,), dtype=tl.float32)
    for n0 in tl.range(0, N, BLOCK):
        cols = n0 + tl.arange(0, BLOCK)
        x = tl.load(s_ptr + row + cols, mask=cols < N, other=float("-inf"))
        m_new = tl.maximum(m, x)
        l = l * tl.exp2(tl.where(m_new == float("-inf"), 0.0, m - m_new)) + tl.where(x == float("-inf"), 0.0,
                                                                                  tl.exp2(x - m_new))
        m = m_new
    m_row = tl.max(m, axis=0)
    l_row = tl.sum(l * tl.exp2(tl.where(m == float("-inf"), float("-inf"), m - m_row)), axis=0)
    for n0 in tl.range(0, N, BLOCK):
        cols = n0 + tl.arange(0, BLOCK)
        x = tl.load(s_ptr + row + cols, mask=cols < N, other=float("-inf"))
        tl.store(p_ptr + row + cols, (tl.exp2(x - m_row) / l_row).to(p_ptr.dtype.element_ty), mask=cols < N)
'''


def wide_launcher(sdpa: bool, half: bool) -> str:
    out = "_sdpa_output(q, k, v, causal)" if sdpa else "q.new_empty((*q.shape[:-1], v.shape[-1]))"
    values = ("vb, vb_strides = v4, v4.stride()" if half else       # fp32 dots read v K-major: packed
              "vb = _k_major(v4.transpose(2, 3), N)\n"
              "    vb_strides = vb.stride(0), vb.stride(1), vb.stride(3), vb.stride(2)")
    return f'''

def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               causal: bool) -> torch.Tensor:
    """Three launches: fp32 scores ``q kᵀ · scale · log2 e`` (masked), probabilities in the
    inputs' dtype, then ``p v`` into the output's own layout (fp32 dots read ``v`` packed
    K-major, a fourth launch: TF32 products of an N-major operand ran at a fraction of the rate,
    30 ms against 24 for eager at KernelBench L1 #97's size on the H200)."""
    out = {out}
    q4, k4, v4, o4 = (_as_4d(t) for t in (q, k, v, out))
    Z, H, M, D = q4.shape
    N, DV = k4.shape[2], v4.shape[3]
    s = torch.empty((Z, H, M, N), device=q.device, dtype=torch.float32)
    p = s if q.dtype == torch.float32 else torch.empty((Z, H, M, N), device=q.device, dtype=q.dtype)
    meta = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=num_warps, num_stages=num_stages)
    bmm_kernel[(triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), Z * H)](
        q4, k4, s, float(scale) * 1.4426950408889634, H, M, N, D, *q4.stride(),
        k4.stride(0), k4.stride(1), k4.stride(3), k4.stride(2), *s.stride(), CAUSAL=causal,
        EVEN_K=D % BLOCK_K == 0, **meta)
    softmax2_kernel[(Z * H * M,)](s, p, N, BLOCK=min(ROW_BLOCK, max(16, triton.next_power_of_2(N))),
                                  num_warps=4)
    {values}
    bmm_kernel[(triton.cdiv(M, BLOCK_M) * triton.cdiv(DV, BLOCK_N), Z * H)](
        p, vb, o4, 1.0, H, M, DV, N, *p.stride(), *vb_strides, *o4.stride(), CAUSAL=False,
        EVEN_K=N % BLOCK_K == 0, **meta)
    return out
'''


def render_wide(op: Attention, signature: str, imports: list[str], init: str, form: str) -> tuple[str, str]:
    """The materialised form, for heads wider than ``MAX_HEAD``."""
    source = (common.header(f"Template: attention ({form}) with heads wider than {MAX_HEAD}, materialised: "
                            f"batched scores, a row softmax, the batched product with v; {op.precision} dots.",
                            imports)
              + common.tunables(WIDE_VALUES, wide_start(op.precision, op.half),
                                common.resources(WIDE_RESOURCES, op.precision))
              + common.DOT_HELPER + AS_4D + (SDPA_OUTPUT if op.sdpa else "")
              + ("" if op.half else matmul.K_MAJOR_HELPER)
              + wide_kernels(op.precision) + wide_launcher(op.sdpa, op.half)
              + common.model_class(init, forward(op, signature)))
    return source, f"template: attention ({form}; heads wider than {MAX_HEAD}: scores materialised, 3 kernels)"
