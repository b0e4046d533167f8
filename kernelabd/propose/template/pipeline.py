"""Graphs no single template covers, as a pipeline of templates: the graph is cut after one of
its ops into a head that one template computes whole (a convolution or matmul with its
elementwise epilogue) and a tail that reads the head's result as its first input and is again
one template or a pipeline (``conv → softmax → sigmoid``: the convolution with its epilogue,
the softmax, then the elementwise chain). Each stage stores its result and the next loads it,
so a pipeline moves more bytes than one fused kernel would; what it buys is the head's
algorithm (3xTF32 tensor-core products in place of fp32 FMA ones), which dominates the time of
the graphs KernelBench's level 2 is made of.

A cut is valid only where the tail needs nothing the head computes but its result (inputs,
parameters and sizes of inputs it reads itself, and the results of earlier stages: every
stage's result is stored, so ``x - x.mean(1, keepdim=True)`` after a matmul is the matmul, the
mean of its result, then an elementwise stage reading both). The longest head that one
template matches is tried first: fewer, larger stages store fewer intermediates.

The stages' sources are composed into one candidate (``compose``): every module-level name of a
stage after the first takes a prefix ``s{i}_`` (kernels, helpers and tunables alike, so the
tuner sees each stage's parameters apart), ``TUNABLES`` and ``STARTS`` are merged, and the
stages' ``ModelNew`` methods become methods of one ``ModelNew`` with the reference's
constructor, whose forward calls the stages in order.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from kernelabd.propose.template.canon import ELEMENTWISE, POSITIONAL, Op
from kernelabd.propose.template.graph import Graph
from kernelabd.propose.template.match import Match
from kernelabd.pysource import parse

STAGE_INPUT = "stage_in"
"""The tail's first input: the head's result (a name no template uses for its locals)."""
STAGE_RESULT = "stage_v"
"""``stage_v{i}``: a later stage's input that is stage ``i``'s result (``v{i}`` in the composed
forward), where a tail reads its head's input too."""
DECLARATIONS = ("TUNABLES", "RESOURCES", "STARTS")
"""The module-level literals the tuner reads, merged across stages rather than renamed."""

MAX_STARTS = 16
"""The most starts a pipeline declares one stage at a time: the tuner screens every start
before its own search, and each start of a whole network is full (every tunable set), so a
GoogLeNet's 70 stages declared 2.4 MB of them; past this, stages' starts are taken together."""

Finder = Callable[[Graph], Match | None]


def sub_graph(g: Graph, gm: fx.GraphModule) -> Graph:
    """A canonical graph of part of ``g``, its inputs renamed as ``trace`` renames them where
    operands are expressions: a stage is given inputs it may not read (the reference's, beside
    its predecessor's result), whose names must not be a template's locals."""
    return Graph(gm, g.model, rename=True)


class _Part(fx.GraphModule):
    """A stage's graph: read, matched and at most interpreted (``fx.Interpreter``), never
    called, so the Python code fx regenerates on each change is never generated: a deep
    network's search built hundreds of them, and spent half its time in that code."""

    def recompile(self) -> None:   # type: ignore[override]
        return None


def _module(g: Graph, graph: fx.Graph) -> fx.GraphModule:
    """``graph`` over the reference's modules and parameters, without the nodes it does not use."""
    gm = _Part(g.gm, graph)
    gm.graph.eliminate_dead_code()
    return gm


def _copy_until(g: Graph, at: fx.Node) -> fx.GraphModule:
    """The reference's nodes up to ``at``, which the graph returns: the head."""
    head, env = fx.Graph(), {}
    for node in g.gm.graph.nodes:
        env[node] = head.node_copy(node, lambda a: env[a])
        if node is at:
            break
    head.output(env[at])
    return _module(g, head)


def _copy_after(g: Graph, at: fx.Node, depth: int) -> fx.GraphModule:
    """Every node but ``at``, whose value is the new first input: the tail.
    ``g`` is stage ``depth``'s graph on: its own first input (stage ``depth - 1``'s result) is
    dropped where the tail does not read it, else kept as ``stage_v{depth - 1}``."""
    tail = fx.Graph()
    first = tail.placeholder(f"{STAGE_INPUT}_next")
    first.meta = dict(at.meta)
    env: dict[fx.Node, fx.Node] = {at: first}
    for node in g.gm.graph.nodes:
        if node is not at:
            env[node] = tail.node_copy(node, lambda a: env[a])
    gm = _module(g, tail)
    inputs = {n.target: n for n in gm.graph.nodes if n.op == "placeholder"}
    if STAGE_INPUT in inputs:
        if inputs[STAGE_INPUT].users:
            inputs[STAGE_INPUT].target = f"{STAGE_RESULT}{depth - 1}"
        else:
            gm.graph.erase_node(inputs[STAGE_INPUT])
    inputs[f"{STAGE_INPUT}_next"].target = STAGE_INPUT
    return gm


