"""The canonical form of a reference's torch.fx graph, op by op: what ``graph.Graph`` reads.

References write one computation many ways; a matcher (``match``) should see one. So:

- every torch function, tensor method, in-place variant and module call that means the same
  thing (``F.relu``, ``x.relu()``, ``x.relu_()``, ``nn.ReLU(inplace=True)``) is one kind
  (``canon``), and an in-place op's later readers read its result, as they do in eager PyTorch
  (``functionalise``);
- ``dtype=`` on softmax and the reductions is a cast of their input (``explicit_casts``), and
  BatchNorm in eval is the per-channel affine map it computes (``decompose``);
- vector norms and ``F.normalize`` are the reductions they compute (``decompose_norms``);
- elementwise ops beyond the templates' own table carry their Triton expression here
  (``MORE_ELEMENTWISE``), so that any elementwise chain or epilogue takes them.

How casts, views and sizes are placed is ``graph``'s (``Graph``).
"""

from __future__ import annotations

import builtins
import math
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import fx

from kernelabd.propose.templates import common

FUNCTIONS: dict[Any, str] = {
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
    operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div",
    operator.neg: "neg", torch.neg: "neg", torch.relu: "relu", F.relu: "relu",
    torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", F.silu: "silu", torch.tanh: "tanh",
    F.tanh: "tanh", torch.exp: "exp", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt",
    torch.square: "square", operator.pow: "pow", torch.pow: "pow", F.gelu: "gelu",
    torch.softmax: "softmax", F.softmax: "softmax", torch.log_softmax: "log_softmax",
    F.log_softmax: "log_softmax", F.layer_norm: "layer_norm", F.rms_norm: "rms_norm",
    F.group_norm: "group_norm",
    F.max_pool1d: "max_pool", F.max_pool2d: "max_pool", F.max_pool3d: "max_pool", F.avg_pool1d: "avg_pool",
    F.avg_pool2d: "avg_pool", F.avg_pool3d: "avg_pool", F.adaptive_avg_pool1d: "adaptive_avg_pool",
    F.adaptive_avg_pool2d: "adaptive_avg_pool", F.adaptive_avg_pool3d: "adaptive_avg_pool",
    torch.sum: "sum", torch.mean: "mean", torch.amax: "max", torch.max: "max", torch.min: "min",
    torch.amin: "min", torch.logsumexp: "logsumexp",
    torch.matmul: "matmul", torch.mm: "matmul", operator.matmul: "matmul", F.linear: "linear",
    operator.getitem: "getitem", torch.clone: "identity", torch.detach: "identity",
    torch.bmm: "matmul", torch.transpose: "transpose", torch.swapaxes: "transpose",
    torch.swapdims: "transpose", torch.permute: "permute", builtins.getattr: "getattr",
    F.scaled_dot_product_attention: "sdpa", F.conv1d: "conv1d", torch.conv1d: "conv1d",
    F.conv2d: "conv2d", torch.conv2d: "conv2d", F.conv3d: "conv3d", torch.conv3d: "conv3d",
    F.conv_transpose1d: "conv_transpose1d", torch.conv_transpose1d: "conv_transpose1d",
    F.conv_transpose2d: "conv_transpose2d", torch.conv_transpose2d: "conv_transpose2d",
    F.conv_transpose3d: "conv_transpose3d", torch.conv_transpose3d: "conv_transpose3d",
    torch.abs: "abs", torch.log: "log", torch.erf: "erf", torch.reciprocal: "reciprocal",
    F.leaky_relu: "leaky_relu", F.elu: "elu", F.selu: "selu", torch.selu: "selu",
    F.hardtanh: "hardtanh", F.relu6: "relu6", F.hardsigmoid: "hardsigmoid",
    F.hardswish: "hardswish", F.softplus: "softplus", F.softsign: "softsign", F.mish: "mish",
    torch.clamp: "clamp", torch.clip: "clamp", torch.clamp_min: "clamp_min",
    torch.clamp_max: "clamp_max", torch.maximum: "maximum", torch.minimum: "minimum",
    F.dropout: "dropout", torch.dropout: "dropout", F.dropout1d: "dropout", F.dropout2d: "dropout",
    F.dropout3d: "dropout", F.alpha_dropout: "dropout", F.batch_norm: "batch_norm",
    torch.reshape: "view", torch.flatten: "view", torch.unsqueeze: "view", torch.squeeze: "view",
    torch.split: "view", torch.chunk: "view", torch.unbind: "view", torch.narrow: "view",
    torch.select: "view",
    torch.t: "transpose", torch.multiply: "mul", torch.divide: "div", torch.true_divide: "div",
    torch.subtract: "sub", torch.negative: "neg", torch.special.expit: "sigmoid",
    torch.triu: "triu", torch.tril: "tril", torch.cat: "cat", torch.concat: "cat",
    torch.concatenate: "cat", torch.stack: "stack", torch.masked_fill: "masked_fill",
}
METHODS: dict[str, str] = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "relu": "relu",
    "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "square": "square", "pow": "pow", "softmax": "softmax", "log_softmax": "log_softmax",
    "sum": "sum", "mean": "mean", "amax": "max", "max": "max", "min": "min", "amin": "min",
    "logsumexp": "logsumexp",
    "matmul": "matmul", "triu": "triu", "tril": "tril",
    "clone": "identity", "detach": "identity", "contiguous": "identity", "bmm": "matmul",
    "transpose": "transpose", "swapaxes": "transpose", "swapdims": "transpose", "permute": "permute",
    "size": "size", "dim": "size", "numel": "size", "abs": "abs", "log": "log", "erf": "erf",
    "reciprocal": "reciprocal", "clamp": "clamp", "clip": "clamp", "clamp_min": "clamp_min",
    "clamp_max": "clamp_max", "maximum": "maximum", "minimum": "minimum", "t": "transpose",
    "float": "cast", "half": "cast", "bfloat16": "cast", "double": "cast", "to": "cast",
    "type": "cast", "type_as": "cast", "cuda": "cast", "cpu": "cast",
    "view": "view", "reshape": "view", "flatten": "view", "unsqueeze": "view", "squeeze": "view",
    "view_as": "view", "reshape_as": "view", "expand": "view", "expand_as": "view", "unflatten": "view",
    "masked_fill": "masked_fill",
    "split": "view", "chunk": "view", "unbind": "view", "narrow": "view", "select": "view", "unfold": "view",
    "multiply": "mul", "divide": "div", "true_divide": "div", "subtract": "sub", "negative": "neg",
}
MODULES: dict[type, str] = {
    nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu", nn.GELU: "gelu",
    nn.Softmax: "softmax", nn.LogSoftmax: "log_softmax", nn.LayerNorm: "layer_norm",
    nn.RMSNorm: "rms_norm", nn.Linear: "linear", nn.Identity: "identity", nn.Conv1d: "conv1d",
    nn.Conv2d: "conv2d", nn.Conv3d: "conv3d", nn.ConvTranspose1d: "conv_transpose1d",
    nn.ConvTranspose2d: "conv_transpose2d", nn.ConvTranspose3d: "conv_transpose3d",
    nn.LeakyReLU: "leaky_relu", nn.ELU: "elu", nn.SELU: "selu", nn.Hardtanh: "hardtanh",
    nn.ReLU6: "relu6", nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish",
    nn.Softplus: "softplus", nn.Softsign: "softsign", nn.Mish: "mish", nn.Dropout: "dropout",
    nn.Dropout1d: "dropout", nn.Dropout2d: "dropout", nn.Dropout3d: "dropout",
    nn.AlphaDropout: "dropout", nn.BatchNorm1d: "batch_norm", nn.BatchNorm2d: "batch_norm",
    nn.BatchNorm3d: "batch_norm", nn.Flatten: "view", nn.Unflatten: "view", nn.InstanceNorm1d: "instance_norm",
    nn.InstanceNorm2d: "instance_norm", nn.InstanceNorm3d: "instance_norm", nn.GroupNorm: "group_norm",
    nn.MaxPool1d: "max_pool", nn.MaxPool2d: "max_pool", nn.MaxPool3d: "max_pool", nn.AvgPool1d: "avg_pool",
    nn.AvgPool2d: "avg_pool", nn.AvgPool3d: "avg_pool", nn.AdaptiveAvgPool1d: "adaptive_avg_pool",
    nn.AdaptiveAvgPool2d: "adaptive_avg_pool", nn.AdaptiveAvgPool3d: "adaptive_avg_pool",
}
POOL_DIMS: dict[type | Any, int] = {
    nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3, nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3,
    nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2, nn.AdaptiveAvgPool3d: 3,
    F.max_pool1d: 1, F.max_pool2d: 2, F.max_pool3d: 3, F.avg_pool1d: 1, F.avg_pool2d: 2, F.avg_pool3d: 3,
    F.adaptive_avg_pool1d: 1, F.adaptive_avg_pool2d: 2, F.adaptive_avg_pool3d: 3,
}
"""Spatial axes of each pooling module and function."""
POOL_ARGS = {"max_pool": ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
             "avg_pool": ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                          "divisor_override"),
             "adaptive_avg_pool": ("input", "output_size")}
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
POSITIONAL: dict[str, list[str]] = {
    "triu": ["tl.where(_col - _row >= {1}, {0}, 0.0)"],
    "tril": ["tl.where(_col - _row <= {1}, {0}, 0.0)"],
}
"""Elementwise ops whose result depends on the element's place in a matrix (``{1}`` the
diagonal): a chain takes them only where the kernel knows its elements' rows and columns
(``_row``, ``_col``: a matmul's output tile), never on a flat index."""
ZEROED_TILE: dict[str, str] = {
    "triu": "n0 + BLOCK_N - 1 - m0 < {1}",
    "tril": "n0 - m0 - BLOCK_M + 1 > {1}",
}
"""Where a positional op zeroes the whole ``BLOCK_M × BLOCK_N`` output tile at ``(m0, n0)``:
when it is the chain's last op, that tile's product is never read, and its K loop is skipped
(half the tiles of a square ``triu(a @ b)``)."""
REDUCTIONS = {"sum", "mean", "max", "min", "logsumexp"}
# keyword arguments that do not change what an op computes
HARMLESS_KWARGS = {"inplace", "_stacklevel", "non_blocking", "copy", "memory_format"}
EXPRESSION_OPERATORS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
                        operator.floordiv: "//", operator.mod: "%", operator.pow: "**"}
