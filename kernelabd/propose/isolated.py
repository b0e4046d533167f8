"""A proposer's work on untrusted code, in a process of its own: the reference's import,
``get_init_inputs``, ``get_inputs``, ``Model(...)`` and whatever tracing or compiling runs it.

The process is fresh (``python -P -m MODULE``), starts from a scrubbed environment (the
sandboxes' ``ENV_KEEP``; ``HOME`` and ``TMPDIR`` a private directory removed afterwards), leads
its own session so that whatever it starts dies with it, and runs under a deadline. It reads one
JSON request on stdin and writes one JSON answer to ``request["out"]``; nothing it prints is
parsed, and its output goes to a file of which only the tail is kept as evidence. A hang, a crash
or a missing answer is an answer too (``{"declined": "..."}`` saying what happened and where), so
the worker always goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernelabd.harness.sandbox import ENV_KEEP

ROOT = Path(__file__).resolve().parents[2]
TAIL_CHARS = 2000            # of the process's output, kept as evidence of a failure
PHASE_SUFFIX = ".phase"      # beside the answer: what the process was doing, for a timeout's reason


def _no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def scrubbed_env(home: Path, gpu: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a proposer's subprocess starts from: what running Python, torch and
    Triton needs, nothing of the worker's secrets; no GPU unless ``gpu``."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.update(HOME=str(home), TMPDIR=str(home), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - TAIL_CHARS))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _ended(code: int, output: str) -> str:
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    return how + (f": {last[:300]}" if last else "")


def write_phase(request: dict[str, Any], phase: str) -> None:
    """Called inside the subprocess before each stage, so that a timeout can say which one hung."""
    Path(str(request["out"]) + PHASE_SUFFIX).write_text(phase)


def run_json(module: str, request: dict[str, Any], *, timeout: float, what: str, gpu: bool = False,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m module`` on ``request`` and return its JSON answer (a dict), or
    ``{"declined": why}`` when it hangs past ``timeout`` seconds, dies, or answers nothing
    usable; ``what`` names the work in those reasons. Never raises for what the process does.
    ``env`` adds variables (``{HOME}`` in a value is the private directory)."""
    with tempfile.TemporaryDirectory(prefix="kernelab-propose-") as tmp:
        home = Path(tmp)
        answer = home / "answer.json"
        log = home / "output.txt"
        extra = {k: v.replace("{HOME}", tmp) for k, v in (env or {}).items()}
        payload = json.dumps({**request, "out": str(answer)}).encode()
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-P", "-m", module], stdin=subprocess.PIPE, stdout=out,
                                    stderr=out, cwd=tmp, env=scrubbed_env(home, gpu, extra),
                                    start_new_session=True, preexec_fn=_no_core_dumps)
            try:
                proc.communicate(payload, timeout=timeout)
            except subprocess.TimeoutExpired:
                phase = Path(str(answer) + PHASE_SUFFIX)
                doing = phase.read_text() if phase.is_file() else "starting"
                return {"declined": f"{what} did not finish within {timeout:.0f} s ({doing}); killed"}
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return _answer(answer, proc.returncode, _tail(log), what)


def _answer(path: Path, code: int, output: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"declined": f"{what} {_ended(code, output)}"[:500], "output": output}
    if not isinstance(data, dict):
        return {"declined": f"{what} answered something other than a JSON object"}
    return data
