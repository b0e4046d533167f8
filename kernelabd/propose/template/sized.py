"""Tracing a forward whose Python reads its tensors' sizes.

torch.fx's symbolic tracer hands ``x.size()`` back as a proxy, so a forward that slices with a
size (minGPT's causal mask ``self.bias[:, :, :T, :T]``), passes one to ``range`` or indexes a
tuple with it cannot be traced. This tracer carries each proxy's example value beside it (a
meta tensor, or a tuple of them) so that sizes, ``dim()``, ``dtype`` and lengths are plain
numbers while tracing. The graph is then specialised to the traced sizes, as a port generated
for those sizes is, and the gate runs the reference at the same sizes. It is the fallback
where ``fx.symbolic_trace`` fails, never the first try: a symbolic graph keeps its size
arithmetic as expressions that follow the shapes a gate tries.

Example values are computed on the meta device whatever the model's device is, so tracing
costs no arithmetic; tensors the forward computes from real buffers without touching an input
(the mask ``self.bias[…] == 0``) stay real constants of the graph, with their values.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch import fx

MAX_CALLS = 64
"""The most calls of one module a traced graph may hold: more is a loop over a size unrolled
(an RNN's steps), a graph of that many stages that the pipeline search would take past its
deadline to cut, and launches one after another where eager's are no fewer."""

MAX_NODES = 4096
"""The most nodes a traced graph may hold, for loops whose steps call functions, not modules."""


class Unrolled(Exception):
    """The forward, traced at its sizes, repeats a module more than ``MAX_CALLS`` times or makes
    more than ``MAX_NODES`` ops."""


class _Unknown(Exception):
    """An argument's example value is not known: the node gets none."""


def _meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


class SizedProxy(fx.Proxy):
    """A proxy that knows its example value: sizes read off it are numbers, not nodes."""

    value: Any = None

    def _tensor(self) -> torch.Tensor | None:
        return self.value if isinstance(self.value, torch.Tensor) else None

    def size(self, dim: int | None = None) -> Any:
        if (t := self._tensor()) is None:
            return self.tracer.create_proxy("call_method", "size", (self,) if dim is None else (self, dim), {})
        return t.size() if dim is None else t.size(dim)

    def dim(self) -> Any:
        if (t := self._tensor()) is None:
            return self.tracer.create_proxy("call_method", "dim", (self,), {})
        return t.dim()

    def numel(self) -> Any:
        if (t := self._tensor()) is None:
            return self.tracer.create_proxy("call_method", "numel", (self,), {})
        return t.numel()

    @property
    def shape(self) -> Any:
        if (t := self._tensor()) is None:
            return self.tracer.create_proxy("call_function", getattr, (self, "shape"), {})
        return t.shape

    @property
    def ndim(self) -> Any:
        return self.dim()

    @property
    def dtype(self) -> Any:
        if (t := self._tensor()) is None:
            return self.tracer.create_proxy("call_function", getattr, (self, "dtype"), {})
        return t.dtype

    @property
    def device(self) -> Any:
        return _Device(self, "device")

    def __len__(self) -> int:
        if isinstance(self.value, (tuple, list)):
            return len(self.value)
        if (t := self._tensor()) is not None and t.dim() > 0:
            return t.shape[0]
        return super().__len__()

    def __iter__(self) -> Any:
        if isinstance(self.value, (tuple, list)):
            return iter([self[i] for i in range(len(self.value))])
        return super().__iter__()


class _Device(fx.proxy.Attribute):
    """``x.device``: an argument like any attribute (``torch.zeros(n, device=x.device)``), but
    compared with another traced tensor's device as equal, which they are in any forward that
    runs (NetVLAD checks ``x.device != self.clusters.device`` before it computes)."""

    def __eq__(self, other: object) -> Any:
        return True if isinstance(other, _Device) else super().__eq__(other)

    def __ne__(self, other: object) -> Any:
        return False if isinstance(other, _Device) else super().__ne__(other)

    __hash__ = fx.proxy.Attribute.__hash__


class SizedTracer(fx.Tracer):
    """``fx.Tracer`` whose proxies are ``SizedProxy``: each node's example value is the op run
    on its arguments' example values (placeholders' are given), or unknown where that fails."""

    def __init__(self, examples: dict[str, Any]) -> None:
        super().__init__()
        self.examples = examples
        self.computing = False     # while an example runs: modules and attributes are plain Python

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.computing:
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self.computing:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return SizedProxy(node, self)

    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     name: str | None = None, type_expr: Any | None = None, proxy_factory_fn: Any = None) -> Any:
        rv = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if isinstance(rv, SizedProxy):
            self.computing = True
            try:
                rv.value = self._example(kind, target, args, kwargs)
            except Exception:  # the reference is arbitrary code: an op meta tensors cannot run
                rv.value = None
            finally:
                self.computing = False
        return rv

    def _value(self, arg: Any) -> Any:
        if isinstance(arg, SizedProxy):
            if arg.value is None:
                raise _Unknown(arg.node.name)
            return arg.value
        if isinstance(arg, fx.proxy.Attribute):
            return getattr(self._value(arg.root), arg.attr)
        return _meta(arg)

    def _example(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kind == "placeholder":
            return self.examples.get(target)
        if kind == "get_attr":
            return _meta(_attribute(self.root, target))
        a = fx.node.map_aggregate(args, self._value)
        k = fx.node.map_aggregate(kwargs, self._value)
        if kind == "call_function":
            return target(*a, **k)
        if kind == "call_method":
            return getattr(a[0], target)(*a[1:], **k)
        if kind == "call_module":
            module = self.root.get_submodule(target)
            with _on_meta(module):
                return module.forward(*a, **k)
        return None


@contextmanager
def _on_meta(module: nn.Module) -> Iterator[None]:
    """``module``'s parameters and buffers swapped for meta copies, for one example run."""
    saved = []
    for m in module.modules():
        for store in (m._parameters, m._buffers):
            for name, tensor in store.items():
                if tensor is not None:
                    saved.append((store, name, tensor))
                    store[name] = _meta(tensor)
    try:
        yield
    finally:
        for store, name, tensor in saved:
            store[name] = tensor


def _attribute(root: nn.Module, target: str) -> Any:
    value: Any = root
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


def trace(model: nn.Module, inputs: list[Any]) -> fx.GraphModule:
    """``model``'s forward traced at the sizes of ``inputs`` (their meta copies are the example
    values), as a GraphModule over ``model``."""
    tracer = SizedTracer({name: _meta(x) for name, x in zip(_argument_names(model), inputs, strict=False)})
    graph = tracer.trace(model, concrete_args=defaults(model, len(inputs)))
    drop_defaults(graph, len(inputs))
    calls = Counter(str(n.target) for n in graph.nodes if n.op == "call_module")
    if calls and max(calls.values()) > MAX_CALLS:
        name, count = calls.most_common(1)[0]
        raise Unrolled(f"it calls {name} {count} times at the traced sizes (a loop over a size, unrolled)")
    if len(graph.nodes) > MAX_NODES:
        raise Unrolled(f"it makes {len(graph.nodes)} ops at the traced sizes (a loop over a size, unrolled)")
    return fx.GraphModule(tracer.root, graph, model.__class__.__name__)


def defaults(model: nn.Module, given: int) -> dict[str, Any] | None:
    """The forward's parameters past the ``given`` inputs, at their defaults (NetVLAD's
    ``mask=None``): traced as those values, so that ``if mask is not None`` takes the branch
    the reference runs."""
    params = list(inspect.signature(model.forward).parameters.values())[given:]
    bound = {p.name: p.default for p in params if p.default is not p.empty
             and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return bound or None


def drop_defaults(graph: fx.Graph, given: int) -> None:
    """The placeholders past the ``given`` inputs (those ``defaults`` bound), and fx's checks of
    their values, out of ``graph``: the candidate's forward takes the inputs the reference is
    called with."""
    bound = [n for n in graph.nodes if n.op == "placeholder"][given:]
    for node in list(graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none" \
                and node.args and node.args[0] in bound:
            graph.erase_node(node)
    for node in bound:
        if not node.users:
            graph.erase_node(node)


def _argument_names(model: nn.Module) -> list[str]:
    return [p.name for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
