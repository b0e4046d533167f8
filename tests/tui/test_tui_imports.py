"""The TUI must start fast over SSH on a box full of GPU software: importing any module of
``tui/`` must not pull in torch, triton, CUDA, NVML or the daemon's code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the probe runs there, in a fresh interpreter, so that ``tui`` is the
package of this tree and nothing this test process imported counts."""

FORBIDDEN = ("torch", "triton", "cuda", "pynvml", "kernelabd")

PROBE = """
import json, pkgutil, importlib, sys
import tui
assert tui.__file__, "tui resolved to a namespace package"
names = [m.name for m in pkgutil.walk_packages(tui.__path__, "tui.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def test_no_module_of_tui_imports_torch_triton_cuda_nvml_or_the_daemon() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    result = json.loads(out)
    assert {"tui.app", "tui.cli", "tui.data", "tui.screens.detail"} <= set(result["imported"])
    leaked = [m for m in result["modules"]
              if m.split(".")[0] in FORBIDDEN or m.startswith("kernelabd")]
    assert leaked == []
