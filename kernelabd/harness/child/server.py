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
import functools
import importlib.util
import math
import os
import resource
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from types import CellType, FunctionType, ModuleType
from typing import Any

import numpy
import torch
from torch.autograd.profiler import profile as op_profile
from torch.autograd.profiler import record_function

from kernelabd.harness import gate, problem, shared, wire
from kernelabd.harness.child import capture, perturb
from kernelabd.harness.child import inputs as reference_inputs
from kernelabd.harness.child.inputs import (
    Refused,
    apply_variant,
    on_device,
    outputs_of,
    randomise_parameters,
    require_json,
)
from kernelabd.harness.gate import calibrate, oracle_wire_dtype, rel_errors, same_bits

# Captured before any evaluated code is imported: what the harness relies on.
_TENSOR = torch.Tensor
_type = builtins.type
_perf_ns = time.perf_counter_ns
# On a CPU a sample is this process's CPU time, all threads: the cores are shared with whatever
# else runs on the machine, and a preemption lands more often on a longer call, so wall time
# inflates a slower side's samples more than a faster one's (on a loaded 2-core machine an
# honest 2x gain read as 3.1-3.3x, and the parent's wall-clock cross-check rightly refused it).
_cpu_ns = functools.partial(time.clock_gettime_ns, time.CLOCK_PROCESS_CPUTIME_ID)
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
WATCHED_MODULES: tuple[ModuleType, ...] = (gate, perturb, wire, shared, reference_inputs, capture, problem)


def _harness_objects() -> dict[str, Any]:
    """This module's own functions and classes, the harness classes' methods, and the watched
    modules' functions: replacing any of them is tampering, like replacing ``time.*``."""
    found: dict[str, Any] = {}
    for name, value in list(globals().items()):
        if callable(value) or isinstance(value, ModuleType):
            found[f"sandbox.{name}"] = value
    for cls in (Harness, LaunchCounter, shared.Arena):
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


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


