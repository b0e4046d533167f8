"""The ``inductor`` proposer: compile the reference with TorchInductor, capture the Triton it
generates, and rewrite that output into a standalone ``ModelNew`` — a deterministic
PyTorch → Triton port whose kernels and launch configurations are explicit and tunable.

Why it is built this way:

- **The compile runs in a subprocess** (``python -m kernelabd.propose.inductor.codegen``, with a timeout
  and a private Inductor cache directory). Dynamo and Inductor keep process-wide caches, config
  and patched globals; none of that may leak into the worker that keeps running jobs. Only a
  JSON answer (the candidate, or why there is none) comes back.
- **Nothing is run**: a hook on ``GraphLowering.save_output_code`` takes Inductor's output code
  (the Python module with ``async_compile.triton(...)`` kernel sources and the ``call(args)``
  wrapper) and aborts the compile there, before any kernel is compiled or launched.
- **GPU-only by default.** On a GPU (job device ``cuda:N``) Inductor runs as it does for
  ``torch.compile``. Without one Inductor emits C++, so the proposer is unavailable on a machine
  without an NVIDIA GPU unless ``KERNELAB_INDUCTOR_ON_CPU=1``: the subprocess then asks for
  Inductor's Triton CPU backend (``cpu_backend = "triton"``) and registers a stand-in Triton
  driver whose target is an sm_90 GPU, which is all code generation needs. Those kernels are what
  the CPU worker runs under ``TRITON_INTERPRET=1``; Inductor's choices for a real GPU (tiling,
  persistent vs looped reductions) can differ, so CPU runs prove the rewrite, not GPU performance.
- **Shapes are symbolic** (``dynamic=True``, no duck sizing, parameters not forced static), so
  one port serves every batch size. What Inductor still specialises (sizes that come from
  constructor arguments, such as ``nn.LayerNorm(features)``) is kept as its own
  size/stride assertions, which raise a clear error; and the port is generated for every shape
  the gate will check (the sidecar's sizes for the device and its ``extra_shapes``): if the
  generated code differs between them, the proposer declines instead of proposing a candidate
  that is right for one shape only.
- **The candidate never imports ``torch._inductor`` or calls ``torch.compile``.** The
  ``@triton_heuristics.*`` decorators (autotuning, size hints) are dropped; each kernel is a
  plain ``@triton.jit`` function launched by an explicit launcher with its grid, block sizes,
  ``num_warps`` and ``num_stages`` as module-level ``TUNABLES`` (the ``tune`` proposer's
  convention). ``triton_helpers`` functions a kernel uses are copied in (renamed ``th_*``);
  ``libdevice`` is Triton's own on a GPU, as in Inductor, and ``tl`` equivalents under the
  interpreter, which cannot run libdevice.
- **Graphs Inductor hands to extern kernels are declined**: ``extern_kernels.mm``/``addmm``/
  convolutions and aten fallbacks would be PyTorch compute outside a Triton launch (the gate's
  ``torch_compute`` rule). So are kernel kinds this rewrite does not know (templates, scans,
  cooperative or split reductions, combo kernels, user Triton kernels). A decline is a
  ``Decline`` from ``propose`` with the reason, also in the log.

The package follows the port's steps: ``parse`` reads Inductor's output code, ``rewrite`` turns
its ``call`` into plain allocations and explicit launches, ``emit`` writes the candidate file,
``codegen`` is the subprocess (the only module that imports ``torch._inductor``) and
``proposer`` the proposer that runs it.
"""
