"""Pieces every template shares: the file header, the constructor copied from the reference,
elementwise expressions in Triton, and the runtime helper that lines broadcast operands up.

The constructor is copied verbatim from the reference's ``Model.__init__`` (with the
reference's own imports) so that a generated ``ModelNew`` takes the same arguments and owns
parameters and buffers of exactly the same names and shapes, for every size the gate tries:
that is what lets ``load_state_dict(strict=True)`` work without the template knowing how the
sizes follow from the arguments.
"""

from __future__ import annotations

import ast
import re
import symtable
import textwrap
from dataclasses import dataclass, field
from typing import Any

from kernelabd.pysource import parse

# Elementwise ops in fp32 Triton; ``{0}``/``{1}`` are operand expressions.
# tanh(z) = 2·sigmoid(2z) − 1 keeps to tl.exp, which every Triton backend (and the
# interpreter) provides.
UNARY: dict[str, str] = {
    "neg": "-{0}",
    "relu": "tl.maximum({0}, 0.0)",
    "sigmoid": "1.0 / (1.0 + tl.exp(-{0}))",
    "silu": "{0} / (1.0 + tl.exp(-{0}))",
    "tanh": "2.0 / (1.0 + tl.exp(-2.0 * {0})) - 1.0",
    "exp": "tl.exp({0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "1.0 / tl.sqrt({0})",
    "square": "{0} * {0}",
    "gelu": "0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476))",
    "gelu_tanh": ("0.5 * {0} * (1.0 + (2.0 / (1.0 + tl.exp(-1.5957691216057308 * ({0} + 0.044715"
                  " * {0} * {0} * {0}))) - 1.0))"),
}
BINARY: dict[str, str] = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
                          "div": "{0} / {1}"}

IDLE_SHARE = 0.25
"""How many idle lanes or rows, as a share of the useful ones, a layout may add to give the
compiler a cheaper address (a conv program one image's pixels, a GroupNorm step one channel's):
masked lanes cost issue slots, not memory traffic, and what they buy is per-element integer
divisions and gathers gone."""

# Lines the generated forward uses to line operands up with the output (see ``suffix_operand``).
OPERAND_HELPER = '''

def _operand(t: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, int, int]:
    """``t`` laid out so that output flat index ``k`` reads its element ``k // d % n``, with
    ``n`` and ``d``: itself when its dims past leading and trailing ones are a contiguous block
    of ``shape`` (a bias, a per-channel ``(C, 1, 1)`` scale; ``d`` the size of the dims after the
    block), else a copy expanded to ``shape``, whose every element is read once. ``n`` is 0 where
    ``k`` itself is the element (a full-size operand, or the copy): the kernel then reads at
    ``k``, contiguous like the output, where ``% n`` would hide that from the compiler."""
    dims = list(t.shape)
    lead = len(shape) - len(dims)
    while dims and dims[0] == 1:
        dims.pop(0)
        lead += 1
    trail = 0
    while dims and dims[-1] == 1:
        dims.pop()
        trail += 1
    if t.is_contiguous() and list(shape)[lead:len(shape) - trail] == dims:
        d = math.prod(shape[len(shape) - trail:])
        return t, 0 if d == 1 and t.numel() == math.prod(shape) else max(1, t.numel()), d
    return t.expand(shape).contiguous(), 0, 1
'''

SMS_HELPER = '''

def _sms(x: torch.Tensor) -> int:
    """SMs of the GPU (persistent launches run a few programs an SM); on a CPU (the
    interpreter) a few programs, so that their loops run more than once there too."""
    return torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 3
'''

SCRATCH_HELPER = '''

def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory for descriptors built on the device (``tl.make_tensor_descriptor``),
    which Triton asks of the allocator it was given (``triton.set_allocator``)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)
'''


def operand_index(i: int, index: str) -> str:
    """Where operand ``i`` (laid out by ``_operand``) is read for output flat index ``index``:
    ``index`` itself for a full-size operand (``n`` 0, a compile-time branch). A residual read
    through ``% n`` loaded one float at a time (KernelBench L2 #92's logsumexp stage on an H100:
    32 LDG.32 a thread a step, 2628 µs where torch.compile's kernel took 413)."""
    return f"(({index}) if t{i}_n == 0 else ({index}) // t{i}_d % t{i}_n)"