class Harness:
    """State of one sandbox: the model(s) under evaluation, the arenas it keeps mapped, and its
    timing buffers. A reference sandbox lives as long as its job; a candidate's as long as the
    candidate is evaluated or stays the incumbent."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.ready = False
        self.module: ModuleType | None = None
        self.shapes: list[dict[str, Any]] = []
        self.defaults: dict[str, Any] = {}
        self.models: list[torch.nn.Module] = []
        self.param_seeds: list[int] | None = None
        self.init_inputs: list[list[Any]] = []
        self.oracle_chunks = 1                      # the memory plan's batch chunks for float64
        self.oracle_whole_fits = False              # the plan's room for it whole, if not separable
        self.arenas: list[shared.Arena] = []        # the reference's sets, kept mapped
        self.timing_arena: shared.Arena | None = None
        self.timing_inputs: list[list[Any]] = []
        self.work: list[list[Any]] = []
        self.weights: dict[int, torch.Tensor] = {}
        self.seeds: tuple[int, int] | None = None
        self.perturb_seed = self.fp_seed = 0
        self.oracle_models: dict[int, torch.nn.Module] = {}
        self.launches = LaunchCounter()
        self.graphs: list[Any] | None = None
        self.graph_reps = 1
        self.flush_buf: torch.Tensor | None = None
        self.after_send: list[shared.Arena] = []

    # ----- setup -------------------------------------------------------------------------
    def setup(self, msg: dict[str, Any]) -> None:
        """Once per process: the device, TF32 policy and the launch counter."""
        if self.ready:
            return
        self.device = msg["device"]
        tf32 = bool(msg.get("tf32", False))
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if self.device != "cpu":
            torch.cuda.set_device(0)
        else:
            torch.set_num_threads(1)     # no worker threads spinning into a sample's CPU time
        with contextlib.suppress(ImportError):  # no Triton/cuda-python: nothing can launch
            self.launches.install(msg.get("target", "triton"))
        self.ready = True

    def hello(self) -> dict[str, Any]:
        arenas = self.arenas + ([self.timing_arena] if self.timing_arena is not None else [])
        info: dict[str, Any] = {"device": self.device, "rss_peak_bytes": _rss_peak(),
                                "arena_bytes": sum(a.nbytes for a in arenas)}
        if self.device != "cpu":
            props = torch.cuda.get_device_properties(0)
            free, total = torch.cuda.mem_get_info(0)
            info.update(name=props.name, uuid=str(getattr(props, "uuid", "")),
                        l2_bytes=int(getattr(props, "L2_cache_size", 0)), device_free_bytes=int(free),
                        device_total_bytes=int(total), device_peak_bytes=int(torch.cuda.max_memory_allocated()))
        return info

    def open_arenas(self, msg: dict[str, Any], fds: list[int]) -> list[shared.Arena]:
        sizes = msg.get("arenas", [])
        if not isinstance(sizes, list) or len(sizes) != len(fds):
            for fd in fds:
                os.close(fd)
            raise Refused("protocol", "arena descriptors do not match the message")
        return [shared.Arena.open(self.device, fd, int(n)) for fd, n in zip(fds, sizes, strict=True)]

    # ----- reference ---------------------------------------------------------------------
    def use_shape(self, idx: int) -> None:
        """Set shape ``idx``'s module constants; a peer, whose constants were set once at load
        (it is timed at one shape and never gated), has no module kept."""
        if self.module is None:
            return
        for key, value in {**self.defaults, **self.shapes[idx]}.items():
            setattr(self.module, key, value)

    def build(self, msg: dict[str, Any]) -> None:
        """The reference module and one model per shape, parameters re-randomised from the
        secret seeds; kept across requests until the seeds change."""
        self.setup(msg)
        if self.module is None:
            stage("import")
            self.module = load_module(msg["path"], "kernelab_reference")
            self.shapes = msg["shapes"]
            self.defaults = {k: getattr(self.module, k, None) for consts in self.shapes for k in consts}
        if self.param_seeds == msg["param_seeds"]:
            return
        self.models, self.oracle_models, self.init_inputs = [], {}, []
        for idx, seed in enumerate(msg["param_seeds"]):
            self.use_shape(idx)
            stage("get_init_inputs")
            init = list(self.module.get_init_inputs())
            require_json(init, "get_init_inputs()")
            stage("Model(...)")
            model = on_device(self.device, seed, lambda init=init: self.module.Model(*init))
            randomise_parameters(model, seed)
            model._kernelab_consts = dict(self.shapes[idx])
            self.models.append(model.to(self.device).eval())
            self.init_inputs.append(init)
        self.param_seeds = list(msg["param_seeds"])

    def draw(self, entry: dict[str, Any]) -> list[Any]:
        """One input set, made on the device from its secret seed, in its variant."""
        assert self.module is not None
        self.use_shape(entry["shape"])
        stage("get_inputs")
        inputs = on_device(self.device, entry["seed"], lambda: list(self.module.get_inputs()))
        inputs = [v.to(self.device) if isinstance(v, _TENSOR) else v for v in inputs]
        inputs = apply_variant(inputs, entry["variant"], entry["seed"])
        require_json([v for v in inputs if not isinstance(v, _TENSOR)], "get_inputs()")
        return inputs

    def probe_meta(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Sizes without memory: the model, the inputs and one forward on the meta device, so
        that a problem far too large for the machine is refused before anything is allocated.
        A reference that cannot run there (host-only code, an op without a meta kernel) gets
        no estimate, and the real probe decides."""
        self.setup(msg)
        if self.module is None:
            stage("import")
            self.module = load_module(msg["path"], "kernelab_reference")
            self.shapes = msg["shapes"]
            self.defaults = {k: getattr(self.module, k, None) for consts in self.shapes for k in consts}
        shapes = []
        for idx in range(len(self.shapes)):
            self.use_shape(idx)
            try:
                with torch.device("meta"), torch.no_grad():
                    stage("get_init_inputs")
                    init = self.module.get_init_inputs()
                    stage("Model(...)")
                    model = self.module.Model(*init)
                    stage("get_inputs")
                    inputs = list(self.module.get_inputs())
                    stage("forward")
                    outs = outputs_of(model(*inputs), "reference")
            except Exception:  # the real probe reports the reference's own errors
                return {"shapes": None}
            tensors = [v for v in inputs if isinstance(v, _TENSOR)]
            shapes.append(sizes_of(tensors, list(model.state_dict().values()), outs, 0))
        return {"shapes": shapes}

    def probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Sizes for the memory plan: each shape's inputs, parameters and outputs, and the
        peak of one fp32 forward above its inputs (measured on the device)."""
        self.build(msg)
        shapes = []
        for idx in range(len(self.shapes)):
            inputs = self.draw({"shape": idx, "seed": msg["seed"], "variant": "base"})
            tensors = [v for v in inputs if isinstance(v, _TENSOR)]
            if self.device != "cpu":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            with torch.no_grad():
                stage("forward")
                outs = outputs_of(self.models[idx](*inputs), "reference")
            sync(self.device)
            peak = torch.cuda.max_memory_allocated() - before if self.device != "cpu" else 0
            shapes.append(sizes_of(tensors, list(self.models[idx].state_dict().values()), outs, int(peak)))
            del inputs, tensors, outs
        if self.device != "cpu":
            torch.cuda.empty_cache()    # the free memory the plan is sized against, without the probe's
        return {"shapes": shapes, "info": self.hello()}

    def load_reference(self, msg: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """Every input set with its float64 oracle, each set in an arena of its own that the
        trusted process maps; the state dicts in one more. Kept until the next load."""
        self.build(msg)
        self.release()
        self.oracle_chunks = max(1, int(msg.get("oracle_chunks", 1)))
        self.oracle_whole_fits = bool(msg.get("oracle_whole_fits", False))
        state = [v.detach() for m in self.models for v in m.state_dict().values()]
        state_arena, slots = shared.pack(state, self.device)
        self.arenas.append(state_arena)
        shapes, it = [], iter(slots)
        for idx, model in enumerate(self.models):
            keys = list(model.state_dict())
            shapes.append({"init_inputs": self.init_inputs[idx], "state_keys": keys,
                           "state": [next(it).to_json() for _ in keys]})
        n_gate, sets = len(msg["sets"]), []
        timing: list[list[Any]] = []
        for k, entry in enumerate(msg["sets"] + msg["timing_sets"]):
            chunks = self.oracle_chunks if entry["shape"] == 0 else 1
            record, views = self.make_set(entry, keep_oracle=k < n_gate, chunks=chunks)
            sets.append(record)
            if k >= n_gate:
                timing.append(views)
        self.set_timing_inputs(timing)
        if self.device != "cpu":
            torch.cuda.empty_cache()    # the forwards' outputs: the job's other processes need it
        reply = {"shapes": shapes, "sets": sets, "arenas": [a.nbytes for a in self.arenas],
                 "oracle_chunks": self.oracle_chunks, "info": self.hello()}
        return reply, [a.export() for a in self.arenas]

    def make_set(self, entry: dict[str, Any], keep_oracle: bool,
                 chunks: int) -> tuple[dict[str, Any], list[Any]]:
        """One input set: its inputs (pristine) and, for a gate set, its oracle, in a new arena;
        the reference's own error against the oracle calibrates the set's tolerance. A timing
        set's oracle is needed for that alone, so it is dropped once the calibration is made:
        on 63_conv two of them held 16 GiB for nothing."""
        inputs = self.draw(entry)
        tensors = [v for v in inputs if isinstance(v, _TENSOR)]
        with torch.no_grad():
            stage("forward")
            outs = outputs_of(self.models[entry["shape"]](*[_fresh(v) for v in inputs]), "reference")
        sync(self.device)
        layout = shared.Layout()
        in_slots = [layout.add(t.dtype, list(t.shape)) for t in tensors]
        or_slots = [layout.add(oracle_wire_dtype(o), list(o.shape)) for o in outs] if keep_oracle else []
        arena = shared.Arena.allocate(self.device, layout.nbytes)
        self.arenas.append(arena)
        for t, slot in zip(tensors, in_slots, strict=True):
            arena.tensor(slot).copy_(t)
        del tensors
        pristine = self.rebuild(inputs, arena, in_slots)
        oracle = ([arena.tensor(s) for s in or_slots] if keep_oracle else
                  [torch.empty(o.shape, dtype=oracle_wire_dtype(o), device=o.device) for o in outs])
        stage("forward (float64)")
        self.fill_oracle(entry["shape"], pristine, oracle, chunks, outs)
        record = {"kinds": ["tensor" if isinstance(v, _TENSOR) else "scalar" for v in inputs],
                  "scalars": [None if isinstance(v, _TENSOR) else v for v in inputs],
                  "inputs": [s.to_json() for s in in_slots],
                  "oracle": [s.to_json() for s in or_slots],
                  "outputs": describe(outs), "calib": calibrate(outs, oracle),
                  "arena": len(self.arenas) - 1}
        return record, pristine

    @staticmethod
    def rebuild(inputs: list[Any], arena: shared.Arena, slots: list[shared.Slot]) -> list[Any]:
        it = iter(slots)
        return [arena.tensor(next(it)) if isinstance(v, _TENSOR) else v for v in inputs]

    def fill_oracle(self, shape: int, inputs: list[Any], oracle: list[torch.Tensor], chunks: int,
                    outs: list[torch.Tensor]) -> None:
        """The float64 reference on ``inputs``, written into ``oracle``; with ``chunks`` > 1 one
        batch slice at a time, after checking on fp32 that the model is separable that way. Not
        separable, it is computed whole where the plan found room for that (chunks were chosen
        for margin), and for the rest of the job; else the problem is refused."""
        model = self.oracle(shape)
        batch = inputs_batch(inputs)
        if chunks > 1 and batch is not None and not self.separable(shape, inputs, outs, batch // chunks):
            if not self.oracle_whole_fits:
                raise Refused("too_big", "the float64 oracle does not fit on the device whole, and the "
                              "reference's outputs are not separable along the batch (a slice of the batch "
                              "gives other values), so it cannot be computed in chunks")
            self.oracle_chunks = chunks = 1
        if chunks <= 1 or batch is None:
            with torch.no_grad():
                got = outputs_of(model(*_as_double(inputs)), "reference (float64)")
            _store(oracle, got)
            return
        step = batch // chunks
        for c in range(chunks):
            part = _slice_batch(inputs, batch, c * step, (c + 1) * step)
            with torch.no_grad():
                got = outputs_of(model(*_as_double(part)), "reference (float64)")
            _store([o[c * step:(c + 1) * step] for o in oracle], got)

    def separable(self, shape: int, inputs: list[Any], outs: list[torch.Tensor], step: int) -> bool:
        """Whether the fp32 reference on the batch's first ``step`` rows gives the whole's."""
        with torch.no_grad():
            part = outputs_of(self.models[shape](*_slice_batch(inputs, inputs_batch(inputs), 0, step)),
                              "reference")
        return all(got.shape == full[:step].shape and rel_errors(got, full[:step])[0] <= SEPARABLE_TOL
                   for full, got in zip(outs, part, strict=True))

    def release(self) -> None:
        """Unmap this sandbox's sets before new ones are made (a reseeded reference)."""
        self.drop_timing()
        for arena in self.arenas:
            arena.close()
        self.arenas = []

    def capture(self, msg: dict[str, Any]) -> dict[str, Any]:
        stage("capture")
        inputs = [_fresh(v) for v in self.timing_inputs[0]]
        return capture.capture(self.models[0], inputs, self.device, dict(self.shapes[0]))

    # ----- candidate ---------------------------------------------------------------------
    def load_candidate(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Build ``ModelNew`` for every shape from fresh copies of the reference's weights; keep
        its timing inputs (fresh copies too) mapped."""
        self.setup(msg)
        module = load_module(msg["path"], "kernelab_candidate")
        self.check_tamper("importing the candidate")
        if not hasattr(module, "ModelNew"):
            raise Refused("bad_candidate", "the candidate defines no ModelNew")
        arenas = self.open_arenas(msg, fds)
        if not arenas:
            raise Refused("protocol", "load_candidate needs the reference's state arena")
        state, timing = arenas[0], arenas[1] if len(arenas) > 1 else None
        # The shape's module constants, as the reference had them, where the candidate defines
        # them too: a copied constructor or forward that reads ``batch_size`` sees the shape's.
        self.module = module
        self.shapes = [{k: v for k, v in shape.get("constants", {}).items() if hasattr(module, k)}
                       for shape in msg["shapes"]]
        self.defaults = {k: getattr(module, k) for consts in self.shapes for k in consts}
        try:
            for idx, shape in enumerate(msg["shapes"]):
                self.use_shape(idx)
                model = on_device(self.device, None, lambda shape=shape: module.ModelNew(*shape["init_inputs"]))
                sd = {k: state.tensor(shared.Slot.from_json(s, state.nbytes))
                      for k, s in zip(shape["state_keys"], shape["state"], strict=True)}
                try:
                    model.load_state_dict(sd, strict=True)
                except RuntimeError as exc:
                    raise Refused("state_dict", "ModelNew does not load the reference's state_dict: "
                                  + str(exc).strip().splitlines()[-1].strip()) from exc
                self.models.append(model.to(self.device).eval())
        finally:
            state.close()
        if timing is not None:
            self.take_timing(msg["timing_sets"], timing)
        return {"info": self.hello()}

    def retime(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """New timing inputs (the reference was reseeded): the incumbent keeps its kernels."""
        [timing] = self.open_arenas(msg, fds)
        self.take_timing(msg["timing_sets"], timing)
        return {}

    def take_timing(self, entries: list[dict[str, Any]], arena: shared.Arena) -> None:
        self.drop_timing()
        self.timing_arena = arena
        self.set_timing_inputs([self.rebuild_entry(e, arena) for e in entries])

    @staticmethod
    def rebuild_entry(entry: dict[str, Any], arena: shared.Arena) -> list[Any]:
        it = iter(entry["inputs"])
        return [arena.tensor(shared.Slot.from_json(next(it), arena.nbytes)) if kind == "tensor" else scalar
                for kind, scalar in zip(entry["kinds"], entry["scalars"], strict=True)]

    def set_timing_inputs(self, inputs: list[list[Any]]) -> None:
        self.drop_timing(keep_arena=True)
        self.timing_inputs = inputs

    def drop_timing(self, keep_arena: bool = False) -> None:
        """Forget timing buffers (captured graphs first: they point into them)."""
        self.graphs, self.graph_reps = None, 1
        self.work, self.weights, self.seeds = [], {}, None
        self.timing_inputs = []
        if not keep_arena and self.timing_arena is not None:
            self.timing_arena.close()
            self.timing_arena = None

    def gate_set(self, msg: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        """One gated forward on an input set the trusted process copied for this call; its
        outputs go back in a new arena (this process keeps no copy)."""
        [arena] = self.open_arenas(msg, fds)
        layout = shared.Layout()
        for out in msg.get("expect", []):
            layout.add(wire.DTYPES[out["dtype"]], out["shape"])
        out_arena = shared.Arena.allocate(self.device, layout.nbytes)
        try:
            args = self.rebuild_entry(msg, arena)
            outs, report, slots = self.gated_call(int(msg["shape"]), args, int(msg.get("poison_bytes", 0)),
                                                  out_arena, layout.slots)
            if slots is None:               # not the expected outputs: sent as they are
                out_arena.close()
                out_arena, slots = shared.pack(outs, self.device)
            sync(self.device)
        except BaseException:
            out_arena.close()
            raise
        finally:
            arena.close()
        del args, outs
        if self.device != "cpu":
            torch.cuda.empty_cache()        # a gated call's blocks are not kept beside the timing's
        self.after_send.append(out_arena)
        return ({"report": report, "outputs": [s.to_json() for s in slots], "arenas": [out_arena.nbytes],
                 "kernels": dict(self.launches.kernels), "info": self.hello()}, [out_arena.export()])

    def gated_call(self, shape: int, args: list[Any], poison_bytes: int, out_arena: shared.Arena,
                   expect: list[shared.Slot]) -> tuple[list[torch.Tensor], dict[str, Any], list[shared.Slot] | None]:
        """One forward with poisoned memory and op/launch counting; its outputs are copied into
        ``out_arena`` at once on the caller's stream when they have the expected shapes and
        dtypes (that copy is also the snapshot the synchronisation rule compares). Whether it
        wrote into its inputs is for the trusted process to see."""
        self.poison(poison_bytes)
        launches_before = sum(self.launches.kernels.values())
        if self.device != "cpu":
            self.launches.caller_stream = torch.cuda.current_stream()
        self.use_shape(shape)
        slots: list[shared.Slot] | None = None
        try:
            # The autograd profiler, not ``torch.profiler.profile``: the same dispatcher hooks and
            # events, without the latter's first-use import of ``torch._inductor`` (measured at
            # 10 s of a fresh sandbox's first gated call on a loaded 2-core host, torch 2.14).
            with torch.no_grad(), op_profile(use_cpu=True, use_kineto=True) as prof:
                outs = flatten_outputs(self.models[shape](*args))
                # Copied on the caller's stream at once, before any synchronisation (and before
                # the profiler's own teardown): work still running on another stream when
                # forward returned shows up as a difference.
                if [(list(o.shape), o.dtype) for o in outs] == [(s.shape, wire.DTYPES[s.dtype]) for s in expect]:
                    slots = expect
                    for o, slot in zip(outs, slots, strict=True):
                        out_arena.tensor(slot).copy_(o)
            ops = torch_compute_ops(prof.function_events)
        except RuntimeError as exc:
            if "profiler" not in str(exc).lower():
                raise
            raise Refused("tampering", f"the op profiler was stopped during forward: {exc}") from exc
        finally:
            self.launches.caller_stream = None
        sync(self.device)
        self.check_tamper("running forward")
        unsynchronised = [] if slots is None else [
            i for i, (o, slot) in enumerate(zip(outs, slots, strict=True)) if not same_bits(o, out_arena.tensor(slot))]
        report = {"outputs": describe(outs), "torch_ops": dict(ops),
                  "launches": sum(self.launches.kernels.values()) - launches_before,
                  "poisoned": [poisoned_fraction(o) for o in outs], "unsynchronised": unsynchronised}
        return outs, report, slots

    def release_timing(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Drop the work buffers and graphs of the last comparison (a reference that was the
        baseline), keeping the timing inputs: the next comparison makes its own."""
        self.graphs, self.work, self.seeds, self.weights = None, [], None, {}
        if self.device != "cpu":
            torch.cuda.empty_cache()
        return {}

    def poison(self, nbytes: int) -> None:
        """Fill memory the allocator will hand out next with NaN bytes, then free it.

        An output the candidate allocates but never writes then reads as poison, whatever the
        allocator recycled. On a GPU one block (twice the outputs' size, as the trusted process
        says) covers the caching allocator's next allocations; on CPU, blocks of that size are
        what malloc returns next.
        """
        nbytes = max(nbytes, 1 << 20)
        if self.device == "cpu":
            blob = torch.empty(nbytes, dtype=torch.uint8)
            blob.fill_(POISON_BYTE)
            del blob
            return
        blob = torch.empty(max(nbytes, 64 << 20), dtype=torch.uint8, device=self.device)
        blob.fill_(POISON_BYTE)
        del blob

    def check_tamper(self, when: str) -> None:
        changed = tampered()
        if changed:
            raise Refused("tampering", f"harness functions replaced while {when}: "
                          f"{', '.join(changed)}", {"replaced": changed})

    # ----- peers (torch.compile of the reference) ----------------------------------------
    def load_peer(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """The reference under ``torch.compile(mode=...)``, with the candidate's weights and
        timing inputs, compiled by one warm-up call: what a user already has."""
        self.setup(msg)
        module = load_module(msg["path"], "kernelab_reference")
        for key, value in msg["constants"].items():
            setattr(module, key, value)
        state, timing = self.open_arenas(msg, fds)
        shape = msg["shapes"][0]
        try:
            model = on_device(self.device, 0, lambda: module.Model(*shape["init_inputs"]))
            model.load_state_dict({k: state.tensor(shared.Slot.from_json(s, state.nbytes))
                                   for k, s in zip(shape["state_keys"], shape["state"], strict=True)})
        finally:
            state.close()
        model = model.to(self.device).eval()
        mode = None if msg["mode"] == "default" else msg["mode"]
        self.models = [torch.compile(model, mode=mode)]
        self.take_timing(msg["timing_sets"], timing)
        t0 = _perf_ns()
        with torch.no_grad():
            self.models[0](*[_fresh(v) for v in self.timing_inputs[0]])
        sync(self.device)
        return {"compile_s": (_perf_ns() - t0) / 1e9, "info": self.hello()}

    # ----- timing ------------------------------------------------------------------------
    def prepare_timing(self, msg: dict[str, Any]) -> None:
        """Work buffers (what the model reads while timed) and the perturbation noise, made
        again whenever a comparison brings new seeds."""
        seeds = (int(msg["perturb_seed"]), int(msg["fp_seed"]))
        self.use_shape(0)                           # timed at the first shape's sizes
        if self.seeds == seeds:
            return
        self.graphs, self.graph_reps, self.work, self.weights = None, 1, [], {}
        self.perturb_seed, self.fp_seed = seeds
        self.work = [[v.clone() if isinstance(v, _TENSOR) else v for v in inputs] for inputs in self.timing_inputs]
        self.seeds = seeds
    def perturbed_inputs(self, s: int, into: list[Any] | None = None) -> list[Any]:
        """Sample ``s``'s inputs: its set's pristine values times 1 + EPS·noise of its own."""
        pristine = self.timing_inputs[s % len(self.timing_inputs)]
        target = into if into is not None else [v.clone() if isinstance(v, _TENSOR) else v for v in pristine]
        for j, v in enumerate(pristine):
            if perturb.perturbable(v):
                perturb.perturb_into(target[j], v, self.perturb_seed, s, j)
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
            t0 = _cpu_ns()
            out = self.forward(s)
            ms = (_cpu_ns() - t0) / 1e6
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
        return [perturb.fingerprint(o, self.weights_for(j, o)) for j, o in enumerate(outs)]

    def weights_for(self, j: int, o: torch.Tensor, numel: int | None = None) -> torch.Tensor:
        numel = o.numel() if numel is None else numel
        if self.weights.get(j) is None or self.weights[j].numel() != min(numel, perturb.WEIGHTS_MAX):
            self.weights[j] = perturb.weights_for(numel, self.fp_seed, j, o.device)
        return self.weights[j]

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
            self.oracle_models[shape] = model_copy(self.models[shape]).double()
        return self.oracle_models[shape]

    def oracle_fingerprints(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Reference sandbox only: the float64 oracle's fingerprints (and norms) for samples,
        computed in the memory plan's batch chunks (the parts' dot products and squared norms
        add up to the whole's). It needs the comparison's seeds, not its work buffers."""
        seeds = (int(msg["perturb_seed"]), int(msg["fp_seed"]))
        if (self.perturb_seed, self.fp_seed) != seeds:
            self.perturb_seed, self.fp_seed = seeds
            self.weights = {}
        found = []
        for s in msg["samples"]:
            inputs = self.perturbed_inputs(int(s))
            batch = inputs_batch(inputs)
            chunks = self.oracle_chunks if batch else 1
            step = batch // chunks if batch else 0
            parts = []
            for c in range(chunks):
                part = _slice_batch(inputs, batch, c * step, (c + 1) * step) if chunks > 1 else inputs
                with torch.no_grad():
                    outs = outputs_of(self.oracle(0)(*_as_double(part)), "reference (float64)")
                parts.append(self.part_prints(outs, c * step, step * chunks if chunks > 1 else None))
            found.append([{"fp": sum(p[j][0] for p in parts), "norm": math.sqrt(sum(p[j][1] for p in parts)),
                           "finite": all(p[j][2] for p in parts)} for j in range(len(parts[0]))])
            del inputs
        return {"samples": found}

    def part_prints(self, outs: list[torch.Tensor], row: int, rows: int | None) -> list[tuple[float, float, bool]]:
        """(fingerprint, squared norm, finite) of each output's part starting at batch ``row``
        of ``rows`` (None: the whole output)."""
        found = []
        for j, o in enumerate(outs):
            per_row = o[0].numel() if o.dim() else 1
            w = self.weights_for(j, o, per_row * rows if rows else None)
            found.append((perturb.fingerprint(o, w, row * per_row), squared_norm(o), gate.all_finite(o)))
        return found



def model_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose functions close over the copy: ``copy.deepcopy`` keeps a
    function stored on a module as it is, so minGPT's ``self.mlpf = lambda x:
    m.c_proj(m.act(m.c_fc(x)))`` would still run the original's float32 layers inside a float64
    oracle (and fail, or mix precisions)."""
    memo: dict[int, Any] = {}
    twin = copy.deepcopy(model, memo)
    for module in twin.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, FunctionType) and value.__closure__:
                cells = tuple(_cell_copy(c, memo) for c in value.__closure__)
                module.__dict__[name] = FunctionType(value.__code__, value.__globals__, value.__name__,
                                                     value.__defaults__, cells)
    return twin


def _cell_copy(cell: CellType, memo: dict[int, Any]) -> CellType:
    """``cell`` holding the copy of what it holds, where the deep copy made one."""
    try:
        contents = cell.cell_contents
    except ValueError:      # a cell not yet filled
        return CellType()
    return CellType(memo.get(id(contents), contents))


def squared_norm(t: torch.Tensor) -> float:
    """||t||² in float64 by a reduction, with no float64 copy of ``t``: the re-check of a timed
    sample on KernelBench's 63_conv (an 8 GiB output) asked for 16 GiB more with ``square()``
    on a device its plan had filled, and lost the job."""
    if not t.numel():
        return 0.0
    if not (t.is_floating_point() or t.is_complex()):      # argmax's indices, masks: small
        return float(t.double().square().sum())
    return float(torch.linalg.vector_norm(t.reshape(-1), dtype=torch.float64)) ** 2


SEPARABLE_TOL = 1e-5        # fp32: a batch slice of the outputs must match the whole's that closely


def stage(name: str) -> None:
    """Say on stderr which piece of evaluated code runs next, so that a crash that kills this
    process (os._exit, a segmentation fault) is reported with where it happened."""
    with contextlib.suppress(OSError):
        os.write(2, f"\n{wire.STAGE_MARK}{name}\n".encode())


def sizes_of(tensors: list[torch.Tensor], state: list[torch.Tensor], outs: list[torch.Tensor],
             peak: int) -> dict[str, Any]:
    """One shape's sizes, as the memory plan reads them (``plan.ShapeProbe``)."""
    elem = max((t.element_size() for t in tensors if t.is_floating_point()), default=4)
    return {"inputs_bytes": capture.nbytes(tensors), "params_bytes": capture.nbytes(state),
            "outputs_bytes": capture.nbytes(outs),
            "oracle_bytes": sum(o.numel() * torch.empty((), dtype=oracle_wire_dtype(o)).element_size()
                                for o in outs),
            "peak_bytes": peak, "f64_factor": 8 / elem, "batch": _batch(tensors, outs)}


def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _fresh(v: Any) -> Any:
    """A private copy of an input for one call: the reference may write into its inputs."""
    return v.clone() if isinstance(v, _TENSOR) else v


def _as_double(values: list[Any]) -> list[Any]:
    return [v.double() if isinstance(v, _TENSOR) and v.is_floating_point() else _fresh(v) for v in values]


def _store(into: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    if len(into) != len(got) or any(a.shape != b.shape for a, b in zip(into, got, strict=False)):
        raise Refused("bad_reference", "the float64 reference returned other outputs than the fp32 one")
    for a, b in zip(into, got, strict=True):
        a.copy_(b)


def inputs_batch(inputs: list[Any]) -> int | None:
    """The size of dim 0 that every tensor input with more than one dimension shares, if any."""
    sizes = {v.shape[0] for v in inputs if isinstance(v, _TENSOR) and v.dim() >= 1}
    return sizes.pop() if len(sizes) == 1 else None


def _batch(tensors: list[torch.Tensor], outs: list[torch.Tensor]) -> int | None:
    """The batch the oracle could be chunked along: dim 0 of every input and output alike."""
    size = inputs_batch(list(tensors))
    if size is None or any(o.dim() == 0 or o.shape[0] != size for o in outs):
        return None
    return size


def _slice_batch(inputs: list[Any], batch: int | None, lo: int, hi: int) -> list[Any]:
    return [v[lo:hi] if isinstance(v, _TENSOR) and v.dim() >= 1 and v.shape[0] == batch else v
            for v in inputs]


def poisoned_fraction(t: torch.Tensor) -> float:
    """Share of an output's elements whose bytes all still hold the poison pattern."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() == 0:
        return 0.0
    width = t.element_size()
    words = raw.view(-1, width)
    step = max(1, gate.CHUNK // width)
    poisoned = sum(int((words[i:i + step] == POISON_BYTE).all(dim=1).sum()) for i in range(0, words.shape[0], step))
    return poisoned / words.shape[0]


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
    reply: dict[str, Any] = {"error": problem.one_line(exc, 500),
                             "where": where, "traceback": traceback.format_exc()[-3000:]}
    if isinstance(exc, SystemExit):
        reply["error"] = f"called sys.exit({exc.code!r}) while {where.replace('_', ' ')}"
    elif isinstance(exc, KeyboardInterrupt):
        reply["error"] = f"raised KeyboardInterrupt while {where.replace('_', ' ')}"
    elif isinstance(exc, Refused):
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
    plain = {
        "probe_meta": harness.probe_meta, "probe": harness.probe, "capture": harness.capture,
        "calibrate": harness.calibrate, "block": harness.block, "hot": harness.hot, "graphs": harness.use_graphs,
        "oracle_fingerprints": harness.oracle_fingerprints, "fingerprint": machine_fingerprint,
    }
    with_fds = {"load_candidate": harness.load_candidate, "retime": harness.retime, "load_peer": harness.load_peer}
    untrusted = {"load_candidate", "load_peer", "fingerprint"}
    while True:
        fds: list[int] = []
        msg, _ = wire.recv(sock, fds)
        cmd = msg.get("cmd")
        if cmd == "exit":
            return
        out: list[int] = []
        try:
            if cmd in untrusted and prewarming is not None:
                prewarming.join()        # no thread of ours runs beside a candidate's code
            if cmd == "load_reference":
                reply, out = harness.load_reference(msg)
            elif cmd == "gate_set":
                reply, out = harness.gate_set(msg, fds)
            elif cmd in with_fds:
                reply = with_fds[cmd](msg, fds)
            else:
                reply = plain[cmd](msg)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # evaluated code's failures are replies
            reply, out = error_reply(exc, str(cmd)), []
        finally:
            fds.clear()
        wire.send(sock, reply, fds=out)
        for fd in out:
            os.close(fd)
        for arena in harness.after_send:
            arena.close()
        harness.after_send = []


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
