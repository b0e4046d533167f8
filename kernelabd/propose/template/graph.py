"""Graph recognition for the ``template`` proposer: the reference's torch.fx graph as a
canonical op list (``Op``).

Every torch function, tensor method and module call that means the same thing (``F.relu``,
``x.relu()``, ``nn.ReLU``) becomes one kind, with its operands resolved to forward arguments,
parameters or scalars. A node no template knows marks the graph unknown, so that a matcher
(``match``) never silently drops part of the computation.

The reference is loaded and traced in this process: the worker is trusted with the reference
as with any code it proposes from. Candidates are never run here.
"""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from kernelabd.propose.templates import common
from kernelabd.service.capture import load_reference

FUNCTIONS: dict[Any, str] = {
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
    operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div",
    operator.neg: "neg", torch.neg: "neg", torch.relu: "relu", F.relu: "relu",
    torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", F.silu: "silu", torch.tanh: "tanh",
    F.tanh: "tanh", torch.exp: "exp", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt",
    torch.square: "square", operator.pow: "pow", torch.pow: "pow", F.gelu: "gelu",
    torch.softmax: "softmax", F.softmax: "softmax", torch.log_softmax: "log_softmax",
    F.log_softmax: "log_softmax", F.layer_norm: "layer_norm", F.rms_norm: "rms_norm",
    torch.sum: "sum", torch.mean: "mean", torch.amax: "max", torch.max: "max",
    torch.matmul: "matmul", torch.mm: "matmul", operator.matmul: "matmul", F.linear: "linear",
    operator.getitem: "getitem", torch.clone: "identity", torch.detach: "identity",
    torch.bmm: "matmul", torch.transpose: "transpose", torch.swapaxes: "transpose",
    torch.swapdims: "transpose", torch.permute: "permute", builtins.getattr: "getattr",
    F.scaled_dot_product_attention: "sdpa", F.conv2d: "conv2d", torch.conv2d: "conv2d",
}
METHODS: dict[str, str] = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "relu": "relu",
    "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "square": "square", "pow": "pow", "softmax": "softmax", "log_softmax": "log_softmax",
    "sum": "sum", "mean": "mean", "amax": "max", "max": "max", "matmul": "matmul",
    "clone": "identity", "detach": "identity", "contiguous": "identity", "bmm": "matmul",
    "transpose": "transpose", "swapaxes": "transpose", "swapdims": "transpose", "permute": "permute",
    "size": "size",
}
MODULES: dict[type, str] = {
    nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu", nn.GELU: "gelu",
    nn.Softmax: "softmax", nn.LogSoftmax: "log_softmax", nn.LayerNorm: "layer_norm",
    nn.RMSNorm: "rms_norm", nn.Linear: "linear", nn.Identity: "identity", nn.Conv2d: "conv2d",
}
ELEMENTWISE = set(common.UNARY) | set(common.BINARY)
REDUCTIONS = {"sum", "mean", "max"}
# keyword arguments that do not change what an op computes
HARMLESS_KWARGS = {"inplace", "_stacklevel"}
SCALAR_SYMBOLS = {"mul": "*", "div": "/", "add": "+", "sub": "-"}   # arithmetic on sizes
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