def operand_params(i: int) -> str:
    """Operand ``i``'s kernel parameters for ``_operand``'s three values. ``n`` and ``d`` are
    compile-time constants, so that ``k // d % n`` compiles to multiplies and shifts rather than
    two integer divisions an element (KernelBench L1 #33's BatchNorm reads four per-channel
    vectors: eight divisions an element made a copy-rate kernel compute-bound)."""
    return f"t{i}_ptr, t{i}_n: tl.constexpr, t{i}_d: tl.constexpr"


@dataclass
class Chain:
    """An elementwise expression over loaded operands, as Triton statements.

    ``tensors`` are the forward-side expressions of tensor operands (``x``, ``self.bias``),
    ``scalars`` those of scalar operands (``self.scale``, ``0.5``); the kernel sees them as
    ``t0_ptr``/``t0_n``/``t0_d`` (``_operand``'s layout) and ``s0``.
    """

    tensors: list[str] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    result: str = ""
    positional: bool = False    # the lines read ``_row`` and ``_col``, which the kernel defines
    zeroed_tile: str | None = None  # where the result is zero whatever the product (a matmul tile's)

    def kernel_args(self) -> str:
        args = [operand_params(i) for i in range(len(self.tensors))]
        args += [f"s{i}" for i in range(len(self.scalars))]
        return "".join(f", {a}" for a in args)

    def loads(self, index: str, mask: str) -> list[str]:
        """Statements loading every tensor operand at output flat index ``index``."""
        return [f"t{i} = tl.load(t{i}_ptr + {operand_index(i, index)}, mask={mask}, other=0.0)"
                f".to(tl.float32)" for i in range(len(self.tensors))]

    def call_args(self, shape: str) -> str:
        """Arguments the forward passes for the operands, given the output's shape expression."""
        args = []
        for t in self.tensors:
            args.append(f"*_operand({t}, {shape})")
        args += [f"float({s})" for s in self.scalars]
        return "".join(f", {a}" for a in args)


def header(doc: str, imports: list[str]) -> str:
    """Module docstring and imports: torch/triton plus the reference's own imports."""
    base = ["import math", "import os", "import torch", "import torch.nn as nn",
            "import torch.nn.functional as F", "import triton", "import triton.language as tl"]
    extra = [i for i in imports if i not in base]
    return f'"""{doc}"""\n\n' + "\n".join(base + extra) + "\n"


TILE_HELPER = '''

def _tile(limit: int, extent: int) -> int:
    """A tile side no larger than needed: ``limit`` cut to ``extent`` rounded up to a power of
    two, at least 16 (the least a dot takes). A 1-column product does not run 256-wide tiles,
    nor 24 output channels 64-wide ones, nor a K of 32 (or a 1×1 convolution of 16 channels)
    64-deep steps: the rest would be loaded and multiplied only to be masked off."""
    return min(limit, max(16, triton.next_power_of_2(extent)))
'''


DOT_HELPER = '''

# Triton's interpreter (CPU runs) multiplies bfloat16 dot operands as raw bit patterns
# (triton-lang/triton#11584); there, and only there, operands are widened to fp32 first. On a
# GPU the branch is resolved at compile time and the dot stays on the tensor cores.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _dot(a, b, precision: tl.constexpr):
    if INTERPRETED:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=precision)


@triton.jit
def _dot_acc(a, b, acc, precision: tl.constexpr):
    if INTERPRETED:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=precision)
'''
"""Every template's matrix products go through ``_dot``, or ``_dot_acc`` where the product
accumulates into ``acc`` in place (a ``wgmma`` with its accumulator in registers)."""


def resources(tiles: dict[str, list[list[str]]], precision: str) -> dict[str, Any]:
    """A template's ``RESOURCES`` with its dots' input precision: fp32 ``ieee`` dots run on the
    FMA units and ``tf32x3`` ones split each operand in two, so both need more registers than
    plain tensor-core dots (``tune.fits``)."""
    return {**tiles, "dots": precision}


