"""Graph recognition for the ``template`` proposer: the reference's torch.fx graph in a
canonical form, as a list of canonical ops (``Op``).

References write one computation many ways; a matcher (``match``) should see one. So:

- every torch function, tensor method, in-place variant and module call that means the same
  thing (``F.relu``, ``x.relu()``, ``x.relu_()``, ``nn.ReLU(inplace=True)``) is one kind, and an
  in-place op's later readers read its result, as they do in eager PyTorch;
- a dtype cast is a value, not an op: every template loads its operands into fp32 and stores
  once, so a lossless cast (``.float()`` of a bf16 tensor, ``.to(x.dtype)`` of a tensor already
  of that dtype) is the value itself, a rounding one between two ops is a ``round_*`` op, a cast
  of an input or a parameter is an operand expression (``x.to(torch.float16)``), and the last
  casts set the output's dtype (``Graph.out_dtype``);
- a view of an input or a parameter is an operand expression (``x.view(-1, d)``, ``A.T``), the
  last views set the output's shape, and sizes with arithmetic on them (``x.size(0) * 2``) are
  forward-side expressions (``Graph.expr``), never ops;
- what computes nothing disappears (dropout in eval, ``contiguous``, ``.to(device)``), and
  BatchNorm in eval is the per-channel affine map it computes;
- parameters and model attributes that hold numbers are read from the model, so a constructor
  argument follows the instance.

A node no template knows makes the graph unknown, with that node and its op as the reason
(``Graph.unknown``), so that a matcher never silently drops part of the computation.

The reference is untrusted code: ``trace`` runs only in the recognition subprocess
(``kernelabd.propose.template.recognise``), under its deadline, never in the worker.
"""

from __future__ import annotations

