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
WINDOW = 1 << 22           # distinct offsets of a large input's noise: 4 M perturbations each
WEIGHTS_MAX = 1 << 28      # fingerprint weights beyond this many elements repeat (1 GiB fp32)


def window(numel: int) -> int:
    """How many offsets an input's noise offers: one per element for small inputs; for a
    multi-gigabyte one, WINDOW (the noise is then only WINDOW elements longer than the input,
    not twice its size, and no two of a comparison's few hundred samples share one)."""
    return max(1, min(numel, WINDOW))


def offsets(seed: int, sample: int, count: int, numels: list[int]) -> list[int]:
    """Roll offsets of the noise for each perturbed input of one sample (deterministic)."""
    rng = random.Random(f"{seed}:{sample}")
    return [rng.randrange(window(n)) for n in numels[:count]]


def _generator(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed % (2**63))


def factors_like(t: torch.Tensor, seed: int, index: int) -> torch.Tensor:
    """``1 + EPS·u``, u ~ Uniform(-1, 1), ``t``'s size plus its window, flat, in ``t``'s dtype
    and device.

    A sample reads a window of it starting at its offset, so perturbing costs one
    multiplication and no copy: the timed kernel's neighbours stay light.
    """
    gen = _generator(seed * 1000003 + index, t.device)
    u = torch.rand(t.numel() + window(t.numel()), generator=gen, device=t.device, dtype=torch.float32)
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
    """Gaussian weights for an output of ``shape``, flat; at most WEIGHTS_MAX of them, repeated
    over a larger output (whose honest error then still projects to about ||c - o||)."""
    gen = _generator(seed * 7919 + index, device)
    numel = 1
    for s in shape:
        numel *= s
    return torch.randn(min(numel, WEIGHTS_MAX), generator=gen, device=device, dtype=torch.float32)


def fingerprint(out: torch.Tensor, w: torch.Tensor) -> float:
    """Dot product with the weights, products in fp32 and the sum in fp64 (float64 outputs:
    fully in fp64), a weight-vector's length at a time."""
    flat = out.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=out.device)
    for start in range(0, flat.numel(), w.numel()):
        piece = flat[start:start + w.numel()]
        ws = w[:piece.numel()]
        if out.dtype == torch.float64:
            total += (piece * ws.double()).sum()
        else:
            total += (piece.float() * ws).sum(dtype=torch.float64)
    return float(total)
