"""``kernelab service``: install kernelab under systemd, and release clocks after it stops.

The unit files and the example configuration are rendered here (the package ships no data
files); ``systemd/`` in the repository holds the same text rendered for ``/opt/kernelab``, and a
test keeps the two identical.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import click
import platformdirs

from kernelabd.config import ConfigError, load
from store.home import resolve_home

SERVICE_NAME = "kernelabd.service"
SERVICE_USER = "kernelab"
SYSTEM_STATE = Path("/var/lib/kernelab")
SYSTEM_CONFIG = Path("/etc/kernelab")
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
SYSUSERS_FILE = Path("/etc/sysusers.d/kernelab.conf")
DEFAULT_BINDIR = Path("/opt/kernelab/bin")

# /proc/devices names the NVIDIA driver registers, under old and new drivers (the name of major
# 195 changed from nvidia-frontend to nvidia); systemd skips names a host does not have.
NVIDIA_DEVICE_GROUPS = (
    "nvidia", "nvidia-frontend", "nvidiactl", "nvidia-uvm", "nvidia-caps",
    "nvidia-caps-imex-channels", "nvidia-nvswitch", "nvidia-nvlink",
)

_COMMON_ENV = """\
Environment=PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
Environment=TRITON_CACHE_DIR=%C/kernelab/triton CUDA_CACHE_PATH=%C/kernelab/nv
Environment=PATH={bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin
"""

_LIFECYCLE = """\
# The daemon sends READY=1 once the database, NVML and the inbox watcher are up, then
# WATCHDOG=1 every WatchdogSec/2 from its event loop: a wedged scheduler gets restarted.
Type=notify
NotifyAccess=main
WatchdogSec=30s
TimeoutStartSec=180s
TimeoutStopSec=120s
Restart=on-failure
RestartSec=5s
# SIGTERM to the daemon only; it stops its workers and sandboxes itself, and whatever is left
# after TimeoutStopSec is killed.
KillMode=mixed
# One key=value line per event on stdout; journald stamps and stores it.
StandardOutput=journal
StandardError=journal
SyslogIdentifier=kernelabd
"""

SYSTEM_UNIT = """\
# kernelab daemon as a system service. Installed by `kernelab service install`
# (see docs/service.md); edit with `systemctl edit kernelabd`, not in place.
[Unit]
Description=kernelab daemon: port and tune GPU kernels
After=network-online.target nvidia-persistenced.service
Wants=network-online.target

[Service]
ExecStart={bindir}/kernelabd
# The inbox is a trust boundary: code dropped there runs as the kernelab user, so only the
# kernelab group may write to it (setgid 2770). Re-applied at every start, with full
# privileges because RestrictSUIDSGID= below forbids setting the setgid bit from inside.
ExecStartPre=+/usr/bin/install -d -o kernelab -g kernelab -m 2770 %S/kernelab/inbox
# Release clocks locked for timing ([timing] lock_clocks) after every stop, crashes included;
# a no-op when lock_clocks is off. "+" runs it as root: resetting clocks needs it.
ExecStopPost=-+{bindir}/kernelab service release-clocks
User=kernelab
Group=kernelab
# Group members (the people who may submit kernels) can read the database and the results.
UMask=0007
StateDirectory=kernelab
StateDirectoryMode=2770
ConfigurationDirectory=kernelab
ConfigurationDirectoryMode=0755
CacheDirectory=kernelab
{env}
{lifecycle}
# Hardening that keeps /dev/nvidia* usable and JIT compilation (Triton, NVRTC) working:
# no PrivateDevices= (it hides the GPUs) and no MemoryDenyWriteExecute= (it breaks JITs).
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=no
DevicePolicy=closed
{device_allow}
# Sandboxes run in user, PID, mount and network namespaces of their own, each with a fresh
# /proc and /sys: the kernel refuses those where /proc is overmounted, so there is no
# ProtectKernelTunables= or ProtectKernelLogs= (a sandbox cannot write a tunable or read the
# kernel log either way). Delegate= gives the daemon its own cgroup subtree, where each sandbox
# gets a memory limit ([sandbox] memory_gb); hence no ProtectControlGroups= either.
Delegate=memory pids
ProtectKernelModules=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
"""

USER_UNIT = """\
# kernelab daemon as a user service, for a single-user box. Installed by
# `kernelab service install --user`; run `loginctl enable-linger` so it survives logout.
[Unit]
Description=kernelab daemon (user service): port and tune GPU kernels

[Service]
ExecStart={bindir}/kernelabd
# Nobody but this user may drop code into the inbox.
ExecStartPre=/usr/bin/install -d -m 0700 %S/kernelab/inbox
# Release clocks locked for timing; a no-op when [timing] lock_clocks is off.
ExecStopPost=-{bindir}/kernelab service release-clocks
UMask=0077
StateDirectory=kernelab
ConfigurationDirectory=kernelab
CacheDirectory=kernelab
{env}
{lifecycle}
NoNewPrivileges=yes
# A cgroup subtree of its own, where each sandbox gets a memory limit ([sandbox] memory_gb).
Delegate=memory pids

[Install]
WantedBy=default.target
"""

SYSUSERS = 'u kernelab - "kernelab daemon" /var/lib/kernelab\n'


def render_unit(*, user: bool, bindir: Path) -> str:
    """The unit text for ``bindir`` (the folder holding the ``kernelab``/``kernelabd`` scripts)."""
    template = USER_UNIT if user else SYSTEM_UNIT
    device_allow = "\n".join(f"DeviceAllow=char-{name} rw" for name in NVIDIA_DEVICE_GROUPS)
    return template.format(
        bindir=bindir,
        env=_COMMON_ENV.format(bindir=bindir).rstrip("\n"),
        lifecycle=_LIFECYCLE.rstrip("\n"),
        device_allow=device_allow,
    )


def example_toml() -> str:
    """The documented example configuration (``systemd/kernelab.toml.example``)."""
    return EXAMPLE_TOML


class Step(Protocol):
    def describe(self) -> str: ...

    def apply(self) -> None: ...


@dataclass(frozen=True)
class WriteFile:
    path: Path
    text: str
    keep_existing: bool = False   # configuration the admin may have edited

    def describe(self) -> str:
        if self.keep_existing and self.path.exists():
            return f"keep {self.path} (exists)"
        return f"write {self.path}"

    def apply(self) -> None:
        if self.keep_existing and self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.text)
        self.path.chmod(0o644)


@dataclass(frozen=True)
class MakeDir:
    path: Path
    mode: int
    owner: str | None = None

    def describe(self) -> str:
        owner = f", owner {self.owner}:{self.owner}" if self.owner else ""
        return f"mkdir {self.path} (mode {self.mode:04o}{owner})"

    def apply(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.owner:
            shutil.chown(self.path, self.owner, self.owner)
        self.path.chmod(self.mode)


@dataclass(frozen=True)
class Symlink:
    path: Path
    target: Path

    def describe(self) -> str:
        if self.path.exists() or self.path.is_symlink():
            return f"keep {self.path} (exists)"
        return f"link {self.path} -> {self.target}"

    def apply(self) -> None:
        if not (self.path.exists() or self.path.is_symlink()):
            self.path.symlink_to(self.target)


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]

    def describe(self) -> str:
        return "run " + " ".join(self.argv)

    def apply(self) -> None:
        proc = subprocess.run(self.argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            output = (proc.stderr or proc.stdout).strip()
            raise click.ClickException(f"{' '.join(self.argv)} failed "
                                       f"(exit {proc.returncode}): {output}")


def find_bindir() -> Path:
    """The folder of the ``kernelabd`` script that belongs to this Python (venv, pipx, uv tool).

    ``sys.executable`` is not resolved: in a virtual environment it is a symlink into the base
    interpreter, whose folder holds no kernelab scripts.
    """
    here = Path(sys.executable).parent
    if (here / "kernelabd").exists():
        return here.absolute()
    found = shutil.which("kernelabd")
    if found:
        return Path(found).parent.absolute()
    raise click.ClickException("cannot find the kernelabd script next to this Python or on "
                               "PATH; install kernelab into a virtual environment first")


def unreachable_by_others(path: Path) -> Path | None:
    """The first folder above ``path`` that other users cannot enter (``/root``, a 0700 home):
    the service user could not start the daemon from there."""
    for folder in [*reversed(path.parents), path]:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


def system_plan(bindir: Path) -> list[Step]:
    """Everything ``service install`` does for the system unit, in order."""
    return [
        WriteFile(SYSUSERS_FILE, SYSUSERS),
        Run(("systemd-sysusers", str(SYSUSERS_FILE))),
        WriteFile(SYSTEM_CONFIG / "kernelab.toml", example_toml(), keep_existing=True),
        MakeDir(SYSTEM_STATE, 0o2770, SERVICE_USER),
        MakeDir(SYSTEM_STATE / "inbox", 0o2770, SERVICE_USER),
        Symlink(SYSTEM_STATE / "kernelab.toml", SYSTEM_CONFIG / "kernelab.toml"),
        WriteFile(SYSTEM_UNIT_DIR / SERVICE_NAME, render_unit(user=False, bindir=bindir)),
        Run(("systemctl", "daemon-reload")),
        Run(("systemctl", "enable", "--now", SERVICE_NAME)),
    ]


def user_plan(bindir: Path) -> list[Step]:
    """Everything ``service install --user`` does, in the XDG folders systemd maps
    ``StateDirectory=``/``ConfigurationDirectory=`` to for user units (systemd ≥ 247)."""
    config = Path(platformdirs.user_config_dir("kernelab"))
    state = Path(platformdirs.user_state_dir("kernelab"))
    units = Path(platformdirs.user_config_dir("systemd")) / "user"
    return [
        WriteFile(config / "kernelab.toml", example_toml(), keep_existing=True),
        MakeDir(state, 0o700),
        MakeDir(state / "inbox", 0o700),
        Symlink(state / "kernelab.toml", config / "kernelab.toml"),
        WriteFile(units / SERVICE_NAME, render_unit(user=True, bindir=bindir)),
        Run(("systemctl", "--user", "daemon-reload")),
        Run(("systemctl", "--user", "enable", "--now", SERVICE_NAME)),
    ]


def _next_steps(user: bool) -> list[str]:
    if user:
        return [
            "keep it running after logout: loginctl enable-linger $USER",
            "follow it: journalctl --user -u kernelabd -f",
            "check it: kernelab doctor",
        ]
    return [
        "let a person submit kernels (they run code as the kernelab user): "
        "usermod -aG kernelab NAME",
        f"follow it: journalctl -u kernelabd -f; check it: kernelab doctor --home {SYSTEM_STATE}",
    ]


@click.group()
def service() -> None:
    """Install kernelab as a systemd service, and clean up after it."""


@service.command()
@click.option("--user", "user_mode", is_flag=True,
              help="Install a user unit (systemctl --user) instead of the system unit.")
@click.option("--dry-run", is_flag=True, help="Print the units and the steps; change nothing.")
def install(user_mode: bool, dry_run: bool) -> None:
    """Write the systemd unit, create the kernelab user and a 2770 inbox, start the service."""
    bindir = find_bindir()
    plan = user_plan(bindir) if user_mode else system_plan(bindir)
    if dry_run:
        for step in plan:
            if isinstance(step, WriteFile) and not step.describe().startswith("keep"):
                click.echo(f"# --- {step.path}\n{step.text}")
        click.echo("# --- steps (nothing was changed: --dry-run)")
        for step in plan:
            click.echo(step.describe())
        return
    if not user_mode and os.geteuid() != 0:
        raise click.ClickException("the system unit needs root: run it with sudo (using this "
                                   f"environment's {bindir}/kernelab), or use --user")
    if not user_mode:
        blocked = unreachable_by_others(bindir)
        if blocked is not None:
            raise click.ClickException(
                f"the kernelab user cannot reach {bindir}: {blocked} is closed to other users; "
                f"install kernelab somewhere shared, e.g. python -m venv {DEFAULT_BINDIR.parent}")
    for step in plan:
        click.echo(step.describe())
        step.apply()
    click.echo("kernelabd is installed and started. Next:")
    for line in _next_steps(user_mode):
        click.echo(f"  {line}")


@service.command("release-clocks")
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="kernelab home (default: $KERNELAB_HOME, $STATE_DIRECTORY, XDG state dir).")
def release_clocks(home: str | None) -> None:
    """Reset GPU clocks locked for timing; a no-op unless [timing] lock_clocks is set.

    The unit runs this as ExecStopPost=, so clocks are released even after a crash or a
    SIGKILL that gave the daemon no chance to do it itself.
    """
    cfg_path = resolve_home(home).config
    try:
        cfg = load(cfg_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if cfg.timing.lock_clocks == "off":
        click.echo(f"lock_clocks is off in {cfg_path}: nothing to release")
        return
    problems = reset_locked_clocks(cfg.daemon.gpus)
    for line in problems:
        click.echo(line, err=True)
    if problems:
        sys.exit(1)


def reset_locked_clocks(gpus: list[int]) -> list[str]:
    """``nvmlDeviceResetGpuLockedClocks`` on ``gpus`` (every GPU when empty); returns one line
    per GPU that could not be reset. No driver means nothing was locked: no problem."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        click.echo(f"no NVIDIA driver ({exc}): nothing to release")
        return []
    problems: list[str] = []
    try:
        indices = gpus or list(range(pynvml.nvmlDeviceGetCount()))
        for index in indices:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceResetGpuLockedClocks(handle)
                click.echo(f"GPU {index}: locked clocks released")
            except pynvml.NVMLError_NotSupported:
                click.echo(f"GPU {index}: clock locking not supported; nothing to release")
            except pynvml.NVMLError as exc:
                problems.append(f"GPU {index}: could not release locked clocks: {exc} "
                                f"(needs root; run: sudo nvidia-smi -i {index} -rgc)")
    finally:
        pynvml.nvmlShutdown()
    return problems


EXAMPLE_TOML = """\
# kernelab configuration: /etc/kernelab/kernelab.toml for the system service
# (~/.config/kernelab/kernelab.toml for the user service; KERNELAB_HOME/kernelab.toml
# otherwise). `kernelab service install` links it into the state directory.
#
# Every key is optional and every value shown is the default. Unknown sections or keys are
# errors, so a misspelt key stops the daemon instead of being ignored.
# After editing: sudo systemctl restart kernelabd, then kernelab doctor.

[daemon]
# GPU indices (CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi shows) that kernelab may
# use. Empty: every GPU NVML finds. On a shared box, list only the GPUs kernelab owns.
gpus = []
# Poll the inbox instead of using inotify. Needed when the inbox is on NFS/CIFS, where
# inotify does not see files written from other hosts.
polling_observer = false
# A file dropped in the inbox counts as complete once its size and mtime have not changed
# for this many seconds (scp and editors write in several steps).
stable_s = 2.0
# Full rescan of the inbox every this many seconds, so that a missed event never loses a file.
rescan_s = 30.0
# NVML sampling period for the GPU panel of the TUI (utilisation, clocks, temperature, power).
gpu_sample_s = 1.0
# debug | info | warning | error. The daemon's --log-level overrides it.
log_level = "info"

[jobs]
# A job stops after this many candidates ...
max_candidates = 40
# ... or after this many minutes ...
max_minutes = 30.0
# ... or after this many proposals in a row without an accepted gain.
patience = 8
# Proposers that suggest candidates, in this order (README: "Proposers").
proposers = ["template", "inductor", "tune"]

[gate]
# A candidate passes when its error against the float64 oracle is within tol_factor times
# the fp32 reference's own error on the same inputs (floored per dtype).
tol_factor = 10.0
# Deadline of one evaluation in seconds; a hang past it is killed and recorded as a failure.
timeout_s = 300.0

[timing]
# Wall-time budget in seconds of one interleaved A/B comparison.
budget_s = 8.0
# Stop sampling early once the speedup's confidence half-width is below this (0.5 %).
target_rel_noise = 0.005
# Interleaved A/B block pairs measured before the noise target may stop a comparison.
min_pairs = 6
# A candidate is kept only when its speedup's CI lies above 1 + max(min_gain, A/A noise).
min_gain = 0.01
# Device time in milliseconds per measurement block.
block_ms = 40.0
# Lock the SM clock while timing, so boost and thermal drift add less noise.
#   off    do not touch clocks (default); every block still records the clock state, and
#          blocks measured under thermal or power slowdown are discarded and re-run
#   base   lock to the GPU's base (TDP) clock: the most stable numbers
#   max    lock to the maximum clock: the fastest numbers, more thermal throttling
#   <MHz>  lock to this many MHz, as a string, e.g. "1500"
# Only on a box you own and nobody else benchmarks on: locked clocks slow or change every
# other program on the GPU. NVML only lets root lock clocks (Volta or newer), so the daemon
# must run as root: `sudo systemctl edit kernelabd`, add [Service] User=root, and set
# [sandbox] user below so candidates do not run as root. kernelab releases the clocks on
# every exit, and the unit's ExecStopPost= (kernelab service release-clocks) releases them
# after a crash too. Check first with: kernelab doctor (the "clocks" line).
lock_clocks = "off"

[sandbox]
# Every sandbox runs in its own user, PID, mount, network and IPC namespaces, sees only its
# files and a read-only Python environment, and has a system-call filter (docs/gate.md).
# "none" runs candidates as the daemon's own user with none of that: only on a machine where
# namespaces are unavailable and you trust every candidate. `kernelab doctor` says what is active.
isolation = "namespaces"
# When the daemon runs as root, candidates and references run as this user ("" = nobody).
user = ""
# Host memory limit per sandbox in GiB; 0 = none. Enforced with a cgroup where the daemon may
# make one (systemd Delegate=yes, or root), else RLIMIT_AS on CPU, else a resident-memory
# watchdog (CUDA reserves huge address ranges, so a GPU sandbox never gets RLIMIT_AS).
memory_gb = 0.0

[search]
# Screening (docs/port.md, "tune"): a batch of configurations of the incumbent is compiled in
# parallel, checked for spills, and timed briefly; only the best few that beat the incumbent's
# own screened time go on to the full gate and A/B. Configurations a batch holds (0 = none).
batch = 32
# Screened configurations gated and timed in A/B per batch, fastest first.
contenders = 2
# Device time each configuration is timed for while screened, in ms.
screen_ms = 5.0
# Compile-only processes per batch; 0 = one a core.
compile_workers = 0
# CPU jobs screen too (Triton's interpreter, host timing: for tests and laptops; its times say
# little of a GPU's, so by default a CPU job changes one tunable per candidate instead).
on_cpu = false
# CPU jobs only: also compile for this GPU arch ("sm_90") to drop spilling configurations.
cpu_arch = ""

# Agents as proposers (README.md, "Agents"): name one in [jobs] proposers as "agents.NAME",
# or per job with `kernelab port REF --proposer agents.NAME` (every key: docs/service.md).
# [agents.local]
# kind = "openai"                        # any OpenAI-compatible /v1/chat/completions endpoint
# base_url = "http://127.0.0.1:8000/v1"
# model = "qwen2.5-coder-32b"
# api_key_env = "OPENAI_API_KEY"         # optional: the NAME of the variable, never the key
# max_tokens = 8192
# timeout_s = 300
#
# [agents.cli]
# kind = "command"                       # a coding agent run non-interactively
# command = ["my-agent", "--prompt-file", "{prompt}", "--workdir", "{workdir}"]
# timeout_s = 600

[cluster]
# "local": this box's GPUs (default). "ray": evaluations run on a Ray cluster's GPUs, one
# actor per running job, while this daemon (on the head) keeps the inbox, the database and
# the TUI; needs pip install 'kernelab[ray]' on every node (docs/cluster.md).
backend = "local"
# Ray's address when backend = "ray": "auto" (the cluster this node belongs to, started with
# ray start), "HOST:PORT" (the head's GCS) or "ray://HOST:PORT" (Ray Client).
address = "auto"
"""
