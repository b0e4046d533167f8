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

The op-by-op forms are ``canon``'s; this module places casts, views and sizes and holds the
graph as matchers read it.

A node no template knows makes the graph unknown, with that node and its op as the reason
(``Graph.unknown``), so that a matcher never silently drops part of the computation.

The reference is untrusted code: ``trace`` runs only in the recognition subprocess
(``kernelabd.propose.template.recognise``), under its deadline, never in the worker.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from kernelabd.harness.problem import one_line
from kernelabd.propose.template import sized
from kernelabd.propose.template.canon import (
    ELEMENTWISE,
    EXPRESSION_FUNCTIONS,
    EXPRESSION_OPERATORS,
    FLOATS,
    LITERAL_SIZES,
    METHODS,
    MORE_ELEMENTWISE,
    POSITIONAL,
    PRECISION,
    ROUNDING,
    ZEROED_TILE,
    Expr,
    NotRecognised,
    Op,
    basic_index,
    canon,
    decompose,
    decompose_norms,
    describe,
    dtype_of,
    explicit_casts,
    functionalise,
    is_expression,
    is_tensor,
    lossless,
    meta_of,
)
from kernelabd.propose.template.einsum import decompose_einsum
from kernelabd.propose.template.transformer import decompose_encoders, decompose_mha
from kernelabd.propose.templates import common
from kernelabd.service.capture import load_reference

FX_CONSTANT = "_tensor_constant"   # how torch.fx's tracer names the tensors it meets in forward
RESHAPED = {"view": "reshape", "view_as": "reshape_as"}
"""Views written as reshapes in operand expressions: the same view wherever ``view`` would
succeed, and a copy where the reference made one with ``.contiguous()``, which is an alias here
(ShuffleNet's channel shuffle: ``x.view(…).transpose(1, 2).contiguous().view(…)``)."""
REWRITES = (decompose_encoders, decompose_mha, decompose, decompose_norms, decompose_einsum, explicit_casts)
"""The graph rewrites, in order, shapes propagated again after each that changes the graph (the
next reads the shapes of what it made)."""
RENAMED = "_in"
"""The suffix of the inputs' names in a candidate whose operands are expressions over them."""


