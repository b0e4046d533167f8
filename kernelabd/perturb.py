"""Timed inputs that never repeat, and output fingerprints the verdict can spot-check.

Every timed sample runs on its input set multiplied elementwise by ``1 + EPS·noise``, the noise
rolled by an offset derived from (comparison seed, sample index). No two samples see the same
values, so a cache keyed on content never hits, and one keyed on addresses returns stale
outputs. Right after each sample the sandbox records a fingerprint of its outputs: their dot
product with fixed Gaussian weights. Afterwards the trusted parent picks samples at random and
has the reference sandbox recompute those fingerprints from the float64 oracle; a stale, deferred
or unwritten output is off by far more than an honest rounding error can be.

Both sandboxes derive the same perturbations and weights from the seeds, on the same device,
with the same operations, so the reference sees exactly the values the candidate saw.
"""

from __future__ import annotations

import random
from typing import Any

import torch

EPS = 1e-2
FINGERPRINT_SIGMAS = 8.0   # honest error projects to N(0, ||c - o||²): 8σ is never reached


def offsets(seed: int, sample: int, count: int, numels: list[int]) -> list[int]:
    """Roll offsets of the noise for each perturbed input of one sample (deterministic)."""
    rng = random.Random(f"{seed}:{sample}")
    return [rng.randrange(max(n, 1)) for n in numels[:count]]


def _generator(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed % (2**63))


def noise_like(t: torch.Tensor, seed: int, index: int) -> torch.Tensor:
    """Uniform(-1, 1) noise of ``t``'s shape, flattened, in float32 on ``t``'s device."""
    gen = _generator(seed * 1000003 + index, t.device)
    return torch.rand(t.numel(), generator=gen, device=t.device, dtype=torch.float32) * 2 - 1


def perturbable(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1


def perturb_into(out: torch.Tensor, pristine: torch.Tensor, noise: torch.Tensor, offset: int) -> None:
    """``out = pristine · (1 + EPS · roll(noise, offset))`` in the input's own dtype.

    Multiplicative and elementwise, so signs (and positivity) are kept while no affine
    normalisation (softmax, layer norm) can undo it.
    """
    factor = torch.roll(noise, offset).view(pristine.shape).to(pristine.dtype).mul_(EPS).add_(1)
    torch.mul(pristine, factor, out=out)


def weights_for(shape: torch.Size, seed: int, index: int, device: torch.device | str) -> torch.Tensor:
    gen = _generator(seed * 7919 + index, device)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)


def fingerprint(out: torch.Tensor, w: torch.Tensor) -> float:
    """Dot product with the weights, products in fp32 and the sum in fp64 (float64 outputs:
    fully in fp64)."""
    if out.dtype == torch.float64:
        return float((out * w.double()).sum())
    return float((out.float() * w).sum(dtype=torch.float64))
