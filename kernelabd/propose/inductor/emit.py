"""The candidate file: Inductor's kernels with explicit launchers and ``TUNABLES``, the
rewritten ``call``, and a ``ModelNew`` whose forward calls it."""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelabd.propose.inductor.parse import (
    BLOCKS,
    GRID_AXES,
    Capture,
    Kernel,
    Unsupported,
    dotted,
    parse_output_code,
)
from kernelabd.propose.inductor.rewrite import rewrite_call
from kernelabd.propose.templates import common
from kernelabd.pysource import parse

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


WARPS = [1, 2, 4, 8, 16]
STAGES = [1, 2, 3, 4, 5]


def launch_config(kernel: Kernel) -> Launch:
    """The kernel's launch defaults and the tuner's space around them. A template's are what
    Inductor's autotuning chose (block sizes stay in its body, since the wrapper's grid follows
    them; ``num_warps`` and ``num_stages`` are tunable). For other kernels, what Inductor's
    autotuning settled on when the graph ran on a GPU (``Kernel.launch``) replaces the defaults
    drawn from the size hints;
    either way the ``tune`` proposer continues from there, one edit at a time."""
    if kernel.kind == "template":
        return Launch(dict(kernel.launch), {"num_warps": sorted({2, 4, 8} | {kernel.launch["num_warps"]}),
                                            "num_stages": sorted({*STAGES, kernel.launch["num_stages"]})})
    hinted = _hinted_config(kernel)
    chosen = {k: int(v) for k, v in kernel.launch.items() if k in hinted.defaults}
    spaces = {k: sorted({*space, chosen[k]}) if k in chosen else space for k, space in hinted.spaces.items()}
    return Launch({**hinted.defaults, **chosen}, spaces)


def _hinted_config(kernel: Kernel) -> Launch:
    """Deterministic launch defaults from Inductor's size hints (what its heuristics read),
    standing in for its autotuner."""
    hx = _pow2(kernel.size_hints.get("x", 1))
    hr = _pow2(kernel.size_hints.get("r0_", 1))
    d: dict[str, int] = {}
    s: dict[str, list[int]] = {}
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
    s["num_warps"] = WARPS
    return Launch(d, s)


ACCUMULATOR = re.compile(r"tl\.(?:full|zeros)\(\[XBLOCK, R0_BLOCK\]")


def kernel_resources(kernel: Kernel, names: dict[str, str]) -> dict[str, Any] | None:
    """What one program of ``kernel`` keeps in registers, in its launch tunables' terms, for the
    tuner's pruning (``tune.fits``): a looped reduction its accumulators and the tile it loads,
    XBLOCK × R0_BLOCK elements each; a pointwise kernel its block. A persistent reduction's tile
    is bounded by its launcher, a template's blocks are in its body: nothing to declare. Without
    it the screen compiled every tile the spaces allow, and Triton took 47 s and more on one
    reduction's 16 × 4096 elements (H100, bench/port's softmax_bf16_cast_odd)."""
    if kernel.kind == "reduction":
        tile = [names[b] for b in ("XBLOCK", "R0_BLOCK") if b in names]
        tiles = [tile] * (1 + len(ACCUMULATOR.findall(kernel.text)))
    elif kernel.kind == "pointwise":
        tiles = [[names[b] for b in ("YBLOCK", "XBLOCK") if b in names]]
    else:
        return None
    return {"acc": tiles, "warps": names["num_warps"]}


def launcher_source(kernel: Kernel, names: dict[str, str]) -> str:
    """``launch_<kernel>(...)``: grid and block sizes explicit, read from module-level tunables
    (``names`` maps XBLOCK/num_warps/... to this kernel's tunable names)."""
    if kernel.kind == "template":
        params = ", ".join(kernel.launcher_params)
        return (f"def launch_{kernel.name}({params}):\n"
                f"    {kernel.name}[({', '.join(kernel.extra_args)})]({', '.join(kernel.runtime_params)}, "
                f"num_warps={names['num_warps']}, num_stages={names['num_stages']})\n")
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


RUNTIME = '''

def _empty(size, stride, dtype, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def _reinterpret(t, size, stride, offset):
    """A view of ``t``'s storage, ``offset`` elements after ``t``'s own start."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _fits(t, size, stride):
    """Whether ``t`` has this shape and these strides (a dimension of one has any stride)."""
    size, stride = tuple(size), tuple(stride)
    return tuple(t.shape) == size and all(n == 1 or a == b for n, a, b in zip(size, t.stride(), stride))


def _check_layout(t, size, stride, what="tensor"):
    """Inductor's size/stride assertion: the kernels index with the sizes and strides they were
    generated for, so anything else is an error, never a silently wrong result."""
    if not _fits(t, size, stride):
        raise ValueError(f"Inductor port: {what} has shape {tuple(t.shape)} and strides {t.stride()}, "
                         f"but its kernels were generated for shape {tuple(size)} and strides {tuple(stride)}")
'''

