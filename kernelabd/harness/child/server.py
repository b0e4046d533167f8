"""What runs inside a sandbox process: load a reference or candidate, run it, time it.

Everything here shares a process with untrusted code, so nothing here decides anything. It
produces outputs and samples; the trusted parent compares outputs against an oracle computed in
another process and cross-checks the samples against its own clock. The checks made here (types,
launch counts, tampering) are tripwires that give a clear reason sooner, not the last line.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import importlib.util
import math
import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kernelabd.harness import gate, wire
from kernelabd.harness.child import perturb
from kernelabd.harness.gate import calibrate, oracle_wire_dtype

T = TypeVar("T")

# Captured before any evaluated code is imported: what the harness relies on.
_TENSOR = torch.Tensor
_type = builtins.type
_perf_ns = time.perf_counter_ns
_WATCHED: list[tuple[Any, str]] = [
    (time, "perf_counter"), (time, "perf_counter_ns"), (time, "time"), (time, "monotonic"),
    (torch.cuda, "synchronize"), (torch.cuda, "Event"), (torch.cuda.Event, "record"),
    (torch.cuda.Event, "elapsed_time"), (torch.cuda.Event, "synchronize"),
    (torch, "allclose"), (torch, "isclose"), (torch, "equal"), (torch.testing, "assert_close"),
    (numpy, "allclose"), (numpy.testing, "assert_allclose"), (torch.Tensor, "__eq__"),
    (builtins, "type"), (builtins, "isinstance"), (wire, "send"), (wire, "encode"),
]
_ORIGINALS = {(id(owner), attr): getattr(owner, attr) for owner, attr in _WATCHED}

# aten ops a port may use outside its kernels: allocation, views and data movement.
ALLOWED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill_", "zero_", "arange", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided",
    "t", "transpose", "permute", "expand", "expand_as", "clone", "copy_", "_to_copy", "detach",
    "alias", "slice", "select", "unsqueeze", "squeeze", "flatten", "unflatten", "split",
    "split_with_sizes", "chunk", "narrow", "unbind", "lift_fresh", "contiguous", "cat", "stack",
    "view_as", "resize_", "set_", "_local_scalar_dense", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "_has_compatible_shallow_copy_type", "record_stream",
    # composites of the above, as the profiler records them
    "item", "to", "type_as", "size", "stride", "numel", "dim", "is_contiguous", "resolve_conj",
    "resolve_neg", "detach_", "requires_grad_", "squeeze_", "unsqueeze_", "t_", "transpose_",
    "as_strided_", "scalar_tensor", "result_type", "lift", "empty_permuted",
})

LAUNCH_RANGE = "kernelab::launch"   # profiler range around every target-language launch
SIDE_STREAM_DELAY_CYCLES = 50_000_000   # ~25 ms at 2 GHz ahead of any side-stream launch
POISON_BYTE = 0xFF            # float32 0xFFFFFFFF is a NaN: unwritten outputs show as poison
CPU_FLUSH_BYTES = 32 << 20
COMPILE_LOG_CHARS = 8000     # tail of a compiler log kept as a compile failure's evidence
WARMUP_SAMPLES = 1 << 40      # sample indices used while calibrating: never timed, never checked


class Refused(Exception):
    """The evaluated code did something the harness refuses; ``rule`` names what."""

    def __init__(self, rule: str, message: str, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.evidence = evidence or {}


def torch_compute_ops(events: Any) -> Counter[str]:
    """aten ops that ran outside target-language launches, from a profiler trace.

    The profiler records through the dispatcher's RecordFunction hooks, below anything Python
    code can switch off (a TorchDispatchMode can be popped from the evaluated code itself).
    """
    ops: Counter[str] = Counter()
    for evt in events:
        name = evt.name
        if not name.startswith("aten::") or name[6:] in ALLOWED_OPS:
            continue
        parent, inside = evt.cpu_parent, False
        while parent is not None and not inside:
            inside = parent.name == LAUNCH_RANGE
            parent = parent.cpu_parent
        if not inside:
            ops[name[6:]] += 1
    return ops


class LaunchCounter:
    """Counts target-language kernel launches: Triton's by wrapping the launchers' ``run``
    methods, CUDA C++'s by wrapping ``cuda.core.launch``, which the CUDA loader a candidate
    carries looks up at each launch.

    While gating on a GPU it also delays any launch made on a stream other than the caller's
    (a spin kernel queued ahead of it), so that work left running on a side stream when
    forward returns cannot finish before the harness looks at the outputs.
    """

    def __init__(self) -> None:
        self.kernels: Counter[str] = Counter()
        self.caller_stream: Any = None

    def install(self, target: str) -> None:
        if target == "cuda":
            self.install_cuda()
            return
        from triton.runtime import jit

        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            cls.run = self._wrap(cls.run)

    def install_cuda(self) -> None:
        import cuda.core

        launch, counter = cuda.core.launch, self

        def counted(stream: Any, config: Any, kernel: Any, *args: Any) -> Any:
            counter.kernels[f"cuda:{getattr(kernel, 'name', None) or 'kernel'}"] += 1
            counter.delay_side_stream()
            with record_function(LAUNCH_RANGE):
                return launch(stream, config, kernel, *args)
        cuda.core.launch = counted

    def _wrap(self, run: Any) -> Any:
        counter = self

        def counted(fn_self: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("warmup", False):
                counter.kernels[getattr(fn_self, "__name__", None) or fn_self.fn.__name__] += 1
                counter.delay_side_stream()
            with record_function(LAUNCH_RANGE):
                return run(fn_self, *args, **kwargs)
        return counted

    def delay_side_stream(self) -> None:
        if self.caller_stream is not None and torch.cuda.current_stream() != self.caller_stream:
            torch.cuda._sleep(SIDE_STREAM_DELAY_CYCLES)


# The harness modules this process runs besides this one: replacing a function of any of them
# is tampering. tests/harness/test_tamper_list.py fails if the child imports one not listed.
WATCHED_MODULES: tuple[ModuleType, ...] = (gate, perturb, wire)


def _harness_objects() -> dict[str, Any]:
    """This module's own functions and classes, the harness classes' methods, and the watched
    modules' functions: replacing any of them is tampering, like replacing ``time.*``."""
    found: dict[str, Any] = {}
    for name, value in list(globals().items()):
        if callable(value) or isinstance(value, ModuleType):
            found[f"sandbox.{name}"] = value
    for cls in (Harness, LaunchCounter):
        found.update({f"{cls.__name__}.{k}": v for k, v in vars(cls).items() if callable(v)})
    for mod in WATCHED_MODULES:
        found.update({f"{mod.__name__}.{k}": v for k, v in vars(mod).items() if callable(v)})
    return found


