"""The code-generation subprocess (``python -m kernelabd.propose.inductor.codegen``): TorchInductor
run on the reference, its output code captured and ported. The only module that imports
``torch._inductor``; it runs in a process of its own so that Dynamo's and Inductor's
process-wide caches, config and patched globals never reach the worker."""

from __future__ import annotations

import ast
import inspect
import json
import keyword
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from kernelabd.harness.problem import one_line
from kernelabd.propose.inductor.emit import Port, port
from kernelabd.propose.inductor.parse import Arg, Capture, Unsupported
from kernelabd.pysource import parse


def helper_sources(names: set[str]) -> list[str]:
    """Sources of the ``triton_helpers`` functions ``names`` needs (dependencies first), renamed
    ``th_*`` so that they cannot collide with anything in the candidate."""
    from torch._inductor.runtime import triton_helpers
    from triton.runtime.jit import JITFunction

    def is_helper(n: str) -> bool:
        return isinstance(getattr(triton_helpers, n, None), JITFunction)

    order: list[str] = []
    deps: dict[str, set[str]] = {}

    def visit(n: str, seen: tuple[str, ...] = ()) -> None:
        if n in order or n in seen:
            return
        if not is_helper(n):
            raise Unsupported(f"kernels use triton_helpers.{n}, which is not a @triton.jit helper")
        src = textwrap.dedent(inspect.getsource(getattr(triton_helpers, n).fn))
        tree = parse(src)
        fn = tree.body[0]
        local = {a.arg for a in fn.args.args} | {t.id for t in ast.walk(fn)
                                                 if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        used = {t.id for t in ast.walk(fn) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Load)} - local
        deps[n] = {u for u in used if is_helper(u)}
        other = used - deps[n] - {"tl", "triton", "libdevice", "math", "float", "int", "range"} - {n}
        if other:
            raise Unsupported(f"triton_helpers.{n} uses {sorted(other)}, which the port cannot copy")
        for d in sorted(deps[n]):
            visit(d, (*seen, n))
        order.append(n)
        sources[n] = src

    sources: dict[str, str] = {}
    for n in sorted(names):
        visit(n)
    out = []
    for n in order:
        src = sources[n]
        for d in [*deps[n], n]:
            src = re.sub(rf"(?<![\w.]){d}\b", f"th_{d}", src)
        out.append(re.sub(r"(?<![\w.])math\.", "tl_math.", src).rstrip() + "\n")
    return out


class _Captured(Exception):
    """Raised from Inductor's output-code hook: the code is in hand, stop before compiling."""


def use_stand_in_driver() -> None:
    """Let Inductor's Triton code generation run without a GPU: it asks the active Triton
    driver for a target only to hash and pick options. Code generation only; nothing built
    with this driver is ever launched."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver

    class StandInDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self) -> Any:
            return torch.device("cpu")

        def get_benchmarker(self) -> Any:
            raise RuntimeError("code generation only: nothing is benchmarked")

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: Any = None) -> int:
            return 0

    driver.set_active(StandInDriver())


DEFAULT = "default"
MAX_AUTOTUNE = "max-autotune"
"""torch.compile's mode "max-autotune-no-cudagraphs" with only Triton in the GEMM and
convolution backends, so that every choice it benchmarks is a Triton kernel a port can launch
(ATen's would be cuBLAS calls, PyTorch compute outside Triton)."""
MODES = (DEFAULT, MAX_AUTOTUNE)
AUTOTUNE_COMPILE_THREADS = 8     # max-autotune compiles every choice before benchmarking it


def _configure(device: str, mode: str = DEFAULT) -> None:
    import torch._dynamo.config as dynamo_config
    import torch._inductor
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as fx_config

    inductor_config.compile_threads = 1
    inductor_config.fx_graph_cache = False
    inductor_config.max_autotune = False
    if mode == MAX_AUTOTUNE:
        for key, value in torch._inductor.list_mode_options("max-autotune-no-cudagraphs").items():
            setattr(inductor_config, key, value)
        inductor_config.max_autotune_gemm_backends = "TRITON"
        inductor_config.max_autotune_conv_backends = "TRITON"
        inductor_config.compile_threads = min(AUTOTUNE_COMPILE_THREADS, os.cpu_count() or 1)
    inductor_config.triton.cudagraphs = False
    dynamo_config.force_parameter_static_shapes = False
    dynamo_config.force_nn_module_property_static_shapes = False
    dynamo_config.allow_unspec_int_on_nn_module = True
    dynamo_config.specialize_float = True
    dynamo_config.cache_size_limit = 64
    fx_config.use_duck_shape = False      # equal sizes must not become one symbol
    if device == "cpu":
        inductor_config.cpu_backend = "triton"
        use_stand_in_driver()


def _source_expr(name: str, forward_params: list[str]) -> str | None:
    """A Dynamo source name (``L['self']._modules['ln']._parameters['weight']``) as the
    forward's Python expression (``self.ln.weight``); None when it is not reachable from there."""
    m = re.match(r"L\['(\w+)'\]", name)
    if m is None or (m.group(1) != "self" and m.group(1) not in forward_params):
        return None
    expr = m.group(1) + name[m.end():]

    def attr(mm: re.Match[str]) -> str:
        key = mm.group(1)
        return f".{key}" if key.isidentifier() and not keyword.iskeyword(key) else mm.group(0)

    return re.sub(r"\._(?:modules|parameters|buffers)\['([^'\]]+)'\]", attr, expr)


def _graph_input(node: Any) -> tuple[str, bool]:
    """A Dynamo placeholder's source name and whether Dynamo passes it as a tensor although
    the forward holds a Python number (an unspecialised scalar)."""
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None)
    name = getattr(src, "name", None)
    name = name() if callable(name) else name
    return str(name or node.name), bool(getattr(ga, "pass_arg_as_tensor", False))