import builtins
import math
import operator
import warnings
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
    torch.abs: "abs", torch.log: "log", torch.erf: "erf", torch.reciprocal: "reciprocal",
    F.leaky_relu: "leaky_relu", F.elu: "elu", F.selu: "selu", torch.selu: "selu",
    F.hardtanh: "hardtanh", F.relu6: "relu6", F.hardsigmoid: "hardsigmoid",
    F.hardswish: "hardswish", F.softplus: "softplus", F.softsign: "softsign", F.mish: "mish",
    torch.clamp: "clamp", torch.clip: "clamp", torch.clamp_min: "clamp_min",
    torch.clamp_max: "clamp_max", torch.maximum: "maximum", torch.minimum: "minimum",
    F.dropout: "dropout", torch.dropout: "dropout", F.dropout1d: "dropout", F.dropout2d: "dropout",
    F.dropout3d: "dropout", F.alpha_dropout: "dropout", F.batch_norm: "batch_norm",
    torch.reshape: "view", torch.flatten: "view", torch.unsqueeze: "view", torch.squeeze: "view",
    torch.t: "transpose", torch.multiply: "mul", torch.divide: "div", torch.true_divide: "div",
    torch.subtract: "sub", torch.negative: "neg", torch.special.expit: "sigmoid",
}
METHODS: dict[str, str] = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "relu": "relu",
    "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "square": "square", "pow": "pow", "softmax": "softmax", "log_softmax": "log_softmax",
    "sum": "sum", "mean": "mean", "amax": "max", "max": "max", "matmul": "matmul",
    "clone": "identity", "detach": "identity", "contiguous": "identity", "bmm": "matmul",
    "transpose": "transpose", "swapaxes": "transpose", "swapdims": "transpose", "permute": "permute",
    "size": "size", "dim": "size", "numel": "size", "abs": "abs", "log": "log", "erf": "erf",
    "reciprocal": "reciprocal", "clamp": "clamp", "clip": "clamp", "clamp_min": "clamp_min",
    "clamp_max": "clamp_max", "maximum": "maximum", "minimum": "minimum", "t": "transpose",
    "float": "cast", "half": "cast", "bfloat16": "cast", "double": "cast", "to": "cast",
    "type": "cast", "type_as": "cast", "cuda": "cast", "cpu": "cast",
    "view": "view", "reshape": "view", "flatten": "view", "unsqueeze": "view", "squeeze": "view",
    "view_as": "view", "reshape_as": "view", "expand": "view", "expand_as": "view", "unflatten": "view",
    "multiply": "mul", "divide": "div", "true_divide": "div", "subtract": "sub", "negative": "neg",
}
MODULES: dict[type, str] = {
    nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu", nn.GELU: "gelu",
    nn.Softmax: "softmax", nn.LogSoftmax: "log_softmax", nn.LayerNorm: "layer_norm",
    nn.RMSNorm: "rms_norm", nn.Linear: "linear", nn.Identity: "identity", nn.Conv2d: "conv2d",
    nn.LeakyReLU: "leaky_relu", nn.ELU: "elu", nn.SELU: "selu", nn.Hardtanh: "hardtanh",
    nn.ReLU6: "relu6", nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish",
    nn.Softplus: "softplus", nn.Softsign: "softsign", nn.Mish: "mish", nn.Dropout: "dropout",
    nn.Dropout1d: "dropout", nn.Dropout2d: "dropout", nn.Dropout3d: "dropout",
    nn.AlphaDropout: "dropout", nn.BatchNorm1d: "batch_norm", nn.BatchNorm2d: "batch_norm",
    nn.BatchNorm3d: "batch_norm", nn.Flatten: "view", nn.Unflatten: "view",
}
# Elementwise ops beyond the templates' own tables (``common.UNARY``/``BINARY``), in fp32
# Triton. ``{0}`` is the value, ``{1}``, ``{2}`` the op's scalar settings, ``{t}`` a prefix for
# temporaries; the last statement is the result. Each computes what PyTorch does.
LOG1P = "tl.where({t}w == 1.0, {t}u, tl.log({t}w) * {t}u / ({t}w - 1.0))"
"""log1p(u) with w = 1 + u to fp32 precision (Goldberg), where tl.log(1 + u) loses a tiny u."""
MORE_ELEMENTWISE: dict[str, list[str]] = {
    "abs": ["tl.abs({0})"],
    "log": ["tl.log({0})"],
    "erf": ["tl.math.erf({0})"],
    "reciprocal": ["1.0 / {0}"],
    "cube": ["{0} * {0} * {0}"],
    "softsign": ["{0} / (1.0 + tl.abs({0}))"],
    "leaky_relu": ["tl.where({0} > 0.0, {0}, {0} * {1})"],
    "clamp": ["tl.minimum(tl.maximum({0}, {1}), {2})"],
    "clamp_min": ["tl.maximum({0}, {1})"],
    "clamp_max": ["tl.minimum({0}, {1})"],
    "maximum": ["tl.maximum({0}, {1})"],
    "minimum": ["tl.minimum({0}, {1})"],
    "elu": ["tl.where({0} > 0.0, {0}, {1} * (tl.exp(tl.minimum({0}, 0.0)) - 1.0))"],
    "selu": ["1.0507009873554805 * tl.where({0} > 0.0, {0}, 1.6732632423543772 * "
             "(tl.exp(tl.minimum({0}, 0.0)) - 1.0))"],
    "hardsigmoid": ["tl.minimum(tl.maximum({0} + 3.0, 0.0), 6.0) / 6.0"],
    "hardswish": ["{0} * (tl.minimum(tl.maximum({0} + 3.0, 0.0), 6.0) / 6.0)"],
    "softplus": ["{t}z = {0} * {1}", "{t}u = tl.exp(tl.minimum({t}z, {2}))", "{t}w = 1.0 + {t}u",
                 f"tl.where({{t}}z > {{2}}, {{0}}, {LOG1P} / {{1}})"],
    "mish": ["{t}u = tl.exp(tl.minimum({0}, 20.0))", "{t}w = 1.0 + {t}u",
             f"{{t}}s = tl.where({{0}} > 20.0, {{0}}, {LOG1P})",
             "{0} * (2.0 / (1.0 + tl.exp(-2.0 * {t}s)) - 1.0)"],
    "round_bf16": ["{0}.to(tl.bfloat16).to(tl.float32)"],
    "round_fp16": ["{0}.to(tl.float16).to(tl.float32)"],
}
ELEMENTWISE = set(common.UNARY) | set(common.BINARY) | set(MORE_ELEMENTWISE)
REDUCTIONS = {"sum", "mean", "max"}
# keyword arguments that do not change what an op computes
HARMLESS_KWARGS = {"inplace", "_stacklevel", "non_blocking", "copy", "memory_format"}
SCALAR_SYMBOLS = {"mul": "*", "div": "/", "add": "+", "sub": "-"}   # arithmetic on sizes
EXPRESSION_OPERATORS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
                        operator.floordiv: "//", operator.mod: "%", operator.pow: "**"}
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
# positional settings of the elementwise ops that take them, with PyTorch's defaults
SETTINGS: dict[str, tuple[tuple[str, float], ...]] = {
    "leaky_relu": (("negative_slope", 0.01),), "elu": (("alpha", 1.0),),
    "hardtanh": (("min_val", -1.0), ("max_val", 1.0)), "softplus": (("beta", 1.0), ("threshold", 20.0)),
}
PARAMETRISED = {*SETTINGS, "relu6", "clamp", "clamp_min", "clamp_max"}
ROUNDING = {torch.bfloat16: "round_bf16", torch.float16: "round_fp16"}
FLOATS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}
VIEW_LIKE = {"view", "transpose", "permute", "getitem", "cast", "identity", "getattr"}
LITERAL_SIZES = (-1, 0, 1)
"""View sizes kept literal rather than read from a model attribute of equal value."""


class Expr(str):
    """A forward-side Python expression for a scalar (``self.act.negative_slope``), as opposed
    to a ``self.…`` string naming a parameter."""


@dataclass
class Op:
    """One computing node in canonical form: ``args`` are fx nodes or Python scalars,
    ``attrs`` the op's settings (dims, eps, and parameters as ``self.…`` expressions)."""

    node: fx.Node
    kind: str
    args: tuple[Any, ...]
    attrs: dict[str, Any] = field(default_factory=dict)


class NotRecognised(Exception):
    """The reference could not be traced into a graph; the message (one line) says why."""


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def as_dim(value: Any) -> int | None:
    """A dim given as an int or a one-element list (``dim=[-1]``); None for anything else."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kwargs_ok(node: fx.Node, allowed: set[str]) -> bool:
    """Whether every keyword is one the op's template honours (a ``dtype`` only when None)."""
    return all(k in allowed | HARMLESS_KWARGS or (k == "dtype" and v is None)
               for k, v in node.kwargs.items())


