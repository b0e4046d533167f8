"""What the reference sandbox makes from the reference's code: models with re-randomised
parameters and input sets from secret seeds, in the distributions the gate checks.

These run next to the reference's own code, inside its sandbox: nothing here decides anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class Refused(Exception):
    """The evaluated code did something the harness refuses; ``rule`` names what."""

    def __init__(self, rule: str, message: str, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.evidence = evidence or {}


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
            mean, std = moments(p.detach())
            scale = max(std, 0.1 * abs(mean), 0.05)
            noise = torch.randn(p.shape, generator=gens[p.device], dtype=work_dtype(p), device=p.device)
            p.copy_((noise.mul_(scale).add_(mean)).to(p.dtype))


def work_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 arithmetic for every floating dtype but fp64: a variant of a 6 GB fp32 input must
    not need 13 GB of float64 temporaries, and its values are rounded to the input's dtype."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def moments(t: torch.Tensor) -> tuple[float, float]:
    """Mean and standard deviation accumulated in float64 without a float64 copy."""
    if t.numel() == 0:
        return 0.0, 0.0
    mean = float(t.sum(dtype=torch.float64)) / t.numel()
    if t.numel() < 2:
        return mean, 0.0
    var = float(torch.var(t.to(work_dtype(t)), correction=1))
    return mean, math.sqrt(max(var, 0.0))


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
        mean, std = moments(v)
        std = std or 1.0
        x = v.to(work_dtype(v), copy=True)
        if variant == "scaled":
            scale = 10 ** (torch.rand((), generator=gen, dtype=torch.float64).item() * 1.5 - 0.5)
            offset = 100 + 100 * torch.rand((), generator=gen, dtype=torch.float64).item()
            # The offset is counted in standard deviations of the *scaled* values: counted in
            # the original ones, a stretch by 10 left only 10-20 σ, which a one-pass variance
            # (E[x²] - E[x]²) survived now and then.
            y = x.sub_(mean).mul_(scale).add_(mean + offset * max(std * scale, 1.0))
        else:
            t = student_t(v.shape, 2.5, int(torch.randint(0, 2**62, (), generator=gen)), v.device, x.dtype)
            y = t.clamp_(-1e3, 1e3).mul_(std / math.sqrt(5.0)).add_(mean)
        out.append(y.to(v.dtype))
    return out


def student_t(shape: torch.Size, df: float, seed: int, device: torch.device,
              dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Student-t draws made on the tensor's own device (fast for GPU-sized inputs)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    chi2 = torch._standard_gamma(torch.full(shape, df / 2, device=device, dtype=dtype), generator=gen)
    return z.div_(chi2.mul_(2 / df).sqrt_())
