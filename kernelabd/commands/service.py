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

from kernelabd.config import DEFAULT_TOML, ConfigError, load
from kernelabd.harness import nvml
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
    """The documented example configuration (``systemd/kernelab.toml.example``): the defaults'
    own text, so that what is documented and what a fresh home gets are one."""
    return DEFAULT_TOML


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
    try:
        pynvml = nvml.init()
    except nvml.NvmlUnavailable as exc:
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