def _meta(value: Any) -> Any:
    return value.meta.get("tensor_meta") if isinstance(value, fx.Node) else None


def dtype_of(value: Any) -> torch.dtype | None:
    meta = _meta(value)
    return meta.dtype if hasattr(meta, "dtype") else None


def is_tensor(value: Any) -> bool:
    return isinstance(value, fx.Node) and "tensor_meta" in value.meta


def _is_expression(node: fx.Node) -> bool:
    """Whether a node computes a Python value from sizes (``x.size(0) * 2``, ``x.shape[1:]``),
    which the forward recomputes as an expression, rather than a tensor."""
    if is_tensor(node):
        return False
    if node.op == "call_method":
        return METHODS.get(str(node.target)) == "size"
    return node.op == "call_function" and (node.target in EXPRESSION_OPERATORS or node.target in (
        operator.getitem, builtins.getattr, operator.neg))


def describe(node: fx.Node, gm: fx.GraphModule) -> str:
    """The op of a node as a user wrote it: ``nn.BatchNorm2d``, ``torch.cumsum``, ``Tensor.clamp``."""
    if node.op == "call_module":
        return f"nn.{type(gm.get_submodule(str(node.target))).__name__}"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    name = getattr(target, "__name__", str(target))
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    return f"torch.{name}" if module.startswith("torch") or module == "" else f"{module}.{name}"


def _in_place_functions() -> dict[Any, str]:
    """``torch.relu_``, ``F.elu_``…: the in-place twin of each function of ``FUNCTIONS``."""
    found = {}
    for fn, kind in FUNCTIONS.items():
        name = getattr(fn, "__name__", "")
        for owner in (torch, F):
            twin = getattr(owner, f"{name}_", None)
            if callable(twin) and twin not in FUNCTIONS:
                found[twin] = kind
    return found


IN_PLACE_FUNCTIONS = _in_place_functions()


def _in_place_base(node: fx.Node, gm: fx.GraphModule) -> str | None:
    """The out-of-place kind of an in-place node (``x.relu_()``, ``torch.relu_``,
    ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``), or None for any other node."""
    if node.op == "call_method" and str(node.target).endswith("_"):
        return METHODS.get(str(node.target)[:-1])
    if node.op == "call_function" and node.target in IN_PLACE_FUNCTIONS:
        return IN_PLACE_FUNCTIONS[node.target]
    if node.kwargs.get("inplace") is True and node.op == "call_function":
        return FUNCTIONS.get(node.target)
    if node.op == "call_module" and getattr(gm.get_submodule(str(node.target)), "inplace", False) is True:
        return MODULES.get(type(gm.get_submodule(str(node.target))))
    return None


def _base_kind(node: Any, gm: fx.GraphModule) -> str | None:
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_module":
        return MODULES.get(type(gm.get_submodule(str(node.target))))
    if node.op == "call_method":
        return METHODS.get(str(node.target))
    return FUNCTIONS.get(node.target) if node.op == "call_function" else None


def functionalise(gm: fx.GraphModule) -> str | None:
    """Make in-place ops pure: every reader of a mutated value after the mutation reads the
    in-place node's result instead (fx records ``x.relu_(); y = x + 1`` as reading the
    unmutated ``x``). Returns why it cannot when a mutation would reach another value through
    a view, or would change a parameter for the next call."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if _in_place_base(node, gm) is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        target = node.args[0]
        if target.op == "get_attr":
            return f"{describe(node, gm)} ({node.name}) changes a parameter or buffer in place"
        base = target
        while _base_kind(base, gm) in VIEW_LIKE and base.args and isinstance(base.args[0], fx.Node):
            base = base.args[0]
            if any(order[u] > order[node] for u in base.users):
                return (f"{describe(node, gm)} ({node.name}) writes through a view into a value "
                        "read again later")
        for user in [u for u in target.users if u is not node and order[u] > order[node]]:
            user.replace_input_with(target, node)
    return None


def _per_channel(gm: fx.GraphModule, module_path: str, name: str, trailing: tuple[int, ...]) -> fx.Node:
    """``self.bn.running_mean.view(-1, 1, 1)``: a channel vector lined up with NC… values."""
    return gm.graph.call_method("view", (gm.graph.get_attr(f"{module_path}.{name}"), -1, *trailing))


DTYPE_KWARG_KINDS = {"softmax", "log_softmax", "sum", "mean"}


def explicit_casts(gm: fx.GraphModule) -> bool:
    """``softmax(x, dim, dtype=torch.float32)`` as ``softmax(x.to(torch.float32), dim)``: the
    ``dtype=`` of softmax and of the reductions casts their input, and is placed like any
    cast. True if it changed the graph."""
    changed = False
    for node in list(gm.graph.nodes):
        dtype = node.kwargs.get("dtype")
        if not isinstance(dtype, torch.dtype) or _base_kind(node, gm) not in DTYPE_KWARG_KINDS or not node.args:
            continue
        with gm.graph.inserting_before(node):
            cast = gm.graph.call_method("to", (node.args[0], dtype))
        node.args = (cast, *node.args[1:])
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "dtype"}
        changed = True
    if changed:
        gm.recompile()
    return changed


def decompose(gm: fx.GraphModule) -> bool:
    """BatchNorm in eval (running statistics) as the per-channel affine map it computes,
    ``(x - mean) * rsqrt(var + eps) * weight + bias``, with the statistics viewed as
    ``(C, 1, …)``, so that it fuses into elementwise chains and epilogues. True if it changed
    the graph (shapes then need propagating again)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or MODULES.get(type(gm.get_submodule(str(node.target)))) != "batch_norm":
            continue
        module, path = gm.get_submodule(str(node.target)), str(node.target)
        shape = _meta(node.args[0]).shape if _meta(node.args[0]) is not None else None
        if module.training or not module.track_running_stats or shape is None or len(shape) < 2:
            continue
        trailing = (1,) * (len(shape) - 2)
        graph = gm.graph
        with graph.inserting_before(node):
            y = graph.call_function(operator.sub, (node.args[0], _per_channel(gm, path, "running_mean", trailing)))
            with warnings.catch_warnings():    # eps is a float, not a parameter or buffer
                warnings.simplefilter("ignore", UserWarning)
                eps = graph.get_attr(f"{path}.eps")
            var = graph.call_function(operator.add, (_per_channel(gm, path, "running_var", trailing), eps))
            y = graph.call_function(operator.mul, (y, graph.call_function(torch.rsqrt, (var,))))
            if module.affine:
                y = graph.call_function(operator.mul, (y, _per_channel(gm, path, "weight", trailing)))
                y = graph.call_function(operator.add, (y, _per_channel(gm, path, "bias", trailing)))
        node.replace_all_uses_with(y)
        graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _settings(node: fx.Node, kind: str, module: nn.Module | None) -> tuple[Any, ...] | None:
    """The scalar settings of a parametrised elementwise op, as numbers or ``Expr`` reading
    the module attribute that holds them (None when one is not a number)."""
    out: list[Any] = []
    for i, (name, default) in enumerate(SETTINGS[kind]):
        if module is not None:
            value = getattr(module, name)
            out.append(Expr(f"self.{node.target}.{name}") if is_number(value) else None)
        else:
            out.append(_arg(node, i + 1, name, default))
    return tuple(out) if all(v is not None and (isinstance(v, Expr) or is_number(v)) for v in out) else None


