"""The ``inductor`` proposer: compile the reference with TorchInductor, capture the Triton it
generates, and rewrite that output into a standalone ``ModelNew`` — a deterministic
PyTorch → Triton port whose kernels and launch configurations are explicit and tunable.

Why it is built this way:

- **The compile runs in a subprocess** (``python -m kernelabd.propose.inductor``, with a timeout
  and a private Inductor cache directory). Dynamo and Inductor keep process-wide caches, config
  and patched globals; none of that may leak into the worker that keeps running jobs. Only a
  JSON answer (the candidate, or why there is none) comes back.
- **Nothing is run**: a hook on ``GraphLowering.save_output_code`` takes Inductor's output code
  (the Python module with ``async_compile.triton(...)`` kernel sources and the ``call(args)``
  wrapper) and aborts the compile there, before any kernel is compiled or launched.
- **GPU-only by default.** On a GPU (job device ``cuda:N``) Inductor runs as it does for
  ``torch.compile``. Without one Inductor emits C++, so the proposer is unavailable on a machine
  without an NVIDIA GPU unless ``KERNELAB_INDUCTOR_ON_CPU=1``: the subprocess then asks for
  Inductor's Triton CPU backend (``cpu_backend = "triton"``) and registers a stand-in Triton
  driver whose target is an sm_90 GPU, which is all code generation needs. Those kernels are what
  the CPU worker runs under ``TRITON_INTERPRET=1``; Inductor's choices for a real GPU (tiling,
  persistent vs looped reductions) can differ, so CPU runs prove the rewrite, not GPU performance.
- **Shapes are symbolic** (``dynamic=True``, no duck sizing, parameters not forced static), so
  one port serves every batch size. What Inductor still specialises (sizes that come from
  constructor arguments, such as ``nn.LayerNorm(features)``) is kept as its own
  size/stride assertions, which raise a clear error; and the port is generated for every shape
  the gate will check (the sidecar's sizes for the device and its ``extra_shapes``): if the
  generated code differs between them, the proposer declines instead of proposing a candidate
  that is right for one shape only.
- **The candidate never imports ``torch._inductor`` or calls ``torch.compile``.** The
  ``@triton_heuristics.*`` decorators (autotuning, size hints) are dropped; each kernel is a
  plain ``@triton.jit`` function launched by an explicit launcher with its grid, block sizes,
  ``num_warps`` and ``num_stages`` as module-level ``TUNABLES`` (the ``tune`` proposer's
  convention). ``triton_helpers`` functions a kernel uses are copied in (renamed ``th_*``);
  ``libdevice`` is Triton's own on a GPU, as in Inductor, and ``tl`` equivalents under the
  interpreter, which cannot run libdevice.
- **Graphs Inductor hands to extern kernels are declined**: ``extern_kernels.mm``/``addmm``/
  convolutions and aten fallbacks would be PyTorch compute outside a Triton launch (the gate's
  ``torch_compute`` rule). So are kernel kinds this rewrite does not know (templates, scans,
  cooperative or split reductions, combo kernels, user Triton kernels). A decline is a
  ``None`` from ``propose`` with the reason in ``last_reason`` and in the log.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import keyword
import logging
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelabd.propose.base import JobContext, Proposal, ProposerUnavailable
from kernelabd.propose.templates import common
from kernelabd.propose.tune import params_of
from kernelabd.pysource import parse

log = logging.getLogger("kernelab.propose.inductor")

CPU_OPT_IN = "KERNELAB_INDUCTOR_ON_CPU"   # "1": port CPU jobs too (Triton CPU backend, for tests)
CPU_UNAVAILABLE = ("without a CUDA GPU TorchInductor emits C++, not Triton, so the inductor proposer is "
                   f"GPU-only; set {CPU_OPT_IN}=1 to port CPU jobs through Inductor's Triton CPU backend "
                   "(checked under the Triton interpreter: for tests, not for performance)")
CODEGEN_TIMEOUT_S = 300.0        # one subprocess, every gate shape; a cold Inductor takes ~10 s
ROOT = Path(__file__).resolve().parents[2]

# libdevice functions and their tl equivalents for the Triton interpreter (which cannot run
# libdevice's extern calls). ``tanh`` keeps to tl.exp, like the templates.
INTERPRETER_LIBDEVICE: dict[str, str] = {
    "exp": "tl.exp(x)", "exp2": "tl.exp2(x)", "log": "tl.log(x)", "log2": "tl.log2(x)",
    "sqrt": "tl.sqrt(x)", "rsqrt": "tl.rsqrt(x)", "abs": "tl.abs(x)", "floor": "tl.floor(x)",
    "ceil": "tl.ceil(x)", "erf": "tl.erf(x)", "sin": "tl.sin(x)", "cos": "tl.cos(x)",
    "tanh": "2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0", "log1p": "tl.log(1.0 + x)",
    "expm1": "tl.exp(x) - 1.0", "isnan": "x != x", "isinf": "tl.abs(x) == float('inf')",
}
# Under the interpreter, tl.reduce with a Python combine function runs element by element
# (minutes for one softmax); these triton_helpers reductions get vectorised equivalents there
# (NaN propagation aside: the gate rejects NaN outputs anyway). GPU runs keep Inductor's own.
INTERPRETER_HELPERS: dict[str, tuple[str, str]] = {
    "max2": ("a, dim", "return tl.max(a, dim)"),
    "min2": ("a, dim", "return tl.min(a, dim)"),
    "any": ("a, dim", "return tl.max(a.to(tl.int8), dim) != 0"),
    "welford": ("mean, m2, weight, dim",
                "w = tl.sum(weight, dim)\n"
                "m = tl.sum(mean * weight, dim) / tl.where(w == 0.0, 1.0, w)\n"
                "d = mean - tl.expand_dims(m, dim)\n"
                "return m, tl.sum(m2 + weight * d * d, dim), w"),
}
KERNEL_KINDS = ("pointwise", "reduction", "persistent_reduction")
GRID_AXES = {"Grid1D": ("x",), "Grid2D": ("x", "y")}
BLOCKS = {"x": "XBLOCK", "y": "YBLOCK", "r": "R0_BLOCK"}
# What the rewritten ``call`` may call: our runtime helpers, launchers, and shape arithmetic.
SAFE_CALLS = {"_empty", "_reinterpret", "_check_layout", "max", "min", "abs", "int", "float", "len"}
SAFE_METHODS = {"size", "stride", "storage_offset", "numel", "dim"}
SAFE_MATH = {"floor", "ceil", "sqrt", "trunc"}
DROPPED_CALLS = {"get_raw_stream", "assert_alignment", "torch.cuda.set_device", "args.clear",
                 "torch.cuda.synchronize"}
EMPTY_CALLS = {"empty_strided_cuda", "empty_strided_cpu", "empty_strided_xpu", "empty_strided"}
EXTERN_ROOTS = {"extern_kernels", "aten", "torch.ops", "inductor_ops", "alloc_from_pool",
                "empty_strided_p2p"}


class Unsupported(Exception):
    """Inductor's output cannot be rewritten into a valid candidate; the message says why."""


