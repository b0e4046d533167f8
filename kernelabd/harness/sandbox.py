"""Fresh, isolated processes for untrusted code (every candidate, and the reference too).

Each evaluation gets a new process started from a scrubbed environment, in a private working
directory, optionally as an unprivileged user. It talks to us only through one socket carrying
``wire`` messages (no pickle), so it can hang, crash, print or exit as it likes: we see a
deadline pass, an exit status, or a malformed message, and turn each into a verdict.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # torch is imported by ``request`` only: a head start must not wait for it
    import torch

PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
            "CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "NVIDIA_DRIVER_CAPABILITIES",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
STDERR_TAIL = 4000


class SandboxError(RuntimeError):
    """The sandboxed process failed: it crashed, hung past its deadline or broke the protocol.

    ``kind`` is one of ``timeout``, ``crash``, ``protocol`` or ``raised`` (the sandbox caught an
    exception in the evaluated code and reported it); ``message`` is one line for the verdict.
    """

    def __init__(self, kind: str, message: str, detail: str = "", rule: str | None = None,
                 evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.detail = detail
        self.rule = rule
        self.evidence = evidence or {}


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def make_undumpable() -> None:
    """Keep same-user sandboxes from ptracing or reading /proc/PID/mem of trusted processes."""
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def sandbox_user(configured: str) -> pwd.struct_passwd | None:
    """The unprivileged user to run untrusted code as (only when we are root and one is set).

    Raises ``SandboxError`` for a configured user that does not exist: silently running
    candidates as root instead would be the wrong way to fail.
    """
    if not configured or os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(configured)
    except KeyError:
        raise SandboxError("config", f"[sandbox] user {configured!r} does not exist") from None


def _child_setup(memory_gb: float) -> None:
    """Runs in the child between fork and exec: no core dumps, no privilege regain, own group."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_gb > 0:
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


@dataclass
class SandboxSpec:
    device: str = "cpu"
    user: str = ""
    memory_gb: float = 0.0
    label: str = "sandbox"
    module: str = "kernelabd.harness.child.server"   # the child's entry module (``-m``)


class Sandbox:
    """One untrusted process and the socket we talk to it over."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kernelab-{spec.label}-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._stderr_path = self.workdir / "stderr.txt"

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        env["HOME"] = str(self.workdir)
        env["TMPDIR"] = str(self.workdir)
        env["TRITON_CACHE_DIR"] = str(self.workdir / "triton-cache")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if self.spec.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif ":" in self.spec.device:
            env["CUDA_VISIBLE_DEVICES"] = self._physical_index(self.spec.device.split(":")[1])
        return env

    @staticmethod
    def _physical_index(logical: str) -> str:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            if logical.isdigit() and int(logical) < len(ids):
                return ids[int(logical)]
        return logical

    def start(self) -> None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        user = sandbox_user(self.spec.user)
        if user is not None:
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
        stderr = self._stderr_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-m", self.spec.module, str(child_sock.fileno())],
                stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, cwd=self.workdir,
                env=self._env(), pass_fds=(child_sock.fileno(),),
                preexec_fn=lambda: _child_setup(self.spec.memory_gb),
                user=user.pw_uid if user else None, group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
            )
        finally:
            stderr.close()
            child_sock.close()
        self._sock = parent_sock

    def stage_file(self, path: Path, name: str) -> str:
        """Copy a source file into the sandbox's directory: it reads that copy, never ours."""
        dest = self.workdir / name
        shutil.copyfile(path, dest)
        dest.chmod(0o444)
        return str(dest)

    def _failure(self, kind: str, what: str) -> SandboxError:
        """Describe how the process ended, from its exit status and the tail of its stderr."""
        tail = self.stderr_tail()
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self._proc.wait()
        last = next((ln for ln in reversed(tail.strip().splitlines()) if ln.strip()), "")
        cause = f"killed by {_signal_name(code)}" if code < 0 else f"exited with status {code}"
        message = f"{self.spec.label} {cause} while {what}" + (f": {last[:300]}" if last else "")
        return SandboxError(kind, message, tail)

    def stderr_tail(self) -> str:
        try:
            data = self._stderr_path.read_bytes()
        except OSError:
            return ""
        return data[-STDERR_TAIL:].decode(errors="replace")

    def request(self, header: dict[str, Any], tensors: list[torch.Tensor] | None = None, *,
                deadline: float, what: str, fds: list[int] | None = None,
                received: list[int] | None = None) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """Send one message and wait for the reply until ``deadline`` (a ``time.monotonic``).
        ``fds`` travel with the message (the caller keeps its own); descriptors that come back
        are appended to ``received`` (the caller owns them; without it they are closed)."""
        from kernelabd.harness import wire

        assert self._sock is not None
        try:
            self._sock.settimeout(max(0.01, deadline - time.monotonic()))
            wire.send(self._sock, header, tensors, fds=fds)
            reply, out = wire.recv(self._sock, received)
        except TimeoutError:
            self.kill()
            raise SandboxError("timeout", f"{self.spec.label} did not finish {what} before its "
                               f"deadline; killed") from None
        except (wire.ProtocolError, OSError, ValueError) as exc:
            if self._exits_within(2.0):
                raise self._failure("crash", what) from None
            self.kill()
            raise SandboxError("protocol", f"{self.spec.label} broke the protocol while {what}: "
                               f"{exc}") from None
        if reply.get("error"):
            evidence = reply.get("evidence")
            raise SandboxError("raised", str(reply["error"])[:500], str(reply.get("traceback", "")),
                               rule=str(reply["rule"]) if reply.get("rule") else None,
                               evidence=evidence if isinstance(evidence, dict) else None)
        return reply, out

    def _exits_within(self, seconds: float) -> bool:
        assert self._proc is not None
        try:
            self._proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def close(self) -> None:
        """Kill the process (and anything it started) and remove its working directory."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self.kill()
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def canonical_device(device: str) -> str | None:
    """``cpu`` or ``cuda:N`` for a well-formed device string (``cuda`` is ``cuda:0``), else None.
    Syntax only, without torch: whether the device exists is the check's to say."""
    if device == "cpu":
        return device
    if device == "cuda":
        return "cuda:0"
    return device if device.startswith("cuda:") and device[5:].isdigit() else None


def head_start(device: str, user: str, memory_gb: float, labels: tuple[str, ...]) -> dict[str, Sandbox]:
    """Sandboxes started before the caller imports torch, so that their interpreters, torch
    imports and CUDA contexts come up while ours does (seconds of a check's wall time on a GPU
    machine). Only for a device string that names one device as the check will; anything else
    is left for the check to reject."""
    device = canonical_device(device)
    if device is None:
        return {}
    make_undumpable()
    boxes: dict[str, Sandbox] = {}
    try:
        for label in labels:
            box = Sandbox(SandboxSpec(device=device, user=user, memory_gb=memory_gb, label=label))
            boxes[label] = box
            box.start()
    except (SandboxError, OSError):   # the check starts its own and reports the cause
        for box in boxes.values():
            box.close()
        return {}
    return boxes
