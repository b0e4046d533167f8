"""Parsing Inductor's output code: the kernels handed to ``async_compile.triton`` and the
``call`` wrapper, and the capture the codegen subprocess sends back."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from kernelabd.pysource import parse

KERNEL_KINDS = ("pointwise", "reduction", "persistent_reduction", "template")
GRID_AXES = {"Grid1D": ("x",), "Grid2D": ("x", "y")}
FIXED_GRID = "FixedGrid"
"""Inductor's Triton templates (max-autotune's matmuls and convolutions) are launched on a
grid the wrapper computes for the block sizes autotuning chose, passed as three extra launcher
arguments after the kernel's own."""
COMPANION_PREFIX = "_triton_helper_fn"
"""What Inductor names the ``@triton.jit`` functions it writes beside a kernel (a scan's combine)."""
BLOCKS = {"x": "XBLOCK", "y": "YBLOCK", "r": "R0_BLOCK"}


class Unsupported(Exception):
    """Inductor's output cannot be rewritten into a valid candidate; the message says why."""


@dataclass(frozen=True)
class Arg:
    """One argument of Inductor's ``call``: the forward's expression for it (``x``,
    ``self.ln.weight``, ``x.size()[0]``), its kind, for a forward input whether it was
    contiguous (then the candidate passes ``.contiguous()``, as the kernels assume), and what
    the capture saw: a tensor's ``(shape, strides)`` as ``call`` gets it, a number's value."""

    expr: str
    kind: str                    # tensor | int
    input_contiguous: bool = False
    seen: Any = None


@dataclass(frozen=True)
class Capture:
    """Inductor's output code for one reference at one shape, and how to call it."""

    code: str
    args: tuple[Arg, ...]
    output: str                  # tensor | tuple | list: what the reference's forward returns
    n_outputs: int
    device: str
    # max-autotune's launch choices by kernel name (``codegen.chosen_configs``); {} otherwise
    configs: dict[str, dict[str, int]] = field(default_factory=dict)
    dynamic: bool = False        # compiled with symbolic sizes: serves shapes it was not captured at


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
    companions: list[str] = field(default_factory=list)   # ``_companions``, decorated, renamed
    # the launch configuration Inductor chose: a template's ``num_warps``/``num_stages`` from its
    # decorator; for other kernels what max-autotune's run settled on (``codegen.chosen_configs``)
    launch: dict[str, int] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)   # a template's grid, ``_grid_0``…

    @property
    def runtime_params(self) -> list[str]:
        return [p for p in self.params if p not in self.constexprs]

    @property
    def launcher_params(self) -> list[str]:
        """What the wrapper's ``kernel.run(...)`` passes: the runtime parameters, then a
        template's grid."""
        return [*self.runtime_params, *self.extra_args]


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
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
    kernel = [n for n in fns if n.name == name]
    if len(kernel) != 1:
        raise Unsupported(f"kernel {name}: expected one function of that name in its source")
    fn = kernel[0]
    companions = _companions(name, [n for n in fns if n is not fn], source)
    heuristic = None
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and dotted(dec.func).startswith("triton_heuristics."):
            heuristic = dec
    if heuristic is None:
        raise Unsupported(f"kernel {name} has no triton_heuristics decorator")
    kind = dotted(heuristic.func).split(".", 1)[1]
    if kind not in KERNEL_KINDS:
        raise Unsupported(f"kernel {name} is an Inductor {kind} kernel; only pointwise and "
                          "reduction kernels are ported")
    kwargs = {k.arg: k.value for k in heuristic.keywords if k.arg}
    if kind == "template":
        if companions:
            raise Unsupported(f"template kernel {name} has helper functions beside it")
        return _template_kernel(name, fn, kwargs, source)
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
    text, helpers = _body(name, fn, source)
    return Kernel(name=name, kind=kind, params=params, constexprs=constexprs,
                  size_hints={k: int(v) for k, v in size_hints.items()},
                  reduction_hint=ast.unparse(hint).rsplit(".", 1)[-1] if hint is not None else None,
                  grid_type=grid_type, text=_renamed(text, name, companions), helpers=helpers,
                  companions=[f"@triton.jit\n{src}" for src in companions.values()])