MAX_HEAD_ANCHORS = 4
"""The most ops that are not elementwise a head may hold: no template computes more (a gated
MLP's three products, attention's two products and softmax), so longer heads are not built.
Without the bound a network's search built every prefix of every tail: GoogLeNet's took 250 s."""


def _anchors(op: Op) -> int:
    return 0 if op.kind in ELEMENTWISE or op.kind in POSITIONAL else 1


def _tail_reads(at: fx.Node, roots: list[fx.Node]) -> set[fx.Node]:
    """The nodes ``roots`` (the output and every op with effects) depend on other than through
    ``at``: those a tail cut after ``at`` keeps once its dead code is eliminated (found without
    building it)."""
    seen, stack = {at}, [r for r in roots if r is not at]
    seen.update(stack)
    while stack:
        node = stack.pop()
        for arg in node.all_input_nodes:
            if arg not in seen:
                seen.add(arg)
                stack.append(arg)
    seen.discard(at)
    return seen


def cuts(g: Graph) -> list[int]:
    """The ``k`` (longest head first) after whose ``k``-th op ``g`` may be cut: the tail needs
    no value the head computes but its result, and the head holds at most
    ``MAX_HEAD_ANCHORS`` ops that are not elementwise."""
    found, anchors = [], 0
    roots = [n for n in g.gm.graph.nodes if n.is_impure()]     # the output, placeholders, effects
    for k, op in enumerate(g.ops[:-1], start=1):
        anchors += _anchors(op)
        if anchors > MAX_HEAD_ANCHORS:
            break
        reads = _tail_reads(op.node, roots)
        if not any(earlier.node in reads for earlier in g.ops[:k - 1]):
            found.append(k)
    return found[::-1]


def head(g: Graph, k: int) -> Graph:
    """The head of ``g`` cut after its ``k``-th op (one of ``cuts``)."""
    return sub_graph(g, _copy_until(g, g.ops[k - 1].node))


def tail(g: Graph, k: int, depth: int = 0) -> Graph:
    """The tail of ``g`` (stage ``depth``'s graph on) cut after its ``k``-th op (one of ``cuts``)."""
    return sub_graph(g, _copy_after(g, g.ops[k - 1].node, depth))


def find(g: Graph, whole: Finder, failed: set[tuple[str, ...]] | None = None,
         depth: int = 0) -> list[tuple[Graph, Match]] | None:
    """The stages of ``g`` (stage ``depth`` on): the one template ``whole`` finds for it, else
    the longest head ``whole`` matches followed by the tail's own stages; None when no cut gives
    a pipeline. The tail is built only behind a head that matched. ``failed`` remembers the
    tails (by their ops' node names) that have none, so that a long elementwise run, every
    prefix of which is a head, is not searched again from each."""
    failed = set() if failed is None else failed
    key = tuple(op.node.name for op in g.ops)
    found = whole(g) if g.known else None
    if found is not None:
        return [(g, found)]
    if key in failed:
        return None
    for k in cuts(g):
        first = head(g, k)
        if not first.known or first.widest_output() is not None:
            continue
        matched = whole(first)
        if matched is None:
            continue
        rest = tail(g, k, depth)
        found_rest = None if rest.widest_output() is not None else find(rest, whole, failed, depth + 1)
        if found_rest is not None:
            return [(first, matched), *found_rest]
    failed.add(key)
    return None


def rematch(plan: tuple[Graph, ...], whole: Finder) -> list[tuple[Graph, Match]] | None:
    """The stages of a pipeline found before (``plan``: its stage graphs) matched again, with
    other settings (the fallback's IEEE dots): no search; None if a stage no longer matches."""
    stages = [(part, whole(part)) for part in plan]
    return None if any(m is None for _, m in stages) else stages  # type: ignore[return-value]


@dataclass
class _Stage:
    """One stage's source taken apart: imports, declarations (renamed), module body (renamed)
    and its ``ModelNew`` classes."""

    imports: list[str] = field(default_factory=list)
    declared: dict[str, Any] = field(default_factory=dict)
    body: list[ast.stmt] = field(default_factory=list)
    classes: list[ast.ClassDef] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    key: str | None = None


def _assigned(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _locals(fn: ast.FunctionDef) -> set[str]:
    """The names a function binds (its parameters and whatever it assigns anywhere), which
    shadow module-level names throughout its body."""
    args = fn.args
    found = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                             *([args.vararg] if args.vararg else []), *([args.kwarg] if args.kwarg else [])]}
    declared: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            found.add(node.id)
        elif (isinstance(node, ast.ExceptHandler) and node.name) or (isinstance(node, ast.FunctionDef)
                                                                     and node is not fn):
            found.add(node.name)
        elif isinstance(node, ast.Global):
            declared.update(node.names)
    return found - declared


