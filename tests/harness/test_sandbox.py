"""Sandbox processes: no secrets in their environment, nothing left behind, hangs killed; and
the fence (issue 20): a sandbox sees and signals only its own processes, sees only its own files
and a read-only Python environment, reaches no socket, cannot trace, mount or make namespaces,
and nothing it starts outlives it. Run as root (sandboxes drop to ``nobody``) and as an
ordinary user (a user namespace): both must pass."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernelabd.config import Config, SandboxConfig
from kernelabd.harness import shared
from kernelabd.harness.check import run_check
from kernelabd.harness.isolation import environment_paths, probe
from kernelabd.harness.problem import load_problem
from kernelabd.harness.sandbox import (
    OUTPUT_CAP,
    STDERR_TAIL,
    Sandbox,
    SandboxError,
    SandboxSpec,
    head_start,
    sweep_abandoned,
)
from kernelabd.harness.session import Session
from tests.loopback import Listener

ROOT = Path(__file__).resolve().parents[2]
SOFTMAX = ROOT / "examples" / "softmax.py"
HONEST = (ROOT / "examples" / "softmax.new.py").read_text()
ISOLATION = probe("namespaces", "")
needs_namespaces = pytest.mark.skipif(not ISOLATION.namespaced, reason=f"no namespaces here: {ISOLATION.detail}")
needs_seccomp = pytest.mark.skipif("seccomp" not in ISOLATION.fences, reason="no libseccomp here")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Computes the right answer only if it cannot see the secret; otherwise returns zeros.
SNOOPING = HONEST.replace(
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
    "        import os\n"
    "        leaked = 'KERNELAB_TEST_SECRET' in os.environ or b'KERNELAB_TEST_SECRET' in "
    "open('/proc/self/environ', 'rb').read()\n"
    "        if leaked:\n"
    "            return torch.zeros_like(x)\n",
)
HANG = HONEST.replace(
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
    "        while True:\n"
    "            pass\n",
)


def gate_only(timeout_s: float = 120.0) -> Config:
    cfg = Config()
    cfg.gate.timeout_s = timeout_s
    return cfg


def run_inside(box: Sandbox, code: str, timeout_s: float = 120, device: str = "cpu") -> dict:
    """Run ``code`` in a started sandbox as a module's import-time code (the way a candidate's
    runs) and return the dict ``facts`` it fills in."""
    module = ("import json\nfacts = {}\n" + textwrap.dedent(code)
              + "\nwith open('facts.json', 'w') as fh:\n    json.dump(facts, fh)\nModelNew = object\n")
    source = box.workdir.parent / "probe.py"
    source.write_text(module)
    staged = box.stage_file(source, "probe.py")
    with shared.Arena.allocate(device, shared.ALIGN) as state:     # no weights: an empty arena
        box.request({"cmd": "load_candidate", "path": staged, "device": device, "shapes": [],
                     "timing_sets": [], "arenas": [state.nbytes]}, fds=[state.fd],
                    deadline=time.monotonic() + timeout_s, what="probing")
    return json.loads((box.workdir / "facts.json").read_text())


def processes_with(marker: str) -> list[int]:
    """Processes whose command line or environment holds ``marker`` (a sandbox's has its own
    directory in TMPDIR), other than this one."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                seen = Path(f"/proc/{entry}/cmdline").read_bytes() + Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in seen:
                found.append(int(entry))
    return found


