"""Bytes of every KernelBench problem's inputs, outputs and weights at its own sizes, measured on
PyTorch's meta device (no memory is allocated), so that the sweep can run the large problems one
at a time. Each problem runs in a subprocess of its own with a timeout.

    python3 bench/kernelbench/sizes.py            # writes bench/kernelbench/sizes.json
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "bench" / "coverage" / "kernelbench"

PROBE = r"""
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("ref", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))
with torch.device("meta"), torch.no_grad():
    model = mod.Model(*mod.get_init_inputs())
    inputs = list(mod.get_inputs())
    out = model(*inputs)
outs = list(out) if isinstance(out, (tuple, list)) else [out]
sizes = {"inputs": nbytes(inputs), "outputs": nbytes(outs), "params": nbytes(list(model.state_dict().values()))}
print(json.dumps({**sizes, "bytes": sum(sizes.values())}))
"""


def meta_bytes(path: Path) -> dict:
    """One problem's bytes, from a subprocess of its own (its code is the problem's)."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True,
                              timeout=120)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return {"error": "no meta run (see the sweep's own row)"}


def main() -> None:
    found = {}
    for path in sorted(PROBLEMS.glob("level[12]/*.py")):
        found[f"{path.parent.name}/{path.name}"] = meta_bytes(path)
        print(path.name, found[f"{path.parent.name}/{path.name}"], flush=True)
    Path(__file__).with_name("sizes.json").write_text(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
