"""Fresh, isolated processes for untrusted code (every candidate, and the reference too).

Each evaluation gets a new process started from a scrubbed environment, in a private working
directory, in namespaces of its own (``isolation``): it sees only its own processes, so it can
signal nothing outside itself; only its files and a read-only Python environment; no network.
It talks to us only through one socket carrying ``wire`` messages (no pickle), so it can hang,
crash, print or exit as it likes: we see a deadline pass, an exit status, a memory limit hit
(``containment``) or a malformed message, and turn each into a verdict. What it prints goes to
a capped file of its own, never to our output or log.

Its directory is removed on every way out: ``close``, an exception, SIGTERM of this process
(which then unwinds like an exit), and, for a process killed outright, by the next sandbox any
kernelab process starts, which removes directories whose owner is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import logging
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelabd.config import SandboxConfig
from kernelabd.harness.containment import MemoryGuard, descendants, guard_for, process_table
from kernelabd.harness.isolation import Isolation, jail_plan, launch_argv, probe
from kernelabd.harness.warmcache import Carried, carry

if TYPE_CHECKING:   # torch is imported by ``request`` only: a head start must not wait for it
    import torch

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
            "CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "NVIDIA_DRIVER_CAPABILITIES",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
STDERR_TAIL = 4000           # characters of a sandbox's output kept as evidence
OUTPUT_CAP = 1 << 20         # bytes of its output kept in its file; past it only the tail is kept
GONE_S = 5.0                 # how long close() waits for a killed sandbox's processes to go
OWNER = ".owner"             # a lock file held while a sandbox directory's process lives
GIB = 1 << 30
log = logging.getLogger("kernelab.sandbox")


class SandboxError(RuntimeError):
    """The sandboxed process failed: it crashed, hung past its deadline, hit its memory limit or
    broke the protocol, or no sandbox could be made.

    ``kind`` is one of ``timeout``, ``crash``, ``memory``, ``protocol``, ``raised`` (the sandbox
    caught an exception in the evaluated code and reported it), ``isolation`` (this machine
    cannot isolate a sandbox) or ``config``; ``message`` is one line for the verdict.
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
    """Keep same-user processes from ptracing or reading /proc/PID/mem of trusted processes."""
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def printable(text: str) -> str:
    """``text`` safe to show in a terminal or a report: control characters (escape sequences,
    binary garbage) become ``\\xNN``; lines and tabs stay."""
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c) & 0xFF:02x}" for c in text)


def _exit_cause(code: int, namespaced: bool) -> str:
    """How a sandbox ended, from its exit status: a namespace's init reports the entry module's
    death by signal N as status 128 + N, as shells do."""
    if namespaced and code > 128:
        code = 128 - code
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass
class SandboxSpec:
    """What a sandbox is for: its device, who and how isolated it runs, its host memory limit
    in bytes (0 = none), its label (in messages and directory names), its entry module, and
    whether on a CPU it runs Triton in the interpreter: one that only compiles for a GPU arch
    must not, since Triton imported under ``TRITON_INTERPRET`` cannot compile afterwards."""

    device: str = "cpu"
    user: str = ""
    memory_bytes: int = 0
    isolation: str = "namespaces"
    label: str = "sandbox"
    module: str = "kernelabd.harness.child.server"
    interpret: bool = True

    @classmethod
    def from_config(cls, config: SandboxConfig, device: str, label: str) -> SandboxSpec:
        return cls(device=device, user=config.user, memory_bytes=int(config.memory_gb * GIB),
                   isolation=config.isolation, label=label)