def _elementwise_op(node: fx.Node, kind: str, x: Any, module: nn.Module | None) -> Op | None:
    """The elementwise kinds with settings, each put in the form its Triton expression takes
    (``relu6`` and ``hardtanh`` are clamps)."""
    if kind == "relu6":
        return Op(node, "clamp", (x, 0.0, 6.0))
    if kind in SETTINGS:
        settings = _settings(node, kind, module)
        if settings is None:
            return None
        return Op(node, "clamp" if kind == "hardtanh" else kind, (x, *settings))
    if kind in ("clamp", "clamp_min", "clamp_max"):
        lo = _arg(node, 1, "min") if kind != "clamp_max" else None
        hi = _arg(node, 2 if kind == "clamp" else 1, "max") if kind != "clamp_min" else None
        if not all(v is None or is_number(v) for v in (lo, hi)) or (lo is None and hi is None):
            return None
        if lo is not None and hi is not None:
            return Op(node, "clamp", (x, lo, hi))
        return Op(node, "clamp_min", (x, lo)) if lo is not None else Op(node, "clamp_max", (x, hi))
    return Op(node, kind, (x,))


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
    if kind == "dropout":
        return Op(node, "identity", (x,)) if not module.training else None
    if kind == "view" and isinstance(module, nn.Flatten):
        return Op(node, "view", (x,), {"method": "flatten", "args": (module.start_dim, module.end_dim)})
    if kind == "view":
        return Op(node, "view", (x,), {"method": "unflatten", "args": (module.dim, tuple(module.unflattened_size))})
    if kind == "batch_norm":
        return None         # in training mode (``decompose`` took the eval ones)
    return _elementwise_op(node, kind, x, module)