# ---------------------------------------------------------------------------------------------
# What the codegen subprocess captures
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """One argument of Inductor's ``call``: the forward's expression for it (``x``,
    ``self.ln.weight``, ``x.size()[0]``), its kind, and for a forward input whether it was
    contiguous (then the candidate passes ``.contiguous()``, as the kernels assume)."""

    expr: str
    kind: str                    # tensor | int
    input_contiguous: bool = False


@dataclass(frozen=True)
class Capture:
    """Inductor's output code for one reference at one shape, and how to call it."""

    code: str
    args: tuple[Arg, ...]
    output: str                  # tensor | tuple | list: what the reference's forward returns
    n_outputs: int
    device: str


# ---------------------------------------------------------------------------------------------
# Parsing Inductor's output code
# ---------------------------------------------------------------------------------------------

@dataclass
class Kernel:
    """One ``async_compile.triton`` kernel of the output code, ready to be re-emitted."""

    name: str
    kind: str                              # pointwise | reduction | persistent_reduction
    params: list[str]                      # every parameter, in order
    constexprs: list[str]                  # the constexpr ones (block sizes)
    size_hints: dict[str, int]
    reduction_hint: str | None
    grid_type: str
    text: str                              # ``def …`` through the end, decorators removed
    helpers: set[str] = field(default_factory=set)

    @property
    def runtime_params(self) -> list[str]:
        return [p for p in self.params if p not in self.constexprs]


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _dict_value(node: ast.AST | None, key: str) -> Any:
    """``node[key]`` for a dict display whose value is a literal (None when absent)."""
    if not isinstance(node, ast.Dict):
        return None
    for k, v in zip(node.keys, node.values, strict=True):
        if isinstance(k, ast.Constant) and k.value == key:
            try:
                return ast.literal_eval(v)
            except ValueError:
                return None
    return None


def parse_kernel(name: str, source: str) -> Kernel:
    """One kernel's source (as handed to ``async_compile.triton``) as a ``Kernel``."""
    tree = parse(source)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if len(fns) != 1 or fns[0].name != name:
        raise Unsupported(f"kernel {name}: expected one function of that name in its source")
    fn = fns[0]
    heuristic = None
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and _dotted(dec.func).startswith("triton_heuristics."):
            heuristic = dec
    if heuristic is None:
        raise Unsupported(f"kernel {name} has no triton_heuristics decorator")
    kind = _dotted(heuristic.func).split(".", 1)[1]
    if kind not in KERNEL_KINDS:
        raise Unsupported(f"kernel {name} is an Inductor {kind} kernel; only pointwise and "
                          "reduction kernels are ported")
    kwargs = {k.arg: k.value for k in heuristic.keywords if k.arg}
    size_hints = ast.literal_eval(kwargs["size_hints"]) if "size_hints" in kwargs else {}
    hint = kwargs.get("reduction_hint")
    grid_type = _dict_value(kwargs.get("inductor_meta"), "grid_type") or "Grid1D"
    if grid_type not in GRID_AXES:
        raise Unsupported(f"kernel {name} needs Inductor's {grid_type} launch grid, which is not ported")
    params = [a.arg for a in fn.args.args]
    constexprs = [a.arg for a in fn.args.args
                  if a.annotation is not None and ast.unparse(a.annotation) in ("tl.constexpr", "constexpr")]
    allowed = {BLOCKS[a] for a in GRID_AXES[grid_type]} | ({"R0_BLOCK"} if kind != "pointwise" else set())
    if not set(constexprs) <= allowed:
        raise Unsupported(f"kernel {name} takes constexpr(s) {sorted(set(constexprs) - allowed)}, "
                          "which this port does not launch (split, cooperative or multi-dim reductions)")
    needed = [f"{axis}numel" for axis in GRID_AXES[grid_type]]
    if kind == "persistent_reduction" and "R0_BLOCK" in constexprs:
        needed.append("r0_numel")
    if missing := [n for n in needed if n not in params]:
        raise Unsupported(f"kernel {name} has no {', '.join(missing)} parameter to size its grid")
    if kind == "reduction" and "R0_BLOCK" not in constexprs:
        raise Unsupported(f"kernel {name}: a looped reduction without an R0_BLOCK parameter")
    if any(k in size_hints for k in ("r1_", "z")):
        raise Unsupported(f"kernel {name} tiles {sorted(size_hints)}; only x/y and one reduction dim are ported")
    lines = source.splitlines()
    text = "\n".join(lines[fn.lineno - 1:fn.end_lineno])
    helpers = set(re.findall(r"\btriton_helpers\.(\w+)", text))
    text = re.sub(r"\btriton_helpers\.(\w+)", r"th_\1", text)
    for forbidden in ("triton_heuristics", "triton_helpers", "torch."):
        if forbidden in text:
            raise Unsupported(f"kernel {name} refers to {forbidden.rstrip('.')} in its body")
    return Kernel(name=name, kind=kind, params=params, constexprs=constexprs,
                  size_hints={k: int(v) for k, v in size_hints.items()},
                  reduction_hint=ast.unparse(hint).rsplit(".", 1)[-1] if hint is not None else None,
                  grid_type=grid_type, text=text, helpers=helpers)


