"""``torch.einsum`` of two operands as the product it is: permutes and flattens of each operand,
one ``torch.matmul``, and a permute of the result, so that the matmul template (and its 3xTF32
dots, its epilogues) takes a contraction written as an equation (KernelBench's
``einsum("bijl,lk->bijk", A, B)``, attention's ``"bhqd,bhkd->bhqk"``).

An equation is a product when each index is of one of four kinds: in both operands and the
output (a batch dim), in one operand and the output (that operand's free dims), in both operands
and not the output (contracted). The operands are laid out as ``(batch…, free_a…, contracted…)``
and ``(batch…, contracted…, free_b)``, the contracted dims flattened into one ``K``; the product's
dims are then ``(batch…, free_a…, free_b)``, permuted to the output's order. Whatever does not fit
that (a diagonal ``"ii->i"``, an index summed in one operand alone, an outer product, several free
dims of the second operand, several free dims of the first beside batch dims, sizes that
broadcast) stays an einsum, which no template knows.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
from torch import fx

from kernelabd.propose.template.canon import meta_of, rewrite


@dataclass(frozen=True)
class Plan:
    """How an einsum of two operands is a matmul: each operand's permutation (None: as given) and
    the dims its contracted run starts and ends at (flattened when they differ), then the
    result's permutation."""
    perm_a: tuple[int, ...] | None
    flat_a: tuple[int, int]
    perm_b: tuple[int, ...] | None
    flat_b: tuple[int, int]
    perm_out: tuple[int, ...] | None


def _terms(equation: str, ndims: tuple[int, int]) -> tuple[str, str, str] | None:
    """The two input terms and the output term with every ellipsis written out as letters no
    term uses (aligned from the right, as broadcasting aligns them) and the implicit output
    (the indices seen once, in alphabetical order, after the ellipsis dims) made explicit."""
    equation = equation.replace(" ", "")
    inputs, arrow, out = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != 2:
        return None
    spare = [c for c in string.ascii_letters if c not in equation]
    widest = 0
    for i, term in enumerate(terms):
        if term.count("...") > 1 or "." in term.replace("...", ""):
            return None
        if "..." in term:
            width = ndims[i] - (len(term) - 3)
            if width < 0 or width > len(spare):
                return None
            widest = max(widest, width)
            terms[i] = term.replace("...", "".join(spare[len(spare) - width:]))
    ellipsis = "".join(spare[len(spare) - widest:])
    if not arrow:
        seen = "".join(terms)
        out = ellipsis + "".join(sorted(c for c in set(seen) if seen.count(c) == 1 and c not in ellipsis))
    out = out.replace("...", ellipsis)
    if any(len(t) != n or not t.isalpha() for t, n in zip(terms, ndims, strict=True)) or not out.isalpha():
        return None
    return terms[0], terms[1], out


def _perm(term: str, order: str) -> tuple[int, ...] | None:
    """The permutation taking ``term``'s dims to ``order``'s; None when it changes nothing."""
    perm = tuple(term.index(c) for c in order)
    return None if perm == tuple(range(len(term))) else perm


def plan(equation: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Plan | None:
    """The matmul an einsum of operands of these shapes computes, or None (see the module)."""
    terms = _terms(equation, (len(shape_a), len(shape_b)))
    if terms is None:
        return None
    a, b, out = terms
    if any(len(set(t)) != len(t) for t in terms) or not set(out) <= set(a) | set(b):
        return None
    size = dict(zip(a, shape_a, strict=True))
    if any(size.setdefault(c, n) != n for c, n in zip(b, shape_b, strict=True)):
        return None           # a broadcast size-1 dim against a full one
    batch = "".join(c for c in out if c in a and c in b)
    free_a = "".join(c for c in out if c in a and c not in b)
    free_b = "".join(c for c in out if c in b and c not in a)
    contracted = "".join(c for c in a if c in b and c not in out)
    summed_alone = (set(a) ^ set(b)) - set(out)
    if summed_alone or not contracted or not free_a or len(free_b) != 1 or (batch and len(free_a) > 1):
        return None
    order_a, order_b = batch + free_a + contracted, batch + contracted + free_b
    result = batch + free_a + free_b
    return Plan(_perm(a, order_a), (len(order_a) - len(contracted), len(order_a) - 1),
                _perm(b, order_b), (len(batch), len(batch) + len(contracted) - 1), _perm(result, out))


def _laid_out(graph: fx.Graph, x: fx.Node, perm: tuple[int, ...] | None, flat: tuple[int, int]) -> fx.Node:
    if perm is not None:
        x = graph.call_method("permute", (x, *perm))
    if flat[0] != flat[1]:
        x = graph.call_method("flatten", (x, *flat))
    return x


def _einsum_node(graph: fx.Graph, node: fx.Node) -> fx.Node | None:
    """The product replacing an einsum node, inserted before it; None where it is not one."""
    if node.op != "call_function" or node.target is not torch.einsum or node.kwargs or len(node.args) < 2:
        return None
    equation, operands = node.args[0], node.args[1:]
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or len(operands) != 2 or not all(isinstance(o, fx.Node) for o in operands):
        return None
    shapes = [getattr(meta_of(o), "shape", None) for o in operands]
    if any(s is None for s in shapes):
        return None
    found = plan(equation, tuple(shapes[0]), tuple(shapes[1]))
    if found is None:
        return None
    a = _laid_out(graph, operands[0], found.perm_a, found.flat_a)
    b = _laid_out(graph, operands[1], found.perm_b, found.flat_b)
    y = graph.call_function(torch.matmul, (a, b))
    return y if found.perm_out is None else graph.call_method("permute", (y, *found.perm_out))


def decompose_einsum(gm: fx.GraphModule) -> bool:
    """Every einsum that is a product, as one (see the module). True if it changed the graph
    (shapes then need propagating again)."""
    return rewrite(gm, _einsum_node)