EXPRESSION_FUNCTIONS = {math.sqrt: "math.sqrt", math.log: "math.log", math.log2: "math.log2",
                        math.exp: "math.exp", math.ceil: "math.ceil", math.floor: "math.floor",
                        builtins.float: "float", builtins.int: "int", builtins.abs: "abs"}
"""One-argument functions of sizes (``1 / math.sqrt(q.size(-1))``) a forward recomputes as it
is written: every candidate file imports ``math``."""
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
CONV_TRANSPOSE_ARGS = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
CONVS = {f"conv{t}{n}d": (n, bool(t)) for n in (1, 2, 3) for t in ("", "_transpose")}
"""Each convolution kind: its spatial axes, and whether it is transposed."""
# positional settings of the elementwise ops that take them, with PyTorch's defaults
SETTINGS: dict[str, tuple[tuple[str, float], ...]] = {
    "leaky_relu": (("negative_slope", 0.01),), "elu": (("alpha", 1.0),),
    "hardtanh": (("min_val", -1.0), ("max_val", 1.0)), "softplus": (("beta", 1.0), ("threshold", 20.0)),
}
PARAMETRISED = {*SETTINGS, "relu6", "clamp", "clamp_min", "clamp_max"}
ROUNDING = {torch.bfloat16: "round_bf16", torch.float16: "round_fp16"}
FLOATS = (torch.float16, torch.bfloat16, torch.float32)   # what the templates load and store
PRECISION = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}   # significand bits
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