@dataclass
class Op:
    """One computing node in canonical form: ``args`` are fx nodes or Python scalars,
    ``attrs`` the op's settings (dims, eps, and parameters as ``self.…`` expressions)."""

    node: fx.Node
    kind: str
    args: tuple[Any, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def as_dim(value: Any) -> int | None:
    """A dim given as an int or a one-element list (``dim=[-1]``); None for anything else."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _kwargs_ok(node: fx.Node, allowed: set[str]) -> bool:
    """Whether every keyword is one the op's template honours (a ``dtype`` only when None)."""
    return all(k in allowed | HARMLESS_KWARGS or (k == "dtype" and v is None)
               for k, v in node.kwargs.items())


def _module_op(node: fx.Node, module: nn.Module, kind: str) -> Op | None:
    path = f"self.{node.target}"
    x = node.args[0] if node.args else None
    if kind == "gelu":
        kind = "gelu_tanh" if getattr(module, "approximate", "none") == "tanh" else "gelu"
    if kind in ("softmax", "log_softmax"):
        return Op(node, kind, (x,), {"dim": as_dim(module.dim)})
    if kind == "layer_norm":
        return Op(node, kind, (x,), {"ndim": len(module.normalized_shape), "eps": f"{path}.eps",
                                     "weight": f"{path}.weight" if module.weight is not None else None,
                                     "bias": f"{path}.bias" if module.bias is not None else None})
    if kind == "rms_norm":
        eps = f"{path}.eps" if module.eps is not None else "torch.finfo(x.dtype).eps"
        return Op(node, kind, (x,), {"ndim": len(module.normalized_shape), "eps": eps,
                                     "weight": f"{path}.weight" if module.weight is not None else None})
    if kind == "linear":
        return Op(node, kind, (x,), {"weight": f"{path}.weight",
                                     "bias": f"{path}.bias" if module.bias is not None else None})
    if kind == "conv2d":
        # the geometry is read from the module at run time (``self.conv.stride``), so it follows
        # the instance; groups and padding mode are checked here, at trace time, by the matcher
        return Op(node, kind, (x,), {"weight": f"{path}.weight",
                                     "bias": f"{path}.bias" if module.bias is not None else None,
                                     "stride": f"{path}.stride", "padding": f"{path}.padding",
                                     "dilation": f"{path}.dilation", "groups": module.groups,
                                     "padding_mode": module.padding_mode})
    return Op(node, kind, (x,))


def canon(node: fx.Node, gm: fx.GraphModule) -> Op | None:
    """The canonical op of a call node, or None when no template knows it."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        kind = MODULES.get(type(module))
        return _module_op(node, module, kind) if kind else None
    kind = FUNCTIONS.get(node.target) if node.op == "call_function" else METHODS.get(str(node.target))
    if kind is None:
        return None
    x = node.args[0] if node.args else node.kwargs.get("input")
    if kind in common.BINARY:
        return Op(node, kind, tuple(node.args[:2])) if not node.kwargs and len(node.args) == 2 else None
    if kind == "pow":
        exponent = _arg(node, 1, "exponent")
        if exponent == 2:
            return Op(node, "square", (x,))
        # other numeric exponents only matter to sizes (``d ** -0.5``); no tensor template takes them
        return Op(node, "pow", (x, exponent)) if _number(exponent) and not node.kwargs else None
    if kind == "gelu":
        kind = "gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu"
    if kind in common.UNARY or kind == "identity":
        return Op(node, kind, (x,)) if _kwargs_ok(node, {"approximate"}) else None
    if kind in ("softmax", "log_softmax") and _kwargs_ok(node, {"dim"}):
        return Op(node, kind, (x,), {"dim": as_dim(_arg(node, 1, "dim"))})
    if kind in REDUCTIONS and _kwargs_ok(node, {"dim", "keepdim"}):
        return Op(node, kind, (x,), {"dim": as_dim(_arg(node, 1, "dim")),
                                     "keepdim": bool(_arg(node, 2, "keepdim", False))})
    if kind == "matmul":
        return Op(node, kind, (node.args[0], node.args[1]))
    if kind == "getitem":
        return Op(node, kind, (x, node.args[1]))
    if kind == "linear":
        return Op(node, kind, (x,), {"weight": _arg(node, 1, "weight"), "bias": _arg(node, 2, "bias")})
    if kind == "layer_norm":
        shape = _arg(node, 1, "normalized_shape")
        return Op(node, kind, (x,), {"ndim": len(shape) if isinstance(shape, list | tuple) else 1,
                                     "weight": _arg(node, 2, "weight"), "bias": _arg(node, 3, "bias"),
                                     "eps": _arg(node, 4, "eps", 1e-5)})
    if kind == "rms_norm":
        shape = _arg(node, 1, "normalized_shape")
        return Op(node, kind, (x,), {"ndim": len(shape) if isinstance(shape, list | tuple) else 1,
                                     "weight": _arg(node, 2, "weight"),
                                     "eps": _arg(node, 3, "eps") or "torch.finfo(x.dtype).eps"})
    if kind == "conv2d":
        return _conv_op(node)
    return _view_or_attention_op(node, kind, x)


def _geometry_literal(value: Any, strings: tuple[str, ...] = ()) -> str | None:
    """A conv stride/padding/dilation given in the graph as an int, a pair of ints or (padding
    only) "same"/"valid", as a Python literal; None for anything computed in the forward."""
    if isinstance(value, str):
        return repr(value) if value in strings else None
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if as_dim(value) is not None:
        return repr(value)
    if isinstance(value, list | tuple) and len(value) == 2 and all(as_dim(v) is not None for v in value):
        return repr(tuple(value))
    return None


def _conv_op(node: fx.Node) -> Op | None:
    """``F.conv2d(input, weight, bias, stride, padding, dilation, groups)``: the geometry must be
    literal in the graph (fx inlines numbers the forward reads from attributes)."""
    if set(node.kwargs) - set(CONV_ARGS) or len(node.args) > len(CONV_ARGS):
        return None
    given = {name: _arg(node, i, name) for i, name in enumerate(CONV_ARGS)}
    stride = _geometry_literal(1 if given["stride"] is None else given["stride"])
    padding = _geometry_literal(0 if given["padding"] is None else given["padding"], ("same", "valid"))
    dilation = _geometry_literal(1 if given["dilation"] is None else given["dilation"])
    groups = 1 if given["groups"] is None else given["groups"]
    if stride is None or padding is None or dilation is None or as_dim(groups) is None:
        return None
    return Op(node, "conv2d", (given["input"],),
              {"weight": given["weight"], "bias": given["bias"], "stride": stride, "padding": padding,
               "dilation": dilation, "groups": groups, "padding_mode": "zeros"})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _view_or_attention_op(node: fx.Node, kind: str, x: Any) -> Op | None:
    """Transposes, sizes and SDPA: what attention is written with.

    A permutation that swaps two dims is a transpose; ``x.mT`` is ``transpose(-2, -1)``;
    ``x.shape`` is ``size`` without a dim (then indexed). SDPA is canonical only without a mask,
    dropout or grouped heads, so such a graph matches nothing rather than losing a term.
    """
    if kind == "transpose" and _kwargs_ok(node, {"dim0", "dim1"}):
        d0, d1 = as_dim(_arg(node, 1, "dim0")), as_dim(_arg(node, 2, "dim1"))
        return Op(node, kind, (x,), {"dims": (d0, d1)}) if d0 is not None and d1 is not None else None
    if kind == "permute" and not node.kwargs:
        dims = node.args[1:]
        if len(dims) == 1 and isinstance(dims[0], list | tuple):
            dims = tuple(dims[0])
        if not dims or not all(isinstance(d, int) for d in dims):
            return None
        norm = [d % len(dims) for d in dims]
        moved = [i for i, d in enumerate(norm) if d != i]
        if sorted(norm) != list(range(len(dims))) or len(moved) != 2:
            return None
        return Op(node, "transpose", (x,), {"dims": (moved[0], moved[1])})
    if kind == "getattr" and len(node.args) == 2:
        if node.args[1] == "shape":
            return Op(node, "size", (x,), {"dim": None})
        if node.args[1] == "mT":
            return Op(node, "transpose", (x,), {"dims": (-2, -1)})
        return None
    if kind == "size" and _kwargs_ok(node, {"dim"}):
        dim = _arg(node, 1, "dim")
        return Op(node, kind, (x,), {"dim": dim}) if dim is None or as_dim(dim) is not None else None
    if kind == "sdpa" and set(node.kwargs) <= set(SDPA_ARGS) and len(node.args) <= len(SDPA_ARGS):
        given = {name: _arg(node, i, name) for i, name in enumerate(SDPA_ARGS)}
        dropout, causal = given["dropout_p"] or 0.0, given["is_causal"] or False
        if (given["attn_mask"] is not None or dropout != 0 or given["enable_gqa"]
                or not isinstance(causal, bool)):
            return None
        return Op(node, kind, (given["query"], given["key"], given["value"]),
                  {"is_causal": causal, "scale": given["scale"]})
    return None


class Graph:
    """The traced reference: canonical ops, operand expressions and traced shapes."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module) -> None:
        self.gm = gm
        self.model = model
        self.inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.signature = ", ".join(str(n.target) for n in self.inputs)
        self.alias: dict[fx.Node, Any] = {}
        self.ops: list[Op] = []
        self.known = True
        for node in gm.graph.nodes:
            if node.op in ("call_function", "call_method", "call_module"):
                op = canon(node, gm)
                if op is None:
                    self.known = False
                elif op.kind == "identity":
                    self.alias[node] = self.resolve(op.args[0])
                else:
                    self.ops.append(Op(op.node, op.kind, tuple(self.resolve(a) for a in op.args),
                                       {k: self.resolve(v) for k, v in op.attrs.items()}))
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.out = self.resolve(outputs)

    def resolve(self, value: Any) -> Any:
        return self.alias.get(value, value) if isinstance(value, fx.Node) else value

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype of the largest floating input, as the capture reports the job's."""
        metas = [n.meta.get("tensor_meta") for n in self.inputs]
        floating = [m for m in metas if hasattr(m, "dtype") and m.dtype.is_floating_point]
        return max(floating, key=lambda m: m.shape.numel()).dtype if floating else None

    @property
    def half(self) -> bool:
        return self.dtype in (torch.float16, torch.bfloat16)

    def leaf(self, value: Any) -> str | None:
        """The forward's expression for an input or a parameter (None for anything else)."""
        if isinstance(value, str) and value.startswith("self."):
            return value
        if isinstance(value, fx.Node) and value.op == "placeholder":
            return str(value.target)
        if isinstance(value, fx.Node) and value.op == "get_attr":
            return f"self.{value.target}"
        return None

    def scalar(self, value: Any) -> str | None:
        """A Python number's expression: the model attribute holding it when exactly one does
        (so a constructor argument like ``eps`` follows the instance), else its literal."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        names = [k for k, v in vars(self.model).items() if not k.startswith("_")
                 and type(v) in (int, float) and v == value]
        return f"self.{names[0]}" if len(names) == 1 else repr(value)

    def shape(self, value: Any) -> tuple[int, ...] | None:
        if isinstance(value, fx.Node) and "tensor_meta" in value.meta:
            meta = value.meta["tensor_meta"]           # a tuple of them for (values, indices)
            return tuple(meta.shape) if hasattr(meta, "shape") else None
        if isinstance(value, str):
            return tuple(self.model.get_parameter(value.removeprefix("self.")).shape)
        return None

    def chain(self, ops: list[Op], chain: common.Chain, names: dict[fx.Node, str]) -> common.Chain | None:
        """``ops`` as Triton statements appended to ``chain``; None if one is not elementwise
        or takes an operand from outside (a value computed by something else)."""
        for k, op in enumerate(ops):
            if op.kind not in ELEMENTWISE:
                return None
            operands = []
            for a in op.args:
                if isinstance(a, fx.Node) and a in names:
                    operands.append(names[a])
                elif (expr := self.leaf(a)) is not None:
                    if expr not in chain.tensors:
                        chain.tensors.append(expr)
                    operands.append(f"t{chain.tensors.index(expr)}")
                elif (expr := self.scalar(a)) is not None:
                    chain.scalars.append(expr)
                    operands.append(f"s{len(chain.scalars) - 1}")
                else:
                    return None
            template = common.UNARY.get(op.kind) or common.BINARY[op.kind]
            chain.lines.append(f"v{k} = {template.format(*operands)}")
            names[op.node] = f"v{k}"
            chain.result = f"v{k}"
        return chain


def trace(source: str) -> Graph | None:
    """The reference's fx graph with traced shapes; None when it cannot be traced (dynamic
    control flow, a reference that fails to build): then no template applies."""
    try:
        _, model, inputs = load_reference(source)
        gm = fx.symbolic_trace(model)
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    except Exception:   # the reference is arbitrary user code; any failure means "no match"
        return None
    return Graph(gm, model)