FENCE_PROBE = """
import ctypes, errno, os, socket, sys, time
P = json.loads({params!r})
def err(exc):
    return errno.errorcode.get(exc.errno, str(exc)) if isinstance(exc, OSError) else str(exc)
facts["pid"] = os.getpid()
facts["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
try:
    os.kill(P["trusted_pid"], 0)
    facts["signal_trusted"] = "delivered"
except OSError as exc:
    facts["signal_trusted"] = err(exc)
facts["sees"] = {{name: os.path.exists(path) for name, path in P["paths"].items()}}
facts["tmp"] = sorted(os.listdir(os.path.dirname(os.path.dirname(os.getcwd()))))
for name, path in (("workdir", "written.txt"), ("environment", os.path.join(P["site"], "kernelab-probe"))):
    try:
        open(path, "w").close()
        facts["write_" + name] = "ok"
    except OSError as exc:
        facts["write_" + name] = err(exc)
facts["reads_environment"] = os.path.exists(os.path.join(P["site"], "torch", "__init__.py"))
for family, address in ((socket.AF_INET, ("127.0.0.1", P["port"])), (socket.AF_UNIX, "\\0" + P["abstract"])):
    sock = socket.socket(family)
    sock.settimeout(2)
    try:
        sock.connect(address)
        facts["connect_" + str(int(family))] = "connected"
    except OSError as exc:
        facts["connect_" + str(int(family))] = err(exc)
libc = ctypes.CDLL(None, use_errno=True)
calls = {{"ptrace": lambda: libc.ptrace(0, 0, 0, 0), "unshare": lambda: libc.unshare(0x10000000),
         "mount": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), "chroot": lambda: libc.chroot(b"/")}}
facts["syscalls"] = {{}}
for name, call in calls.items():
    result = call()
    facts["syscalls"][name] = errno.errorcode.get(ctypes.get_errno(), "?") if result == -1 else "allowed"
import torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    torch.ones(4) + 1
facts["profiled"] = sorted({{e.name for e in prof.events() if e.name.startswith("aten::")}})
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", P["marker"]])
    os._exit(0)
os.wait()
def running(marker):
    for p in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if marker in open(f"/proc/{{p}}/cmdline", "rb").read():
                return True
        except OSError:
            pass
    return False
for _ in range(600):   # until the detached process has started
    if running(P["marker"].encode()):
        break
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def fence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One sandbox probed from inside, with a kernelab home, another sandbox's directory, a TCP
    server and an abstract unix socket next to it; what it saw, and what was left after it."""
    home = tmp_path_factory.mktemp("home")
    for name in ("kernelab.db", "kernelab.toml"):
        (home / name).write_text("secret")
    (home / "results" / "softmax").mkdir(parents=True)
    other = Sandbox(SandboxSpec(label="candidate"))
    (other.workdir / "cand-7.py").write_text("another job's candidate")
    listener = Listener()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0kernelab-test-{os.getpid()}")
    abstract.listen()
    marker = f"kernelab-test-survivor-{os.getpid()}"
    site = Path(torch.__file__).parent.parent
    params = {"trusted_pid": os.getpid(), "port": listener.port, "abstract": f"kernelab-test-{os.getpid()}",
              "marker": marker, "site": str(site),
              "paths": {"database": str(home / "kernelab.db"), "config": str(home / "kernelab.toml"),
                        "results": str(home / "results"), "other_sandbox": str(other.workdir / "cand-7.py"),
                        "trusted_proc": f"/proc/{os.getpid()}/cmdline"}}
    box = Sandbox(SandboxSpec(label="probe"))
    try:
        box.start()
        facts = run_inside(box, FENCE_PROBE.format(params=json.dumps(params)))
        alive_before_close = processes_with(marker)
    finally:
        box.close()
        other.close()
        written = site / "kernelab-probe"
        leaked_write = written.exists()
        written.unlink(missing_ok=True)
    assert not leaked_write, "the sandbox wrote into the Python environment"
    yield {"facts": facts, "accepted": listener.accepted, "survivors": processes_with(marker),
           "alive_before_close": alive_before_close, "workdir": box.workdir}
    listener.close()
    abstract.close()


@needs_namespaces
def test_a_sandbox_sees_and_signals_only_its_own_processes(fence: dict) -> None:
    facts = fence["facts"]
    assert facts["pid"] == 2, "the sandbox runs under the init of its own PID namespace"
    assert facts["pids"] == [1, 2], f"it sees only its own processes: {facts['pids']}"
    assert facts["signal_trusted"] == "ESRCH", "the trusted process's PID names nothing in there"
    assert not facts["sees"]["trusted_proc"]


