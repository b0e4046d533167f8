"""Rewriting Inductor's ``call`` into plain PyTorch allocation and explicit launches, and
checking that the result calls nothing but what the candidate defines."""

from __future__ import annotations

import ast
import textwrap

from kernelabd.propose.inductor.parse import Kernel, Unsupported, dotted
from kernelabd.pysource import parse

# What the rewritten ``call`` may call: our runtime helpers, launchers, and shape arithmetic.
SAFE_CALLS = {"_empty", "_reinterpret", "_check_layout", "max", "min", "abs", "int", "float", "len"}
SAFE_METHODS = {"size", "stride", "storage_offset", "numel", "dim"}
SAFE_MATH = {"floor", "ceil", "sqrt", "trunc"}
DROPPED_CALLS = {"get_raw_stream", "assert_alignment", "torch.cuda.set_device", "args.clear",
                 "torch.cuda.synchronize"}
EMPTY_CALLS = {"empty_strided_cuda", "empty_strided_cpu", "empty_strided_xpu", "empty_strided"}
EXTERN_ROOTS = {"extern_kernels", "aten", "torch.ops", "inductor_ops", "alloc_from_pool",
                "empty_strided_p2p"}


class _CallRewriter(ast.NodeTransformer):
    """Inductor's ``call`` with its runtime replaced: allocations on the inputs' device, our
    layout check, launches through explicit launchers, streams and device guards dropped."""

    def __init__(self, kernels: dict[str, Kernel]) -> None:
        self.kernels = kernels

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            if isinstance(stmt, ast.With) and all(
                    dotted(i.context_expr.func if isinstance(i.context_expr, ast.Call) else i.context_expr)
                    .startswith(("torch.cuda._DeviceGuard", "torch.cuda.device")) for i in stmt.items):
                out.extend(self._statements(stmt.body))
                continue
            value = stmt.value if isinstance(stmt, ast.Expr | ast.Assign) else None
            if isinstance(value, ast.Call) and dotted(value.func) in DROPPED_CALLS:
                continue
            new = self.visit(stmt)
            if new is not None:
                out.append(new)
        return out

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.body = self._statements(node.body) or [ast.Pass()]
        node.args.args.append(ast.arg(arg="device"))
        node.decorator_list = []
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        node.test = self.visit(node.test)
        node.body = self._statements(node.body) or [ast.Pass()]
        node.orelse = self._statements(node.orelse)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = dotted(node.func)
        if func in EMPTY_CALLS:
            if len(node.args) != 3 or node.keywords:
                raise Unsupported(f"unexpected {func}(...) call in Inductor's output")
            return ast.Call(ast.Name("_empty", ast.Load()), [*node.args, ast.Name("device", ast.Load())], [])
        if func == "reinterpret_tensor":
            return ast.Call(ast.Name("_reinterpret", ast.Load()), node.args, node.keywords)
        if func == "assert_size_stride":
            return ast.Call(ast.Name("_check_layout", ast.Load()), node.args, node.keywords)
        if func == "assert_size_stride_grouped":
            return _ungroup_layout_checks(node)
        if func.endswith(".run") and func[:-4] in self.kernels:
            kernel = self.kernels[func[:-4]]
            if any(k.arg != "stream" for k in node.keywords):
                raise Unsupported(f"{kernel.name}.run(...) passes keyword arguments other than stream")
            if len(node.args) != len(kernel.launcher_params):
                raise Unsupported(f"{kernel.name}.run(...) passes {len(node.args)} arguments for "
                                  f"{len(kernel.launcher_params)} launcher parameters")
            return ast.Call(ast.Name(f"launch_{kernel.name}", ast.Load()), node.args, [])
        return node


def _ungroup_layout_checks(node: ast.Call) -> ast.AST:
    """Newer Inductor (torch ≥ 2.14) checks several inputs in one call,
    ``assert_size_stride_grouped((a, b), (size_a, size_b), (stride_a, stride_b), op)``; with a
    single input the parentheses are not tuples (``(a), ((s0, 8)), ((8, 1))``). Either way it
    becomes one ``_check_layout`` per input."""
    if len(node.args) < 3 or node.keywords:
        raise Unsupported("unexpected assert_size_stride_grouped(...) call in Inductor's output")
    names, sizes, strides = node.args[:3]
    if not isinstance(names, ast.Tuple):
        return ast.Call(ast.Name("_check_layout", ast.Load()), [names, sizes, strides], [])
    if not (isinstance(sizes, ast.Tuple) and isinstance(strides, ast.Tuple)
            and len(names.elts) == len(sizes.elts) == len(strides.elts)):
        raise Unsupported("assert_size_stride_grouped(...) with names, sizes and strides of different lengths")
    checks = [ast.Call(ast.Name("_check_layout", ast.Load()), list(args), [])
              for args in zip(names.elts, sizes.elts, strides.elts, strict=True)]
    return ast.Tuple(checks, ast.Load())


def _check_call(fn: ast.FunctionDef, kernels: dict[str, Kernel]) -> None:
    """Refuse any call or name in the rewritten ``call`` that is not allocation, layout,
    shape arithmetic or a launch: that would be PyTorch compute outside Triton."""
    defined = {a.arg for a in fn.args.args}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            defined.add(node.id)
    launchers = {f"launch_{k}" for k in kernels}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            func = dotted(node.func)
            root = func.split(".", 1)[0]
            if any(func == r or func.startswith(r + ".") for r in EXTERN_ROOTS):
                raise Unsupported(f"Inductor routes part of this graph to {func}, which would run as "
                                  "PyTorch compute outside a Triton kernel")
            if func in SAFE_CALLS or func in launchers:
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in SAFE_METHODS \
                    and root in defined:
                continue
            if func.startswith("math.") and func[5:] in SAFE_MATH:
                continue
            raise Unsupported(f"Inductor's wrapper calls {func or ast.unparse(node.func)}(...), "
                              "which a standalone port cannot keep")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in defined or node.id in SAFE_CALLS or node.id in launchers \
                    or node.id in ("torch", "math"):
                continue
            raise Unsupported(f"Inductor's wrapper uses {node.id}, a value captured at compile "
                              "time (a constant tensor or an extern helper)")


def rewrite_call(call: ast.FunctionDef, kernels: list[Kernel], name: str = "call") -> str:
    """The source of ``name(args, device)`` for the candidate."""
    by_name = {k.name: k for k in kernels}
    fn = _CallRewriter(by_name).visit(parse(textwrap.dedent(ast.unparse(call))).body[0])
    fn.name = name
    fn.args.args = [a for a in fn.args.args if a.arg != "self"]
    ast.fix_missing_locations(fn)
    _check_call(fn, by_name)
    return ast.unparse(fn)