def canon(node: fx.Node, gm: fx.GraphModule) -> Op | None:
    """The canonical op of a call node, or None when no template knows it."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        kind = MODULES.get(type(module))
        return _module_op(node, module, kind) if kind else None
    if node.op == "call_function":
        kind = FUNCTIONS.get(node.target) or IN_PLACE_FUNCTIONS.get(node.target)
    else:
        name = str(node.target)
        kind = METHODS.get(name) or (METHODS.get(name[:-1]) if name.endswith("_") else None)
    if kind is None:
        return None
    x = node.args[0] if node.args else node.kwargs.get("input")
    if kind in common.BINARY or kind in ("maximum", "minimum"):
        return Op(node, kind, tuple(node.args[:2])) if not node.kwargs and len(node.args) == 2 else None
    if kind == "pow":
        return _pow_op(node, x)
    if kind == "gelu":
        kind = "gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu"
    if kind in PARAMETRISED:
        allowed = {"min", "max", *(name for name, _ in SETTINGS.get(kind, ()))}
        return _elementwise_op(node, kind, x, None) if _kwargs_ok(node, allowed) else None
    if kind in common.UNARY or kind == "identity" or kind in MORE_ELEMENTWISE:
        return Op(node, kind, (x,)) if _kwargs_ok(node, {"approximate"}) else None
    if kind in ("softmax", "log_softmax") and _kwargs_ok(node, {"dim"}) and _upcast_kwarg(node):
        return Op(node, kind, (x,), {"dim": as_dim(_arg(node, 1, "dim"))})
    if kind in REDUCTIONS and _kwargs_ok(node, {"dim", "keepdim"}) and _upcast_kwarg(node):
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
    if kind == "dropout":
        return _dropout_op(node, x)
    if kind in ("cast", "view"):
        return Op(node, kind, (x,), {"method": _method_name(node), "args": tuple(node.args[1:]),
                                     "kwargs": dict(node.kwargs)})
    return _view_or_attention_op(node, kind, x)


def _method_name(node: fx.Node) -> str:
    return str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")


def _upcast_kwarg(node: fx.Node) -> bool:
    """A ``dtype=`` on softmax or a reduction: fine when it is fp32, which is what the
    templates compute in anyway (the output dtype follows the traced one)."""
    dtype = node.kwargs.get("dtype")
    return dtype is None or dtype == torch.float32


def _pow_op(node: fx.Node, x: Any) -> Op | None:
    """``x ** 2`` and ``x ** 3`` are products, ``x ** 0.5`` a square root; other numeric
    exponents only matter to sizes (``d ** -0.5``), where ``Graph.expr`` reads them."""
    exponent = _arg(node, 1, "exponent")
    if node.kwargs or not is_number(exponent):
        return None
    kinds = {2: "square", 3: "cube", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal", 1: "identity"}
    if exponent in kinds:
        return Op(node, kinds[exponent], (x,))
    return Op(node, "pow", (x, exponent))


def _dropout_op(node: fx.Node, x: Any) -> Op | None:
    """Dropout computes nothing when it is off: ``training=False`` or ``p=0`` (``F.dropout``'s
    ``training`` defaults to True, so ``F.dropout(x, 0.5)`` drops even in eval)."""
    train_key = "train" if node.target is torch.dropout else "training"
    p = _arg(node, 1, "p", 0.5)
    training = _arg(node, 2, train_key, node.target is not torch.dropout)
    return Op(node, "identity", (x,)) if training is False or p == 0 else None


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


def _view_or_attention_op(node: fx.Node, kind: str, x: Any) -> Op | None:
    """Transposes, sizes and SDPA: what attention is written with.

    A permutation that swaps two dims is a transpose; ``x.mT`` and ``x.T`` of a matrix are
    ``transpose(-2, -1)``; ``x.shape`` is ``size`` without a dim (then indexed). SDPA is
    canonical only without a mask, dropout or grouped heads, so such a graph matches nothing
    rather than losing a term.
    """
    if kind == "transpose" and _method_name(node) == "t":
        return Op(node, kind, (x,), {"dims": (-2, -1)})
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
        if sorted(norm) != list(range(len(dims))):
            return None
        if len(moved) != 2:       # any other permutation: a view (of an input, or at the end)
            return Op(node, "view", (x,), {"method": "permute", "args": tuple(dims), "kwargs": {}})
        return Op(node, "transpose", (x,), {"dims": (moved[0], moved[1])})
    if kind == "getattr" and len(node.args) == 2:
        if node.args[1] == "shape":
            return Op(node, "size", (x,), {"dim": None})
        if node.args[1] in ("mT", "T"):
            return Op(node, "transpose", (x,), {"dims": (-2, -1)})
        if node.args[1] in ("values", "indices"):      # of torch.max(x, dim): a (values, indices) pair
            return Op(node, "getitem", (x, 0 if node.args[1] == "values" else 1))
        return Op(node, "meta", (x,)) if node.args[1] in ("dtype", "device", "is_cuda", "ndim") else None
    if kind == "size" and _kwargs_ok(node, {"dim"}):
        dim = _arg(node, 1, "dim")
        return Op(node, kind, (x,), {"dim": dim, "method": _method_name(node)}) \
            if dim is None or as_dim(dim) is not None else None
    if kind == "sdpa" and set(node.kwargs) <= set(SDPA_ARGS) and len(node.args) <= len(SDPA_ARGS):
        given = {name: _arg(node, i, name) for i, name in enumerate(SDPA_ARGS)}
        dropout, causal = given["dropout_p"] or 0.0, given["is_causal"] or False
        if (given["attn_mask"] is not None or dropout != 0 or given["enable_gqa"]
                or not isinstance(causal, bool)):
            return None
        return Op(node, kind, (given["query"], given["key"], given["value"]),
                  {"is_causal": causal, "scale": given["scale"]})
    return None


def _basic_index(index: Any) -> bool:
    """An index that makes a view (ints, slices, None, ``...``), not a gather."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, int | slice) or
               (isinstance(p, fx.Node) and not is_tensor(p)) for p in parts)


def _lossless(source: torch.dtype | None, target: torch.dtype | None) -> bool:
    """Whether a cast keeps every value: the same dtype, or a half type widened to fp32."""
    return source == target or (source in FLOATS and target == torch.float32)