@needs_namespaces
def test_a_sandbox_sees_no_home_no_other_sandbox_and_only_its_own_directory(fence: dict) -> None:
    facts = fence["facts"]
    hidden = {k: v for k, v in facts["sees"].items() if v}
    assert not hidden, f"visible from inside the sandbox: {hidden}"
    tmp = fence["workdir"].parent.parent
    mounted = {Path(p).relative_to(tmp).parts[0] for p in environment_paths({}) if Path(p).is_relative_to(tmp)}
    assert facts["tmp"] == sorted({fence["workdir"].parent.name} | mounted), \
        "of the temporary directory, only its own (and the environment where it lives there)"
    assert facts["write_workdir"] == "ok"
    assert facts["reads_environment"] and facts["write_environment"] == "EROFS", "the Python environment is read-only"


@needs_namespaces
def test_a_sandbox_reaches_no_socket(fence: dict) -> None:
    facts = fence["facts"]
    assert facts[f"connect_{int(socket.AF_INET)}"] in ("ENETUNREACH", "ECONNREFUSED"), facts
    assert facts[f"connect_{int(socket.AF_UNIX)}"] == "ECONNREFUSED", "abstract sockets belong to a network namespace"
    assert fence["accepted"] == 0, "the loopback server was never reached"


@needs_seccomp
def test_the_syscall_filter_refuses_tracing_mounting_and_new_namespaces(fence: dict) -> None:
    assert fence["facts"]["syscalls"] == {"ptrace": "EPERM", "unshare": "EPERM", "mount": "EPERM", "chroot": "EPERM"}


@needs_namespaces
def test_the_op_profiler_works_inside_the_fence(fence: dict) -> None:
    assert "aten::add" in fence["facts"]["profiled"], fence["facts"]["profiled"]


@needs_namespaces
def test_a_forked_process_does_not_outlive_its_sandbox(fence: dict) -> None:
    assert fence["alive_before_close"], "the probe's detached process ran while the sandbox did"
    assert not fence["survivors"], "it died with the sandbox"


GPU_PROBE = """
import os, pynvml, torch, triton, triton.language as tl

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

x = torch.zeros(1000, device="cuda")
add_one[(4,)](x, 1000, BLOCK=256)
facts["sum"] = float(x.sum())
facts["pid"] = os.getpid()
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
facts["name"] = str(pynvml.nvmlDeviceGetName(handle))
facts["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
facts["reasons"] = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
"""


@pytest.mark.gpu
@needs_cuda
@needs_namespaces
def test_a_namespaced_gpu_sandbox_runs_a_triton_kernel_and_queries_nvml() -> None:
    with Sandbox(SandboxSpec(device="cuda:0", label="gpu")) as box:
        facts = run_inside(box, GPU_PROBE, device="cuda")
    assert facts["pid"] == 2, "in its own PID namespace"
    assert facts["sum"] == 1000.0, "the Triton kernel ran on the GPU"
    assert facts["name"] and facts["sm_clock_mhz"] > 0 and isinstance(facts["reasons"], int)


@pytest.mark.gpu
@needs_cuda
@needs_namespaces
def test_a_gpu_sandbox_is_killed_at_its_host_memory_limit_and_cuda_works_under_it() -> None:
    hog = """
import torch
facts["cuda"] = float(torch.ones(4, device="cuda").sum())   # an address-space limit would break this
held = [b"\\x01" * (256 << 20) for _ in range(64)]
"""
    with Sandbox(SandboxSpec(device="cuda:0", label="hungry", memory_bytes=4 << 30)) as box:
        assert box._guard.mode in ("cgroup", "watchdog")
        with pytest.raises(SandboxError) as caught:
            run_inside(box, hog, device="cuda")
    assert caught.value.kind == "memory" and "memory limit of 4.0 GiB" in caught.value.message


def test_candidate_sees_none_of_the_parents_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "KERNELAB_TEST_SECRET" in SNOOPING
    monkeypatch.setenv("KERNELAB_TEST_SECRET", "hunter2")
    cand = tmp_path / "snoop.py"
    cand.write_text(SNOOPING)
    result = run_check(SOFTMAX, cand, config=gate_only(), time_it=False)
    assert result.verdict == "pass", result.reason


