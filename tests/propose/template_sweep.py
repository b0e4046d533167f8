"""Run one generated template candidate under several settings of its module-level tunables in
Triton's interpreter, and hold each output to the reference in float64; record which kernels
each setting launched with which compile-time choices (the load path, the split), so that a
test asserts the path it means to cover was taken.

The candidate runs in a subprocess: the interpreter must be on before Triton is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernelabd.propose.base import Proposal
from kernelabd.propose.template.proposer import TemplateProposer
from tests.propose.test_template import context

RUNNER = """
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("candidate", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
config = json.loads(sys.argv[2])
launches = []


class Recorder:
    def __init__(self, name, kernel):
        self.name, self.kernel = name, kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            given = {**dict(zip(getattr(self.kernel, "arg_names", []), args)), **kwargs}
            launches.append({"kernel": self.name, "grid": list(grid),
                             **{k: v for k, v in given.items() if isinstance(v, (bool, int))}})
            return launch(*args, **kwargs)
        return run


for name in [n for n in vars(module) if n.endswith("_kernel")]:
    setattr(module, name, Recorder(name, getattr(module, name)))
gen = torch.Generator().manual_seed(3)
model = module.ModelNew(*config["init"])
for p in model.parameters():
    p.data = (torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5).to(p.dtype)
dtype = getattr(torch, config["dtype"])
inputs = [(torch.randn(s, generator=gen) * config["scale"] + config["offset"]).to(dtype) for s in config["shapes"]]
defaults = {k: getattr(module, k) for k in module.TUNABLES}
results = []
for settings in config["settings"]:
    for name, value in {**defaults, **settings}.items():
        setattr(module, name, value)
    launches.clear()
    with torch.no_grad():
        out = model(*inputs)
    results.append({"settings": settings, "out": out, "launches": list(launches)})
torch.save(results, sys.argv[3])
"""

TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
"""Normwise relative error against float64 a correct kernel stays under: fp32 products at fp32
accuracy (3xTF32 lands at 2–4e-7), half precision at the rounding of its output."""


@dataclass
class Run:
    """One setting's result: its normwise error against float64 and the launches it made."""

    settings: dict[str, int]
    error: float
    launches: list[dict[str, Any]]

    def launched(self, kernel: str, **choices: Any) -> bool:
        """Whether ``kernel`` was launched with every one of ``choices``."""
        return any(launch["kernel"] == kernel and all(launch.get(k) == v for k, v in choices.items())
                   for launch in self.launches)


def candidate(source: str) -> str:
    proposal = TemplateProposer().propose(context(source))
    assert isinstance(proposal, Proposal), "no template matched"
    return proposal.source


def sweep(tmp_path: Path, source: str, init: list[Any], shapes: list[list[int]], settings: list[dict[str, int]],
          dtype: str = "float32", offset: float = 0.0, scale: float = 1.0) -> list[Run]:
    """Every setting of ``settings`` run on the same inputs (``randn · scale + offset`` of
    ``shapes``, in ``dtype``) and weights; errors are normwise against the reference in float64."""
    cand, out = tmp_path / "cand.py", tmp_path / "out.pt"
    cand.write_text(candidate(source))
    config = {"init": init, "shapes": shapes, "settings": settings, "dtype": dtype, "offset": offset,
              "scale": scale}
    run = subprocess.run([sys.executable, "-c", RUNNER, str(cand), json.dumps(config), str(out)],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    space: dict[str, Any] = {}
    exec(source, space)
    model = space["Model"](*init)
    gen = torch.Generator().manual_seed(3)
    for p in model.parameters():
        p.data = (torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5).to(p.dtype)
    inputs = [(torch.randn(s, generator=gen) * scale + offset).to(getattr(torch, dtype)).double() for s in shapes]
    with torch.no_grad():
        want = model.double()(*inputs)
    runs = []
    for result in torch.load(out, weights_only=False):
        got = result["out"]
        assert got.shape == want.shape and got.dtype == getattr(torch, dtype), result["settings"]
        error = float(torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want))
        runs.append(Run(result["settings"], error, result["launches"]))
    return runs


def assert_accurate(runs: list[Run], dtype: str = "float32") -> None:
    bad = {json.dumps(r.settings): r.error for r in runs if not r.error < TOLERANCE[dtype]}   # NaN fails too
    assert not bad, f"normwise error over {TOLERANCE[dtype]:g}: {bad}"