class Graph:
    """The traced reference in canonical form: canonical ops, operand expressions, the traced
    shapes, and what its output is (dtype, and the views that end it)."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module) -> None:
        self.gm = gm
        self.model = model
        self.inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.signature = ", ".join(str(n.target) for n in self.inputs)
        self.alias: dict[fx.Node, Any] = {}
        self.leaves: dict[fx.Node, str] = {}       # views and casts of inputs and parameters
        self.upcast: dict[fx.Node, Any] = {}       # lossless casts among those: what they widen
        self.transposed: dict[fx.Node, tuple[Any, tuple[int, int]]] = {}   # transposed leaves
        self.ops: list[Op] = []
        self.unknown: list[str] = []               # why, for each node no template knows
        self.casts = False
        self.keep_casts = False
        output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.final = output
        self.trailing = self._trailing(output)
        for node in gm.graph.nodes:
            if node.op in ("call_function", "call_method", "call_module"):
                self._add(node)
        self.out = self.resolve(output)
        self.out_dtype = dtype_of(output)
        self.out_shape = self.shape(output)

    @property
    def known(self) -> bool:
        return not self.unknown

    def _trailing(self, output: Any) -> set[fx.Node]:
        """The casts and views the graph ends with: they set the output's dtype and shape. A
        cast there that rounds to a narrower dtype than the output's (``y.half().float()``) is
        not one of them: its rounding shows, so it stays a ``round_*`` op."""
        found: set[fx.Node] = set()
        node, final = output, dtype_of(output)
        while isinstance(node, fx.Node) and node.op != "placeholder":
            op = canon(node, self.gm) if node.op.startswith("call") else None
            if op is None or op.kind not in ("cast", "view", "identity"):
                break
            source, target = dtype_of(op.args[0]), dtype_of(node)
            if op.kind == "cast" and not _lossless(source, target) and target != final \
                    and _lossless(target, final):
                break
            found.add(node)
            node = op.args[0]
        return found

    def _add(self, node: fx.Node) -> None:
        if _is_expression(node):
            return          # sizes and arithmetic on them: expressions (``expr``), not ops
        op = canon(node, self.gm)
        if op is None:
            self.unknown.append(f"{describe(node, self.gm)} ({node.name})")
            return
        if op.kind == "meta":
            return
        if op.kind == "identity":
            self.alias[node] = self.resolve(op.args[0])
            return
        why = None
        if op.kind == "cast":
            why = self._cast(node, op)
        elif op.kind == "view":
            why = self._view(node, op)
        elif op.kind == "getitem" and self.leaf(self.resolve(op.args[0])) is not None and \
                _basic_index(op.args[1]):
            index = self.expr(op.args[1], literal=True)
            if index is None:
                why = "an index computed from values no expression reaches"
            else:
                self.leaves[node] = f"{self.leaf(self.resolve(op.args[0]))}[{index}]"
        elif op.kind == "transpose" and self.leaf(self.resolve(op.args[0])) is not None:
            x, (d0, d1) = self.resolve(op.args[0]), op.attrs["dims"]
            self.leaves[node] = f"{self.leaf(x)}.transpose({d0}, {d1})"
            self.transposed[node] = (x, (d0, d1))
        else:
            self.ops.append(Op(op.node, op.kind, tuple(self.resolve(a) for a in op.args),
                               {k: self.resolve(v) for k, v in op.attrs.items()}))
        if why:
            self.unknown.append(f"{describe(node, self.gm)} ({node.name}): {why}")

    def _cast(self, node: fx.Node, op: Op) -> str | None:
        """Place a dtype cast (see the module's docstring); the reason when no template can
        compute what it asks for."""
        self.casts = True
        x = self.resolve(op.args[0])
        source, target = dtype_of(x), dtype_of(node)
        if target is None or not target.is_floating_point:
            return "a cast to a non-floating dtype"
        if node in self.trailing:
            self.alias[node] = x
            return None
        if target not in FLOATS:
            return f"a cast to {target} (the templates compute in fp32)"
        if self.leaf(x) is not None:
            self.leaves[node] = f"{self.leaf(x)}.to({target})"
            if _lossless(source, target):
                self.upcast[node] = x
        elif _lossless(source, target):
            self.alias[node] = x
        else:
            self.ops.append(Op(node, ROUNDING[target], (x,)))
        return None

    def _view(self, node: fx.Node, op: Op) -> str | None:
        """Place a view: of an input or a parameter, an operand expression; at the end, the
        output's shape; anywhere else it would change how later operands broadcast."""
        x = self.resolve(op.args[0])
        if node in self.trailing:
            self.alias[node] = x
            return None
        base = self.leaf(x)
        if base is None:
            return "a view of a computed value before further ops"
        call = self.call_expr(op.attrs["method"], op.attrs["args"], op.attrs["kwargs"])
        if call is None:
            return "view sizes computed from values no expression reaches"
        self.leaves[node] = f"{base}.{call}"
        return None

    def call_expr(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                  names: dict[fx.Node, str] | None = None) -> str | None:
        """``method(args…)`` as a forward-side expression over the inputs and the model."""
        parts = [self.expr(a, names, literal=True) for a in args]
        keys = {k: self.expr(v, names, literal=True) for k, v in kwargs.items()}
        for i, a in enumerate(args):
            if is_tensor(a):          # view_as/expand_as/type_as(other): the other's leaf
                parts[i] = self.leaf(a) or (names or {}).get(a)
        if any(p is None for p in parts) or any(v is None for v in keys.values()):
            return None
        return f"{method}({', '.join([*parts, *(f'{k}={v}' for k, v in keys.items())])})"

    def resolve(self, value: Any) -> Any:
        return self.alias.get(value, value) if isinstance(value, fx.Node) else value

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype the templates' dots read: that of the largest floating operand, as the
        ops take it (after casts of inputs and parameters)."""
        found: list[tuple[int, torch.dtype]] = []
        for op in self.ops:
            for value in (*op.args, *op.attrs.values()):
                value = self.strip(value)
                meta = _meta(value) if self.leaf(value) is not None else None
                if hasattr(meta, "dtype") and meta.dtype.is_floating_point:
                    found.append((math.prod(meta.shape), meta.dtype))
        if not found:
            metas = [_meta(n) for n in self.inputs]
            found = [(math.prod(m.shape), m.dtype) for m in metas if hasattr(m, "dtype")
                     and m.dtype.is_floating_point]
        return max(found, key=lambda f: f[0])[1] if found else None

    def operand_dtypes(self) -> set[torch.dtype]:
        """The floating dtypes of every tensor operand the ops read, as templates take them."""
        found = set()
        for op in self.ops:
            for value in (*op.args, *op.attrs.values()):
                value = self.strip(value)
                if self.leaf(value) is not None and (dtype := self.value_dtype(value)) is not None \
                        and dtype.is_floating_point:
                    found.add(dtype)
        return found

    def widest_output(self) -> str | None:
        """Set the graph up so that each template stores at least the output's precision: the
        templates store the dtype of an operand, so an output wider than the operands as read
        (a bf16 input widened by ``.float()``, kept fp32 at the end) keeps the casts of inputs
        (``keep_casts``). The reason when even that leaves an operand narrower than the output
        (PyTorch's type promotion: a bf16 input times an fp32 parameter)."""
        narrower = {d for d in self.operand_dtypes() if d != self.out_dtype and _lossless(d, self.out_dtype)}
        if not narrower:
            return None
        self.keep_casts = True
        narrower = {d for d in self.operand_dtypes() if d != self.out_dtype and _lossless(d, self.out_dtype)}
        if narrower:
            return (f"the output is {self.out_dtype} but an operand is {', '.join(sorted(map(str, narrower)))}: "
                    "the templates store an operand's dtype")
        return None

    @property
    def half(self) -> bool:
        return self.dtype in (torch.float16, torch.bfloat16)

    def leaf(self, value: Any) -> str | None:
        """The forward's expression for an input or a parameter, or a view or cast of one
        (None for anything computed)."""
        if isinstance(value, str) and not isinstance(value, Expr) and value.startswith("self."):
            return value
        if not isinstance(value, fx.Node):
            return None
        if value in self.leaves:
            return self.leaves[value]
        if value.op == "placeholder":
            return str(value.target)
        if value.op == "get_attr" and is_tensor(value):
            return f"self.{value.target}"
        return None

    def strip(self, value: Any) -> Any:
        """``value`` without the lossless casts of an input or a parameter that a template
        loading its operands into fp32 makes anyway (``x.float()`` of a bf16 ``x`` is ``x``);
        unless ``keep_casts``: then the template is given the widened operand, and stores the
        wider dtype (``widest_output``)."""
        while not self.keep_casts and isinstance(value, fx.Node) and value in self.upcast:
            value = self.upcast[value]
        return value

    def loaded(self, value: Any) -> str | None:
        """The expression of ``strip(value)`` when it is a leaf."""
        return self.leaf(self.strip(value))

    def value_dtype(self, value: Any) -> torch.dtype | None:
        """The dtype of a node or of a ``self.…`` parameter or buffer."""
        if isinstance(value, str) and value.startswith("self."):
            for get in (self.model.get_parameter, self.model.get_buffer):
                try:
                    return get(value.removeprefix("self.")).dtype
                except AttributeError:
                    continue
            return None
        return dtype_of(value)

    def scalar(self, value: Any, literal: bool = False) -> str | None:
        """A Python number's expression: the model attribute holding it when exactly one does
        (so a constructor argument like ``eps`` follows the instance), else its literal;
        ``literal``: sizes such as -1 and 1 stay literal. An ``Expr`` is its own expression."""
        if isinstance(value, Expr):
            return str(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if literal and value in LITERAL_SIZES:
            return repr(value)
        names = [k for k, v in vars(self.model).items() if not k.startswith("_")
                 and type(v) in (int, float) and v == value]
        return f"self.{names[0]}" if len(names) == 1 else repr(value)

    def expr(self, value: Any, names: dict[fx.Node, str] | None = None, literal: bool = False) -> str | None:
        """A non-tensor value as a forward-side Python expression: numbers (``scalar``), dtypes,
        tuples, slices, and sizes of inputs with arithmetic on them (``x.shape[0] * 2``);
        ``names`` gives expressions for computed tensors whose sizes may be read. None for
        anything that depends on a computed value."""
        if isinstance(value, fx.Node):
            if value in (names or {}):
                return (names or {})[value]
            return None if is_tensor(value) else self._expr_node(value, names)
        if isinstance(value, list | tuple):
            parts = [self.expr(v, names, literal) for v in value]
            return None if any(p is None for p in parts) else f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        if isinstance(value, slice):
            parts = [self.expr(v, names, literal) for v in (value.start, value.stop, value.step)]
            return None if any(p is None for p in parts) else f"slice({', '.join(parts)})"
        if value is None or value is Ellipsis or isinstance(value, bool | str | torch.dtype):
            return repr(value) if not isinstance(value, torch.dtype) else str(value)
        return self.scalar(value, literal)

    def _tensor_expr(self, value: Any, names: dict[fx.Node, str] | None) -> str | None:
        value = self.resolve(value)
        if isinstance(value, fx.Node) and value in (names or {}):
            return (names or {})[value]
        return self.leaf(value)

    def _expr_node(self, node: fx.Node, names: dict[fx.Node, str] | None) -> str | None:
        if node.op == "get_attr":
            return f"self.{node.target}"         # a number the model holds (``self.bn.eps``)
        if node.op == "call_method" and METHODS.get(str(node.target)) == "size":
            base = self._tensor_expr(node.args[0], names)
            dims = [self.expr(a, names) for a in node.args[1:]]
            if base is None or any(d is None for d in dims):
                return None
            method = "shape" if str(node.target) == "size" else f"{node.target}()"
            return f"{base}.{method}" + (f"[{dims[0]}]" if dims else "")
        if node.op != "call_function":
            return None
        if node.target is builtins.getattr and node.args[1] in ("shape", "ndim"):
            base = self._tensor_expr(node.args[0], names)
            return f"{base}.{node.args[1]}" if base is not None else None
        if node.target is operator.getitem:
            base, index = self.expr(node.args[0], names), self.expr(node.args[1], names)
            return f"{base}[{index}]" if base is not None and index is not None else None
        if node.target in EXPRESSION_OPERATORS:
            a, b = (self.expr(v, names) for v in node.args[:2])
            return f"({a} {EXPRESSION_OPERATORS[node.target]} {b})" if a is not None and b is not None else None
        if node.target is operator.neg:
            a = self.expr(node.args[0], names)
            return f"(-{a})" if a is not None else None
        return None

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
        for op in ops:
            if op.kind not in ELEMENTWISE:
                return None
            operands = [self._operand(a, chain, names) for a in op.args]
            if None in operands:
                return None
            value = f"v{len(chain.lines)}"
            template = MORE_ELEMENTWISE.get(op.kind) or [common.UNARY.get(op.kind) or common.BINARY[op.kind]]
            steps = [step.format(*operands, t=f"{value}_") for step in template]
            chain.lines.extend(steps[:-1])
            chain.lines.append(f"{value} = {steps[-1]}")
            names[op.node] = value
            chain.result = value
        return chain

    def _operand(self, value: Any, chain: common.Chain, names: dict[fx.Node, str]) -> str | None:
        """One operand of a chain op: a value computed earlier in the chain, a scalar (number,
        model attribute or size expression: ``s…``) or a tensor loaded from memory (``t…``)."""
        if isinstance(value, fx.Node) and value in names:
            return names[value]
        scalar = self.scalar(value) if not isinstance(value, fx.Node) else \
            (self.expr(value) if not is_tensor(value) else None)
        if scalar is not None:
            chain.scalars.append(scalar)
            return f"s{len(chain.scalars) - 1}"
        tensor = self.loaded(value)
        if tensor is None:
            return None
        if tensor not in chain.tensors:
            chain.tensors.append(tensor)
        return f"t{chain.tensors.index(tensor)}"

    def output_view(self) -> str | None:
        """The calls the graph's trailing views make of the computed output, as forward-side
        method calls to append to ``out`` (``.flatten(1)``), "" when there are none, None
        when one cannot be expressed."""
        names = {self.out: "out"} if isinstance(self.out, fx.Node) else {}
        calls = []
        for node in self.gm.graph.nodes:
            op = canon(node, self.gm) if node in self.trailing else None
            if op is None or op.kind != "view":
                continue
            call = self.call_expr(op.attrs["method"], op.attrs["args"], op.attrs["kwargs"], names)
            if call is None:
                return None
            calls.append(f".{call}")
        return "".join(calls)


def _canon_kind(node: fx.Node, gm: fx.GraphModule) -> str | None:
    op = canon(node, gm) if node.op.startswith("call") else None
    return op.kind if op is not None else None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")[:300]


def _build(source: str, constants: dict[str, Any] | None, device: str) -> tuple[nn.Module, list[Any]]:
    with torch.device(device):
        _, model, inputs = load_reference(source, constants)
    return model.eval(), inputs


def trace(source: str, constants: dict[str, Any] | None = None) -> Graph:
    """The reference's canonical graph at the sizes ``constants`` set, with traced shapes.

    Built and propagated on the meta device first, so that KernelBench's sizes (a 4096 ×
    393216 softmax) cost nothing; a reference that cannot run on meta tensors (``.item()``,
    NumPy inputs) is built again on the CPU. Raises ``NotRecognised`` with the reason."""
    failures = []
    for device in ("meta", "cpu"):
        try:
            model, inputs = _build(source, constants, device)
        except Exception as exc:  # the reference is arbitrary user code
            failures.append(f"building the model and inputs failed: {_first_line(exc)}")
            continue
        try:
            gm = fx.symbolic_trace(model)
        except Exception as exc:
            raise NotRecognised(f"torch.fx cannot trace forward: {_first_line(exc)}") from exc
        why = functionalise(gm)
        if why is not None:
            raise NotRecognised(why)
        gm.recompile()
        try:
            with torch.no_grad():
                ShapeProp(gm).propagate(*inputs)
                if decompose(gm) | explicit_casts(gm):
                    ShapeProp(gm).propagate(*inputs)
        except Exception as exc:
            failures.append(f"running forward on {device} tensors failed: {_first_line(exc)}")
            continue
        return Graph(gm, model)
    raise NotRecognised(failures[-1])