class _Rename(ast.NodeTransformer):
    """Module-level names renamed wherever they are read as such: not where a function's own
    binding shadows them (a kernel's ``BLOCK_M: tl.constexpr`` parameter keeps its name, the
    launch's ``BLOCK_M=BLOCK_M`` reads the renamed global)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names, self.shadowed = names, set()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args.defaults = [self.visit(d) for d in node.args.defaults]
        outer, self.shadowed = self.shadowed, self.shadowed | _locals(node)
        node.body = [self.visit(s) for s in node.body]
        self.shadowed = outer
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names and node.id not in self.shadowed:
            node.id = self.names[node.id]
        return node


def _reads(fn: ast.FunctionDef) -> set[str]:
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _shared_key(body: list[ast.stmt], tunables: set[str]) -> str | None:
    """A stage's module body as text, its tunables' assignments left out: stages with equal
    keys define the same kernels and helpers, and share one copy (``_share``). None where a
    function reads a tunable as a global: shared, it would tie two stages' settings."""
    kept = []
    for node in body:
        if isinstance(node, ast.Assign) and _assigned(node) and _assigned(node)[0] in tunables:
            continue
        if isinstance(node, ast.FunctionDef) and tunables & (_reads(node) - _locals(node)):
            return None
        kept.append(ast.unparse(node))
    return "\n".join(kept)


def _share(stage: _Stage, owner: _Stage) -> None:
    """``stage`` reads ``owner``'s kernels and helpers, keeping only its own tunables: each
    kernel of a network's repeated blocks is defined, and compiled, once (a ResNet's 3×3
    convolutions are a few kernels, not one a block)."""
    tunables = set(stage.declared.get("TUNABLES", {}))
    own = {stage.names[n] for n in tunables if n in stage.names}
    stage.body = [node for node in stage.body if _assigned(node) and _assigned(node)[0] in own]
    renamer = _Rename({stage.names[n]: owner.names.get(n, n) for n in stage.names if n not in tunables})
    stage.classes = [renamer.visit(node) for node in stage.classes]


def _stage(source: str, i: int) -> _Stage:
    tree, stage = parse(source), _Stage()
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) \
        and isinstance(tree.body[0].value, ast.Constant) else tree.body
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            stage.imports.append(ast.unparse(node))
        elif isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            stage.classes.append(node)
        elif isinstance(node, ast.Assign) and _assigned(node)[0] in DECLARATIONS and len(_assigned(node)) == 1:
            stage.declared[_assigned(node)[0]] = ast.literal_eval(node.value)
        else:
            stage.body.append(node)
    stage.key = _shared_key(stage.body, set(stage.declared.get("TUNABLES", {})))
    if i:
        stage.names = {n: f"s{i}_{n}" for node in stage.body for n in _assigned(node)}
        renamer = _Rename(stage.names)
        stage.body = [renamer.visit(node) for node in stage.body]
        for node in stage.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                node.name = stage.names[node.name]
        stage.classes = [renamer.visit(node) for node in stage.classes]
    return stage


class _Methods(ast.NodeTransformer):
    """A stage's method bodies in the composed class: ``self.m`` of a stage method is its
    renamed most-derived definition, ``super().m`` the definition it overrides."""

    def __init__(self, final: dict[str, str], base: dict[str, str]) -> None:
        self.final, self.base = final, base

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        value = node.value
        if isinstance(value, ast.Name) and value.id == "self" and node.attr in self.final:
            node.attr = self.final[node.attr]
        elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
              and not value.args and node.attr in self.base):
            return ast.Attribute(ast.Name("self", ast.Load()), self.base[node.attr], node.ctx)
        return node


def _methods(stage: _Stage, i: int) -> tuple[list[ast.FunctionDef], ast.FunctionDef | None, str]:
    """The stage's methods renamed ``_s{i}[_{j}]_{name}`` (j: the j-th class of its chain of
    ``ModelNew`` subclasses), its ``__init__`` (calling them by their new names) and its
    forward's new name."""
    final: dict[str, str] = {}
    chain: list[tuple[ast.ClassDef, dict[str, str]]] = []
    for j, cls in enumerate(stage.classes):
        names = {f.name: f"_s{i}{f'_{j}' if j else ''}_{f.name}" for f in cls.body
                 if isinstance(f, ast.FunctionDef) and f.name != "__init__"}
        chain.append((cls, dict(final)))
        final.update(names)
    out: list[ast.FunctionDef] = []
    init = None
    for j, (cls, base) in enumerate(chain):
        for f in cls.body:
            if not isinstance(f, ast.FunctionDef):
                continue
            if f.name == "__init__":      # it may call the reference's helper methods, renamed too
                init = init or _Methods(final, base).visit(f)
                continue
            own = f"_s{i}{f'_{j}' if j else ''}_{f.name}"
            f = _Methods(final, base).visit(f)
            f.name = own
            out.append(f)
    return out, init, final["forward"]