def parse_output_code(code: str) -> tuple[list[Kernel], ast.FunctionDef]:
    """The Triton kernels of Inductor's output module and its ``call(args)`` function."""
    tree = parse(code)
    kernels: list[Kernel] = []
    call: ast.FunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "call" and node.args.args \
                and node.args.args[-1].arg == "args":
            call = node
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = _dotted(node.value.func)
        if not func.startswith("async_compile."):
            continue
        target = node.targets[0]
        name = target.id if isinstance(target, ast.Name) else "?"
        if func != "async_compile.triton":
            raise Unsupported(f"Inductor compiled {name} with {func} (not Triton)")
        src = node.value.args[1] if len(node.value.args) > 1 else None
        if not (isinstance(src, ast.Constant) and isinstance(src.value, str)):
            raise Unsupported(f"kernel {name}: its source is not a string literal")
        kernels.append(parse_kernel(name, src.value))
    if call is None:
        raise Unsupported("Inductor's output has no call(args) function")
    return kernels, call


# ---------------------------------------------------------------------------------------------
# Rewriting ``call`` into plain PyTorch allocation + explicit launches
# ---------------------------------------------------------------------------------------------

class _CallRewriter(ast.NodeTransformer):
    """Inductor's ``call`` with its runtime replaced: allocations on the inputs' device, our
    layout check, launches through explicit launchers, streams and device guards dropped."""

    def __init__(self, kernels: dict[str, Kernel]) -> None:
        self.kernels = kernels

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            if isinstance(stmt, ast.With) and all(
                    _dotted(i.context_expr.func if isinstance(i.context_expr, ast.Call) else i.context_expr)
                    .startswith(("torch.cuda._DeviceGuard", "torch.cuda.device")) for i in stmt.items):
                out.extend(self._statements(stmt.body))
                continue
            value = stmt.value if isinstance(stmt, ast.Expr | ast.Assign) else None
            if isinstance(value, ast.Call) and _dotted(value.func) in DROPPED_CALLS:
                continue
            new = self.visit(stmt)
            if new is not None:
                out.append(new)
        return out

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.body = self._statements(node.body) or [ast.Pass()]
        node.args.args.append(ast.arg(arg="device"))
        node.decorator_list = []
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        node.test = self.visit(node.test)
        node.body = self._statements(node.body) or [ast.Pass()]
        node.orelse = self._statements(node.orelse)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = _dotted(node.func)
        if func in EMPTY_CALLS:
            if len(node.args) != 3 or node.keywords:
                raise Unsupported(f"unexpected {func}(...) call in Inductor's output")
            return ast.Call(ast.Name("_empty", ast.Load()), [*node.args, ast.Name("device", ast.Load())], [])
        if func == "reinterpret_tensor":
            return ast.Call(ast.Name("_reinterpret", ast.Load()), node.args, node.keywords)
        if func == "assert_size_stride":
            return ast.Call(ast.Name("_check_layout", ast.Load()), node.args, node.keywords)
        if func == "assert_size_stride_grouped":
            return _ungroup_layout_checks(node)
        if func.endswith(".run") and func[:-4] in self.kernels:
            kernel = self.kernels[func[:-4]]
            if any(k.arg != "stream" for k in node.keywords):
                raise Unsupported(f"{kernel.name}.run(...) passes keyword arguments other than stream")
            if len(node.args) != len(kernel.runtime_params):
                raise Unsupported(f"{kernel.name}.run(...) passes {len(node.args)} arguments for "
                                  f"{len(kernel.runtime_params)} kernel parameters")
            return ast.Call(ast.Name(f"launch_{kernel.name}", ast.Load()), node.args, [])
        return node