def chosen_configs(code: str, names: list[str]) -> dict[str, dict[str, int]]:
    """What Inductor's autotuning chose for each kernel of the output module ``code``, once it
    has run: ``{kernel: {"XBLOCK": …, "num_warps": …, "num_stages": …}}`` from each kernel's
    remaining launcher (kernels that were not autotuned are left out)."""
    from torch._inductor.codecache import PyCodeCache

    loaded = [*getattr(PyCodeCache, "modules", []), *list(sys.modules.values())]
    modules = [m for m in loaded if m is not None and names and all(hasattr(m, n) for n in names)]
    same = [m for m in modules if Path(getattr(m, "__file__", "") or "/").is_file()
            and Path(m.__file__).read_text() == code]
    found: dict[str, dict[str, int]] = {}
    for module in (same or modules)[-1:]:
        for name in names:
            launchers = getattr(getattr(module, name), "launchers", None) or []
            if len(launchers) == 1 and getattr(launchers[0], "config", None) is not None:
                config = launchers[0].config
                found[name] = {**{k: int(v) for k, v in config.kwargs.items() if isinstance(v, int)},
                               "num_warps": int(config.num_warps), "num_stages": int(config.num_stages)}
    return found


def capture(source: str, device: str, constants: dict[str, Any], mode: str = DEFAULT, *,
            dynamic: bool = False, run: bool | None = None) -> Capture:
    """Run TorchInductor on the reference at one shape and take its output code (in-process:
    call it only from the codegen subprocess). ``dynamic``: compile with symbolic sizes, so
    that the code serves other shapes too; otherwise the kernels are specialised to this shape,
    as ``torch.compile`` of the reference is. By default (``run``) on a GPU the compiled graph
    is run once, so that Inductor benchmarks its choices on the device (max-autotune's, and in
    the default mode the few launch configurations its heuristics give a reduction), and what
    it chose comes back with the code (``Capture.configs``): without them, the default mode's
    softmax port ran at 0.59x of the job's incumbent where torch.compile's own kernel was 1.10x
    eager (bench/port, 2026-12-03). On a CPU job the code is taken before anything runs."""
    import torch
    import torch._dynamo
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.graph import GraphLowering

    from kernelabd.service.capture import load_reference

    torch._dynamo.reset()
    _, model, inputs = load_reference(source, constants)
    model = model.to(device).eval()
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    sig = inspect.signature(model.forward)
    params = list(sig.parameters)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        raise Unsupported("forward takes *args/**kwargs")
    bound = dict(zip(params, inputs, strict=False))
    seen: dict[str, Any] = {}

    def backend(gm: Any, example_inputs: list[Any]) -> Any:
        # read now: Dynamo drops the graph's metadata once the compile is aborted
        seen["inputs"] = [_graph_input(n) for n in gm.graph.nodes if n.op == "placeholder"]
        seen["examples"] = list(example_inputs)
        seen["gm"] = gm
        return compile_fx(gm, example_inputs)

    if run is None:
        run = mode == MAX_AUTOTUNE or device.startswith("cuda")

    def hook(code: str) -> None:
        seen["code"] = code
        if not run:
            raise _Captured

    GraphLowering.save_output_code = staticmethod(hook)
    with torch.no_grad():
        eager = model(*inputs)
        try:
            compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)
            compiled(*inputs)
            if run:      # the first call autotuned; a second runs what it chose
                compiled(*inputs)
        except Exception as exc:
            if "code" not in seen or run:
                raise Unsupported(f"torch.compile failed: {one_line(exc, 280)}") from exc
    outs = list(eager) if isinstance(eager, tuple | list) else [eager]
    if not all(isinstance(t, torch.Tensor) for t in outs):
        raise Unsupported("forward returns something other than tensors")
    args, values = [], []
    scope = {"self": model, **bound}
    for (name, as_tensor), example in zip(seen["inputs"], seen["examples"], strict=True):
        expr = _source_expr(name, params)
        if expr is None or as_tensor:
            raise Unsupported(f"graph input {name} is not an input, parameter or size of the forward")
        try:
            value = eval(expr, {}, scope)   # our own expression over the model and its inputs
        except Exception as exc:
            raise Unsupported(f"graph input {expr} cannot be re-evaluated: {exc}") from exc
        values.append(value)
        if isinstance(example, torch.Tensor):
            if not (isinstance(value, torch.Tensor) and value.shape == example.shape
                    and torch.equal(value, example)):
                raise Unsupported(f"graph input {expr} is not the tensor Dynamo saw")
            contiguous = expr in params and value.is_contiguous()
            passed = value.contiguous() if contiguous else value
            args.append(Arg(expr, "tensor", contiguous, (tuple(passed.shape), tuple(passed.stride()))))
        else:
            hint = example.node.hint if isinstance(example, torch.SymInt) else example
            if value != hint:
                raise Unsupported(f"graph input {expr} is {value}, Dynamo saw {hint}")
            args.append(Arg(expr, "int", seen=int(value)))
    graph_out = seen["gm"](*values)
    graph_out = list(graph_out) if isinstance(graph_out, tuple | list) else [graph_out]
    if len(graph_out) != len(outs) or not all(
            isinstance(g, torch.Tensor) and g.shape == o.shape and torch.allclose(g, o, rtol=1e-4, atol=1e-5,
                                                                                  equal_nan=True)
            for g, o in zip(graph_out, outs, strict=True)):
        raise Unsupported("Dynamo's graph outputs are not the forward's outputs one for one")
    kind = "tensor" if isinstance(eager, torch.Tensor) else type(eager).__name__
    configs = chosen_configs(seen["code"], _kernel_names(seen["code"])) if run else {}
    return Capture(code=seen["code"], args=tuple(args), output=kind, n_outputs=len(outs),
                   device=device, configs=configs, dynamic=dynamic)


