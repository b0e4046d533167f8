"""Timed inputs that never repeat, and output fingerprints the verdict can spot-check.

Every timed sample runs on its input set multiplied elementwise by ``1 + EPS·u`` (u uniform
noise), read at an offset derived from (comparison seed, sample index). No two samples see the same
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


def factors_like(t: torch.Tensor, seed: int, index: int) -> torch.Tensor:
    """``1 + EPS·u``, u ~ Uniform(-1, 1), twice ``t``'s size, flat, in ``t``'s dtype and device.

    A sample reads a window of it starting at its offset, so perturbing costs one
    multiplication and no copy: the timed kernel's neighbours stay light.
    """
    gen = _generator(seed * 1000003 + index, t.device)
    u = torch.rand(2 * t.numel(), generator=gen, device=t.device, dtype=torch.float32)
    return (u.mul_(2 * EPS).add_(1 - EPS)).to(t.dtype)


def perturbable(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1


def perturb_into(out: torch.Tensor, pristine: torch.Tensor, factors: torch.Tensor, offset: int) -> None:
    """``out = pristine · factors[offset : offset + numel]`` (elementwise).

    Multiplicative and elementwise, so signs (and positivity) are kept while no affine
    normalisation (softmax, layer norm) can undo it.
    """
    window = factors[offset:offset + pristine.numel()].view(pristine.shape)
    torch.mul(pristine, window, out=out)


def weights_for(shape: torch.Size, seed: int, index: int, device: torch.device | str) -> torch.Tensor:
    gen = _generator(seed * 7919 + index, device)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)


def fingerprint(out: torch.Tensor, w: torch.Tensor) -> float:
    """Dot product with the weights, products in fp32 and the sum in fp64 (float64 outputs:
    fully in fp64)."""
    if out.dtype == torch.float64:
        return float((out * w.double()).sum())
    return float((out.float() * w).sum(dtype=torch.float64))