def _merged(stages: list[_Stage]) -> dict[str, Any]:
    """One ``TUNABLES`` (every stage's, renamed), the first stage's ``RESOURCES`` that has one
    (the head's: its tile is what can overflow), and ``STARTS``: each stage's known-good starts
    with the other stages at their current values, or past ``MAX_STARTS`` in all, start ``j``
    setting every stage to its ``j``-th."""
    tunables: dict[str, Any] = {}
    current: dict[str, Any] = {}
    resources = None
    for stage in stages:
        names = stage.names
        tunables.update({names.get(k, k): v for k, v in stage.declared.get("TUNABLES", {}).items()})
        for node in stage.body:
            if isinstance(node, ast.Assign) and len(_assigned(node)) == 1 and _assigned(node)[0] in tunables:
                current[_assigned(node)[0]] = ast.literal_eval(node.value)
        if resources is None and "RESOURCES" in stage.declared:
            resources = _renamed_strings(stage.declared["RESOURCES"], names)
    own = [[{s.names.get(k, k): v for k, v in start.items()} for start in s.declared.get("STARTS", [])]
           for s in stages]
    if sum(map(len, own)) <= MAX_STARTS:
        starts = [{**current, **start} for stage in own for start in stage]
    else:
        starts = [{**current, **{k: v for stage in own if j < len(stage) for k, v in stage[j].items()}}
                  for j in range(max(map(len, own)))]
    merged: dict[str, Any] = {"TUNABLES": tunables}
    if resources is not None:
        merged["RESOURCES"] = resources
    if starts:
        merged["STARTS"] = starts
    return merged


def _renamed_strings(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [_renamed_strings(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _renamed_strings(v, names) for k, v in value.items()}
    return value


def _stage_args(g: Graph, i: int, reference: dict[str, str]) -> list[str]:
    """Stage ``i``'s forward arguments, in its graph's input order: the stage before's result,
    earlier stages' results it reads, and the reference's inputs (``reference``: by name)."""
    def value(target: str) -> str:
        if target == STAGE_INPUT:
            return f"v{i - 1}"
        return f"v{target.removeprefix(STAGE_RESULT)}" if target.startswith(STAGE_RESULT) else reference[target]
    return [value(str(n.target)) for n in g.inputs]


def compose(stages: list[tuple[Graph, Match]], signature: str) -> Match:
    """One candidate computing the stages in order; ``signature`` is the reference forward's.
    Its class keeps the first stage's class attributes (the reference's, which its constructor
    may read)."""
    parts = [_stage(m.source, i) for i, (_, m) in enumerate(stages)]
    owners: dict[str, _Stage] = {}
    for part in parts:
        if part.key is not None and part.key in owners:
            _share(part, owners[part.key])
        elif part.key is not None:
            owners[part.key] = part
    imports = list(dict.fromkeys(line for p in parts for line in p.imports))
    methods, calls, init = [], [], None
    args = [a.strip() for a in signature.split(",") if a.strip()]
    reference = dict(zip((str(n.target) for n in stages[0][0].inputs), args, strict=True))
    for i, part in enumerate(parts):
        own, stage_init, forward = _methods(part, i)
        methods += own
        init = init or stage_init
        value = ", ".join(_stage_args(stages[i][0], i, reference))
        calls.append(f"v{i} = self.{forward}({value})")
    assert init is not None, "every template's ModelNew copies the reference's constructor"
    edits = [m.edit.removeprefix("template: ") for _, m in stages]
    doc = "Template pipeline, each stage's result stored and read by the next: " + "; then ".join(edits) + "."
    lines = [f'"""{doc}"""', *imports, ""]
    lines += [f"{k} = {v!r}" for k, v in _merged(parts).items()]
    lines += [ast.unparse(node) for part in parts for node in part.body]
    forward = f"def forward(self, {signature}):\n" + "".join(f"    {c}\n" for c in calls) + \
        f"    return v{len(parts) - 1}\n"
    attributes = [n for n in parts[0].classes[0].body if isinstance(n, ast.Assign | ast.AnnAssign)]
    cls = ast.ClassDef(name="ModelNew", bases=[parse("nn.Module").body[0].value], keywords=[],
                       body=[*attributes, init, *methods, *parse(forward).body], decorator_list=[])
    lines.append(ast.unparse(ast.fix_missing_locations(cls)))
    dots = next((m.dots for _, m in stages if m.dots), None)
    return Match("\n\n".join(lines) + "\n", "template: pipeline of " + " → ".join(edits), dots,
                 tuple(part for part, _ in stages))
