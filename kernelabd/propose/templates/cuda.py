"""CUDA C++ templates: what the template proposer writes when a problem's sidecar says
``target = "cuda"``. Row-wise softmax and log-softmax, row reductions (sum, mean, max) and
elementwise chains of one fp32 input, each one kernel compiled at run time with NVRTC. Every
candidate carries the CUDA loader (torch + cuda-python only) and declares ``TUNABLES`` that
reach the kernel as macros of the same name, so ``tune`` edits them like a Triton block size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from kernelabd.cudalang import with_loader
from kernelabd.propose.templates import common

# Elementwise ops in fp32 CUDA C++; ``{0}``/``{1}`` are operand expressions.
UNARY: dict[str, str] = {
    "neg": "-{0}",
    "relu": "fmaxf({0}, 0.f)",
    "sigmoid": "1.f / (1.f + expf(-{0}))",
    "silu": "{0} / (1.f + expf(-{0}))",
    "tanh": "tanhf({0})",
    "exp": "expf({0})",
    "sqrt": "sqrtf({0})",
    "rsqrt": "rsqrtf({0})",
    "square": "{0} * {0}",
    "gelu": "0.5f * {0} * (1.f + erff({0} * 0.70710678118654752f))",
}
BINARY: dict[str, str] = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
                          "div": "{0} / {1}"}
REDUCTIONS: dict[str, tuple[str, str, str]] = {     # kind -> (initial value, combine, finish)
    "sum": ("0.f", "a + b", "acc"),
    "mean": ("0.f", "a + b", "acc / (float)n_cols"),
    "max": ("__int_as_float(0xff800000)", "fmaxf(a, b)", "acc"),
    "min": ("__int_as_float(0x7f800000)", "fminf(a, b)", "acc"),
}

ROW_VALUES = {"BLOCK": [128, 256, 512, 1024]}
ELEMENTWISE_VALUES = {"BLOCK": [128, 256, 512, 1024], "ITEMS": [1, 2, 4, 8]}

# A block's threads combine per-thread values: warp shuffles, then one value a warp in shared
# memory, then every thread folds the warps' values (BLOCK is a multiple of 32).
BLOCK_REDUCE = r"""
template <typename F>
__device__ __forceinline__ float block_reduce(float v, F combine) {
    for (int off = 16; off > 0; off >>= 1) v = combine(v, __shfl_xor_sync(0xffffffff, v, off));
    __shared__ float part[BLOCK / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = part[0];
    for (int w = 1; w < BLOCK / 32; ++w) v = combine(v, part[w]);
    return v;
}
"""

SOFTMAX = r"""
#define NEG_INF __int_as_float(0xff800000)

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    float a = (m == NEG_INF) ? 0.f : s * expf(m - mx);
    float b = (m2 == NEG_INF) ? 0.f : s2 * expf(m2 - mx);
    m = mx;
    s = a + b;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
row_softmax(float* __restrict__ out, const float* __restrict__ in, int n_cols) {
    const float* x = in + (long long)blockIdx.x * n_cols;
    float* y = out + (long long)blockIdx.x * n_cols;
    float m = NEG_INF, s = 0.f;
    for (int c = threadIdx.x; c < n_cols; c += BLOCK) merge(m, s, x[c], 1.f);
    for (int off = 16; off > 0; off >>= 1)
        merge(m, s, __shfl_xor_sync(0xffffffff, m, off), __shfl_xor_sync(0xffffffff, s, off));
    __shared__ float wm[BLOCK / 32], ws[BLOCK / 32];
    if (threadIdx.x % 32 == 0) { wm[threadIdx.x / 32] = m; ws[threadIdx.x / 32] = s; }
    __syncthreads();
    m = NEG_INF; s = 0.f;
    for (int w = 0; w < BLOCK / 32; ++w) merge(m, s, wm[w], ws[w]);
#if LOG
    float lse = m + logf(s);
    for (int c = threadIdx.x; c < n_cols; c += BLOCK) y[c] = x[c] - lse;
#else
    float inv = 1.f / s;
    for (int c = threadIdx.x; c < n_cols; c += BLOCK) y[c] = expf(x[c] - m) * inv;
#endif
}
"""

REDUCE = BLOCK_REDUCE + r"""
extern "C" __global__ void __launch_bounds__(BLOCK)
row_reduce(float* __restrict__ out, const float* __restrict__ in, int n_cols) {
    const float* x = in + (long long)blockIdx.x * n_cols;
    auto combine = [](float a, float b) { return COMBINE; };
    float acc = INIT;
    for (int c = threadIdx.x; c < n_cols; c += BLOCK) acc = combine(acc, x[c]);
    acc = block_reduce(acc, combine);
    if (threadIdx.x == 0) out[blockIdx.x] = FINISH;
}
"""

ELEMENTWISE = r"""
__device__ __forceinline__ float chain(float v) {
BODY
}

extern "C" __global__ void __launch_bounds__(BLOCK)
elementwise(float* __restrict__ out, const float* __restrict__ in, long long n) {
    long long i = (long long)blockIdx.x * BLOCK * ITEMS + threadIdx.x;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k, i += BLOCK)
        if (i < n) out[i] = chain(in[i]);
}
"""

FP32_CHECK = ('    if {x}.dtype != torch.float32:\n'
              '        raise TypeError(f"this CUDA kernel reads float32, got {{{x}.dtype}}")\n')


@dataclass(frozen=True)
class Spec:
    """One recognised computation over the single fp32 input ``x`` (the forward's argument)."""

    kind: str                 # softmax | log_softmax | sum | mean | max | elementwise
    x: str
    keepdim: bool = False
    body: str = ""            # elementwise: the chain's statements over ``v``, ending in a return


def chain_body(steps: list[tuple[str, float | None, bool]]) -> str | None:
    """The device function body for a chain of (op kind, scalar operand or None, scalar is
    on the left); None when an op has no CUDA form here."""
    lines, value = [], "v"
    for i, (kind, scalar, scalar_left) in enumerate(steps):
        if scalar is None and kind in UNARY:
            expr = UNARY[kind].format(value)
        elif scalar is not None and kind in BINARY:
            literal = f"{float(scalar)!r}f".replace("inf", "INFINITY")
            expr = BINARY[kind].format(*((literal, value) if scalar_left else (value, literal)))
        else:
            return None
        lines.append(f"    float t{i} = {expr};")
        value = f"t{i}"
    return "\n".join([*lines, f"    return {value};"])


def _kernel_source(spec: Spec) -> tuple[str, str, dict[str, list[int]], dict[str, int], dict[str, str]]:
    """(CUDA source, kernel name, tunables, their starting values, fixed macros)."""
    if spec.kind in ("softmax", "log_softmax"):
        return SOFTMAX, "row_softmax", ROW_VALUES, {"BLOCK": 256}, {"LOG": str(int(spec.kind == "log_softmax"))}
    if spec.kind in REDUCTIONS:
        init, combine, finish = REDUCTIONS[spec.kind]
        return REDUCE, "row_reduce", ROW_VALUES, {"BLOCK": 256}, {"INIT": init, "COMBINE": combine,
                                                                   "FINISH": finish}
    return (ELEMENTWISE.replace("BODY", spec.body), "elementwise", ELEMENTWISE_VALUES,
            {"BLOCK": 256, "ITEMS": 4}, {})


def _forward(spec: Spec, kernel: str) -> str:
    x = spec.x
    head = f"def forward(self, {x}):\n" + FP32_CHECK.format(x=x) + f"    x2 = {x}.contiguous()\n"
    if spec.kind == "elementwise":
        return head + ("    out = torch.empty_like(x2)\n    n = x2.numel()\n"
                       "    grid = ((n + BLOCK * ITEMS - 1) // (BLOCK * ITEMS),)\n"
                       f'    PROGRAM.launch("{kernel}", grid, (BLOCK,), out, x2, ctypes.c_int64(n))\n'
                       "    return out\n")
    lines = head + "    n_cols = x2.shape[-1]\n    rows = x2.numel() // n_cols\n"
    if spec.kind in REDUCTIONS:
        shape = "x2.shape[:-1] + (1,)" if spec.keepdim else "x2.shape[:-1]"
        lines += f"    out = torch.empty({shape}, dtype=x2.dtype, device=x2.device)\n"
    else:
        lines += "    out = torch.empty_like(x2)\n"
    return lines + f'    PROGRAM.launch("{kernel}", (rows,), (BLOCK,), out, x2, n_cols)\n    return out\n'


def render(spec: Spec, imports: list[str], init: str) -> tuple[str, str]:
    """(candidate source, edit line) for ``spec``: a complete CUDA candidate file."""
    source, kernel, values, current, fixed = _kernel_source(spec)
    macros = "".join(f"#define {k} {v}\n" for k, v in fixed.items())
    defines = ", ".join(f'"{k}": {k}' for k in values)
    doc = f"Template: {spec.kind} as one CUDA C++ kernel ({kernel}), compiled at run time with NVRTC."
    own = [i for i in imports if i not in ("import torch", "import torch.nn as nn")]
    text = (f'"""{doc}"""\n\n# {{LOADER}}\n\nimport torch.nn as nn\n'
            + "".join(f"{i}\n" for i in own)
            + common.tunables(values, current)
            + f'\nCUDA_SOURCE = r"""\n{macros}{source.strip()}\n"""\n\n'
            + f"PROGRAM = CudaProgram(CUDA_SOURCE, {{{defines}}})\n"
            + common.model_class(init, _forward(spec, kernel)))
    return with_loader(text), f"template: {spec.kind} as a CUDA C++ kernel ({kernel})"


def match(g: Any, init: list[Any]) -> tuple[str, str] | None:
    """A CUDA template for the traced reference ``g`` (``template.Graph``), or None: one fp32
    input, and either one row-wise op over the last dim or a chain of elementwise ops."""
    if g.dtype != torch.float32 or len(g.inputs) != 1 or not g.ops or g.out is not g.ops[-1].node:
        return None
    x = g.inputs[0]
    ops, shape, name = g.ops, g.shape(x), str(x.target)
    if len(ops) == 1 and ops[0].kind in (*REDUCTIONS, "softmax", "log_softmax"):
        op = ops[0]
        dim = op.attrs.get("dim")
        last = shape is not None and isinstance(dim, int) and dim % len(shape) == len(shape) - 1
        if op.args[0] is not x or not last or op.node.target in (torch.max, "max", torch.min, "min"):
            return None         # not the last dim, or (values, indices)
        return render(Spec(op.kind, name, keepdim=bool(op.attrs.get("keepdim", False))), *init)
    steps: list[tuple[str, float | None, bool]] = []
    prev = x
    for op in ops:
        tensors = [a for a in op.args if isinstance(a, fx.Node)]
        scalars = [a for a in op.args if isinstance(a, int | float) and not isinstance(a, bool)]
        if tensors != [prev] or len(op.args) != 1 + len(scalars) or len(scalars) > 1:
            return None
        steps.append((op.kind, float(scalars[0]) if scalars else None, op.args[0] is not prev))
        prev = op.node
    body = chain_body(steps)
    return None if body is None else render(Spec("elementwise", name, body=body), *init)
