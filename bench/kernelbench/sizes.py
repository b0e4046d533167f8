"""Bytes of every KernelBench problem's inputs, outputs and weights at its own sizes, measured on
PyTorch's meta device (no memory is allocated), so that the sweep can run the large problems one
at a time. The problems run in subprocesses, 25 to a process, with a timeout.

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
def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))
def measure(path):
    spec = importlib.util.spec_from_file_location("ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with torch.device("meta"), torch.no_grad():
        model = mod.Model(*mod.get_init_inputs())
        inputs = list(mod.get_inputs())
        out = model(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    sizes = {"inputs": nbytes(inputs), "outputs": nbytes(outs), "params": nbytes(list(model.state_dict().values()))}
    return {**sizes, "bytes": sum(sizes.values())}
for path in sys.argv[1:]:
    try:
        found = measure(path)
    except Exception as exc:
        found = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    print(json.dumps({"path": path, **found}), flush=True)
"""
BATCH = 25          # problems a probe process measures (torch is imported once a batch)
TIMEOUT_S = 300


def meta_bytes_many(paths: list[Path]) -> dict[str, dict]:
    """Each problem's bytes, ``BATCH`` problems a subprocess (their code is the problems' own,
    kept out of this process); a batch that dies or runs out of time leaves its unmeasured
    problems with an error, which the sweep's own row then explains."""
    found: dict[str, dict] = {}
    for i in range(0, len(paths), BATCH):
        batch = paths[i:i + BATCH]
        try:
            proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, batch)], capture_output=True,
                                  text=True, timeout=TIMEOUT_S)
            lines = proc.stdout.splitlines()
        except subprocess.TimeoutExpired as exc:
            lines = (exc.stdout or b"").decode(errors="replace").splitlines() if isinstance(exc.stdout, bytes) \
                else (exc.stdout or "").splitlines()
        for line in lines:
            row = json.loads(line)
            found[row.pop("path")] = row
    return {key(p): found.get(str(p), {"error": "no meta run (see the sweep's own row)"}) for p in paths}


def key(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def main() -> None:
    found = meta_bytes_many(sorted(PROBLEMS.glob("level[12]/*.py")))
    for name, sizes in found.items():
        print(name, sizes, flush=True)
    Path(__file__).with_name("sizes.json").write_text(json.dumps(found, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