class Graph:
    """The traced reference in canonical form: canonical ops, operand expressions, the traced
    shapes, and what its output is (dtype, and the views that end it)."""

    def __init__(self, gm: fx.GraphModule, model: nn.Module, rename: bool = False) -> None:
        self.gm = gm
        self.model = model
        self.inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # with operand expressions (``a.to(torch.float32)``), the inputs get names no template
        # uses for its locals, so that an expression a template evaluates after rebinding ``a``
        # still reads the input (the forward is called positionally)
        self.names = {n: f"{n.target}{RENAMED}" if rename else str(n.target) for n in self.inputs}
        self.signature = ", ".join(self.names.values())
        self.alias: dict[fx.Node, Any] = {}
        self.leaves: dict[fx.Node, str] = {}       # views and casts of inputs and parameters
        self.upcast: dict[fx.Node, Any] = {}       # lossless casts among those: what they widen
        self.transposed: dict[fx.Node, tuple[Any, tuple[int, int]]] = {}   # transposed leaves
        self.ops: list[Op] = []
        self.unknown: list[str] = []               # why, for each node no template knows
        self.inner_views: list[fx.Node] = []       # among those, views of computed values
        self.causal_masks: set[fx.Node] = set()    # constants that hide the keys after each query
        self.casts = False
        self.keep_casts = False
        output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.final = output
        self.trailing = self._trailing(output)
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                self._constant(node)
            elif node.op in ("call_function", "call_method", "call_module"):
                self._add(node)
        self.out = self.resolve(output)
        self.out_dtype = dtype_of(output)
        self.out_shape = self.shape(output)

    @property
    def known(self) -> bool:
        return not self.unknown

    @property
    def cuttable(self) -> bool:
        """Whether what no template knows is only views of computed values mid-graph: cut
        there, such a view is a view of a stage's input, which a pipeline's next stage reads
        like any operand view (``pipeline``)."""
        return len(self.unknown) == len(self.inner_views)

    def _trailing(self, output: Any) -> set[fx.Node]:
        """The casts and views (transposes too) the graph ends with: they set the output's
        dtype, shape and strides, and are made on the computed result. A
        cast there that rounds to a narrower dtype than the output's (``y.half().float()``) is
        not one of them: its rounding shows, so it stays a ``round_*`` op."""
        found: set[fx.Node] = set()
        node, final = output, dtype_of(output)
        while isinstance(node, fx.Node) and node.op != "placeholder":
            op = canon(node, self.gm) if node.op.startswith("call") else None
            if op is None or op.kind not in ("cast", "view", "identity", "transpose"):
                break
            source, target = dtype_of(op.args[0]), dtype_of(node)
            if op.kind == "cast" and not lossless(source, target) and target != final \
                    and lossless(target, final):
                break
            found.add(node)
            node = op.args[0]
        return found

    def _constant(self, node: fx.Node) -> None:
        """A tensor fx made while tracing (``torch.tensor(self.c)`` in forward becomes an
        attribute ``_tensor_constant0`` of the traced model, which the candidate's model, built by
        the reference's constructor, does not have): one element is the number it holds;
        anything larger no template reads."""
        if not str(node.target).startswith(FX_CONSTANT) or not is_tensor(node):
            return
        value = getattr(self.gm, str(node.target), None)
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type != "meta":
            self.alias[node] = value.item()
        elif isinstance(value, torch.Tensor) and causal_mask(value):
            self.causal_masks.add(node)
        else:
            self.unknown.append(f"a tensor constant made in forward ({node.name})")

    def _add(self, node: fx.Node) -> None:
        if is_expression(node):
            return          # sizes and arithmetic on them: expressions (``expr``), not ops
        op = canon(node, self.gm)
        if op is None:
            self.unknown.append(f"{describe(node, self.gm)} ({node.name})")
            return
        if op.kind == "meta":
            return
        if op.kind == "identity" or (op.kind == "transpose" and node in self.trailing):
            self.alias[node] = self.resolve(op.args[0])
            return
        why = None
        if op.kind == "masked_fill":
            why = self._masked_fill(node, op)
        elif op.kind == "cast":
            why = self._cast(node, op)
        elif op.kind == "view":
            why = self._view(node, op)
        elif op.kind == "getitem" and self.leaf(self.resolve(op.args[0])) is not None and \
                basic_index(op.args[1]):
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

    def _masked_fill(self, node: fx.Node, op: Op) -> str | None:
        """``scores.masked_fill(mask, -inf)`` with a causal mask (``causal_mask``) is causal
        attention's masking, an op ``causal`` that attention reads; any other mask is a
        gather of values no template makes."""
        x, mask = (self.resolve(a) for a in op.args)
        value = op.attrs["value"]
        if mask not in self.causal_masks or not (isinstance(value, float) and value == -math.inf):
            return "a mask other than a causal one filled with -inf"
        shape, hidden = self.shape(x), self.shape(mask)
        if not shape or len(shape) < 2 or not hidden or tuple(hidden[-2:]) != tuple(shape[-2:]):
            return "a causal mask that does not span the scores' last two dims"
        self.ops.append(Op(node, "causal", (x,), {}))
        return None

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
            if lossless(source, target):
                self.upcast[node] = x
        elif lossless(source, target):
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
            self.inner_views.append(node)
            return "a view of a computed value before further ops"
        call = self.view_call(op)
        if call is None:
            return "view sizes computed from values no expression reaches"
        self.leaves[node] = f"{base}.{call}"
        return None

    def view_call(self, op: Op, names: dict[fx.Node, str] | None = None) -> str | None:
        """A view op as a forward-side call, ``view`` written as ``reshape`` (``RESHAPED``)."""
        method = op.attrs["method"]
        return self.call_expr(RESHAPED.get(method, method), op.attrs["args"], op.attrs["kwargs"], names)

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
                meta = meta_of(value) if self.leaf(value) is not None else None
                if hasattr(meta, "dtype") and meta.dtype.is_floating_point:
                    found.append((math.prod(meta.shape), meta.dtype))
        if not found:
            metas = [meta_of(n) for n in self.inputs]
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

    def stored_dtype(self) -> torch.dtype | None:
        """The precision the reference's result keeps: the narrowest of the computed value's
        dtype and of the casts the graph ends with (``softmax(x.float()).to(x.dtype)`` keeps
        bf16; ``(a.half() @ b.half()).float()`` keeps fp16; ``log_softmax(x, dtype=float32)``
        fp32). A template storing that dtype, then converted to the output's, returns what the
        reference returns."""
        dtypes = [dtype_of(self.out), *(dtype_of(n) for n in self.trailing if canon(n, self.gm).kind == "cast")]
        known = [d for d in dtypes if d in PRECISION]
        return min(known, key=PRECISION.__getitem__) if known else self.out_dtype

    def widest_output(self) -> str | None:
        """Set the graph up so that each template stores at least ``stored_dtype``'s precision:
        the templates store the dtype of an operand, so a result wider than the operands as read
        (a bf16 input widened by ``.float()`` and returned as fp32) keeps the casts of inputs
        (``keep_casts``). The reason when even that leaves an operand narrower than the result
        (PyTorch's type promotion: a bf16 input times an fp32 parameter)."""
        stored = self.stored_dtype()
        if stored not in PRECISION:
            return None
        for keep in (False, True):
            self.keep_casts = keep
            narrower = {d for d in self.operand_dtypes() if PRECISION.get(d, 99) < PRECISION[stored]}
            if not narrower:
                return None
        return (f"the result is {stored} but an operand is {', '.join(sorted(map(str, narrower)))}: "
                "the templates store an operand's dtype")

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
            return self.names[value]
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
        """A Python number's expression: the model attribute of its type holding it when exactly
        one does (so a constructor argument like ``eps`` follows the instance), else its literal;
        ``literal``: sizes such as -1 and 1 stay literal. An ``Expr`` is its own expression."""
        if isinstance(value, Expr):
            return str(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if literal and value in LITERAL_SIZES:
            return repr(value)
        names = [k for k, v in vars(self.model).items() if not k.startswith("_")
                 and type(v) is type(value) and v == value]
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

    def _index(self, value: Any, names: dict[fx.Node, str] | None) -> str | None:
        """A dim or an index (``x.shape[2]``, ``x.size(0)``): a number there is where to look,
        never a model attribute that happens to equal it."""
        return repr(value) if isinstance(value, int) else self.expr(value, names, literal=True)

    def _expr_node(self, node: fx.Node, names: dict[fx.Node, str] | None) -> str | None:
        if node.op == "placeholder":
            return self.names[node]              # a number the forward is given (``A * s``)
        if node.op == "get_attr":
            return f"self.{node.target}"         # a number the model holds (``self.bn.eps``)
        if node.op == "call_method" and METHODS.get(str(node.target)) == "size":
            base = self._tensor_expr(node.args[0], names)
            dims = [self._index(a, names) for a in node.args[1:]]
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
            base, index = self.expr(node.args[0], names), self._index(node.args[1], names)
            return f"{base}[{index}]" if base is not None and index is not None else None
        if node.target in EXPRESSION_OPERATORS:
            a, b = (self.expr(v, names) for v in node.args[:2])
            return f"({a} {EXPRESSION_OPERATORS[node.target]} {b})" if a is not None and b is not None else None
        if node.target is operator.neg:
            a = self.expr(node.args[0], names)
            return f"(-{a})" if a is not None else None
        if node.target in EXPRESSION_FUNCTIONS and len(node.args) == 1 and not node.kwargs:
            a = self.expr(node.args[0], names)
            return f"{EXPRESSION_FUNCTIONS[node.target]}({a})" if a is not None else None
        return None

    def shape(self, value: Any) -> tuple[int, ...] | None:
        if isinstance(value, fx.Node) and "tensor_meta" in value.meta:
            meta = value.meta["tensor_meta"]           # a tuple of them for (values, indices)
            return tuple(meta.shape) if hasattr(meta, "shape") else None
        if isinstance(value, str):
            return tuple(self.model.get_parameter(value.removeprefix("self.")).shape)
        return None

    def chain(self, ops: list[Op], chain: common.Chain, names: dict[fx.Node, str],
              positions: bool = False) -> common.Chain | None:
        """``ops`` as Triton statements appended to ``chain``; None if one is not elementwise
        (nor ``POSITIONAL`` where the kernel knows ``positions``: rows and columns) or takes an
        operand from outside (a value computed by something else)."""
        for op in ops:
            positional = positions and op.kind in POSITIONAL
            if op.kind not in ELEMENTWISE and not positional:
                return None
            operands = [self._operand(a, chain, names) for a in op.args]
            if None in operands:
                return None
            chain.positional |= positional
            chain.zeroed_tile = ZEROED_TILE[op.kind].format(*operands) if positional else None
            value = f"v{len(chain.lines)}"
            template = (MORE_ELEMENTWISE.get(op.kind) or POSITIONAL.get(op.kind)
                        or [common.UNARY.get(op.kind) or common.BINARY[op.kind]])
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
            if op is None or op.kind not in ("view", "transpose"):
                continue
            call = self.view_call(op, names) if op.kind == "view" else "transpose({}, {})".format(*op.attrs["dims"])
            if call is None:
                return None
            calls.append(f".{call}")
        return "".join(calls)


def causal_mask(value: torch.Tensor) -> bool:
    """Whether ``value`` hides exactly the keys after each query: a bool tensor of ones over
    leading dims ``(1, …, 1, M, N)`` with ``value[i, j] = j > i`` (``tril(ones) == 0``),
    PyTorch's top-left aligned causal mask."""
    if value.dtype != torch.bool or value.dim() < 2 or value.device.type == "meta" \
            or any(d != 1 for d in value.shape[:-2]):
        return False
    rows, cols = value.shape[-2:]
    return bool(torch.equal(value.reshape(rows, cols), torch.ones(rows, cols, dtype=torch.bool).triu(1)))


def _canon_kind(node: fx.Node, gm: fx.GraphModule) -> str | None:
    op = canon(node, gm) if node.op.startswith("call") else None
    return op.kind if op is not None else None




def _build(source: str, constants: dict[str, Any] | None, device: str) -> tuple[nn.Module, list[Any]]:
    with torch.device(device):
        _, model, inputs = load_reference(source, constants)
    return model.eval(), inputs


def trace(source: str, constants: dict[str, Any] | None = None) -> Graph:
    """The reference's canonical graph at the sizes ``constants`` set, with traced shapes.

    Built and propagated on the meta device first, so that KernelBench's sizes (a 4096 ×
    393216 softmax) cost nothing; a reference that cannot run on meta tensors (``.item()``,
    NumPy inputs) is built again on the CPU. A forward that torch.fx cannot trace because its
    Python reads sizes is traced at the given sizes (``sized``). Where tracing makes tensors
    from buffers (a causal mask sliced from one), it runs on a CPU build, so that they keep
    their values, and the graph then moves to the meta device. Raises ``NotRecognised`` with
    the reason."""
    failures = []
    for device in ("meta", "cpu"):
        try:
            model, inputs = _build(source, constants, device)
        except Exception as exc:  # the reference is arbitrary user code
            failures.append(f"building the model and inputs failed: {one_line(exc, 300)}")
            continue
        try:
            gm = _symbolic(model, inputs)
        except Exception as exc:
            gm, model, inputs = _sized(source, constants, exc)
        else:
            if device == "meta" and any(_mask_like(v) for v in _constants(gm).values()):
                model, inputs = _build(source, constants, "cpu")
                gm, model, inputs = _to_meta(_symbolic(model, inputs), model, inputs)
        why = functionalise(gm)
        if why is not None:
            raise NotRecognised(why)
        gm.recompile()
        try:
            with torch.no_grad(), _constants_on(gm, inputs):
                ShapeProp(gm).propagate(*inputs)
                for rewritten in REWRITES:
                    if rewritten(gm):
                        ShapeProp(gm).propagate(*inputs)
        except Exception as exc:
            failures.append(f"running forward on {device} tensors failed: {one_line(exc, 300)}")
            continue
        g = Graph(gm, model)
        return Graph(gm, model, rename=True) if g.leaves else g
    raise NotRecognised(failures[-1])


def _symbolic(model: nn.Module, inputs: list[Any]) -> fx.GraphModule:
    """``fx.symbolic_trace``, the forward's parameters past the inputs bound to their defaults."""
    gm = fx.symbolic_trace(model, concrete_args=sized.defaults(model, len(inputs)))
    sized.drop_defaults(gm.graph, len(inputs))
    gm.recompile()
    return gm


def _sized(source: str, constants: dict[str, Any] | None,
           failure: Exception) -> tuple[fx.GraphModule, nn.Module, list[Any]]:
    """The reference built on the CPU and traced at its sizes (``sized.trace``), then moved to
    the meta device (``_to_meta``). ``failure`` is symbolic tracing's, the reason given when
    this fails too."""
    why = f"torch.fx cannot trace forward: {one_line(failure, 300)}"
    try:
        model, inputs = _build(source, constants, "cpu")
        gm = sized.trace(model, inputs)
    except sized.Unrolled as exc:
        raise NotRecognised(f"{why}; traced at its sizes, {exc}") from exc
    except Exception as exc:
        raise NotRecognised(why) from exc
    return _to_meta(gm, model, inputs)


def _mask_like(value: torch.Tensor) -> bool:
    """A meta tensor constant that may be a causal mask, whose values only a CPU build has."""
    return value.device.type == "meta" and value.dtype == torch.bool and value.dim() >= 2


def _to_meta(gm: fx.GraphModule, model: nn.Module,
             inputs: list[Any]) -> tuple[fx.GraphModule, nn.Module, list[Any]]:
    """A CPU-built graph, its model and inputs moved to the meta device, so that propagating
    shapes costs nothing; the tensor constants tracing made keep their values."""
    real = _constants(gm)
    model.to("meta")
    gm.to("meta")
    for name, value in real.items():
        setattr(gm, name, value)
    return gm, model, [x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs]


def _constants(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    """The tensors fx made attributes of ``gm`` while tracing (a plain attribute or a buffer)."""
    found = {**vars(gm), **gm._buffers}
    return {name: value for name, value in found.items()
            if name.startswith(FX_CONSTANT) and isinstance(value, torch.Tensor)}


@contextmanager
def _constants_on(gm: fx.GraphModule, inputs: list[Any]) -> Iterator[None]:
    """The tensor constants of ``gm`` on the inputs' device while shapes propagate (a sized
    trace's real constants among meta inputs), their own values afterwards."""
    device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), None)
    saved = {name: value for name, value in _constants(gm).items() if value.device != device}
    for name, value in saved.items():
        setattr(gm, name, value.to(device))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(gm, name, value)