def _ungroup_layout_checks(node: ast.Call) -> ast.AST:
    """Newer Inductor (torch ≥ 2.14) checks several inputs in one call,
    ``assert_size_stride_grouped((a, b), (size_a, size_b), (stride_a, stride_b), op)``; with a
    single input the parentheses are not tuples (``(a), ((s0, 8)), ((8, 1))``). Either way it
    becomes one ``_check_layout`` per input."""
    if len(node.args) < 3 or node.keywords:
        raise Unsupported("unexpected assert_size_stride_grouped(...) call in Inductor's output")
    names, sizes, strides = node.args[:3]
    if not isinstance(names, ast.Tuple):
        return ast.Call(ast.Name("_check_layout", ast.Load()), [names, sizes, strides], [])
    if not (isinstance(sizes, ast.Tuple) and isinstance(strides, ast.Tuple)
            and len(names.elts) == len(sizes.elts) == len(strides.elts)):
        raise Unsupported("assert_size_stride_grouped(...) with names, sizes and strides of different lengths")
    checks = [ast.Call(ast.Name("_check_layout", ast.Load()), list(args), [])
              for args in zip(names.elts, sizes.elts, strides.elts, strict=True)]
    return ast.Tuple(checks, ast.Load())


def _check_call(fn: ast.FunctionDef, kernels: dict[str, Kernel]) -> None:
    """Refuse any call or name in the rewritten ``call`` that is not allocation, layout,
    shape arithmetic or a launch: that would be PyTorch compute outside Triton."""
    defined = {a.arg for a in fn.args.args}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            defined.add(node.id)
    launchers = {f"launch_{k}" for k in kernels}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            func = _dotted(node.func)
            root = func.split(".", 1)[0]
            if any(func == r or func.startswith(r + ".") for r in EXTERN_ROOTS):
                raise Unsupported(f"Inductor routes part of this graph to {func}, which would run as "
                                  "PyTorch compute outside a Triton kernel")
            if func in SAFE_CALLS or func in launchers:
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in SAFE_METHODS \
                    and root in defined:
                continue
            if func.startswith("math.") and func[5:] in SAFE_MATH:
                continue
            raise Unsupported(f"Inductor's wrapper calls {func or ast.unparse(node.func)}(...), "
                              "which a standalone port cannot keep")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in defined or node.id in SAFE_CALLS or node.id in launchers \
                    or node.id in ("torch", "math"):
                continue
            raise Unsupported(f"Inductor's wrapper uses {node.id}, a value captured at compile "
                              "time (a constant tensor or an extern helper)")


def rewrite_call(call: ast.FunctionDef, kernels: list[Kernel]) -> str:
    """The source of ``call(args, device)`` for the candidate."""
    by_name = {k.name: k for k in kernels}
    fn = _CallRewriter(by_name).visit(parse(textwrap.dedent(ast.unparse(call))).body[0])
    fn.args.args = [a for a in fn.args.args if a.arg != "self"]
    ast.fix_missing_locations(fn)
    _check_call(fn, by_name)
    return ast.unparse(fn)


# ---------------------------------------------------------------------------------------------
# Helpers, libdevice and launch configurations
# ---------------------------------------------------------------------------------------------

def helper_sources(names: set[str]) -> list[str]:
    """Sources of the ``triton_helpers`` functions ``names`` needs (dependencies first), renamed
    ``th_*`` so that they cannot collide with anything in the candidate."""
    from torch._inductor.runtime import triton_helpers
    from triton.runtime.jit import JITFunction

    def is_helper(n: str) -> bool:
        return isinstance(getattr(triton_helpers, n, None), JITFunction)

    order: list[str] = []
    deps: dict[str, set[str]] = {}

    def visit(n: str, seen: tuple[str, ...] = ()) -> None:
        if n in order or n in seen:
            return
        if not is_helper(n):
            raise Unsupported(f"kernels use triton_helpers.{n}, which is not a @triton.jit helper")
        src = textwrap.dedent(inspect.getsource(getattr(triton_helpers, n).fn))
        tree = parse(src)
        fn = tree.body[0]
        local = {a.arg for a in fn.args.args} | {t.id for t in ast.walk(fn)
                                                 if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        used = {t.id for t in ast.walk(fn) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Load)} - local
        deps[n] = {u for u in used if is_helper(u)}
        other = used - deps[n] - {"tl", "triton", "libdevice", "math", "float", "int", "range"} - {n}
        if other:
            raise Unsupported(f"triton_helpers.{n} uses {sorted(other)}, which the port cannot copy")
        for d in sorted(deps[n]):
            visit(d, (*seen, n))
        order.append(n)
        sources[n] = src

    sources: dict[str, str] = {}
    for n in sorted(names):
        visit(n)
    out = []
    for n in order:
        src = sources[n]
        for d in [*deps[n], n]:
            src = re.sub(rf"(?<![\w.]){d}\b", f"th_{d}", src)
        out.append(re.sub(r"(?<![\w.])math\.", "tl_math.", src).rstrip() + "\n")
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _around(default: int, lo: int, hi: int) -> list[int]:
    """Powers of two in [lo, hi] plus the default: a tuner's search space."""
    values = {1 << i for i in range(lo.bit_length() - 1, hi.bit_length()) if lo <= 1 << i <= hi}
    return sorted(values | {default})


@dataclass
class Launch:
    """A kernel's launch configuration: tunable defaults and their search spaces."""

    defaults: dict[str, int]
    spaces: dict[str, list[int]]


