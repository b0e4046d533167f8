"""Timed inputs that never repeat, and output fingerprints the verdict can spot-check.

Every timed sample runs on its input set multiplied elementwise by ``1 + EPS·u``, u uniform
noise drawn from a generator seeded by (comparison seed, sample index, input). No two samples
see the same values, so a cache keyed on content never hits, and one keyed on addresses returns
stale outputs. The noise is drawn straight into the sample's work buffer, so a timed input costs
its pristine copy and one work buffer, however large it is. Right after each sample the sandbox
records a fingerprint of its outputs: their dot product with fixed Gaussian weights. Afterwards
the trusted parent picks samples at random and has the reference sandbox recompute those
fingerprints from the float64 oracle; a stale, deferred or unwritten output is off by far more
than an honest rounding error can be.

Both sandboxes derive the same perturbations and weights from the seeds, on the same device,
with the same operations, so the reference sees exactly the values the candidate saw.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

EPS = 1e-2
FINGERPRINT_SIGMAS = 8.0   # honest error projects to N(0, ||c - o||²): 8σ is never reached
WEIGHTS_MAX = 1 << 28      # fingerprint weights beyond this many elements repeat (1 GiB fp32)


def _generator(*key: int, device: torch.device | str) -> torch.Generator:
    """A generator seeded from a hash of ``key``: the CPU generator keeps only a seed's low 32
    bits, so seeds made by arithmetic (a sample index 2**40 apart) would collide."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


def perturbable(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1


def perturb_into(out: torch.Tensor, pristine: torch.Tensor, seed: int, sample: int, index: int) -> None:
    """``out = pristine · (1 + EPS·u)``, u ~ Uniform(-1, 1) drawn for (seed, sample, index).

    Multiplicative and elementwise, so signs (and positivity) are kept while no affine
    normalisation (softmax, layer norm) can undo it.
    """
    gen = _generator(seed, sample, index, device=out.device)
    torch.rand(out.shape, generator=gen, dtype=out.dtype, device=out.device, out=out)
    out.mul_(2 * EPS).sub_(EPS)
    torch.addcmul(pristine, pristine, out, out=out)


def weights_for(numel: int, seed: int, index: int, device: torch.device | str) -> torch.Tensor:
    """Gaussian weights for an output of ``numel`` elements, flat; at most WEIGHTS_MAX of them,
    repeated over a larger output (whose honest error then still projects to about ||c - o||)."""
    gen = _generator(seed, index, device=device)
    return torch.randn(min(numel, WEIGHTS_MAX), generator=gen, device=device, dtype=torch.float32)


def fingerprint(out: torch.Tensor, w: torch.Tensor, offset: int = 0) -> float:
    """Dot product with the weights, products in fp32 and the sum in fp64 (float64 outputs:
    fully in fp64). ``out`` may be the part of a larger output starting at flat ``offset``:
    the parts' fingerprints then add up to the whole's."""
    flat = out.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=out.device)
    n, start = w.numel(), 0
    while start < flat.numel():
        at = (offset + start) % n
        piece = flat[start:start + n - at]
        ws = w[at:at + piece.numel()]
        if out.dtype == torch.float64:
            total += (piece * ws.double()).sum()
        else:
            total += (piece.float() * ws).sum(dtype=torch.float64)
        start += piece.numel()
    return float(total)