def _companions(name: str, others: list[ast.FunctionDef], source: str) -> dict[str, str]:
    """The ``@triton.jit`` functions Inductor writes beside a kernel that uses them (a scan's
    combine function, ``_triton_helper_fn_add0``), each renamed ``{name}{helper}``: kernels
    of one output name theirs alike, so a candidate that holds several keeps each kernel's own.
    Any other function beside the kernel is code this port does not know."""
    found: dict[str, str] = {}
    for fn in others:
        jit = [d for d in fn.decorator_list if dotted(d) == "triton.jit"]
        if not fn.name.startswith(COMPANION_PREFIX) or len(fn.decorator_list) != 1 or not jit:
            raise Unsupported(f"kernel {name}: its source defines {fn.name}, which is not a "
                              f"@triton.jit {COMPANION_PREFIX}* helper")
        text, helpers = _body(name, fn, source)
        if helpers:
            raise Unsupported(f"kernel {name}: its helper {fn.name} uses triton_helpers")
        found[fn.name] = text
    return {helper: _renamed(text, name, found) for helper, text in found.items()}


def _renamed(text: str, name: str, helpers: dict[str, str]) -> str:
    """``text`` with each of ``helpers`` called by its per-kernel name, ``{name}{helper}``."""
    for helper in helpers:
        text = re.sub(rf"\b{helper}\b", f"{name}{helper}", text)
    return text


def _body(name: str, fn: ast.FunctionDef, source: str) -> tuple[str, set[str]]:
    """The kernel's ``def`` through its end with ``triton_helpers.f`` renamed ``th_f``, and
    the helpers it uses; anything else of Inductor's runtime in it is refused."""
    lines = source.splitlines()
    text = "\n".join(lines[fn.lineno - 1:fn.end_lineno])
    helpers = set(re.findall(r"\btriton_helpers\.(\w+)", text))
    text = re.sub(r"\btriton_helpers\.(\w+)", r"th_\1", text)
    for forbidden in ("triton_heuristics", "triton_helpers", "torch."):
        if forbidden in text:
            raise Unsupported(f"kernel {name} refers to {forbidden.rstrip('.')} in its body")
    return text, helpers


def _template_kernel(name: str, fn: ast.FunctionDef, kwargs: dict[str, ast.AST], source: str) -> Kernel:
    """A Triton template kernel (``@triton_heuristics.template``): its block sizes are
    constexpr definitions in its body, fixed by autotuning, and its grid comes from the wrapper
    (``FIXED_GRID``); ``num_warps`` and ``num_stages`` are the launch's, and tunable."""
    meta = kwargs.get("inductor_meta")
    grid_type = _dict_value(meta, "grid_type")
    extra = _dict_value(meta, "extra_launcher_args") or []
    if grid_type != FIXED_GRID or len(extra) != 3:
        raise Unsupported(f"template kernel {name} is launched on Inductor's {grid_type or 'grid function'}, "
                          "not on a grid its wrapper computes")
    if any(a.annotation is not None for a in fn.args.args):
        raise Unsupported(f"template kernel {name} takes constexpr parameters")
    try:
        launch = {k: int(ast.literal_eval(kwargs[k])) for k in ("num_warps", "num_stages")}
    except (KeyError, ValueError) as exc:
        raise Unsupported(f"template kernel {name} has no literal num_warps/num_stages") from exc
    text, helpers = _body(name, fn, source)
    return Kernel(name=name, kind="template", params=[a.arg for a in fn.args.args], constexprs=[],
                  size_hints={}, reduction_hint=None, grid_type=FIXED_GRID, text=text, helpers=helpers,
                  launch=launch, extra_args=[str(a) for a in extra])


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
        func = dotted(node.value.func)
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