FALLBACK_RUNTIME = '''

def _as_generated(args, seen):
    """Whether ``call``'s arguments are those its kernels were specialised for: tensors of the
    same shapes and strides, numbers of the same values."""
    return all(_fits(a, *s) if isinstance(a, torch.Tensor) else a == s for a, s in zip(args, seen))
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
    mode: str = "default"          # the compile mode it came from (codegen.MODES)
    specialised: bool = False      # its timed kernels have the timed shape's sizes baked in
    resources: list[dict[str, Any]] = field(default_factory=list)   # RESOURCES, one a kernel that has tiles

    @property
    def source(self) -> str:
        return self.head + common.tunables(self.tunables, self.defaults, self.resources) + self.body

    @property
    def edit(self) -> str:
        names = ", ".join(self.kernels)
        how = "" if self.mode == "default" else f" {self.mode}, its choices as TUNABLES"
        shape = ", specialised to the timed shape" if self.specialised else ""
        return f"inductor: {len(self.kernels)} Triton kernel(s) from TorchInductor{how}{shape} ({names})"


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


def _call_args(capture: Capture) -> tuple[str, str]:
    """``call``'s argument list as the forward builds it, and the device expression."""
    args = [f"{a.expr}.contiguous()" if a.input_contiguous else a.expr for a in capture.args]
    tensors = [a.expr for a in capture.args if a.kind == "tensor"]
    if not tensors:
        raise Unsupported("the compiled graph takes no tensor, so there is no device to run on")
    return f"[{', '.join(args)}]", f"{tensors[0]}.device"


def _forward(reference_source: str, paths: list[tuple[Capture, str]]) -> str:
    """``forward``: the reference's signature, Inductor's graph inputs in Dynamo's order, and
    the ``call`` of the first path whose kernels serve them: a specialised capture's where the
    arguments are those it was generated for, a dynamic one's always; with none left, a clear
    error rather than kernels indexing with sizes they were not made for."""
    tree = parse(reference_source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    fwd = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if fwd is None:
        raise Unsupported("Model has no forward method")
    returns = f" -> {ast.unparse(fwd.returns)}" if fwd.returns is not None else ""
    ret = "outputs[0]" if paths[0][0].output == "tensor" else f"{paths[0][0].output}(outputs)"
    if len(paths) == 1:
        args, device = _call_args(paths[0][0])
        return f"def forward({ast.unparse(fwd.args)}){returns}:\n    outputs = call({args}, {device})\n" \
               f"    return {ret}\n"
    lines: list[str] = []
    chain: list[str] = []
    for i, (cap, suffix) in enumerate(paths):
        args, device = _call_args(cap)
        if cap.dynamic:
            chain += ["    else:", f"        outputs = call{suffix}({args}, {device})"]
            break
        if any(a.seen is None for a in cap.args):
            raise Unsupported("a specialised capture did not record what each argument was")
        seen = tuple(a.seen for a in cap.args)
        lines.append(f"    args{suffix} = {args}")
        chain += [f"    {'el' if i else ''}if _as_generated(args{suffix}, {seen!r}):",
                  f"        outputs = call{suffix}(args{suffix}, {device})"]
    else:
        chain += ["    else:", "        raise ValueError(\"Inductor port: its kernels were generated for the gate's "
                  "shapes only, and these inputs are none of them\")"]
    return f"def forward({ast.unparse(fwd.args)}){returns}:\n" + "\n".join(lines + chain) + f"\n    return {ret}\n"


HelperSources = Callable[[set[str]], list[str]]
"""The sources of the ``triton_helpers`` functions a port needs (``codegen.helper_sources``:
reading them imports ``torch._inductor``, which only the codegen subprocess does)."""


@dataclass
class _Section:
    """One capture's kernels, their launchers and its rewritten ``call``."""

    kernels: list[Kernel]
    launchers: list[str]
    call: str
    tunables: dict[str, list[int]]
    defaults: dict[str, int]
    resources: list[dict[str, Any]]


def _section(capture: Capture, suffix: str = "", tunable: bool = True) -> _Section:
    """Inductor's output code as kernels, launchers and ``call{suffix}``, every kernel renamed
    ``{name}{suffix}`` (two captures name their kernels alike). With ``tunable`` the launch
    configuration is module-level TUNABLES; without, it is written in as literals (the
    fallback's launches are never timed, so there is nothing to tune)."""
    kernels, call = parse_output_code(capture.code)
    if suffix:
        code = capture.code
        for k in kernels:
            code = re.sub(rf"\b{k.name}\b", f"{k.name}{suffix}", code)
        kernels, call = parse_output_code(code)
    for k in kernels:
        if k.kind != "template" and k.name.removesuffix(suffix) in capture.configs:
            k.launch = dict(capture.configs[k.name.removesuffix(suffix)])
    call_src = rewrite_call(call, kernels, f"call{suffix}")   # first: an extern kernel is the reason to give
    if not kernels:
        raise Unsupported("Inductor generated no Triton kernel for this graph")
    returns = [n for n in ast.walk(call) if isinstance(n, ast.Return)]
    if len(returns) != 1 or not isinstance(returns[0].value, ast.Tuple) \
            or len(returns[0].value.elts) != capture.n_outputs:
        raise Unsupported(f"Inductor's call does not return the reference's {capture.n_outputs} output(s)")
    unpack = [n for n in call.body if isinstance(n, ast.Assign) and dotted(n.value) == "args"]
    n_args = len(unpack[0].targets[0].elts) if unpack and isinstance(unpack[0].targets[0], ast.Tuple) else 1
    if n_args != len(capture.args):
        raise Unsupported(f"Inductor's call takes {n_args} arguments for {len(capture.args)} graph inputs")
    tunables: dict[str, list[int]] = {}
    defaults: dict[str, int] = {}
    resources = []
    launchers = []
    for i, k in enumerate(kernels):
        cfg = launch_config(k)
        if tunable:
            names = {key: key if len(kernels) == 1 else f"{key}_{i}" for key in cfg.defaults}
            for key, value in cfg.defaults.items():
                defaults[names[key]] = value
                tunables[names[key]] = cfg.spaces[key]
            if (held := kernel_resources(k, names)) is not None:
                resources.append(held)
        else:
            names = {key: str(value) for key, value in cfg.defaults.items()}
        launchers.append(launcher_source(k, names))
    return _Section(kernels, launchers, call_src, tunables, defaults, resources)


def port(capture: Capture, reference_source: str, interpreter: bool, helper_sources: HelperSources,
         mode: str = "default", fallbacks: list[Capture] | tuple[Capture, ...] = ()) -> Port:
    """Inductor's captured output code as a standalone candidate; raises ``Unsupported``.
    ``mode`` names the compile mode (its edit line says which). ``fallbacks``: captures of the
    same graph for the inputs ``capture``'s kernels were not generated for (the gate's other
    shapes), tried in order (``_forward``); their launches are literals, ``capture``'s tunable."""
    import torch
    import triton

    parts = common.reference_parts(reference_source)
    if parts is None:
        raise Unsupported("the reference's Model.__init__ cannot be copied (missing or decorated)")
    assert not (fallbacks and capture.dynamic), "the timed path is the specialised one; fallbacks come after it"
    paths = [(capture, ""), *((f, "_any" if f.dynamic else f"_s{i}") for i, f in enumerate(fallbacks, 1))]
    sections = [_section(cap, suffix, tunable=not suffix) for cap, suffix in paths]
    kernels = [k for sec in sections for k in sec.kernels]
    helper_names = set().union(*(k.helpers for k in kernels))
    helpers = helper_sources(helper_names)
    texts = [t for k in kernels for t in (*k.companions, k.text)] + helpers
    used = set().union(*(set(re.findall(r"\blibdevice\.(\w+)", t)) for t in texts))
    if interpreter and (missing := sorted(used - set(INTERPRETER_LIBDEVICE))):
        raise Unsupported(f"kernels use libdevice.{', libdevice.'.join(missing)}, which the Triton "
                          "interpreter cannot run")
    doc = (f"Inductor port: TorchInductor's Triton kernels for this reference, standalone.\n\n"
           f"Generated by kernelab's inductor proposer (torch {torch.__version__.split('+')[0]}, triton "
           f"{triton.__version__}) on {capture.device.split(':')[0]}: the kernels are Inductor's own with\n"
           "its autotuning decorators removed; grids and block sizes are explicit, the launch\n"
           "configuration is TUNABLES. No torch.compile or torch._inductor at run time.\n")
    if fallbacks:
        doc += ("The kernels of ``call`` are specialised to the timed shape, as torch.compile's are; the\n"
                + ("gate's other shapes run a copy with symbolic sizes.\n" if fallbacks[-1].dynamic else
                   "gate's other shapes run copies specialised to each.\n"))
    imports = ["import os", *parts[0]]
    if any("tl_math." in t for t in texts):
        imports.insert(1, "from triton.language import math as tl_math")
    head = common.header(doc, imports)
    body = ""
    for src in helpers:
        body += "\n\n" + src
    body += _interpreter_block(used, helper_names)
    for k in kernels:
        body += "".join(f"\n\n{c.rstrip()}\n" for c in k.companions)
        body += f"\n\n@triton.jit\n{k.text.rstrip()}\n"
    for src in (launcher for sec in sections for launcher in sec.launchers):
        body += "\n\n" + src
    body += RUNTIME + (FALLBACK_RUNTIME if fallbacks else "")
    for sec in sections:
        body += "\n\n" + sec.call.rstrip() + "\n"
    body += common.model_class(parts[1], _forward(reference_source, paths))
    main = sections[0]
    return Port(body=body, head=head, tunables=main.tunables, defaults=main.defaults,
                kernels=[k.name for k in main.kernels], mode=mode, specialised=not capture.dynamic,
                resources=main.resources)