def arg_of(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
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
    """Whether every keyword is one the op's template honours (``dtype`` and ``out`` only when
    None)."""
    return all(k in allowed | HARMLESS_KWARGS or (k in ("dtype", "out") and v is None)
               for k, v in node.kwargs.items())


def meta_of(value: Any) -> Any:
    return value.meta.get("tensor_meta") if isinstance(value, fx.Node) else None


def dtype_of(value: Any) -> torch.dtype | None:
    meta = meta_of(value)
    return meta.dtype if hasattr(meta, "dtype") else None


def is_tensor(value: Any) -> bool:
    return isinstance(value, fx.Node) and "tensor_meta" in value.meta


def is_expression(node: fx.Node) -> bool:
    """Whether a node computes a Python value from sizes (``x.size(0) * 2``, ``x.shape[1:]``),
    which the forward recomputes as an expression, rather than a tensor."""
    if is_tensor(node):
        return False
    if node.op == "call_method":
        return METHODS.get(str(node.target)) == "size"
    return node.op == "call_function" and (node.target in EXPRESSION_OPERATORS or node.target in (
        operator.getitem, builtins.getattr, operator.neg) or node.target in EXPRESSION_FUNCTIONS)


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
        shape = meta_of(node.args[0]).shape if meta_of(node.args[0]) is not None else None
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


NORM_ARGS = {torch.norm: ("p", "fro"), torch.linalg.vector_norm: ("ord", 2), "norm": ("p", "fro")}
"""Vector norms by target (a method by name), with the name and default of their order argument;
each then takes ``dim`` and ``keepdim``."""


def _norm_target(node: fx.Node) -> Any:
    if node.op == "call_function" and node.target in NORM_ARGS:
        return node.target
    return "norm" if node.op == "call_method" and node.target == "norm" else None


def _norm_of(graph: fx.Graph, x: Any, order: Any, dim: Any, keepdim: bool, ndim: int) -> fx.Node | None:
    """``‖x‖`` as the reduction it is: ``sqrt(sum(x²))`` (order 2, ``"fro"``), ``sum(|x|)``
    (1) or ``amax(|x|)`` (∞) over ``dim`` (every dim when None); None for any other order."""
    dims = tuple(range(ndim)) if dim is None else dim
    if order in (2, 2.0, "fro", None):
        reduced = graph.call_function(torch.sum, (graph.call_function(operator.mul, (x, x)), dims, keepdim))
        return graph.call_function(torch.sqrt, (reduced,))
    if order in (1, 1.0):
        return graph.call_function(torch.sum, (graph.call_function(torch.abs, (x,)), dims, keepdim))
    if order == math.inf:
        return graph.call_function(torch.amax, (graph.call_function(torch.abs, (x,)), dims, keepdim))
    return None


def _norm_node(graph: fx.Graph, node: fx.Node) -> fx.Node | None:
    """The reduction replacing a ``torch.norm``/``Tensor.norm``/``linalg.vector_norm`` or
    ``F.normalize`` node (``x / max(‖x‖, eps)``), inserted before it; None where it is not one
    of those or its arguments are not plain."""
    normalize = node.op == "call_function" and node.target is F.normalize
    target = None if normalize else _norm_target(node)
    x = node.args[0] if node.args else None
    shape = getattr(meta_of(x), "shape", None)
    if shape is None or (target is None and not normalize):
        return None
    if normalize:
        if not _kwargs_ok(node, {"p", "dim", "eps"}):
            return None
        order, dim, eps = (arg_of(node, 1, "p", 2.0), arg_of(node, 2, "dim", 1), arg_of(node, 3, "eps", 1e-12))
        norm = _norm_of(graph, x, order, dim, True, len(shape)) if is_number(eps) else None
        if norm is None:
            return None
        return graph.call_function(operator.truediv, (x, graph.call_function(torch.clamp_min, (norm, eps))))
    name, default = NORM_ARGS[target]
    if not _kwargs_ok(node, {name, "dim", "keepdim"}):
        return None
    return _norm_of(graph, x, arg_of(node, 1, name, default), arg_of(node, 2, "dim"),
                    bool(arg_of(node, 3, "keepdim", False)), len(shape))


def rewrite(gm: fx.GraphModule, replacement: Callable[[fx.Graph, fx.Node], fx.Node | None]) -> bool:
    """Each node for which ``replacement`` (called with the graph's insertion point before the
    node) builds a replacement, replaced by it. True if it changed the graph (shapes then need
    propagating again)."""
    changed = False
    for node in list(gm.graph.nodes):
        with gm.graph.inserting_before(node):
            new = replacement(gm.graph, node)
        if new is None:
            continue
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def decompose_norms(gm: fx.GraphModule) -> bool:
    """Vector norms and ``F.normalize`` as the reductions and elementwise ops they compute
    (KernelBench's ``x / torch.norm(x, p=2, dim=1, keepdim=True)``), so that the reduction and
    pipeline templates take them. True if it changed the graph."""
    return rewrite(gm, _norm_node)


def _settings(node: fx.Node, kind: str, module: nn.Module | None) -> tuple[Any, ...] | None:
    """The scalar settings of a parametrised elementwise op, as numbers or ``Expr`` reading
    the module attribute that holds them (None when one is not a number)."""
    out: list[Any] = []
    for i, (name, default) in enumerate(SETTINGS[kind]):
        if module is not None:
            value = getattr(module, name)
            out.append(Expr(f"self.{node.target}.{name}") if is_number(value) else None)
        else:
            out.append(arg_of(node, i + 1, name, default))
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
        lo = arg_of(node, 1, "min") if kind != "clamp_max" else None
        hi = arg_of(node, 2 if kind == "clamp" else 1, "max") if kind != "clamp_min" else None
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
    if kind in POOL_ARGS:
        if len(node.args) != 1 or node.kwargs:
            return None
        return _pool_op(node, kind, POOL_DIMS[type(module)], {k: getattr(module, k, None) for k in POOL_ARGS[kind][1:]})
    if kind == "group_norm":
        return Op(node, kind, (x,), {"groups": f"{path}.num_groups", "eps": f"{path}.eps",
                                     "weight": f"{path}.weight" if module.affine else None,
                                     "bias": f"{path}.bias" if module.affine else None})
    if kind == "linear":
        return Op(node, kind, (x,), {"weight": f"{path}.weight",
                                     "bias": f"{path}.bias" if module.bias is not None else None})
    if kind in CONVS:
        # the geometry is read from the module at run time (``self.conv.stride``), so it follows
        # the instance; groups and padding mode are checked here, at trace time, by the matcher.
        # A transposed module called with an ``output_size`` is not this op.
        dims, transposed = CONVS[kind]
        if len(node.args) != 1 or node.kwargs:
            return None
        return Op(node, kind, (x,), {"weight": f"{path}.weight",
                                     "bias": f"{path}.bias" if module.bias is not None else None,
                                     "stride": f"{path}.stride", "padding": f"{path}.padding",
                                     "dilation": f"{path}.dilation", "groups": module.groups,
                                     "groups_expr": f"{path}.groups", "padding_mode": module.padding_mode,
                                     "dims": dims, "transposed": transposed,
                                     "output_padding": f"{path}.output_padding" if transposed else None})
    if kind == "dropout":
        return Op(node, "identity", (x,)) if not module.training else None
    if kind == "view" and isinstance(module, nn.Flatten):
        return Op(node, "view", (x,), {"method": "flatten", "args": (module.start_dim, module.end_dim)})
    if kind == "view":
        return Op(node, "view", (x,), {"method": "unflatten", "args": (module.dim, tuple(module.unflattened_size))})
    if kind == "batch_norm":
        return None         # in training mode (``decompose`` took the eval ones)
    if kind == "instance_norm":
        return _instance_norm_op(node, module, x)
    return _elementwise_op(node, kind, x, module)


def _instance_norm_op(node: fx.Node, module: nn.Module, x: Any) -> Op | None:
    """InstanceNorm without affine parameters, on its own statistics (the default): a LayerNorm
    over every dim after the channels, without weight or bias. With ``affine`` the scale is per
    channel, which a LayerNorm's weight over the normalised dims is not."""
    shape = meta_of(x).shape if meta_of(x) is not None else None
    uses_running = module.track_running_stats and not module.training
    if module.affine or uses_running or shape is None or len(shape) < 3:
        return None
    return Op(node, "layer_norm", (x,), {"ndim": len(shape) - 2, "eps": f"self.{node.target}.eps",
                                         "weight": None, "bias": None})


CONCATS = ("cat", "stack")
"""The kinds the concatenation template computes (``torch.stack`` adds the dim it joins on)."""


def _concat_op(node: fx.Node, kind: str) -> Op | None:
    """``torch.cat(tensors, dim)`` and its kin: the tensors are the op's arguments, so that a
    graph reads each as any op's operand (a pipeline's stage result, an input)."""
    tensors, dim = arg_of(node, 0, "tensors"), arg_of(node, 1, "dim", 0)
    if not isinstance(tensors, list | tuple) or not tensors or as_dim(dim) is None \
            or not _kwargs_ok(node, {"tensors", "dim"}):
        return None
    return Op(node, kind, tuple(tensors), {"dim": as_dim(dim)})


def canon(node: fx.Node, gm: fx.GraphModule) -> Op | None:
    """The canonical op of a call node, or None when no template knows it."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        kind = MODULES.get(type(module))
        return _module_op(node, module, kind) if kind else None
    if node.op == "call_function" and node.target is torch.tensor:
        return _number_tensor(node)
    if node.op == "call_function":
        kind = FUNCTIONS.get(node.target) or IN_PLACE_FUNCTIONS.get(node.target)
    else:
        name = str(node.target)
        kind = METHODS.get(name) or (METHODS.get(name[:-1]) if name.endswith("_") else None)
    if kind is None:
        return None
    if kind in CONCATS:
        return _concat_op(node, kind)
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
    if kind in ("softmax", "log_softmax") and _kwargs_ok(node, {"dim"}):
        return Op(node, kind, (x,), {"dim": as_dim(arg_of(node, 1, "dim"))})
    if kind in ("max", "min") and len(node.args) == 2 and is_tensor(node.args[1]):
        return Op(node, "maximum" if kind == "max" else "minimum", tuple(node.args))   # torch.max(a, b)
    if kind in REDUCTIONS and _kwargs_ok(node, {"dim", "keepdim"}):
        return Op(node, kind, (x,), {"dim": as_dim(arg_of(node, 1, "dim")), "dims": arg_of(node, 1, "dim"),
                                     "keepdim": bool(arg_of(node, 2, "keepdim", False))})
    if kind in POSITIONAL:
        diagonal = arg_of(node, 1, "diagonal", 0)
        return Op(node, kind, (x, diagonal)) if isinstance(diagonal, int) and _kwargs_ok(node, {"diagonal"}) else None
    if kind == "matmul":
        return Op(node, kind, (node.args[0], node.args[1]))
    if kind == "masked_fill" and _kwargs_ok(node, {"mask", "value"}):
        return Op(node, kind, (x, arg_of(node, 1, "mask")), {"value": arg_of(node, 2, "value")})
    if kind == "getitem":
        return Op(node, kind, (x, node.args[1]))
    if kind == "linear":
        return Op(node, kind, (x,), {"weight": arg_of(node, 1, "weight"), "bias": arg_of(node, 2, "bias")})
    if kind == "layer_norm":
        shape = arg_of(node, 1, "normalized_shape")
        return Op(node, kind, (x,), {"ndim": len(shape) if isinstance(shape, list | tuple) else 1,
                                     "weight": arg_of(node, 2, "weight"), "bias": arg_of(node, 3, "bias"),
                                     "eps": arg_of(node, 4, "eps", 1e-5)})
    if kind == "rms_norm":
        shape = arg_of(node, 1, "normalized_shape")
        return Op(node, kind, (x,), {"ndim": len(shape) if isinstance(shape, list | tuple) else 1,
                                     "weight": arg_of(node, 2, "weight"),
                                     "eps": arg_of(node, 3, "eps") or "torch.finfo(x.dtype).eps"})
    if kind in POOL_ARGS:
        names = POOL_ARGS[kind]
        if set(node.kwargs) - set(names) or len(node.args) > len(names):
            return None
        given = {name: arg_of(node, i, name) for i, name in enumerate(names) if i}
        return _pool_op(node, kind, POOL_DIMS[node.target], given)
    if kind == "group_norm":
        return Op(node, kind, (x,), {"groups": arg_of(node, 1, "num_groups"), "weight": arg_of(node, 2, "weight"),
                                     "bias": arg_of(node, 3, "bias"), "eps": arg_of(node, 4, "eps", 1e-5)})
    if kind in CONVS:
        return _conv_op(node, kind)
    if kind == "dropout":
        return _dropout_op(node, x)
    if kind in ("cast", "view"):
        return Op(node, kind, (x,), {"method": _method_name(node), "args": tuple(node.args[1:]),
                                     "kwargs": dict(node.kwargs)})
    return _view_or_attention_op(node, kind, x)


def _method_name(node: fx.Node) -> str:
    return str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")


def _pow_op(node: fx.Node, x: Any) -> Op | None:
    """``x ** 2`` and ``x ** 3`` are products, ``x ** 0.5`` a square root; other numeric
    exponents only matter to sizes (``d ** -0.5``), where ``Graph.expr`` reads them."""
    exponent = arg_of(node, 1, "exponent")
    if node.kwargs or not is_number(exponent):
        return None
    kinds = {2: "square", 3: "cube", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal", 1: "identity"}
    if exponent in kinds:
        return Op(node, kinds[exponent], (x,))
    return Op(node, "pow", (x, exponent))


def _number_tensor(node: fx.Node) -> Op | None:
    """``torch.tensor(0.5, device=x.device)`` in forward, a 0-d operand (``torch.min(x,
    torch.tensor(v))``): PyTorch's promotion treats it as the number it holds, so it is that
    number; any other tensor made in forward is not a template's operand."""
    value = node.args[0] if len(node.args) == 1 else None
    dtype = node.kwargs.get("dtype")
    if not is_number(value) or set(node.kwargs) - {"device", "dtype"} \
            or dtype not in (None, torch.float32, torch.float64):
        return None
    return Op(node, "identity", (float(value) if dtype is not None else value,))


def _sizes(value: Any, dims: int) -> tuple[int, ...] | None:
    """A pooling size given as an int or a tuple of ``dims`` ints, as that tuple."""
    if as_dim(value) is not None:
        return (as_dim(value),) * dims
    if isinstance(value, list | tuple) and len(value) == dims and all(as_dim(v) is not None for v in value):
        return tuple(value)
    return None


def _pool_op(node: fx.Node, kind: str, dims: int, given: dict[str, Any]) -> Op | None:
    """A pooling as its geometry (literal: the window unrolls), or a global average pool
    (``AdaptiveAvgPool2d(1)``) as the mean over the spatial dims it is; None for what the pool
    template does not port (indices, a divisor override, other adaptive sizes, and ``ceil_mode``
    of an average, whose divisor then counts a clipped window)."""
    x = node.args[0] if node.args else node.kwargs.get("input")
    if kind == "adaptive_avg_pool":
        if _sizes(given.get("output_size"), dims) != (1,) * dims:
            return None
        return Op(node, "mean", (x,), {"dim": None, "dims": tuple(range(-dims, 0)), "keepdim": True})
    window = _sizes(given.get("kernel_size"), dims)
    stride = window if given.get("stride") in (None, [], ()) else _sizes(given.get("stride"), dims)
    padding = _sizes(given.get("padding") or 0, dims)
    dilation = _sizes(given.get("dilation") or 1, dims)
    ceil = bool(given.get("ceil_mode"))
    if window is None or stride is None or padding is None or dilation is None or (ceil and kind != "max_pool") \
            or given.get("return_indices") or given.get("divisor_override") is not None:
        return None
    count = given.get("count_include_pad")
    return Op(node, kind, (x,), {"dims": dims, "kernel": window, "stride": stride, "padding": padding,
                                 "dilation": dilation, "count_include_pad": True if count is None else bool(count),
                                 "ceil_mode": ceil})


def _dropout_op(node: fx.Node, x: Any) -> Op | None:
    """Dropout computes nothing when it is off: ``training=False`` or ``p=0`` (``F.dropout``'s
    ``training`` defaults to True, so ``F.dropout(x, 0.5)`` drops even in eval)."""
    train_key = "train" if node.target is torch.dropout else "training"
    p = arg_of(node, 1, "p", 0.5)
    training = arg_of(node, 2, train_key, node.target is not torch.dropout)
    return Op(node, "identity", (x,)) if training is False or p == 0 else None


def _geometry_literal(value: Any, dims: int, strings: tuple[str, ...] = ()) -> str | None:
    """A conv stride/padding/dilation given in the graph as an int, a tuple of ``dims`` ints or
    (padding only) "same"/"valid", as a Python literal; None for anything computed in the
    forward."""
    if isinstance(value, str):
        return repr(value) if value in strings else None
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if as_dim(value) is not None:
        return repr(value)
    if isinstance(value, list | tuple) and len(value) == dims and all(as_dim(v) is not None for v in value):
        return repr(tuple(value))
    return None


def _conv_op(node: fx.Node, kind: str) -> Op | None:
    """``F.conv*d(input, weight, bias, stride, padding, dilation, groups)`` or
    ``F.conv_transpose*d(input, weight, bias, stride, padding, output_padding, groups,
    dilation)``: the geometry must be literal in the graph (fx inlines numbers the forward reads
    from attributes)."""
    dims, transposed = CONVS[kind]
    names = CONV_TRANSPOSE_ARGS if transposed else CONV_ARGS
    if set(node.kwargs) - set(names) or len(node.args) > len(names):
        return None
    given = {name: arg_of(node, i, name) for i, name in enumerate(names)}
    stride = _geometry_literal(1 if given["stride"] is None else given["stride"], dims)
    padding = _geometry_literal(0 if given["padding"] is None else given["padding"], dims,
                                () if transposed else ("same", "valid"))
    dilation = _geometry_literal(1 if given["dilation"] is None else given["dilation"], dims)
    output_padding = (_geometry_literal(0 if given.get("output_padding") is None else given["output_padding"], dims)
                      if transposed else None)
    groups = 1 if given["groups"] is None else given["groups"]
    if (stride is None or padding is None or dilation is None or as_dim(groups) is None
            or (transposed and output_padding is None)):
        return None
    return Op(node, kind, (given["input"],),
              {"weight": given["weight"], "bias": given["bias"], "stride": stride, "padding": padding,
               "dilation": dilation, "groups": groups, "groups_expr": repr(groups), "padding_mode": "zeros",
               "dims": dims, "transposed": transposed, "output_padding": output_padding})


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
        d0, d1 = as_dim(arg_of(node, 1, "dim0")), as_dim(arg_of(node, 2, "dim1"))
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
        dim = arg_of(node, 1, "dim")
        return Op(node, kind, (x,), {"dim": dim, "method": _method_name(node)}) \
            if dim is None or as_dim(dim) is not None else None
    if kind == "sdpa" and set(node.kwargs) <= set(SDPA_ARGS) and len(node.args) <= len(SDPA_ARGS):
        given = {name: arg_of(node, i, name) for i, name in enumerate(SDPA_ARGS)}
        dropout, causal = given["dropout_p"] or 0.0, given["is_causal"] or False
        if (given["attn_mask"] is not None or dropout != 0 or given["enable_gqa"]
                or not isinstance(causal, bool)):
            return None
        return Op(node, kind, (given["query"], given["key"], given["value"]),
                  {"is_causal": causal, "scale": given["scale"]})
    return None


def basic_index(index: Any) -> bool:
    """An index that makes a view (ints, slices, None, ``...``), not a gather."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, int | slice) or
               (isinstance(p, fx.Node) and not is_tensor(p)) for p in parts)


def lossless(source: torch.dtype | None, target: torch.dtype | None) -> bool:
    """Whether a cast keeps every value: the same dtype, or a half type widened to fp32."""
    return source == target or (source in FLOATS and target == torch.float32)
