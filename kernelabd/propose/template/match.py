"""The ``template`` proposer's matchers: each asks whether the whole traced graph is one of
its shapes and, if so, instantiates its Triton template (``kernelabd.propose.templates``).

A graph with any op a matcher does not account for matches nothing. The gate checks the result
anyway: a wrong match costs one rejected candidate, never a wrong answer.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from kernelabd.propose.template.canon import CONCATS, CONVS, REDUCTIONS, Op, arg_of, as_dim, dtype_of, is_number
from kernelabd.propose.template.graph import Graph
from kernelabd.propose.templates import (
    attention,
    common,
    concat,
    conv,
    depthwise,
    elementwise,
    groupnorm,
    matmul,
    pool,
    reduce,
    rowwise,
)

SELF_PATH = re.compile(r"\bself((?:\.[A-Za-z_]\w*|\.\d+)+)")
"""A ``self.`` attribute path as the graph names it: an fx target, whose parts may be the
numbers ``nn.Sequential`` and ``nn.ModuleList`` name their children by (``network.0.weight``)."""


def python_paths(source: str) -> str:
    """``source`` with every numbered attribute path made Python (``self.network.0.weight`` →
    ``getattr(self.network, '0').weight``): getattr reads any child by the name fx gives it,
    where indexing would not (a ``ModuleDict``'s keys are strings). A path without a number,
    the usual case, is left as written."""
    def python(m: re.Match[str]) -> str:
        parts = m.group(1).split(".")[1:]
        if not any(part.isdigit() for part in parts):
            return m.group(0)
        expr = "self"
        for part in parts:
            expr = f"getattr({expr}, {part!r})" if part.isdigit() else f"{expr}.{part}"
        return expr
    return SELF_PATH.sub(python, source)


@dataclass(frozen=True)
class Match:
    """A template instantiated for the reference: the candidate's source, its edit line, and
    the input precision its dots were given (``None`` for a template without dots). The graph
    names parameters by their fx paths; the source holds them as Python. ``plan``: a pipeline's
    stage graphs, which another precision's match takes rather than searching again."""

    source: str
    edit: str
    dots: str | None = None
    plan: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", python_paths(self.source))


def _inner_of(shape: tuple[int, ...] | None, end: int) -> bool:
    return bool(shape) and torch.Size(shape[end:]).numel() > 1


def _prologue(g: Graph, row: Op) -> tuple[str, common.Chain | None] | None:
    """The row op's operand: an input or parameter (no prologue), or the elementwise chain of
    every op before it (``x + residual``), with the tensor whose device and dtype the result
    takes; None when the ops before it are not that."""
    if len(g.ops) == 1:
        arg = g.loaded(row.args[0])
        return (arg, None) if arg is not None else None
    feeds = g.resolve(g.strip(row.args[0]))
    if feeds is not g.ops[-2].node:
        return None
    chain = g.chain(g.ops[:-1], common.Chain(), {})
    if chain is None or not chain.tensors:
        return None
    return next((t for t in chain.tensors if not t.startswith("self.")), chain.tensors[0]), chain


def match_rowwise(g: Graph, init: list[Any]) -> Match | None:
    """softmax, log-softmax, LayerNorm or RMSNorm as one op, of an input or of an elementwise
    chain before it (the chain computed as the slices are loaded)."""
    if not g.ops or g.out is not g.ops[-1].node:
        return None
    op = g.ops[-1]
    found = _prologue(g, op)
    shape = g.shape(op.args[0])
    if found is None or shape is None:
        return None
    arg, prologue = found
    if op.kind in ("softmax", "log_softmax") and op.attrs["dim"] is not None:
        dim = op.attrs["dim"] % len(shape)
        spec = rowwise.Rowwise(op.kind, arg, f"{op.attrs['dim']} % x.dim()",
                               f"{op.attrs['dim']} % x.dim() + 1", inner=_inner_of(shape, dim + 1))
    elif op.kind in ("layer_norm", "rms_norm"):
        weight, bias = op.attrs.get("weight"), op.attrs.get("bias")
        eps = op.attrs["eps"]
        eps_expr = eps if isinstance(eps, str) else g.scalar(eps)
        spec = rowwise.Rowwise(op.kind, arg, f"x.dim() - {op.attrs['ndim']}", "x.dim()",
                               eps=eps_expr, weight=g.loaded(weight) if weight is not None else None,
                               bias=g.loaded(bias) if bias is not None else None)
        if (weight is not None and spec.weight is None) or (bias is not None and spec.bias is None):
            return None
    else:
        return None
    spec = replace(spec, prologue=prologue)
    return Match(*rowwise.render(spec, g.signature, *init, tuple(o.kind for o in g.ops[:-1])))


RMS_KINDS = {"square", "mul", "mean", "sum", "add", "clamp_min", "rsqrt", "sqrt", "div", "round_bf16", "round_fp16"}
"""What written RMSNorm is made of after its input (and its prologue): the statistics, the
scaling, and the casts back to the input's dtype that Llama's code writes (``.to(input_dtype)``)."""


ROW_NORMS: dict[tuple[str, str], str | None] = {
    ("mean", "add"): "rms_norm", ("sum", "add"): "l2_norm", ("sum", "clamp_min"): "normalize",
    ("mean", "clamp_min"): None}
"""The row kernel of a statistic (the mean or the sum of squares) and how eps keeps it from
zero (added under the root, or a floor under the norm, as ``F.normalize`` has it)."""
NORM_FORMULAS: dict[str, Callable[[torch.Tensor, int, float], torch.Tensor]] = {
    "rms_norm": lambda h, dim, eps: h * torch.rsqrt(h.pow(2).mean(dim, keepdim=True) + eps),
    "l2_norm": lambda h, dim, eps: h * torch.rsqrt(h.pow(2).sum(dim, keepdim=True) + eps),
    "normalize": lambda h, dim, eps: h / h.pow(2).sum(dim, keepdim=True).sqrt().clamp_min(eps)}
"""What each of them computes, in float64, to confirm a graph against."""


def match_rms_written(g: Graph, init: list[Any]) -> Match | None:
    """RMSNorm as common code writes it (``x * rsqrt(mean(x², d, keepdim) + eps) * w`` and its
    variants, with or without fp32 casts and the cast back, Hugging Face's ``LlamaRMSNorm``),
    and with a sum for the mean an L2 normalisation (``x / torch.norm(x, dim=1, keepdim=True)``
    once vector norms are decomposed; ``F.normalize``, whose eps is a floor), of an input or of an elementwise prologue
    (``x + residual``), recognised by its parts and confirmed by evaluating the graph against
    the formula on random inputs. A row kernel reads a slice once from memory (a wide one a
    second time from L2), where a reduction and then an elementwise stage read it twice."""
    squares = [op for op in g.ops if op.kind == "square"]
    if len(squares) == 1:
        start, x = _rms_input(g, squares[0]), g.resolve(g.strip(squares[0].args[0]))
    elif len(g.inputs) == 1:        # squared as a product (``x * x``): of the input itself
        start, x = 0, g.inputs[0]
    else:
        return None
    if start is None:
        return None
    head, body = g.ops[:start], g.ops[start:]
    stats = [op for op in body if op.kind in ("mean", "sum")]
    if len(stats) != 1 or not stats[0].attrs["keepdim"] or not {op.kind for op in body} <= RMS_KINDS:
        return None
    floors = [op for op in body if op.kind in ("add", "clamp_min") and any(g.scalar(a) for a in op.args)]
    weights = {g.strip(a) for op in body for a in op.args
               if isinstance(g.strip(a), fx.Node) and g.strip(a).op == "get_attr"}
    shape, dim = g.shape(x), stats[0].attrs["dim"]
    if shape is None or not isinstance(dim, int) or len(floors) > 1 or len(weights) > 1:
        return None
    kind = ROW_NORMS[(stats[0].kind, floors[0].kind if floors else "add")]
    prologue = g.chain(head, common.Chain(), {}) if head else None
    arg = g.leaf(x) if not head else _prologue_arg(prologue)
    eps = next(a for a in floors[0].args if g.scalar(a)) if floors else 0.0
    weight = g.leaf(next(iter(weights))) if weights else None
    dim %= len(shape)
    if kind is None or arg is None or not is_number(eps) or not _confirm_rms(g, x, dim, float(eps), weight, kind):
        return None
    spec = rowwise.Rowwise(kind, arg, f"{dim} % x.dim()", f"{dim} % x.dim() + 1",
                           eps=g.scalar(eps) if floors else "0.0", weight=weight, inner=_inner_of(shape, dim + 1),
                           prologue=prologue)
    return Match(*rowwise.render(spec, g.signature, *init, tuple(o.kind for o in head)))


def _rms_input(g: Graph, square: Op) -> int | None:
    """Where RMSNorm's ops begin: 0 when the squared value is an input, else just after the op
    that computes it, every op before it being its elementwise prologue; None otherwise."""
    x = g.resolve(g.strip(square.args[0]))
    if g.leaf(x) is not None:
        return 0
    producers = [i for i, op in enumerate(g.ops) if op.node is x]
    return producers[0] + 1 if producers else None


def _prologue_arg(prologue: common.Chain | None) -> str | None:
    """The tensor whose device and dtype a prologue's result takes (an input before a weight)."""
    if prologue is None or not prologue.tensors:
        return None
    return next((t for t in prologue.tensors if not t.startswith("self.")), prologue.tensors[0])


CONFIRM_EXTENT = 4
"""The rms check's inputs keep the normalised dim and at most this many of every other: it
asks what the graph computes, not at what size."""
CONFIRM_ROUNDED_RTOL = 1e-2
"""Agreement asked of a graph that rounds to bf16 or fp16 on the way (a literal ``.to(torch.
bfloat16)``, which float64 evaluation keeps): a few of bf16's ulps, still far from any other
formula's distance."""


class _Capture(fx.Interpreter):
    """Runs a graph and keeps the value one node computed (RMSNorm's input, after a prologue)."""

    def __init__(self, gm: fx.GraphModule, name: str) -> None:
        super().__init__(gm)
        self.name, self.value = name, None

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name == self.name:
            self.value = out
        return out


def _confirm_rms(g: Graph, x: fx.Node, dim: int, eps: float, weight: str | None, kind: str) -> bool:
    """Whether the graph is RMSNorm (or another of ``NORM_FORMULAS``, ``kind``) of the value
    ``x`` (an input, or what a prologue computes):
    evaluated (a copy, on the CPU in float64, on random inputs) against the formula applied to
    that value. Casts in the graph keep fp32 rounding, so agreement is asked to fp32 precision,
    far tighter than any other formula would come, unless the graph rounds to a half type."""
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for node in g.inputs:
        full = g.shape(node)
        if full is None:
            return False
        small = tuple(n if i == len(full) - len(g.shape(x) or ()) + dim else min(n, CONFIRM_EXTENT)
                      for i, n in enumerate(full))
        inputs.append(torch.randn(small, generator=gen, dtype=torch.float64))
    gm = copy.deepcopy(g.gm).to_empty(device="cpu").double()
    with torch.no_grad():
        for t in [*gm.parameters(), *gm.buffers()]:
            t.copy_(torch.rand(t.shape, generator=gen, dtype=torch.float64) + 0.5)
        w = gm.get_parameter(weight.removeprefix("self.")) if weight is not None else None
        run = _Capture(gm, x.name)
        try:
            got = run.run(*inputs)
        except Exception:          # a graph that only runs at its own sizes is not this formula
            return False
        h = run.value
        if not isinstance(got, torch.Tensor) or not isinstance(h, torch.Tensor):
            return False
        want = NORM_FORMULAS[kind](h.double(), dim, eps)
        if w is not None:
            want = want * w.reshape([h.shape[dim] if i == dim else 1 for i in range(h.dim())])
    rounded = any(op.kind in ("round_bf16", "round_fp16") for op in g.ops)
    rtol, atol = (CONFIRM_ROUNDED_RTOL, 1e-3) if rounded else (1e-5, 1e-6)
    return got.shape == want.shape and bool(torch.allclose(got.double(), want, rtol=rtol, atol=atol))


VALUES_AND_INDICES = (torch.max, "max", torch.min, "min")
"""Reductions that return (values, indices) when given a dim."""


def match_reduction(g: Graph, init: list[Any]) -> Match | None:
    """sum/mean/amax/amin over one dim, neighbouring dims or all of them, or ``torch.max(x,
    dim)[0]`` (values only), of an input or of an elementwise chain before it (``mean((a - b)
    ** 2)``, a loss)."""
    found = _reduction_op(g)
    if found is None:
        return None
    k, op = found
    dims, shape = op.attrs.get("dims"), g.shape(op.args[0])
    every = dims is None
    span = None if every or shape is None else _span(dims, len(shape))
    if not every and span is None:
        return None                  # dims apart (a tuple with a gap): not one slice per output
    head = g.ops[:k]
    if head:
        if g.resolve(g.strip(op.args[0])) is not head[-1].node:
            return None
        prologue = g.chain(head, common.Chain(), {})
        arg = _prologue_arg(prologue)
    else:
        prologue, arg = None, g.loaded(op.args[0])
    if arg is None or shape is None:
        return None
    first, count = span or (None, 1)
    inner = False if first is None else _inner_of(shape, first + count)
    dim = op.attrs["dim"] if count == 1 and op.attrs["dim"] is not None else first   # as written: -1 follows the rank
    spec = reduce.Reduction(op.kind, arg, dim, op.attrs["keepdim"], inner, prologue, count)
    return Match(*reduce.render(spec, g.signature, *init, tuple(o.kind for o in head)))


def _span(dims: Any, rank: int) -> tuple[int, int] | None:
    """(first dim, how many) of a reduction over one dim or neighbouring ones, None otherwise."""
    listed = dims if isinstance(dims, list | tuple) else [dims]
    if not listed or not all(isinstance(d, int) and not isinstance(d, bool) and -rank <= d < rank for d in listed):
        return None
    found = sorted({d % rank for d in listed})
    return (found[0], len(found)) if found == list(range(found[0], found[0] + len(found))) else None


def _reduction_op(g: Graph) -> tuple[int, Op] | None:
    """The graph's reduction, last (or before the ``[0]`` of ``torch.max(x, dim)``), and its index."""
    if not g.ops:
        return None
    last = g.ops[-1]
    if last.kind in REDUCTIONS and g.out is last.node:
        if last.node.target in VALUES_AND_INDICES and arg_of(last.node, 1, "dim") is not None:
            return None              # (values, indices) returned whole
        return len(g.ops) - 1, last
    if len(g.ops) < 2 or last.kind != "getitem" or g.out is not last.node:
        return None
    op = g.ops[-2]
    values = op.kind in REDUCTIONS and op.node.target in VALUES_AND_INDICES and last.args == (op.node, 0)
    return (len(g.ops) - 2, op) if values and op.attrs["dim"] is not None else None


def match_group_norm(g: Graph, init: list[Any]) -> Match | None:
    """GroupNorm of an input (in a pipeline, of the stage before's result), module or ``F.`` form."""
    if len(g.ops) != 1 or g.ops[0].kind != "group_norm" or g.out is not g.ops[0].node:
        return None
    op = g.ops[0]
    x, shape = g.loaded(op.args[0]), g.shape(op.args[0])
    values = [op.attrs[k] for k in ("groups", "eps")]
    groups, eps = (v if isinstance(v, str) else g.scalar(v) for v in values)
    weight, bias = (g.loaded(op.attrs[k]) if op.attrs[k] is not None else None for k in ("weight", "bias"))
    if x is None or not shape or len(shape) < 2 or groups is None or eps is None \
            or (op.attrs["weight"] is not None and weight is None) or (op.attrs["bias"] is not None and bias is None):
        return None
    return Match(*groupnorm.render(groupnorm.GroupNorm(x, groups, eps, weight, bias), g.signature, *init))


def match_pool(g: Graph, init: list[Any]) -> Match | None:
    """Max or average pooling of an input (in a pipeline, of the stage before's result)."""
    if len(g.ops) != 1 or g.ops[0].kind not in ("max_pool", "avg_pool") or g.out is not g.ops[0].node:
        return None
    op = g.ops[0]
    x, shape = g.loaded(op.args[0]), g.shape(op.args[0])
    if x is None or not shape or len(shape) < op.attrs["dims"] + 1:
        return None
    spec = pool.Pool(op.kind.removesuffix("_pool"), x, op.attrs["kernel"], op.attrs["stride"], op.attrs["padding"],
                     op.attrs["dilation"], op.attrs["count_include_pad"], op.attrs["ceil_mode"])
    return Match(*pool.render(spec, g.signature, *init))


def match_concat(g: Graph, init: list[Any]) -> Match | None:
    """A concatenation or stack of inputs (in a pipeline, of earlier stages' results), all of
    one rank and dtype: read as they are stored where all widen the same dtype (the result is
    cast as the reference returns it), else as the reference casts them."""
    if len(g.ops) != 1 or g.ops[0].kind not in CONCATS or g.out is not g.ops[0].node:
        return None
    op = g.ops[0]
    read = g.loaded if len({g.value_dtype(g.strip(a)) for a in op.args}) == 1 else g.leaf
    parts, shapes = [read(a) for a in op.args], [g.shape(a) for a in op.args]
    if any(p is None for p in parts) or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1 \
            or len({g.value_dtype(a) for a in op.args}) != 1:
        return None
    rank = len(shapes[0]) + (op.kind == "stack")
    if not -rank <= op.attrs["dim"] < rank:
        return None
    spec = concat.Concat(tuple(parts), op.attrs["dim"] % rank, op.kind == "stack")
    return Match(*concat.render(spec, g.signature, *init))


def match_elementwise(g: Graph, init: list[Any]) -> Match | None:
    if not g.ops or g.out is not g.ops[-1].node:
        return None
    chain = g.chain(g.ops, common.Chain(), {})
    if chain is None or not chain.tensors:
        return None
    first = next((t for t in chain.tensors if not t.startswith("self.")), chain.tensors[0])
    return Match(*elementwise.render(chain, [op.kind for op in g.ops], g.signature, first, *init))


def operand_pair(g: Graph, a: Any, b: Any) -> tuple[str | None, str | None]:
    """The two operands of a product as the forward passes them: read as they are stored when
    both widen the same dtype (``x.float() @ w.float()`` of bf16 tensors: bf16 products are
    exact in the fp32 accumulator, so this is the fp32 product the reference computes), else
    with their casts, since a dot takes operands of one dtype."""
    if g.value_dtype(g.strip(a)) == g.value_dtype(g.strip(b)):
        return g.loaded(a), g.loaded(b)
    return g.leaf(a), g.leaf(b)


def _matmul_spec(g: Graph, ops: list[Op], out: Any, precision: str) -> tuple[matmul.Matmul, str] | None:
    """``ops`` as a matmul followed by an elementwise epilogue whose result is ``out``."""
    if not ops or ops[0].kind not in ("matmul", "linear"):
        return None
    op, rest = ops[0], ops[1:]
    if out is not (rest[-1].node if rest else op.node) or g.shape(out) != g.shape(op.node):
        return None
    a_shape = g.shape(op.args[0])
    chain = common.Chain(result="acc")
    if op.kind == "linear":
        (a, b), transposed = operand_pair(g, op.args[0], op.attrs["weight"]), True
        if op.attrs["bias"] is not None:
            bias = g.loaded(op.attrs["bias"])
            if bias is None:
                return None
            chain.tensors.append(bias)
            chain.lines.append("acc = acc + t0")
    else:
        (a, b), transposed = operand_pair(g, op.args[0], op.args[1]), False
    b_shape = g.shape(op.attrs["weight"] if op.kind == "linear" else op.args[1])
    if a is None or b is None or not a_shape or len(a_shape) < 2 or not b_shape or len(b_shape) < 2:
        return None
    batched = len(b_shape) > 2
    if batched and (op.kind != "matmul" or tuple(a_shape[:-2]) != tuple(b_shape[:-2])):
        return None     # a batch broadcast against a single matrix or another batch: not one launch
    positions = batched or len(a_shape) == 2       # the kernel's rows are the output matrix's
    if g.chain(rest, chain, {op.node: "acc"}, positions) is None or (batched and chain.tensors):
        return None     # a batched epilogue's operands would need the batch's offsets
    what = " + ".join([op.kind if not batched else "batched matmul",
                       *(["bias"] if op.attrs.get("bias") is not None else []), *(o.kind for o in rest)])
    return matmul.Matmul(a, b, transposed, chain, precision, g.half, batched), what


def match_matmul(g: Graph, init: list[Any], precision: str) -> Match | None:
    found = _matmul_spec(g, g.ops, g.out, precision)
    return None if found is None else Match(*matmul.render(found[0], g.signature, *init, found[1]), precision)


def match_matmul_rowwise(g: Graph, init: list[Any], precision: str) -> Match | None:
    """A matmul with an elementwise epilogue, then softmax or log-softmax over the last dim."""
    if len(g.ops) < 2 or g.out is not g.ops[-1].node:
        return None
    last = g.ops[-1]
    if last.kind not in ("softmax", "log_softmax") or last.attrs["dim"] is None:
        return None
    shape = g.shape(last.args[0])
    if not shape or last.attrs["dim"] % len(shape) != len(shape) - 1:
        return None
    found = _matmul_spec(g, g.ops[:-1], g.resolve(last.args[0]), precision)
    if found is None:
        return None
    row = rowwise.Rowwise(last.kind, "y", "y.dim() - 1", "y.dim()")
    return Match(*matmul.render_then_rowwise(found[0], row, g.signature, *init, found[1]), precision)


def match_mlp(g: Graph, init: list[Any], precision: str) -> Match | None:
    kinds = sorted(op.kind for op in g.ops)
    if kinds != ["linear", "linear", "linear", "mul", "silu"]:
        return None
    if any(op.attrs.get("bias") is not None for op in g.ops if op.kind == "linear"):
        return None
    by_node = {op.node: op for op in g.ops}
    down = by_node.get(g.out)
    mul = by_node.get(down.args[0]) if down is not None and down.kind == "linear" else None
    if mul is None or mul.kind != "mul":
        return None
    first, second = (by_node.get(a) for a in mul.args)
    if first is None or second is None:
        return None
    silu, up = (first, second) if first.kind == "silu" else (second, first)
    gate = by_node.get(silu.args[0]) if silu.kind == "silu" else None
    if gate is None or gate.kind != "linear" or up.kind != "linear" or gate.args[0] is not up.args[0]:
        return None
    names = [g.leaf(gate.args[0]), *(g.leaf(o.attrs["weight"]) for o in (gate, up, down))]
    if any(n is None for n in names):
        return None
    return Match(*matmul.render_mlp(matmul.GatedMLP(*names, precision, g.half), g.signature, *init), precision)


def _tensor_shape(g: Graph, value: Any) -> tuple[int, ...] | None:
    """The traced shape of a node, or of a forward-side expression: an input's name, a
    parameter or buffer of the model (``self.conv.weight``), or a view or cast of one
    (``self.bn.running_mean.view(-1, 1, 1)``, as BatchNorm decomposes)."""
    if isinstance(value, fx.Node):
        return g.shape(value)
    if not isinstance(value, str):
        return None
    if value.startswith("self."):
        name = value.removeprefix("self.")
        for get in (g.model.get_parameter, g.model.get_buffer):
            try:
                return tuple(get(name).shape)
            except AttributeError:
                continue
    node = next((n for n in [*g.inputs, *g.leaves] if g.leaf(n) == value), None)
    return g.shape(node) if node is not None else None


def _per_channel(shape: tuple[int, ...] | None, out: tuple[int, ...]) -> bool:
    """Whether an operand broadcasts against the (N, C, spatial…) output along the channels
    only (a ``(C_out, 1, 1)`` bias): then the kernel reads it per column. With one output
    channel the flat path is used, since the run-time channel count may differ from the traced
    one."""
    if shape is None or len(shape) > len(out) or len(shape) < 2 or out[1] == 1:
        return False
    aligned = (1,) * (len(out) - len(shape)) + tuple(shape)
    return aligned[1] == out[1] and all(d == 1 for i, d in enumerate(aligned) if i != 1)


def _conv_kernel(op: Op, x_shape: tuple[int, ...] | None, w_shape: tuple[int, ...] | None) -> str | None:
    """Which kernel ports the convolution: ``"gemm"`` (implicit GEMM) or ``"direct"`` (a grouped
    convolution whose groups have one input or one output channel: a dot tile of one useful
    column or row in sixteen is no port of it); None where the input and weight do not have the
    convolution's rank or disagree on the input channels, or for a depthwise-like transposed
    one (neither kernel does it)."""
    dims, groups = op.attrs["dims"], op.attrs["groups"]
    if not x_shape or not w_shape or len(x_shape) != dims + 2 or len(w_shape) != dims + 2:
        return None
    if op.attrs["transposed"]:
        fits = w_shape[0] == x_shape[1] and x_shape[1] % groups == 0
        return "gemm" if fits and (groups == 1 or w_shape[1] > 1) else None
    if w_shape[1] * groups != x_shape[1] or w_shape[0] % groups:
        return None
    return "direct" if groups > 1 and 1 in (w_shape[1], w_shape[0] // groups) else "gemm"


def match_conv(g: Graph, init: list[Any], precision: str) -> Match | None:
    """``nn.Conv{1,2,3}d``/``nn.ConvTranspose{1,2,3}d`` and their ``F.`` forms (zero padding,
    any stride/padding/dilation, groups; depthwise-like ones as a direct convolution, but not
    transposed) followed by an elementwise epilogue whose result is the graph's output."""
    if not g.ops or g.ops[0].kind not in CONVS:
        return None
    op, rest = g.ops[0], g.ops[1:]
    if op.attrs["padding_mode"] != "zeros" or as_dim(op.attrs["groups"]) is None:
        return None
    out_shape = g.shape(op.node)
    if g.out is not (rest[-1].node if rest else op.node) or not out_shape or g.shape(g.out) != out_shape:
        return None
    x, weight = operand_pair(g, op.args[0], op.attrs["weight"])
    x_shape, w_shape = g.shape(op.args[0]), _tensor_shape(g, op.attrs["weight"])
    bias = g.loaded(op.attrs["bias"]) if op.attrs["bias"] is not None else None
    kernel = _conv_kernel(op, x_shape, w_shape)
    if x is None or weight is None or kernel is None or (op.attrs["bias"] is not None and bias is None):
        return None
    chain = common.Chain(result="acc")
    if g.chain(rest, chain, {op.node: "acc"}) is None:
        return None
    channel = [_per_channel(_tensor_shape(g, t), out_shape) for t in chain.tensors]
    spec = conv.Conv(x, weight, bias, op.attrs["stride"], op.attrs["padding"], op.attrs["dilation"],
                     chain, precision, channel, dims=op.attrs["dims"], groups=op.attrs["groups_expr"],
                     transposed=op.attrs["transposed"], output_padding=op.attrs["output_padding"],
                     taps=math.prod(w_shape[2:]), group_in=0 if op.attrs["transposed"] else w_shape[1])
    what = " + ".join([op.kind, *(["bias"] if bias is not None else []), *(o.kind for o in rest)])
    if kernel == "direct":
        return Match(*depthwise.render(spec, g.signature, *init, what))
    return Match(*conv.render(spec, g.signature, *init, what), precision)


class _Attention:
    """Reads attention's parts off a graph: operands through views and scale factors, each
    with the nodes it accounts for (the match must account for every op of the graph)."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.ops = {op.node: op for op in g.ops}
        self.used: set[fx.Node] = set()

    def op(self, value: Any, *kinds: str) -> Op | None:
        op = self.ops.get(value) if isinstance(value, fx.Node) else None
        if op is None or op.kind not in kinds:
            return None
        self.used.add(op.node)
        return op

    @staticmethod
    def tensor(value: Any) -> bool:
        return isinstance(value, fx.Node) and "tensor_meta" in value.meta

    def view(self, value: Any) -> str | None:
        """An input or parameter, possibly transposed: the kernel reads views through their
        strides, so the forward passes the same view (no copy)."""
        if (expr := self.g.leaf(value)) is not None:
            return expr
        op = self.op(value, "transpose")
        inner = self.view(op.args[0]) if op is not None else None
        return f"{inner}.transpose({op.attrs['dims'][0]}, {op.attrs['dims'][1]})" if op and inner else None

    def factor(self, value: Any) -> str | None:
        """A scale as a forward-side Python expression: a number (or the attribute holding it),
        or arithmetic on input sizes (``q.size(-1) ** -0.5``), recomputed by the port's forward
        so that it follows the shapes the gate tries."""
        if self.tensor(value):
            return None
        return self.g.expr(value)

    def unscaled(self, value: Any, factors: list[str]) -> Any:
        """``value`` without its multiplications and divisions by scale factors (appended to
        ``factors`` as multipliers): the product is linear in each, so all fold into one scale."""
        while (op := self.op(value, "mul", "div")) is not None:
            before = set(self.used)
            a, b = op.args
            if self.tensor(a) and (f := self.factor(b)) is not None:
                factors.append(f if op.kind == "mul" else f"(1.0 / {f})")
                value = a
            elif op.kind == "mul" and self.tensor(b) and (f := self.factor(a)) is not None:
                factors.append(f)
                value = b
            else:       # not a scaling: leave it (and what was looked at) unaccounted for
                self.used = before - {op.node}
                return value
        return value

    def operands(self, q: Any, k: Any, v: Any) -> tuple[str, str, str] | None:
        """The operands' view expressions, when their traced shapes are attention's:
        (…, M, D), (…, N, D), (…, N, Dv), same leading dims (no broadcasting), same float dtype."""
        metas = [t.meta.get("tensor_meta") if isinstance(t, fx.Node) else None for t in (q, k, v)]
        if any(m is None for m in metas):
            return None
        qs, ks, vs = (tuple(m.shape) for m in metas)
        dtypes = {m.dtype for m in metas}
        if (not 2 <= len(qs) <= 4 or not len(qs) == len(ks) == len(vs) or qs[:-2] != ks[:-2]
                or ks[:-2] != vs[:-2] or qs[-1] != ks[-1] or ks[-2] != vs[-2] or len(dtypes) != 1
                or not next(iter(dtypes)).is_floating_point):
            return None
        qv, kv, vv = self.view(q), self.view(k), self.view(v)
        return (qv, kv, vv) if qv is not None and kv is not None and vv is not None else None

    def written(self, top: Op, factors: list[str]) -> tuple[Any, Any, Any, bool, bool] | None:
        """(q, k, v, causal, relu) of ``softmax(q @ kᵀ * scale, dim=-1) @ v`` or of ``relu(…) @
        v``, with the scale factors found on the scores, on ``q`` and on ``kᵀ`` or ``k``, and
        the scores masked causally or not (``scores.masked_fill(causal mask, -inf)``, before or
        after the scaling, before the softmax or ReLU); None for any other shape of graph."""
        soft = self.op(top.args[0], "softmax", "relu")
        shape = self.g.shape(top.args[0])
        if soft is None or not shape or (soft.kind == "softmax" and (
                soft.attrs["dim"] is None or soft.attrs["dim"] % len(shape) != len(shape) - 1)):
            return None
        scaled = self.unscaled(soft.args[0], factors)
        masked = self.op(scaled, "causal")
        if masked is not None:
            scaled = self.unscaled(masked.args[0], factors)
        scores = self.op(scaled, "matmul")
        kt = self.transpose(self.unscaled(scores.args[1], factors)) if scores is not None else None
        k_shape = self.g.shape(kt[0]) if kt is not None else None
        if kt is None or not k_shape:
            return None
        if {d % len(k_shape) for d in kt[1]} != {len(k_shape) - 2, len(k_shape) - 1}:
            return None
        return (self.unscaled(scores.args[0], factors), self.unscaled(kt[0], factors), top.args[1],
                masked is not None, soft.kind == "relu")

    def transpose(self, value: Any) -> tuple[Any, tuple[int, int]] | None:
        """(what is transposed, the dims): a transpose op, or a transposed input (a leaf)."""
        if value in self.g.transposed:
            return self.g.transposed[value]
        op = self.op(value, "transpose")
        return (op.args[0], op.attrs["dims"]) if op is not None else None


def match_attention(g: Graph, init: list[Any], precision: str) -> Match | None:
    """``F.scaled_dot_product_attention(q, k, v[, is_causal, scale])``, or the written-out
    ``softmax(q @ kᵀ * scale, dim=-1) @ v`` or ``relu(…) @ v``, either masked causally (any mix
    of ``matmul``/``@``/``bmm``, ``transpose``/``mT``/``permute``, scale by a number or from the
    inputs' sizes, on the scores or on ``q``/``k``). Every op of the graph must be part of it
    and the output the attention itself."""
    at = _Attention(g)
    top = at.op(g.out, "sdpa", "matmul") if isinstance(g.out, fx.Node) else None
    if top is None:
        return None
    factors: list[str] = []
    sdpa = top.kind == "sdpa"
    if sdpa:
        qkv = (at.unscaled(top.args[0], factors), at.unscaled(top.args[1], factors), top.args[2])
        causal, relu = bool(top.attrs["is_causal"]), False
    else:
        written = at.written(top, factors)
        qkv, causal, relu = (written[:3], *written[3:]) if written is not None else (None, False, False)
    views = at.operands(*qkv) if qkv is not None else None
    if views is None:
        return None
    scale = top.attrs["scale"] if sdpa else None
    if sdpa and scale is None:      # SDPA's default, 1/sqrt(E) with E the query's last dim
        factors.insert(0, f"(1.0 / math.sqrt({views[0]}.shape[-1]))")
    elif sdpa:
        factors.insert(0, at.factor(scale) or "")
    if not all(factors) or at.used != set(at.ops):
        return None
    head = g.shape(qkv[0])
    wide = bool(head) and head[-1] > attention.MAX_HEAD
    if wide and relu:           # the materialised form's middle kernel is a softmax
        return None
    spec = attention.Attention(*views, " * ".join(factors) or "1.0", causal, sdpa, precision, g.half, wide, relu,
                               head[-1] if head else 0)
    return Match(*attention.render(spec, g.signature, *init), precision)


OUTPUT = '''

class ModelNew(ModelNew):
    """The template's result as the reference returns it ({what})."""

    def forward(self, {signature}):
        out = super().forward({signature})
        return out{calls}
'''


def as_returned(g: Graph, found: Match) -> Match | None:
    """``found`` with the reference's output dtype and final views: the templates store the
    dtype of their first operand in the shape they compute, so casts and views the reference
    ends with (``.to(x.dtype)``, ``.flatten(1)``) are made on the result (a no-op when they
    change nothing). None when the final views cannot be expressed."""
    views = g.output_view()
    floating = {dtype_of(n) for n in g.inputs if dtype_of(n) is not None and dtype_of(n).is_floating_point}
    cast = g.out_dtype is not None and (g.casts or floating != {g.out_dtype})
    if views is None:
        return None
    if not views and not cast:
        return found
    calls = views + (f".to({g.out_dtype})" if cast else "")
    what = ", ".join([*(["viewed as it returns it"] if views else []), *([str(g.out_dtype)] if cast else [])])
    return replace(found, source=found.source + OUTPUT.format(what=what, signature=g.signature, calls=calls),
                   edit=f"{found.edit}; output {what}")


def find(g: Graph, init: list[Any], precision: str) -> Match | None:
    """The first template that matches the whole graph, most specific first (a gated MLP is
    also three matmuls; a matmul + softmax also ends in a row-wise op), with ``precision`` for
    the dots of those that have them."""
    for attempt in (lambda: match_attention(g, init, precision),
                    lambda: match_mlp(g, init, precision), lambda: match_matmul(g, init, precision),
                    lambda: match_conv(g, init, precision),
                    lambda: match_matmul_rowwise(g, init, precision),
                    lambda: match_rowwise(g, init),
                    lambda: match_rms_written(g, init), lambda: match_reduction(g, init),
                    lambda: match_group_norm(g, init), lambda: match_pool(g, init),
                    lambda: match_concat(g, init),
                    lambda: match_elementwise(g, init)):
        found = attempt()
        if found is not None:
            return as_returned(g, found)
    return None