def test_hang_is_killed_at_the_deadline_and_nothing_is_left_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))   # where sandboxes make their dirs
    cand = tmp_path / "hang.py"
    cand.write_text(HANG)
    result = run_check(SOFTMAX, cand, config=gate_only(timeout_s=20), time_it=False)
    assert result.verdict == "error" and result.rule == "timeout", result.reason
    assert result.wall_s is not None and result.wall_s < 40
    assert not glob.glob(str(scratch / "kernelab-*")), "sandbox working directories must be removed"
    assert not processes_with(str(scratch)), "sandbox processes still running"


def test_output_is_capped_in_its_file_and_only_a_printable_tail_is_kept() -> None:
    flood = """
import os, sys
sys.stdout.write("x" * (20 << 20) + "\\n")
sys.stdout.flush()
os.write(2, bytes(range(256)) * 5000 + b"\\x1b[2J\\x1b]0;owned\\x07 last words\\n")
raise RuntimeError("done flooding")
"""
    with Sandbox(SandboxSpec(label="flood")) as box:
        with pytest.raises(SandboxError) as caught:
            run_inside(box, flood)
        time.sleep(0.5)   # the pump drains what is still in the pipe
        size = box.output_path.stat().st_size
        tail = box.stderr_tail()
    assert caught.value.kind == "raised" and "done flooding" in caught.value.message
    assert size <= OUTPUT_CAP, f"{size} bytes kept of 21 MB printed"
    assert len(tail) <= STDERR_TAIL and "last words" in tail
    assert "\x1b" not in tail and "\x07" not in tail, "control characters are escaped"


def test_a_memory_limit_ends_the_sandbox_with_a_reason_naming_it() -> None:
    spec = SandboxSpec(label="hungry", memory_bytes=6 << 30)   # CPU: RLIMIT_AS (torch alone maps ~3.5 GB)
    with Sandbox(spec) as box, pytest.raises(SandboxError) as caught:
        run_inside(box, "hog = bytearray(16 << 30)\n")
    assert caught.value.kind == "memory", caught.value.message
    assert "memory limit of 6.0 GiB" in caught.value.message and "\n" not in caught.value.message


CHECK_ARGS = [str(SOFTMAX), str(ROOT / "examples" / "softmax.new.py"), "--json"]