def tunables(values: dict[str, list[int]], current: dict[str, int],
             resources: dict[str, Any] | list[dict[str, Any]] | None = None) -> str:
    """``TUNABLES`` and one module-level assignment per tunable, as the tune proposer reads;
    ``RESOURCES`` names the tiles a program keeps in shared memory (per pipeline stage) and in
    fp32 accumulators, so the tuner can prune what cannot fit before running it."""
    lines = [f"TUNABLES = {values!r}"]
    if resources:
        lines.append(f"RESOURCES = {resources!r}")
    lines += [f"{k} = {current[k]!r}" for k in values]
    return "\n\n" + "\n".join(lines) + "\n"


def model_class(init_source: str, forward: str) -> str:
    """``class ModelNew`` with the reference's constructor and a generated forward."""
    init = textwrap.indent(textwrap.dedent(init_source), "    ")
    init = re.sub(r"super\(\s*Model\s*,\s*self\s*\)", "super()", init)
    body = textwrap.indent(textwrap.dedent(forward).strip("\n"), "    ")
    return f"\n\nclass ModelNew(nn.Module):\n{init.rstrip()}\n\n{body}\n"


REFERENCE_ONLY = ("Model", "get_inputs", "get_init_inputs")
"""The reference's module-level names a candidate does not copy: its own class is ``ModelNew``."""


def _lines(source: str, node: ast.stmt) -> str:
    """``node``'s source lines, decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(source.splitlines()[first - 1:node.end_lineno])


def _globals_read(table: symtable.SymbolTable) -> set[str]:
    """The module-level names the code under ``table`` reads, nested scopes included."""
    names = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    for child in table.get_children():
        names |= _globals_read(child)
    return names


def _assigned(node: ast.stmt) -> set[str]:
    """The names a module-level assignment binds."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _constants_read(source: str, tree: ast.Module) -> list[ast.stmt]:
    """The module-level assignments the copied classes and functions read (a ``batch_size``
    the constructor sizes a buffer with, a ``to_2tuple = _ntuple(2)`` helper), and those their
    values read in turn: without them the candidate's constructor raises NameError."""
    tables = {t.get_name(): t for t in symtable.symtable(source, "<reference>", "exec").get_children()}
    wanted = set().union(*(_globals_read(t) for name, t in tables.items()
                           if name not in REFERENCE_ONLY or name == "Model"))
    assignments = [n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None]
    kept: list[ast.stmt] = []
    while True:
        more = [n for n in assignments if n not in kept and _assigned(n) & wanted]
        if not more:
            return sorted(kept, key=lambda n: n.lineno)
        kept += more
        wanted |= {x.id for n in more for x in ast.walk(n.value) if isinstance(x, ast.Name)}


def reference_parts(source: str) -> tuple[list[str], str] | None:
    """The reference's import lines and module-level classes and functions (a ``BasicBlock``
    its constructor builds) with the module-level constants they read, and the source of
    ``Model.__init__`` with ``Model``'s class attributes (a ResNet block's ``expansion``) and
    other methods but ``forward`` (a ``_make_stage`` it calls): the candidate's constructor must
    build the same modules, parameters and all. None without an undecorated ``__init__``."""
    tree = parse(source)
    imports = [ast.get_source_segment(source, n) or "" for n in tree.body
               if isinstance(n, ast.Import | ast.ImportFrom)]
    copied = [n for n in tree.body
              if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name not in REFERENCE_ONLY]
    helpers = [_lines(source, n) for n in sorted([*copied, *_constants_read(source, tree)], key=lambda n: n.lineno)]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            init = next((item for item in node.body if isinstance(item, ast.FunctionDef)
                         and item.name == "__init__"), None)
            if init is None or init.decorator_list:
                return None
            attributes = [item for item in node.body if isinstance(item, ast.Assign | ast.AnnAssign)]
            methods = [item for item in node.body if isinstance(item, ast.FunctionDef)
                       and item.name not in ("__init__", "forward")]
            text = "\n\n".join(_lines(source, item) for item in [*attributes, init, *methods])
            return [i for i in imports if i] + helpers, text + "\n"
    return None