class CappedOutput:
    """A sandbox's stdout and stderr, read from a pipe on a thread: the first ``OUTPUT_CAP``
    bytes go to its file, and the last ``STDERR_TAIL`` characters are always kept as evidence,
    whatever it prints (a 20 MB line, binary garbage)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read, self.write_fd = os.pipe()
        self._tail = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, daemon=True, name=f"output-{path.parent.name}")

    def start(self) -> None:
        """Once the sandbox holds the write end: ours closes, so the pipe ends with it."""
        os.close(self.write_fd)
        self._thread.start()

    def _pump(self) -> None:
        kept = dropped = 0
        with self.path.open("wb") as out:
            while chunk := os.read(self._read, 1 << 16):
                room = max(0, OUTPUT_CAP - kept)
                out.write(chunk[:room])
                kept += min(room, len(chunk))
                dropped += max(0, len(chunk) - room)
                with self._lock:
                    self._tail = (self._tail + chunk)[-4 * STDERR_TAIL:]
            if dropped:
                out.write(f"\n[kernelab: {dropped} bytes past the {OUTPUT_CAP}-byte cap dropped; "
                          f"the tail follows]\n".encode() + self._tail)
        os.close(self._read)

    def tail(self) -> str:
        with self._lock:
            data = self._tail
        return printable(data.decode(errors="replace"))[-STDERR_TAIL:]

    def close(self) -> None:
        self._thread.join(timeout=2.0)


def _owned_directory(label: str) -> tuple[Path, int]:
    """A fresh temporary directory and the lock that marks its owner alive. The lock file only
    gets its name once locked, so a sweep never takes a live directory for an abandoned one."""
    path = Path(tempfile.mkdtemp(prefix=f"kernelab-{label}-"))
    fd = os.open(path / f"{OWNER}.new", os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(path / f"{OWNER}.new", path / OWNER)
    return path, fd


def remove_tree(path: Path) -> None:
    """Remove a sandbox's directory, even where what ran there took its own permissions away."""
    shutil.rmtree(path, ignore_errors=True)
    if not path.exists():
        return
    for top, dirs, _ in os.walk(path):
        for name in dirs:
            sub = os.path.join(top, name)
            if not os.path.islink(sub):
                with contextlib.suppress(OSError):
                    os.chmod(sub, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


def sweep_abandoned(directory: Path) -> list[Path]:
    """Remove sandbox directories of ours whose owning process is gone (killed outright, so it
    could not clean up); returns them."""
    removed = []
    for path in directory.glob("kernelab-*-*"):
        try:
            st = path.lstat()
            fd = os.open(path / OWNER, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        remove_tree(path)
        removed.append(path)
    return removed


@functools.cache
def _sweep_once() -> None:
    sweep_abandoned(Path(tempfile.gettempdir()))


_LIVE: set[Sandbox] = set()     # made and not closed yet: closed at exit, used or not


@atexit.register
def _close_live() -> None:
    """Sandboxes still open when this process exits (head starts never used, a SIGTERM)."""
    for box in list(_LIVE):
        box.close()


def _exit_on_sigterm() -> None:
    """Where nobody handles SIGTERM, make it unwind the stack like an exit, so that every
    sandbox is closed and its directory removed on the way out."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


@functools.cache
def _announce(iso: Isolation) -> None:
    """Say once per process, as a warning, when sandboxes are less isolated than they should be."""
    if iso.warning:
        log.warning("sandbox.isolation: %s", iso.warning)


def isolation_of(spec: SandboxSpec) -> Isolation:
    """The isolation a sandbox with ``spec`` gets here; ``SandboxError`` where it can get none."""
    iso = probe(spec.isolation, spec.user)
    if iso.mode == "unavailable":
        raise SandboxError("isolation", iso.detail)
    return iso


def _child_setup(guard: MemoryGuard) -> None:
    """Runs in the child between fork and exec: its own session, no core dumps, no privilege
    regain, killed with this thread (a sandbox must not outlive its owner), and its memory guard."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    guard.preexec()


class Sandbox:
    """One untrusted process and the socket we talk to it over.

    Start it from a thread that outlives it: it is killed when the thread that started it ends
    (``PR_SET_PDEATHSIG``), which is what keeps it from outliving a killed owner."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        _sweep_once()
        self._dir, self._owner = _owned_directory(spec.label)
        self.workdir = self._dir / "work"
        self.workdir.mkdir()
        self.output_path = self._dir / "output.log"    # what it prints, capped; outside its view
        self.isolation: Isolation | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._output: CappedOutput | None = None
        self._guard = guard_for(0, spec.device, spec.label)
        self._closed = False
        _LIVE.add(self)

    @property
    def triton_cache(self) -> Path:
        return self.workdir / "triton-cache"

    @property
    def owner(self) -> tuple[int, int] | None:
        """The (uid, gid) the sandbox runs as where that is an account of its own."""
        account = self.isolation.account if self.isolation is not None else None
        return (account[0], account[1]) if account is not None else None

    def carry_triton_cache(self, source: Sandbox) -> Carried:
        """Start this sandbox's Triton cache from ``source``'s: only ever from a sandbox that
        ran the same author's code (``kernelabd.harness.warmcache`` says why)."""
        return carry(source.triton_cache, self.triton_cache, self.owner)

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        env["HOME"] = str(self.workdir)
        env["TMPDIR"] = str(self.workdir)
        env["TRITON_CACHE_DIR"] = str(self.triton_cache)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if self.spec.device == "cpu":
            if self.spec.interpret:
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
        iso = isolation_of(self.spec)
        _announce(iso)
        _exit_on_sigterm()
        self.isolation = iso
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = self._env()
        argv = [sys.executable, "-P", "-m", self.spec.module, str(child_sock.fileno())]
        plan = jail_plan(iso, root=self._dir / "root", workdir=self.workdir, argv=argv,
                         device=self.spec.device, env=env)
        self._prepare(iso)
        self._guard = guard_for(self.spec.memory_bytes, self.spec.device, self.spec.label)
        self._output = CappedOutput(self.output_path)
        separate = iso.account if iso.mode == "user" else None
        try:
            self._proc = subprocess.Popen(
                launch_argv(iso, plan), stdin=subprocess.DEVNULL, stdout=self._output.write_fd,
                stderr=self._output.write_fd, cwd=self.workdir, env=env, pass_fds=(child_sock.fileno(),),
                preexec_fn=functools.partial(_child_setup, self._guard),
                user=separate[0] if separate else None, group=separate[1] if separate else None,
                extra_groups=list(separate[2]) if separate else None)
        finally:
            self._output.start()
            child_sock.close()
        self._sock = parent_sock
        self._guard.started(self._proc.pid, self.kill)

    def _prepare(self, iso: Isolation) -> None:
        """The directory as the sandbox's user needs it: the jail's mount point, and for a
        separate user its own working directory (and a way through ours to reach it)."""
        if iso.namespaced:
            (self._dir / "root").mkdir()
        if iso.account is not None:
            os.chown(self.workdir, iso.account[0], iso.account[1])
            if iso.mode == "user":
                self._dir.chmod(0o711)

    def stage_file(self, path: Path, name: str) -> str:
        """Copy a source file into the sandbox's directory: it reads that copy, never ours.

        Staged again (the reference, for every probe and reseed) the old copy is replaced, never
        written through: the directory is the sandbox's too, and what it left under that name (a
        read-only file, a symbolic link to a file of ours) must not be followed."""
        dest = self.workdir / name
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        with os.fdopen(fd, "wb") as out, path.open("rb") as src:
            shutil.copyfileobj(src, out)
        return str(dest)

    def _memory_error(self, said: str, what: str) -> SandboxError | None:
        reason = self._guard.breach(said)
        if reason is None:
            return None
        return SandboxError("memory", f"{self.spec.label} {reason} while {what}; killed", self.stderr_tail())

    def _failure(self, kind: str, what: str) -> SandboxError:
        """Describe how the process ended, from its exit status and the tail of its output."""
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self._proc.wait()
        self._output_done()
        tail = self.stderr_tail()
        memory = self._memory_error(tail, what)
        if memory is not None:
            return memory
        last = next((ln for ln in reversed(tail.strip().splitlines()) if ln.strip()), "")
        cause = _exit_cause(code, self.isolation is not None and self.isolation.namespaced)
        message = f"{self.spec.label} {cause} while {what}" + (f"; its last output: {last[:300]}" if last else "")
        return SandboxError(kind, message, tail)

    def _output_done(self) -> None:
        """Let the output pump drain what the ended process wrote, so that the tail is complete."""
        if self._output is not None:
            self._output.close()

    def stderr_tail(self) -> str:
        return self._output.tail() if self._output is not None else ""

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
            raise self._memory_error("", what) or SandboxError(
                "timeout", f"{self.spec.label} did not finish {what} before its deadline; killed") from None
        except (wire.ProtocolError, OSError, ValueError) as exc:
            if self._exits_within(2.0):
                raise self._failure("crash", what) from None
            self.kill()
            raise self._memory_error("", what) or SandboxError(
                "protocol", f"{self.spec.label} broke the protocol while {what}: {exc}") from None
        if reply.get("error"):
            said = f"{reply['error']}\n{reply.get('traceback', '')}"
            memory = self._memory_error(said, what)
            if memory is not None:
                self.kill()
                raise memory
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
        """Kill the sandbox and everything in it now (its PID namespace ends with its first
        process; its cgroup, if it has one, is killed whole)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        self._guard.kill()

    def close(self) -> None:
        """Kill the process (and anything it started), wait for all of it to go, and remove its
        working directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        inside = descendants(self._proc.pid) if self._proc is not None and self._proc.poll() is None else []
        self.kill()
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        _wait_gone(inside)
        self._guard.close()
        self._output_done()
        remove_tree(self._dir)
        os.close(self._owner)

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_gone(pids: list[int]) -> None:
    """Wait until ``pids`` have exited (zombies count as gone: their memory and files are freed)."""
    deadline = time.monotonic() + GONE_S
    while pids and time.monotonic() < deadline:
        table = process_table()
        pids = [p for p in pids if p in table and _state(p) != "Z"]
        if pids:
            time.sleep(0.01)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def canonical_device(device: str) -> str | None:
    """``cpu`` or ``cuda:N`` for a well-formed device string (``cuda`` is ``cuda:0``), else None.
    Syntax only, without torch: whether the device exists is the check's to say."""
    if device == "cpu":
        return device
    if device == "cuda":
        return "cuda:0"
    return device if device.startswith("cuda:") and device[5:].isdigit() else None


def head_start(device: str, config: SandboxConfig, labels: tuple[str, ...]) -> dict[str, Sandbox]:
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
            box = Sandbox(SandboxSpec.from_config(config, device, label))
            boxes[label] = box
            box.start()
    except (SandboxError, OSError):   # the check starts its own and reports the cause
        for box in boxes.values():
            box.close()
        return {}
    return boxes