def _kernel_names(code: str) -> list[str]:
    return re.findall(r"^(\w+) = async_compile\.triton\(", code, flags=re.M)


def generate(source: str, device: str, shapes: list[dict[str, Any]], mode: str = DEFAULT) -> dict[str, Any]:
    """The port of the reference (in-process: call it only from the codegen subprocess): its
    kernels specialised to the first shape, the one timed, as ``torch.compile`` of it would
    be, and for the gate's other shapes ``fallbacks``."""
    if mode == MAX_AUTOTUNE and not device.startswith("cuda"):
        return {"declined": "max-autotune benchmarks its choices on a GPU; there is none on a CPU job"}
    _configure(device.split(":")[0] if device.startswith("cuda") else device, mode)
    interpreter = device == "cpu"
    try:
        main = capture(source, device, shapes[0], mode)
        p = port(main, source, interpreter, helper_sources, mode, fallbacks(source, device, shapes, mode))
    except Unsupported as exc:
        return {"declined": str(exc)}
    return {"source": p.source, "edit": p.edit, "kernels": p.kernels}


def fallbacks(source: str, device: str, shapes: list[dict[str, Any]], mode: str) -> list[Capture]:
    """What serves the gate's shapes after the first: one capture with symbolic sizes where its
    port is the same at every gate shape (it then serves any shape); else, where Inductor bakes
    a size that the shapes change (``nn.LayerNorm(features)``), one specialised capture a shape,
    and the port refuses any other shape with a clear error. Taken without running the graph:
    what a run would add is launch choices (``Capture.configs``), and these kernels are never
    timed (max-autotune still benchmarks its GEMM templates as it lowers the graph)."""
    if len(shapes) < 2:
        return []
    interpreter = device == "cpu"
    first: Port | None = None
    dynamic: Capture | None = None
    for constants in shapes:
        try:
            cap = capture(source, device, constants, mode, dynamic=True, run=False)
            p = port(cap, source, interpreter, helper_sources, mode)
        except Unsupported:
            break
        if first is None:
            first, dynamic = p, cap
        elif p.body != first.body or set(p.tunables) != set(first.tunables):
            break
    else:
        assert dynamic is not None
        return [dynamic]
    specialised = []
    for constants in shapes[1:]:
        try:
            specialised.append(capture(source, device, constants, mode, run=False))
        except Unsupported as exc:
            raise Unsupported(f"{exc} (at gate shape {constants})") from exc
    return specialised


def _main() -> int:
    """Subprocess entry: a JSON request on stdin, the answer written to ``request["out"]``."""
    request = json.loads(sys.stdin.read())
    try:
        answer = generate(request["source"], request["device"], request["shapes"], request.get("mode", DEFAULT))
    except Exception as exc:   # the reference is arbitrary code; any failure is a decline
        answer = {"declined": one_line(exc, 500)}
    Path(request["out"]).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