def launch_config(kernel: Kernel) -> Launch:
    """Deterministic launch defaults from Inductor's size hints (what its heuristics read),
    standing in for its autotuner: the ``tune`` proposer refines them one edit at a time."""
    hx = _pow2(kernel.size_hints.get("x", 1))
    hr = _pow2(kernel.size_hints.get("r0_", 1))
    d: dict[str, int] = {}
    s: dict[str, list[int]] = {}
    warps = [1, 2, 4, 8, 16]
    if kernel.kind == "pointwise":
        if "YBLOCK" in kernel.constexprs:
            d["YBLOCK"] = min(32, _pow2(kernel.size_hints.get("y", 1)))
            s["YBLOCK"] = _around(d["YBLOCK"], 1, 256)
            d["XBLOCK"] = min(32, hx)
            s["XBLOCK"] = _around(d["XBLOCK"], 1, 256)
        elif "XBLOCK" in kernel.constexprs:
            d["XBLOCK"] = min(1024, hx)
            s["XBLOCK"] = _around(d["XBLOCK"], 64, 4096)
        d["num_warps"] = 4
    elif kernel.kind == "persistent_reduction":
        if "XBLOCK" in kernel.constexprs:
            d["XBLOCK"] = max(1, min(hx, 4096 // hr, 64))
            s["XBLOCK"] = _around(d["XBLOCK"], 1, 128)
        d["num_warps"] = 8 if hr >= 2048 else 4
    else:
        if kernel.reduction_hint == "OUTER":
            d["XBLOCK"], d["R0_BLOCK"] = min(64, hx), min(8, hr)
        elif kernel.reduction_hint == "INNER":
            d["XBLOCK"], d["R0_BLOCK"] = 1, min(2048, hr)
        else:
            d["XBLOCK"], d["R0_BLOCK"] = min(8, hx), min(256, hr)
        s["XBLOCK"] = _around(d["XBLOCK"], 1, 128)
        s["R0_BLOCK"] = _around(d["R0_BLOCK"], 8, 4096)
        d["num_warps"] = min(8, max(2, d["XBLOCK"] * d["R0_BLOCK"] // 256))
        d["num_stages"] = 1
        s["num_stages"] = [1, 2, 3, 4]
    s["num_warps"] = warps
    return Launch(d, s)


def launcher_source(kernel: Kernel, names: dict[str, str]) -> str:
    """``launch_<kernel>(...)``: grid and block sizes explicit, read from module-level tunables
    (``names`` maps XBLOCK/num_warps/... to this kernel's tunable names)."""
    body: list[str] = []
    blocks: dict[str, str] = {}
    if kernel.kind == "persistent_reduction" and "R0_BLOCK" in kernel.constexprs:
        # a persistent reduction holds the whole reduced extent in registers
        body.append("r0_block = triton.next_power_of_2(r0_numel)")
        blocks["R0_BLOCK"] = "r0_block"
        if "XBLOCK" in kernel.constexprs:
            body.append(f"xblock = max(1, min({names['XBLOCK']}, 4096 // r0_block))")
            blocks["XBLOCK"] = "xblock"
    for block in kernel.constexprs:
        blocks.setdefault(block, names[block])
    grid = [f"triton.cdiv({axis}numel, {blocks[BLOCKS[axis]]})" if BLOCKS[axis] in blocks else f"{axis}numel"
            for axis in GRID_AXES[kernel.grid_type]]
    grid += ["1"] * (3 - len(grid))
    kwargs = [f"{b}={blocks[b]}" for b in kernel.constexprs]
    kwargs += [f"num_warps={names['num_warps']}",
               f"num_stages={names['num_stages']}" if "num_stages" in names else "num_stages=1"]
    body.append(f"grid = ({', '.join(grid)})")
    body.append(f"{kernel.name}[grid]({', '.join([*kernel.runtime_params, *kwargs])})")
    return f"def launch_{kernel.name}({', '.join(kernel.runtime_params)}):\n" + \
        "".join(f"    {line}\n" for line in body)


# ---------------------------------------------------------------------------------------------
# The candidate file
# ---------------------------------------------------------------------------------------------

RUNTIME = '''

def _empty(size, stride, dtype, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def _reinterpret(t, size, stride, offset):
    """A view of ``t``'s storage, ``offset`` elements after ``t``'s own start."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _check_layout(t, size, stride, what="tensor"):
    """Inductor's size/stride assertion: the kernels index with the sizes and strides they were
    generated for, so anything else is an error, never a silently wrong result."""
    size, stride = tuple(size), tuple(stride)
    if tuple(t.shape) != size or any(n != 1 and a != b for n, a, b in zip(size, t.stride(), stride)):
        raise ValueError(f"Inductor port: {what} has shape {tuple(t.shape)} and strides {t.stride()}, "
                         f"but its kernels were generated for shape {size} and strides {stride}")
'''


@dataclass
class Port:
    """A generated candidate, split so that two shapes' ports can be compared without the
    launch defaults (which follow the shape's size hints)."""

    body: str                      # everything after the tunables
    head: str                      # docstring and imports
    tunables: dict[str, list[int]]
    defaults: dict[str, int]
    kernels: list[str]

    @property
    def source(self) -> str:
        return self.head + common.tunables(self.tunables, self.defaults) + self.body

    @property
    def edit(self) -> str:
        names = ", ".join(self.kernels)
        return f"inductor: {len(self.kernels)} Triton kernel(s) from TorchInductor ({names})"


def _interpreter_block(libdevice_used: set[str], helpers_used: set[str]) -> str:
    """Triton's libdevice on a GPU (as Inductor uses it); under the interpreter, which cannot
    run libdevice, ``tl`` equivalents, and vectorised stand-ins for slow helper reductions."""
    portable = sorted(u for u in libdevice_used if u in INTERPRETER_LIBDEVICE)
    fast = sorted(h for h in helpers_used if h in INTERPRETER_HELPERS)
    if not libdevice_used and not fast:
        return ""
    lines: list[str] = []
    for name in portable:
        lines += ["", "", "@triton.jit", f"def _interp_{name}(x):", f"    return {INTERPRETER_LIBDEVICE[name]}"]
    lines += ["", "", 'if os.environ.get("TRITON_INTERPRET") == "1":']
    if libdevice_used:
        lines += ["    class libdevice:",
                  '        """The Triton interpreter cannot run libdevice: tl equivalents."""',
                  *[f"        {n} = _interp_{n}" for n in portable]]
        if not portable:
            lines.append("        pass")
    for name in fast:
        params, body = INTERPRETER_HELPERS[name]
        lines += ["", "    @triton.jit", f"    def th_{name}({params}):",
                  textwrap.indent(body, " " * 8)]
    if libdevice_used:
        lines += ["else:", "    from triton.language.extra import libdevice"]
    return "\n".join(lines) + "\n"


def _forward(reference_source: str, capture: Capture) -> str:
    """``forward``: the reference's signature, Inductor's graph inputs in Dynamo's order, ``call``."""
    tree = parse(reference_source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    fwd = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if fwd is None:
        raise Unsupported("Model has no forward method")
    returns = f" -> {ast.unparse(fwd.returns)}" if fwd.returns is not None else ""
    args = []
    for a in capture.args:
        args.append(f"{a.expr}.contiguous()" if a.input_contiguous else a.expr)
    tensors = [a.expr for a in capture.args if a.kind == "tensor"]
    if not tensors:
        raise Unsupported("the compiled graph takes no tensor, so there is no device to run on")
    ret = "outputs[0]" if capture.output == "tensor" else f"{capture.output}(outputs)"
    return (f"def forward({ast.unparse(fwd.args)}){returns}:\n"
            f"    outputs = call([{', '.join(args)}], {tensors[0]}.device)\n"
            f"    return {ret}\n")


def port(capture: Capture, reference_source: str, interpreter: bool) -> Port:
    """Inductor's captured output code as a standalone candidate; raises ``Unsupported``."""
    import torch
    import triton

    parts = common.reference_parts(reference_source)
    if parts is None:
        raise Unsupported("the reference's Model.__init__ cannot be copied (missing or decorated)")
    kernels, call = parse_output_code(capture.code)
    call_src = rewrite_call(call, kernels)     # first: an extern kernel is the reason to give
    if not kernels:
        raise Unsupported("Inductor generated no Triton kernel for this graph")
    returns = [n for n in ast.walk(call) if isinstance(n, ast.Return)]
    if len(returns) != 1 or not isinstance(returns[0].value, ast.Tuple) \
            or len(returns[0].value.elts) != capture.n_outputs:
        raise Unsupported(f"Inductor's call does not return the reference's {capture.n_outputs} output(s)")
    unpack = [n for n in call.body if isinstance(n, ast.Assign) and _dotted(n.value) == "args"]
    n_args = len(unpack[0].targets[0].elts) if unpack and isinstance(unpack[0].targets[0], ast.Tuple) else 1
    if n_args != len(capture.args):
        raise Unsupported(f"Inductor's call takes {n_args} arguments for {len(capture.args)} graph inputs")

    tunables: dict[str, list[int]] = {}
    defaults: dict[str, int] = {}
    launchers = []
    for i, k in enumerate(kernels):
        cfg = launch_config(k)
        names = {key: key if len(kernels) == 1 else f"{key}_{i}" for key in cfg.defaults}
        for key, value in cfg.defaults.items():
            defaults[names[key]] = value
            tunables[names[key]] = cfg.spaces[key]
        launchers.append(launcher_source(k, names))

    helper_names = set().union(*(k.helpers for k in kernels))
    helpers = helper_sources(helper_names)
    texts = [k.text for k in kernels] + helpers
    used = set().union(*(set(re.findall(r"\blibdevice\.(\w+)", t)) for t in texts))
    if interpreter and (missing := sorted(used - set(INTERPRETER_LIBDEVICE))):
        raise Unsupported(f"kernels use libdevice.{', libdevice.'.join(missing)}, which the Triton "
                          "interpreter cannot run")
    doc = (f"Inductor port: TorchInductor's Triton kernels for this reference, standalone.\n\n"
           f"Generated by kernelab's inductor proposer (torch {torch.__version__.split('+')[0]}, triton "
           f"{triton.__version__}) on {capture.device.split(':')[0]}: the kernels are Inductor's own with\n"
           "its autotuning decorators removed; grids and block sizes are explicit, the launch\n"
           "configuration is TUNABLES. No torch.compile or torch._inductor at run time.\n")
    imports = ["import os", *parts[0]]
    if any("tl_math." in t for t in texts):
        imports.insert(1, "from triton.language import math as tl_math")
    head = common.header(doc, imports)
    body = ""
    for src in helpers:
        body += "\n\n" + src
    body += _interpreter_block(used, helper_names)
    for k in kernels:
        body += f"\n\n@triton.jit\n{k.text.rstrip()}\n"
    for src in launchers:
        body += "\n\n" + src
    body += RUNTIME + "\n\n" + call_src.rstrip() + "\n"
    body += common.model_class(parts[1], _forward(reference_source, capture))
    return Port(body=body, head=head, tunables=tunables, defaults=defaults, kernels=[k.name for k in kernels])


# ---------------------------------------------------------------------------------------------
# The codegen subprocess
# ---------------------------------------------------------------------------------------------

class _Captured(Exception):
    """Raised from Inductor's output-code hook: the code is in hand, stop before compiling."""


def use_stand_in_driver() -> None:
    """Let Inductor's Triton code generation run without a GPU: it asks the active Triton
    driver for a target only to hash and pick options. Code generation only; nothing built
    with this driver is ever launched."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver

    class StandInDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self) -> Any:
            return torch.device("cpu")

        def get_benchmarker(self) -> Any:
            raise RuntimeError("code generation only: nothing is benchmarked")

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: Any = None) -> int:
            return 0

    driver.set_active(StandInDriver())


def _configure(device: str) -> None:
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as fx_config

    inductor_config.compile_threads = 1
    inductor_config.fx_graph_cache = False
    inductor_config.max_autotune = False
    inductor_config.triton.cudagraphs = False
    dynamo_config.force_parameter_static_shapes = False
    dynamo_config.force_nn_module_property_static_shapes = False
    dynamo_config.allow_unspec_int_on_nn_module = True
    dynamo_config.specialize_float = True
    dynamo_config.cache_size_limit = 64
    fx_config.use_duck_shape = False      # equal sizes must not become one symbol
    if device == "cpu":
        inductor_config.cpu_backend = "triton"
        use_stand_in_driver()


def _source_expr(name: str, forward_params: list[str]) -> str | None:
    """A Dynamo source name (``L['self']._modules['ln']._parameters['weight']``) as the
    forward's Python expression (``self.ln.weight``); None when it is not reachable from there."""
    m = re.match(r"L\['(\w+)'\]", name)
    if m is None or (m.group(1) != "self" and m.group(1) not in forward_params):
        return None
    expr = m.group(1) + name[m.end():]

    def attr(mm: re.Match[str]) -> str:
        key = mm.group(1)
        return f".{key}" if key.isidentifier() and not keyword.iskeyword(key) else mm.group(0)

    return re.sub(r"\._(?:modules|parameters|buffers)\['([^'\]]+)'\]", attr, expr)


def _graph_input(node: Any) -> tuple[str, bool]:
    """A Dynamo placeholder's source name and whether Dynamo passes it as a tensor although
    the forward holds a Python number (an unspecialised scalar)."""
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None)
    name = getattr(src, "name", None)
    name = name() if callable(name) else name
    return str(name or node.name), bool(getattr(ga, "pass_arg_as_tensor", False))


def capture(source: str, device: str, constants: dict[str, Any]) -> Capture:
    """Run TorchInductor on the reference at one shape and take its output code (in-process:
    call it only from the codegen subprocess)."""
    import torch
    import torch._dynamo
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.graph import GraphLowering

    from kernelabd.service.capture import load_reference

    torch._dynamo.reset()
    _, model, inputs = load_reference(source, constants)
    model = model.to(device).eval()
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    sig = inspect.signature(model.forward)
    params = list(sig.parameters)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        raise Unsupported("forward takes *args/**kwargs")
    bound = dict(zip(params, inputs, strict=False))
    seen: dict[str, Any] = {}

    def backend(gm: Any, example_inputs: list[Any]) -> Any:
        # read now: Dynamo drops the graph's metadata once the compile is aborted
        seen["inputs"] = [_graph_input(n) for n in gm.graph.nodes if n.op == "placeholder"]
        seen["examples"] = list(example_inputs)
        seen["gm"] = gm
        return compile_fx(gm, example_inputs)

    def hook(code: str) -> None:
        seen["code"] = code
        raise _Captured

    GraphLowering.save_output_code = staticmethod(hook)
    with torch.no_grad():
        eager = model(*inputs)
        try:
            torch.compile(model, backend=backend, fullgraph=True, dynamic=True)(*inputs)
        except Exception as exc:
            if "code" not in seen:
                msg = str(exc).strip().splitlines()
                raise Unsupported(f"torch.compile failed: {type(exc).__name__}: {msg[0] if msg else ''}"
                                  [:300]) from exc
    outs = list(eager) if isinstance(eager, tuple | list) else [eager]
    if not all(isinstance(t, torch.Tensor) for t in outs):
        raise Unsupported("forward returns something other than tensors")
    args, values = [], []
    scope = {"self": model, **bound}
    for (name, as_tensor), example in zip(seen["inputs"], seen["examples"], strict=True):
        expr = _source_expr(name, params)
        if expr is None or as_tensor:
            raise Unsupported(f"graph input {name} is not an input, parameter or size of the forward")
        try:
            value = eval(expr, {}, scope)   # our own expression over the model and its inputs
        except Exception as exc:
            raise Unsupported(f"graph input {expr} cannot be re-evaluated: {exc}") from exc
        values.append(value)
        if isinstance(example, torch.Tensor):
            if not (isinstance(value, torch.Tensor) and value.shape == example.shape
                    and torch.equal(value, example)):
                raise Unsupported(f"graph input {expr} is not the tensor Dynamo saw")
            contiguous = expr in params and value.is_contiguous()
            args.append(Arg(expr, "tensor", contiguous))
        else:
            hint = example.node.hint if isinstance(example, torch.SymInt) else example
            if value != hint:
                raise Unsupported(f"graph input {expr} is {value}, Dynamo saw {hint}")
            args.append(Arg(expr, "int"))
    graph_out = seen["gm"](*values)
    graph_out = list(graph_out) if isinstance(graph_out, tuple | list) else [graph_out]
    if len(graph_out) != len(outs) or not all(
            isinstance(g, torch.Tensor) and g.shape == o.shape and torch.allclose(g, o, rtol=1e-4, atol=1e-5,
                                                                                  equal_nan=True)
            for g, o in zip(graph_out, outs, strict=True)):
        raise Unsupported("Dynamo's graph outputs are not the forward's outputs one for one")
    kind = "tensor" if isinstance(eager, torch.Tensor) else type(eager).__name__
    return Capture(code=seen["code"], args=tuple(args), output=kind, n_outputs=len(outs),
                   device=device)


def generate(source: str, device: str, shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """Capture and port the reference at every gate shape; the first shape's port when they all
    agree (in-process: call it only from the codegen subprocess)."""
    _configure(device.split(":")[0] if device.startswith("cuda") else device)
    interpreter = device == "cpu"
    first: Port | None = None
    for i, constants in enumerate(shapes):
        try:
            p = port(capture(source, device, constants), source, interpreter)
        except Unsupported as exc:
            where = f" (at gate shape {constants})" if i else ""
            return {"declined": f"{exc}{where}"}
        if first is None:
            first = p
        elif p.body != first.body or set(p.tunables) != set(first.tunables):
            return {"declined": f"Inductor specialises its kernels on sizes that differ between the "
                                f"gate's shapes ({shapes[0] or 'defaults'} vs {constants}); one port "
                                "would fail the other"}
    assert first is not None
    return {"source": first.source, "edit": first.edit, "kernels": first.kernels}


def gate_shapes(sidecar: str | None, device: str) -> list[dict[str, Any]]:
    """The module constants of every shape the gate checks: the device's sizes, then the
    sidecar's ``extra_shapes`` (as ``kernelabd.harness.check.plan_sets`` plans them)."""
    try:
        data = tomllib.loads(sidecar or "")
    except tomllib.TOMLDecodeError:
        data = {}
    sizes = data.get("sizes", {}).get(device.split(":")[0], {})
    extra = [s for s in data.get("extra_shapes", []) if isinstance(s, dict)]
    return [dict(sizes) if isinstance(sizes, dict) else {}, *extra]


def run_codegen(source: str, device: str, shapes: list[dict[str, Any]],
                timeout: float = CODEGEN_TIMEOUT_S) -> dict[str, Any]:
    """``generate`` in a fresh subprocess with a private Inductor cache; never raises."""
    with tempfile.TemporaryDirectory(prefix="kernelab-inductor-") as tmp:
        out = Path(tmp) / "answer.json"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "cache"), TORCHINDUCTOR_COMPILE_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
        request = json.dumps({"source": source, "device": device, "shapes": shapes, "out": str(out)})
        try:
            proc = subprocess.run([sys.executable, "-m", "kernelabd.propose.inductor"], input=request,
                                  capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"declined": f"Inductor code generation took longer than {timeout:.0f} s"}
        if not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            return {"declined": f"Inductor code generation failed (exit {proc.returncode}): "
                                f"{tail[-1] if tail else 'no output'}"[:500]}
        return json.loads(out.read_text())


def _gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible, asked through NVML: unlike ``torch.cuda``, it does not
    initialise CUDA in the worker, which forks sandboxes."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    except Exception:
        return False
    finally:
        pynvml.nvmlShutdown()


class InductorProposer:
    """One Inductor port per job, from scratch (no parent); ``None`` with ``last_reason`` set
    when the reference's graph cannot be ported.

    GPU-only unless ``on_cpu`` (or ``KERNELAB_INDUCTOR_ON_CPU=1``): on a machine without a GPU
    loading it raises ``ProposerUnavailable``, and a CPU job on a GPU box gets ``None``.
    """

    name = "inductor"

    def __init__(self, on_cpu: bool | None = None) -> None:
        self.on_cpu = os.environ.get(CPU_OPT_IN) == "1" if on_cpu is None else on_cpu
        if not self.on_cpu and not _gpu_present():
            raise ProposerUnavailable(f"proposer 'inductor' is not available: {CPU_UNAVAILABLE}")
        self.last_reason: str | None = None
        self._answers: dict[str, dict[str, Any]] = {}

    def propose(self, ctx: JobContext) -> Proposal | None:
        if any(c.proposer == self.name for c in ctx.history):
            return None
        device = ctx.device
        if device == "cpu" and not self.on_cpu:
            self.last_reason = CPU_UNAVAILABLE
            return None
        key = hashlib.sha256("\0".join([ctx.reference_source, ctx.sidecar or "", device]).encode()).hexdigest()
        answer = self._answers.get(key)
        if answer is None:
            timeout = max(30.0, min(CODEGEN_TIMEOUT_S, ctx.budget.seconds_left))
            answer = run_codegen(ctx.reference_source, device, gate_shapes(ctx.sidecar, device), timeout)
            self._answers[key] = answer      # a decline is not retried every loop iteration
            if "declined" in answer:
                log.info("proposer.declined", extra={"proposer": self.name, "job": ctx.job_id,
                                                      "reason": answer["declined"]})
        if "declined" in answer:
            self.last_reason = answer["declined"]
            return None
        self.last_reason = None
        return Proposal(source=answer["source"], edit=answer["edit"], parent_id=None,
                        params=params_of(answer["source"]))


def _main() -> int:
    """Subprocess entry: a JSON request on stdin, the answer written to ``request["out"]``."""
    request = json.loads(sys.stdin.read())
    try:
        answer = generate(request["source"], request["device"], request["shapes"])
    except Exception as exc:   # the reference is arbitrary code; any failure is a decline
        msg = str(exc).strip().splitlines()
        answer = {"declined": f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500]}
    Path(request["out"]).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