def test_sigterm_of_kernelab_check_removes_its_sandboxes_and_their_directories(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "kernelabd", "check", *CHECK_ARGS, "--home", str(tmp_path)],
                            cwd=ROOT, env={**os.environ, "TMPDIR": str(scratch)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(glob.glob(str(scratch / "kernelab-*"))) < 2 or not processes_with(str(scratch)):
        assert time.monotonic() < deadline and proc.poll() is None, "the check's sandboxes never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM
    assert not glob.glob(str(scratch / "kernelab-*")), "every sandbox directory is removed"
    assert not processes_with(str(scratch)), "no sandbox process is left"


def test_a_directory_whose_owner_was_killed_is_swept_and_a_live_one_kept(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, tempfile, time\n"
         f"tempfile.tempdir = {str(tmp_path)!r}\n"
         "from kernelabd.harness.sandbox import Sandbox, SandboxSpec\n"
         "box = Sandbox(SandboxSpec(label='candidate'))\nprint(box.workdir, flush=True)\ntime.sleep(600)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    abandoned = Path(owner.stdout.readline().strip()).parent
    live = Sandbox(SandboxSpec(label="reference"))
    try:
        assert sweep_abandoned(tmp_path) == [], "the owner is alive: nothing is swept"
        owner.kill()
        owner.wait()
        assert sweep_abandoned(tmp_path) == [abandoned]
        assert not abandoned.exists() and live.workdir.exists()
    finally:
        live.close()


def test_head_started_sandboxes_are_the_ones_the_session_uses_and_it_closes_them() -> None:
    early = head_start("cpu", SandboxConfig(), ("reference", "candidate"))
    with Session(load_problem(SOFTMAX), "cpu", gate_only(), early=early) as session:
        session.open()
        result = session.evaluate(ROOT / "examples" / "softmax.new.py", time_it=False)
        assert result.verdict == "pass", result.reason
        assert session.ref_box is early["reference"]
        assert session.pending is not None and session.pending.box is early["candidate"]
    for box in early.values():
        assert box._proc is not None and box._proc.poll() is not None
        assert not box.workdir.exists()


def test_head_started_sandboxes_are_closed_when_the_check_ends_before_using_them(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("class ModelNew(:\n")
    early = head_start("cpu", SandboxConfig(), ("reference", "candidate"))
    result = run_check(SOFTMAX, broken, config=gate_only(), time_it=False, early=early)
    assert result.exit_code == 2 and "broken.py" in result.reason
    for box in early.values():
        assert box._proc is not None and box._proc.wait(timeout=10) is not None
        assert not box.workdir.exists()


def test_no_head_start_for_a_device_the_check_would_reject() -> None:
    assert head_start("gpu", SandboxConfig(), ("reference",)) == {}


def test_a_reference_that_draws_on_the_host_still_gets_its_inputs():
    """On a GPU, weights and inputs are made on the device; code that needs host tensors
    (``.numpy()`` on a fresh draw) fails there and is run again as written, from the same seed.
    The "meta" device stands in for a GPU: host-only code fails on it the same way."""
    from kernelabd.harness.child.inputs import on_device

    def host_only():
        return torch.from_numpy(torch.randn(4).numpy() * 2)

    drawn = on_device("meta", 7, host_only)
    torch.manual_seed(7)
    assert drawn.device.type == "cpu" and torch.equal(drawn, host_only()), "same seed, same draw"
    assert on_device("meta", 7, lambda: torch.randn(4)).device.type == "meta", "made on the device"
    with pytest.raises(ZeroDivisionError):
        on_device("meta", 7, lambda: 1 / 0)



def test_staging_again_replaces_the_copy_and_never_follows_what_the_sandbox_left(tmp_path: Path) -> None:
    """The reference is staged for every probe and reseed: a second copy must replace the
    read-only first (as an ordinary user too), and a symbolic link the sandbox put in its place
    must not carry the trusted side's write to a file of ours."""
    ours = tmp_path / "kernelab.toml"
    ours.write_text("ours")
    source = tmp_path / "ref.py"
    source.write_text("first")
    box = Sandbox(SandboxSpec(label="stage"))
    try:
        box.stage_file(source, "ref.py")
        source.write_text("second")
        assert Path(box.stage_file(source, "ref.py")).read_text() == "second"
        (box.workdir / "ref.py").unlink()
        (box.workdir / "ref.py").symlink_to(ours)
        staged = Path(box.stage_file(source, "ref.py"))
        assert not staged.is_symlink() and staged.read_text() == "second"
        assert ours.read_text() == "ours"
    finally:
        box.close()


OWNER_KILLED = """
import json, os, signal, threading, time
from kernelabd.harness import shared
from kernelabd.harness.containment import descendants
from kernelabd.harness.sandbox import Sandbox, SandboxSpec

box = Sandbox(SandboxSpec(device="cpu", label="orphan"))
box.start()
source = box.workdir.parent / "spin.py"
source.write_text("while True:\\n    pass\\n")
staged = box.stage_file(source, "spin.py")
state = shared.Arena.allocate("cpu", shared.ALIGN)

def load():
    box.request({"cmd": "load_candidate", "path": staged, "device": "cpu", "shapes": [], "timing_sets": [],
                 "arenas": [state.nbytes]}, fds=[state.fd], deadline=time.monotonic() + 600, what="spinning")

threading.Thread(target=load, daemon=True).start()
time.sleep(3)                                   # the entry module is in the candidate's loop now
print(json.dumps([box._proc.pid, *descendants(box._proc.pid)]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@needs_namespaces
def test_a_sandbox_dies_with_an_owner_killed_before_it_could_close_it() -> None:
    """An owner killed outright (SIGKILL: a crashed or killed daemon) closes nothing, and a
    candidate spinning in its sandbox never reads the socket's end. The sandbox must still go: a
    sandbox left running so once burned a core for 45 minutes after its test had ended."""
    owner = subprocess.run([sys.executable, "-c", OWNER_KILLED], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert owner.returncode == -signal.SIGKILL, owner.stderr
    pids = json.loads(owner.stdout.strip().splitlines()[-1])
    assert len(pids) >= 3, f"the launcher, the fence and the entry module were running: {pids}"
    deadline = time.monotonic() + 20
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "every process of the sandbox died with its owner"
