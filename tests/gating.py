"""The real gate as the proposer tests use it: a generated candidate is only as good as its
verdict from the same sandboxed check the worker runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelabd.harness.check import run_check


def gate(tmp_path: Path, name: str, reference: str, sidecar: str | None, candidate: str,
         device: str = "cpu") -> dict[str, Any]:
    """Write the files as a user drops them and check them (no timing)."""
    ref, cand = tmp_path / f"{name}.py", tmp_path / f"{name}.new.py"
    ref.write_text(reference)
    if sidecar:                                    # the gate then checks its extra shapes too
        ref.with_suffix(".toml").write_text(sidecar)
    cand.write_text(candidate)
    result = run_check(ref, cand, device=device, time_it=False).to_json()
    print(json.dumps({"case": name, "verdict": result["verdict"], "max_rel_error": result["max_rel_error"]}))
    return result


def assert_passes(result: dict[str, Any]) -> None:
    assert result["verdict"] == "pass", (result["rule"], result["reason"], result["evidence"])
    assert result["max_rel_error"] <= result["tolerance"]
