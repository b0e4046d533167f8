"""Gate and time the CUDA C++ example on a GPU, next to the Triton one, and check the compile
rule; one command, a short table last.

    python3 bench/cuda/run.py [--out DIR]

Runs, through the real CLI:
  1. ``kernelab fingerprint examples/cuda/softmax.new.py --arch sm_90 --json`` (no GPU needed);
  2. ``kernelab check examples/cuda/softmax.py examples/cuda/softmax.new.py --device cuda --json``:
     the CUDA candidate gated against the float64 oracle and timed against torch.softmax;
  3. the same check of the Triton example (``examples/softmax.new.py``), for comparison;
  4. a copy of the CUDA candidate with a typo in its kernel: expected verdict fail, rule
     ``compile``, the NVRTC log as evidence;
  5. the two GEMMs of bench/fingerprint (fp32 FMA dots, tensor-core dots), each against the
     bf16 reference, so the fingerprints' explanation has its measured times beside it;
  6. the CUDA C++ bf16 GEMM of bench/fingerprint/cuda (mma.sync, cp.async, ldmatrix).
Each result is written as JSON under ``--out`` (default bench/cuda/results). Exit status 0 when
the CUDA candidate passed and the broken copy failed rule ``compile``, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELAB = [sys.executable, "-m", "kernelabd"]   # the CLI as installed, or from the source tree
EXAMPLES = ROOT / "examples"
CUDA_REF, CUDA_NEW = EXAMPLES / "cuda" / "softmax.py", EXAMPLES / "cuda" / "softmax.new.py"
TYPO = ("merge(m, s, x[c], 1.f)", "merge(m, s, z[c], 1.f)")


def kernelab(*args: str) -> tuple[int, dict]:
    """Run one kernelab command as a user would; its single JSON object and exit code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([*KERNELAB, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=1800)
    sys.stderr.write(done.stderr[-2000:])
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done.returncode, {"verdict": "error", "reason": f"no JSON: {done.stdout[-300:]}"}


def row(name: str, r: dict) -> str:
    def fmt(v: object, spec: str) -> str:
        return "—" if v is None else format(v, spec)
    ci = r.get("speedup_ci") or [None, None]
    return (f"| {name} | {r.get('verdict')} | {r.get('rule') or ''} | {fmt(r.get('reference_ms'), '.4f')} "
            f"| {fmt(r.get('candidate_ms'), '.4f')} | {fmt(r.get('speedup'), '.3f')} "
            f"| {fmt(ci[0], '.3f')}–{fmt(ci[1], '.3f')} | {(r.get('reason') or '')[:90]} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "cuda" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    _, results["fingerprint"] = kernelab("fingerprint", str(CUDA_NEW), "--arch", "sm_90", "--json")
    _, results["cuda softmax"] = kernelab("check", str(CUDA_REF), str(CUDA_NEW), "--device", "cuda",
                                          "--json")
    _, results["triton softmax"] = kernelab("check", str(EXAMPLES / "softmax.py"),
                                            str(EXAMPLES / "softmax.new.py"), "--device", "cuda", "--json")
    with tempfile.TemporaryDirectory() as tmp:
        broken = Path(tmp) / "softmax.new.py"
        broken.write_text(CUDA_NEW.read_text().replace(*TYPO))
        for name in ("softmax.py", "softmax.toml"):
            (Path(tmp) / name).write_text((CUDA_REF.parent / name).read_text())
        _, results["cuda, typo"] = kernelab("check", str(Path(tmp) / "softmax.py"), str(broken),
                                            "--device", "cuda", "--json", "--no-timing")
    gemm = ROOT / "bench" / "fingerprint"
    for name in ("gemm_fma", "gemm_tc"):
        _, results[name] = kernelab("check", str(gemm / "gemm.py"), str(gemm / f"{name}.new.py"),
                                    "--device", "cuda", "--json")
    _, results["cuda gemm"] = kernelab("check", str(gemm / "cuda" / "gemm.py"),
                                       str(gemm / "cuda" / "gemm.new.py"), "--device", "cuda", "--json")
    for name, r in results.items():
        (args.out / f"{name.replace(' ', '_').replace(',', '')}.json").write_text(json.dumps(r, indent=1))
    kernels = results["fingerprint"].get("kernels", [])
    print("fingerprint (sm_90):", "; ".join(
        f"{k['name']}: {k['registers']} regs, {k['spills']} B spilled, {k['shared_bytes']} B smem"
        for k in kernels) or results["fingerprint"])
    print("| case | verdict | rule | reference ms | candidate ms | speedup | 95% CI | reason |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for name in ("cuda softmax", "triton softmax", "cuda, typo", "gemm_fma", "gemm_tc", "cuda gemm"):
        print(row(name, results[name]))
    ok = (results["cuda softmax"].get("verdict") == "pass"
          and results["cuda, typo"].get("rule") == "compile")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