def tampered() -> list[str]:
    """Names of harness-critical functions that no longer are what they were at start."""
    changed = [f"{getattr(owner, '__name__', _type(owner).__name__)}.{attr}"
               for owner, attr in _WATCHED if getattr(owner, attr) is not _ORIGINALS[(id(owner), attr)]]
    now = _harness_objects()
    changed += [name for name, value in _HARNESS.items() if now.get(name) is not value]
    return changed


def load_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise Refused("bad_candidate", f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    """Outputs as a list of plain tensors; anything else is refused with its type."""
    items = list(out) if _type(out) in (tuple, list) else [out]
    if not items:
        raise Refused("not_a_tensor", "forward returned an empty sequence")
    for i, t in enumerate(items):
        if _type(t) is not _TENSOR:
            raise Refused("not_a_tensor", f"output {i} is a {_type(t).__module__}."
                          f"{_type(t).__qualname__}, not a plain torch.Tensor",
                          {"output": i, "type": _type(t).__qualname__})
        if t.device.type == "meta" or t.is_sparse or t.layout != torch.strided:
            raise Refused("not_a_tensor", f"output {i} is not a dense tensor with storage")
    return items


def describe(outs: list[torch.Tensor]) -> list[dict[str, Any]]:
    return [{"dtype": wire.DTYPE_NAMES.get(t.dtype, str(t.dtype)), "shape": list(t.shape),
             "stride": list(t.stride())} for t in outs]


def to_device(values: list[Any], device: str) -> list[Any]:
    return [v.to(device).clone() if isinstance(v, _TENSOR) else v for v in values]


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


class Harness:
    """State of one sandbox: the model(s) under evaluation and their inputs."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.models: list[torch.nn.Module] = []
        self.timing_inputs: list[list[Any]] = []
        self.work: list[list[Any]] = []
        self.noise: list[list[torch.Tensor | None]] = []
        self.weights: dict[int, torch.Tensor] = {}
        self.perturb_seed = self.fp_seed = 0
        self.oracle_models: dict[int, torch.nn.Module] = {}
        self.launches = LaunchCounter()
        self.graphs: list[Any] | None = None
        self.graph_reps = 1
        self.flush_buf: torch.Tensor | None = None

    # ----- setup -------------------------------------------------------------------------
    def setup(self, msg: dict[str, Any]) -> None:
        self.device = msg["device"]
        tf32 = bool(msg.get("tf32", False))
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if self.device != "cpu":
            torch.cuda.set_device(0)
        with contextlib.suppress(ImportError):  # no Triton/cuda-python: nothing can launch
            self.launches.install(msg.get("target", "triton"))

    def hello(self) -> dict[str, Any]:
        info: dict[str, Any] = {"device": self.device}
        if self.device != "cpu":
            props = torch.cuda.get_device_properties(0)
            info.update(name=props.name, uuid=str(getattr(props, "uuid", "")),
                        l2_bytes=int(getattr(props, "L2_cache_size", 0)))
        return info

    # ----- reference ---------------------------------------------------------------------
    def load_reference(self, msg: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.setup(msg)
        module = load_module(msg["path"], "kernelab_reference")
        shapes, tensors = [], []
        defaults = {k: getattr(module, k, None) for consts in msg["shapes"] for k in consts}
        for idx, consts in enumerate(msg["shapes"]):
            for key, value in {**defaults, **consts}.items():
                setattr(module, key, value)
            init = list(module.get_init_inputs())
            require_json(init, "get_init_inputs()")
            model = on_device(self.device, msg["param_seeds"][idx], lambda init=init: module.Model(*init))
            randomise_parameters(model, msg["param_seeds"][idx])
            sd = model.state_dict()
            shapes.append({"init_inputs": init, "state_keys": list(sd)})
            tensors.extend(v.detach().cpu() for v in sd.values())
            model._kernelab_consts = dict(consts)
            self.models.append(model.to(self.device).eval())
        module_consts = msg["shapes"]
        sets = []
        n_gate = len(msg["sets"])
        for k, entry in enumerate(msg["sets"] + msg["timing_sets"]):
            for key, value in {**defaults, **module_consts[entry["shape"]]}.items():
                setattr(module, key, value)
            inputs = to_device(on_device(self.device, entry["seed"], lambda: list(module.get_inputs())),
                               self.device)
            inputs = [v.cpu() if isinstance(v, _TENSOR) else v
                      for v in apply_variant(inputs, entry["variant"], entry["seed"])]
            require_json([v for v in inputs if not isinstance(v, _TENSOR)], "get_inputs()")
            kinds = [("tensor" if isinstance(v, _TENSOR) else "scalar") for v in inputs]
            scalars = [None if isinstance(v, _TENSOR) else v for v in inputs]
            outs, oracle = self.reference_outputs(entry["shape"], inputs)
            sets.append({"kinds": kinds, "scalars": scalars, "n_outputs": len(outs),
                         "outputs": describe(outs), "calib": calibrate(outs, oracle)})
            tensors.extend(v for v in inputs if isinstance(v, _TENSOR))
            if k < n_gate:   # a timed sample's oracle is recomputed here, on demand
                tensors.extend(o.detach().to("cpu", oracle_wire_dtype(r))
                               for o, r in zip(oracle, outs, strict=True))
            else:
                self.timing_inputs.append(to_device(inputs, self.device))
        return {"shapes": shapes, "sets": sets, "info": self.hello()}, tensors

    def reference_outputs(self, shape: int, inputs: list[Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The reference's own outputs and the float64 oracle's, on the same inputs."""
        model = self.models[shape]
        with torch.no_grad():
            outs = outputs_of(model(*to_device(inputs, self.device)), "reference")
            sync(self.device)
            dbl = [v.double() if isinstance(v, _TENSOR) and v.is_floating_point() else v
                   for v in to_device(inputs, self.device)]
            oracle = outputs_of(self.oracle(shape)(*dbl), "reference (float64)")
        return outs, oracle

    # ----- candidate ---------------------------------------------------------------------
    def load_candidate(self, msg: dict[str, Any],
                       tensors: list[torch.Tensor]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        self.setup(msg)
        module = load_module(msg["path"], "kernelab_candidate")
        self.check_tamper("importing the candidate")
        if not hasattr(module, "ModelNew"):
            raise Refused("bad_candidate", "the candidate defines no ModelNew")
        it = iter(tensors)
        for shape in msg["shapes"]:
            model = on_device(self.device, None, lambda shape=shape: module.ModelNew(*shape["init_inputs"]))
            sd = {k: next(it) for k in shape["state_keys"]}
            try:
                model.load_state_dict(sd, strict=True)
            except RuntimeError as exc:
                raise Refused("state_dict", "ModelNew does not load the reference's state_dict: "
                              + str(exc).strip().splitlines()[-1].strip()) from exc
            self.models.append(model.to(self.device).eval())
        gate_inputs = [self.take_inputs(s, it) for s in msg["sets"]]
        self.timing_inputs = [to_device(self.take_inputs(s, it), self.device) for s in msg["timing_sets"]]
        if not msg.get("gate", True):
            return {"info": self.hello()}, []
        return self.run_gate(msg["sets"], gate_inputs)

    @staticmethod
    def take_inputs(entry: dict[str, Any], it: Any) -> list[Any]:
        return [next(it) if kind == "tensor" else scalar
                for kind, scalar in zip(entry["kinds"], entry["scalars"], strict=True)]

    def run_gate(self, sets: list[dict[str, Any]],
                 gate_inputs: list[list[Any]]) -> tuple[dict[str, Any], list[torch.Tensor]]:
        results, tensors = [], []
        for entry, inputs in zip(sets, gate_inputs, strict=True):
            outs, report = self.gated_call(entry["shape"], inputs)
            results.append(report)
            tensors.extend(outs)
        again, _ = self.gated_call(sets[0]["shape"], gate_inputs[0])
        tensors.extend(again)
        return {"sets": results, "kernels": dict(self.launches.kernels), "info": self.hello()}, tensors

    def gated_call(self, shape: int, inputs: list[Any]) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """One forward on fresh device copies, with poisoned memory and op/launch counting."""
        args = to_device(inputs, self.device)
        pristine = [a.clone() if isinstance(a, _TENSOR) else a for a in args]
        self.poison(args)
        launches_before = sum(self.launches.kernels.values())
        if self.device != "cpu":
            self.launches.caller_stream = torch.cuda.current_stream()
        try:
            with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
                outs = flatten_outputs(self.models[shape](*args))
                # Snapshot on the caller's stream at once, before any synchronisation (and
                # before the profiler's own teardown): work still running on another stream
                # when forward returned shows up as a difference.
                snapshots = [o.clone() for o in outs] if self.device != "cpu" else outs
            ops = torch_compute_ops(prof.events())
        except RuntimeError as exc:
            if "profiler" not in str(exc).lower():
                raise
            raise Refused("tampering", f"the op profiler was stopped during forward: {exc}") from exc
        finally:
            self.launches.caller_stream = None
        sync(self.device)
        self.check_tamper("running forward")
        mutated = [i for i, (a, p) in enumerate(zip(args, pristine, strict=True))
                   if isinstance(a, _TENSOR) and not same_bits(a, p)]
        report = {"outputs": describe(outs), "mutated": mutated, "torch_ops": dict(ops),
                  "launches": sum(self.launches.kernels.values()) - launches_before,
                  "poisoned": [poisoned_fraction(o) for o in outs],
                  "unsynchronised": [i for i, (a, b) in enumerate(zip(outs, snapshots, strict=True))
                                     if not same_bits(a, b)]}
        return [o.detach().cpu() for o in outs], report

    def poison(self, args: list[Any]) -> None:
        """Fill memory the allocator will hand out next with NaN bytes, then free it.

        An output the candidate allocates but never writes then reads as poison, whatever the
        allocator recycled. On a GPU one large block covers the caching allocator's next
        allocations; on CPU, blocks the size of each input are what malloc returns next.
        """
        tensors = [a for a in args if isinstance(a, _TENSOR)]
        if self.device == "cpu":
            blobs = [torch.empty(a.numel() * a.element_size(), dtype=torch.uint8) for a in tensors]
            for blob in blobs:
                blob.fill_(POISON_BYTE)
            del blobs
            return
        nbytes = sum(a.numel() * a.element_size() for a in tensors)
        blob = torch.empty(max(4 * nbytes, 64 << 20), dtype=torch.uint8, device=self.device)
        blob.fill_(POISON_BYTE)
        del blob

    def check_tamper(self, when: str) -> None:
        changed = tampered()
        if changed:
            raise Refused("tampering", f"harness functions replaced while {when}: "
                          f"{', '.join(changed)}", {"replaced": changed})

    # ----- timing ------------------------------------------------------------------------
    def prepare_timing(self, msg: dict[str, Any]) -> None:
        """Work buffers (what the model reads while timed) and the perturbation noise, once."""
        if self.work:
            return
        self.perturb_seed, self.fp_seed = int(msg["perturb_seed"]), int(msg["fp_seed"])
        for inputs in self.timing_inputs:
            self.work.append([v.clone() if isinstance(v, _TENSOR) else v for v in inputs])
            self.noise.append([perturb.factors_like(v, self.perturb_seed, j) if perturb.perturbable(v)
                               else None for j, v in enumerate(inputs)])

    def perturbed_inputs(self, s: int, into: list[Any] | None = None) -> list[Any]:
        """Sample ``s``'s inputs: its set's pristine values times 1 + EPS·rolled noise."""
        i = s % len(self.timing_inputs)
        pristine, noise = self.timing_inputs[i], self.noise[i]
        target = into if into is not None else [v.clone() if isinstance(v, _TENSOR) else v for v in pristine]
        numels = [v.numel() if isinstance(v, _TENSOR) else 0 for v in pristine]
        for j, k in enumerate(perturb.offsets(self.perturb_seed, s, len(pristine), numels)):
            if noise[j] is not None:
                perturb.perturb_into(target[j], pristine[j], noise[j], k)
        return target

    def forward(self, s: int) -> Any:
        with torch.no_grad():
            return self.models[0](*self.work[s % len(self.work)])

    def flush(self) -> None:
        """Evict caches between samples: write a buffer of at least twice the L2 (or LLC)."""
        if self.flush_buf is None:
            if self.device == "cpu":
                nbytes = CPU_FLUSH_BYTES
            else:
                l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 << 20)
                nbytes = max(2 * l2, 128 << 20)
            self.flush_buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self.flush_buf.zero_()

    def sample(self, s: int) -> tuple[float, list[float]]:
        """One cold sample in ms, and the fingerprints of the outputs it produced.

        The inputs are perturbed before the clock starts (a stale output, even from recycled
        memory, belongs to other inputs and fails its fingerprint); fingerprints are taken
        right after, before the next call could finish any deferred work.
        """
        if self.device != "cpu":
            reset_persisting_l2()
        self.perturbed_inputs(s, into=self.work[s % len(self.work)])
        self.flush()
        if self.device == "cpu":
            t0 = _perf_ns()
            out = self.forward(s)
            ms = (_perf_ns() - t0) / 1e6
        elif self.graphs is not None:
            ms, out = self.replay(s)
        else:
            ms, out = self.eager(s)
        return ms, self.fingerprints(flatten_outputs(out))

    def eager(self, s: int) -> tuple[float, Any]:
        """Device time of one call, spanning every stream: the device is idle when the start
        event is recorded and synchronised as a whole before the end event, so work left on a
        side stream is timed. The call's host overhead is timed with it."""
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.forward(s)
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out

    def replay(self, s: int) -> tuple[float, Any]:
        """Device time of one graph replay, without host overhead.

        The events are queued behind the perturbation and the flush, so the device is busy
        while the host launches the replay and the clock starts exactly when the graph does. A
        replay is one operation on the stream: the end event follows all of the graph's work,
        on every stream it forked (capture refuses a fork that is not joined back).
        """
        graph, out = self.graphs[s % len(self.graphs)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / self.graph_reps, out

    def fingerprints(self, outs: list[torch.Tensor]) -> list[float]:
        for j, o in enumerate(outs):
            if self.weights.get(j) is None or self.weights[j].shape != o.shape:
                self.weights[j] = perturb.weights_for(o.shape, self.fp_seed, j, o.device)
        return [perturb.fingerprint(o, self.weights[j]) for j, o in enumerate(outs)]

    def calibrate(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.prepare_timing(msg)
        for s in range(2 * len(self.work)):
            flatten_outputs(self.forward(s))
        sync(self.device)
        samples = [self.sample(WARMUP_SAMPLES + s)[0] for s in range(max(3, len(self.work)))]
        self.check_tamper("timing")
        return {"est_ms": sorted(samples)[len(samples) // 2]}

    def use_graphs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Capture each input set's forward, ``reps`` times, into a CUDA graph; 0 drops them
        (the other side could not be captured, and both sides are timed the same way)."""
        reps = int(msg["reps"])
        if reps <= 0:
            self.graphs, self.graph_reps = None, 1
            return {"reps": 0}
        graphs = []
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for s in range(len(self.work)):
                flatten_outputs(self.forward(s))
        torch.cuda.current_stream().wait_stream(stream)
        for s in range(len(self.work)):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(reps):
                    out = self.forward(s)
            graphs.append((graph, out))
        torch.cuda.synchronize()
        self.graphs, self.graph_reps = graphs, reps
        return {"reps": reps}

    def block(self, msg: dict[str, Any]) -> dict[str, Any]:
        start = int(msg.get("start", 0))
        results = [self.sample(start + k) for k in range(int(msg["n"]))]
        self.check_tamper("timing")
        return {"samples_ms": [ms for ms, _ in results], "fingerprints": [fp for _, fp in results]}

    def hot(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``k`` back-to-back calls (graph replays once graphs are in use) without flushing;
        the parent times this with its own clock."""
        for k in range(int(msg["k"])):
            if self.graphs is not None:
                self.graphs[k % len(self.graphs)][0].replay()
            else:
                self.forward(k)
        sync(self.device)
        return {}

    def oracle(self, shape: int) -> torch.nn.Module:
        """The reference model of one shape in float64, built once (for every input set of that
        shape and every re-checked timed sample)."""
        if shape not in self.oracle_models:
            self.oracle_models[shape] = copy.deepcopy(self.models[shape]).double()
        return self.oracle_models[shape]

    def oracle_fingerprints(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Reference sandbox only: the float64 oracle's fingerprints (and norms) for samples."""
        self.prepare_timing(msg)
        found = []
        for s in msg["samples"]:
            inputs = [v.double() if isinstance(v, _TENSOR) and v.is_floating_point() else v
                      for v in self.perturbed_inputs(int(s))]
            with torch.no_grad():
                outs = outputs_of(self.oracle(0)(*inputs), "reference (float64)")
            found.append([{"fp": fp, "norm": float(torch.linalg.vector_norm(o)),
                           "finite": bool(torch.isfinite(o).all())}
                          for fp, o in zip(self.fingerprints(outs), outs, strict=True)])
        return {"samples": found}


def outputs_of(out: Any, who: str) -> list[torch.Tensor]:
    items = list(out) if isinstance(out, tuple | list) else [out]
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        kinds = ", ".join(type(t).__name__ for t in items) or "nothing"
        raise Refused("bad_reference", f"{who} forward returned {kinds}; expected tensors")
    if any(t.numel() == 0 for t in items):
        raise Refused("bad_reference", f"{who} forward returned an empty tensor")
    return items


def require_json(values: list[Any], where: str) -> None:
    """Non-tensor arguments travel as JSON; say clearly when one cannot."""
    import json

    try:
        json.dumps(values)
    except (TypeError, ValueError) as exc:
        raise Refused("bad_reference", f"{where} returned a value that is neither a tensor nor "
                      f"a plain number/string/list: {exc}") from exc


def on_device(device: str, seed: int | None, make: Callable[[], T]) -> T:
    """``make()`` with ``device`` as the default device of new tensors, after seeding: weights
    and inputs are made where they will live (a 512 MiB ``randn`` took about a second on CPU,
    the FFN's 176 M weights several). Code that insists on host tensors (``.numpy()`` on a fresh
    draw, a CPU generator) fails there; it is then run again as written, from the same seed."""
    def run(default: str | None) -> T:
        if seed is not None:
            torch.manual_seed(seed)
        if default is None:
            return make()
        with torch.device(default):
            return make()

    if device == "cpu":
        return run(None)
    try:
        return run(device)
    except Exception:  # arbitrary user code: its own failure, if any, shows on the plain run
        return run(None)


def randomise_parameters(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter away from its default init, so that ignoring one is caught.

    Each keeps its own scale (a default-init LayerNorm weight of ones becomes about 1 ± 0.1),
    and buffers (running statistics) stay as they are, since they may have to stay positive.
    The draws are made on each parameter's device (the FFN's 176 M weights took seconds on CPU).
    """
    gens: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for p in model.parameters():
            if not p.is_floating_point() or p.numel() == 0:
                continue
            if p.device not in gens:
                gens[p.device] = torch.Generator(device=p.device).manual_seed(seed ^ 0x5EED)
            gen = gens[p.device]
            data = p.detach().double()
            mean = float(data.mean())
            std = float(data.std()) if p.numel() > 1 else 0.0
            scale = max(std, 0.1 * abs(mean), 0.05)
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64, device=p.device)
            p.copy_((mean + scale * noise).to(p.dtype))


def apply_variant(inputs: list[Any], variant: str, seed: int) -> list[Any]:
    """Input distributions beyond what ``get_inputs`` draws: a candidate must not rely on it.

    ``scaled`` stretches and shifts by a large positive offset, 100 to 200 standard deviations
    (catches, e.g., softmax without max subtraction, whose exp() overflows past 88);
    ``heavy`` replaces values by a Student-t draw with the same centre and spread (outliers).
    """
    if variant == "base":
        return inputs
    gen = torch.Generator().manual_seed(seed ^ 0xC0FFEE)     # two scalars a tensor: CPU
    out = []
    for v in inputs:
        if not (isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1):
            out.append(v)
            continue
        x = v.double()
        mean, std = float(x.mean()), float(x.std()) or 1.0
        if variant == "scaled":
            scale = 10 ** (torch.rand((), generator=gen, dtype=torch.float64).item() * 1.5 - 0.5)
            offset = 100 + 100 * torch.rand((), generator=gen, dtype=torch.float64).item()
            # The offset is counted in standard deviations of the *scaled* values: counted in
            # the original ones, a stretch by 10 left only 10-20 σ, which a one-pass variance
            # (E[x²] - E[x]²) survived now and then.
            y = (x - mean) * scale + mean + offset * max(std * scale, 1.0)
        else:
            t = student_t(v.shape, 2.5, int(torch.randint(0, 2**62, (), generator=gen)), v.device)
            y = mean + std * t.clamp(-1e3, 1e3) / math.sqrt(5.0)
        out.append(y.to(v.dtype))
    return out


def student_t(shape: torch.Size, df: float, seed: int, device: torch.device) -> torch.Tensor:
    """Student-t draws made on the tensor's own device (fast for GPU-sized inputs)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn(shape, generator=gen, device=device, dtype=torch.float64)
    chi2 = 2 * torch._standard_gamma(torch.full(shape, df / 2, device=device, dtype=torch.float64),
                                     generator=gen)
    return z / torch.sqrt(chi2 / df)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and -0.0 included), unlike ``torch.equal``."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool((a.contiguous().view(-1).view(torch.uint8)
                 == b.contiguous().view(-1).view(torch.uint8)).all())


def poisoned_fraction(t: torch.Tensor) -> float:
    """Share of an output's bytes that still hold the poison pattern."""
    raw = t.detach().contiguous().view(-1).view(torch.uint8)
    if raw.numel() == 0:
        return 0.0
    width = t.element_size()
    words = raw.view(-1, width)
    return float((words == POISON_BYTE).all(dim=1).float().mean())


def reset_persisting_l2() -> None:
    """Drop any persisting-L2 carve-out, so data pinned in L2 cannot survive the flush."""
    cudart = _cudart()
    if cudart is None:
        return
    cudart.cudaDeviceSetLimit(cudart.cudaLimit.cudaLimitPersistingL2CacheSize, 0)
    cudart.cudaCtxResetPersistingL2Cache()


_CUDART: Any = None


def _cudart() -> Any:
    global _CUDART
    if _CUDART is None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            try:
                from cuda import cudart
            except ImportError:
                cudart = False
        _CUDART = cudart
    return _CUDART or None


def error_reply(exc: BaseException, where: str) -> dict[str, Any]:
    lines = str(exc).strip().splitlines()
    reply: dict[str, Any] = {"error": f"{type(exc).__name__}: {lines[0] if lines else ''}",
                             "where": where, "traceback": traceback.format_exc()[-3000:]}
    if isinstance(exc, Refused):
        reply.update(rule=exc.rule, error=str(exc), evidence=exc.evidence)
    elif getattr(type(exc), "kernelab_rule", None) == "compile":   # the CUDA loader's CompileError
        log = str(getattr(exc, "log", ""))
        reply.update(rule="compile", error=f"the CUDA source does not compile: {_first_error(log)}",
                     evidence={"log": log[-COMPILE_LOG_CHARS:]})
    return reply


def _first_error(log: str) -> str:
    """The compiler's first ``error:`` line, for a one-line reason; the whole log is evidence."""
    return next((line.strip() for line in log.splitlines() if "error" in line), "see the log")


def machine_fingerprint(msg: dict[str, Any]) -> dict[str, Any]:
    """A fingerprinting sandbox's one request: compile the candidate's kernels for ``arch`` (the
    device's when None) and read their machine code. This replaces Triton's driver with a
    compile-only stand-in, so such a sandbox evaluates nothing else."""
    from kernelabd.fingerprint import to_json
    from kernelabd.fingerprint.build import fingerprint_file

    arch = msg.get("arch")
    if arch is None:
        major, minor = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else (9, 0)
        arch = f"sm_{major}{minor}"
    kernels = fingerprint_file(Path(msg["path"]), arch, Path(msg["reference"]))
    return {"arch": arch, **to_json(kernels, with_code=True)}


def serve(sock: Any, prewarming: threading.Thread | None = None) -> None:
    harness = Harness()
    handlers = {
        "calibrate": harness.calibrate, "block": harness.block, "hot": harness.hot,
        "graphs": harness.use_graphs, "oracle_fingerprints": harness.oracle_fingerprints,
    }
    while True:
        msg, tensors = wire.recv(sock)
        cmd = msg.get("cmd")
        if cmd == "exit":
            return
        try:
            if cmd == "load_reference":
                reply, out = harness.load_reference(msg)
            elif cmd == "load_candidate":
                if prewarming is not None:   # no thread of ours runs beside a candidate's code
                    prewarming.join()
                reply, out = harness.load_candidate(msg, tensors)
            elif cmd == "fingerprint":
                if prewarming is not None:   # nor beside the stand-in driver fingerprinting sets
                    prewarming.join()
                reply, out = machine_fingerprint(msg), []
            else:
                reply, out = handlers[cmd](msg), []
        except Exception as exc:  # every failure of evaluated code becomes a reply
            reply, out = error_reply(exc, str(cmd)), []
        wire.send(sock, reply, out)


_HARNESS = _harness_objects()


def prewarm() -> None:
    """Build what a first request would otherwise wait for: the CUDA context, Triton and the
    driver stubs it compiles with a C compiler into this sandbox's fresh cache.

    It runs on a thread from the moment the process starts, so a check's candidate sandbox,
    started alongside the reference's, does this while the reference runs; a candidate is
    loaded only once it is done. Nothing here decides anything; a failure only means the first
    request does the work itself.
    """
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return
    with contextlib.suppress(Exception):
        torch.empty(1, device="cuda")
        import triton

        triton.runtime.driver.active.get_current_device()


def main() -> None:
    import socket

    sock = socket.socket(fileno=int(sys.argv[1]))
    Path("triton-cache").mkdir(exist_ok=True)
    prewarming = threading.Thread(target=prewarm, name="kernelab-prewarm", daemon=True)
    prewarming.start()
    serve(sock, prewarming)


if __name__ == "__main__":
    main()
