"""Which isolation a sandbox gets on this machine, and the command line that starts it there.

Modes, strongest first; the first one this machine allows is used:

- ``userns``: started by an unprivileged user. ``unshare`` makes new user, PID, mount, network
  and IPC namespaces, and ``child/jail.py`` builds the filesystem allow-list and loads the
  system-call filter before the entry module starts.
- ``root``: started by root. The same namespaces (root needs no user namespace), and the jail
  then drops to the sandbox user (``[sandbox] user``, else ``nobody``), so that the sandbox is
  not root on the files it can see.
- ``user``: root where no namespace can be made (no ``unshare``): the separate user only. It
  cannot signal kernelab, but it sees the host's processes, files and network; a warning says so.
- ``none``: ``[sandbox] isolation = "none"``, written in the configuration: the candidate runs
  as kernelab's own user and could signal it. A warning says so.

An unprivileged user without user namespaces gets ``unavailable`` and no sandbox at all, with
the reason and the fix, never a silent "none".
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import pwd
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMESPACE_FLAGS = ("--pid", "--fork", "--kill-child", "--mount", "--net", "--ipc")
USER_NAMESPACE_FLAGS = ("--user", "--map-root-user")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
FALLBACK_USER = "nobody"
JAIL = Path(__file__).resolve().parent / "child" / "jail.py"
# What no kernel, harness or profiler needs, and what would undo the fence: tracing and reading
# other processes, loading kernel code, mounting, entering or making namespaces, kernel keyrings,
# io_uring (whose operations bypass the filter). torch.profiler's CPU activities need none.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load", "bpf",
    "perf_event_open", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "syslog", "iopl", "ioperm",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "quotactl",
)
PROBE_TIMEOUT_S = 10.0
# Where the kernel says whether unprivileged users may make user namespaces, and the value that
# forbids it (Debian's switch, the generic limit, Ubuntu's AppArmor restriction).
USERNS_SWITCHES = (("/proc/sys/kernel/unprivileged_userns_clone", "0"),
                   ("/proc/sys/user/max_user_namespaces", "0"),
                   ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"))


@dataclass(frozen=True)
class Isolation:
    """What a sandbox started now gets: ``mode`` (see the module), the ``fences`` in force,
    one line for people, and for root modes the account it runs as (uid, gid, groups)."""

    mode: str
    fences: tuple[str, ...]
    detail: str
    account: tuple[int, int, tuple[int, ...]] | None = None
    warning: str = ""

    @property
    def namespaced(self) -> bool:
        return self.mode in ("userns", "root")


@functools.cache
def seccomp_filter() -> bytes | str:
    """The compiled system-call filter every sandbox loads (a classic BPF program, made here
    once by libseccomp so that the jail needs no library), or why none can be made here."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        return f"no seccomp filter ({type(exc).__name__}: {exc}; install libseccomp2 and pyseccomp)"
    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        with contextlib.suppress(OSError, ValueError):   # unknown to this libseccomp: older than the call
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


def seccomp_problem() -> str | None:
    """Why no system-call filter can be loaded here, or None."""
    made = seccomp_filter()
    return made if isinstance(made, str) else None


def userns_switch() -> str | None:
    """The kernel setting that forbids unprivileged user namespaces here, as ``path = value``."""
    for path, forbidding in USERNS_SWITCHES:
        try:
            if Path(path).read_text().strip() == forbidding:
                return f"{path} = {forbidding}"
        except OSError:
            continue
    return None


def unshare_flags(root: bool) -> tuple[str, ...]:
    """Root makes the namespaces itself; anyone else needs a user namespace first."""
    return NAMESPACE_FLAGS if root else (*USER_NAMESPACE_FLAGS, *NAMESPACE_FLAGS)


def _namespace_failure(unshare: str | None, root: bool) -> str | None:
    """Why ``unshare`` cannot make a sandbox's namespaces here, or None when it can (tried once,
    with a fresh /proc, as the jail needs)."""
    if unshare is None:
        return "util-linux unshare is not installed"
    try:
        done = subprocess.run([unshare, *unshare_flags(root), "--mount-proc", "true"], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"unshare cannot make namespaces: {last}"
    return None


def device_groups() -> tuple[int, ...]:
    """Groups owning GPU device files that others may not open: the sandbox user joins them."""
    groups = set()
    for path in gpu_devices():
        st = os.stat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_mode & 0o006 != 0o006:
            groups.add(st.st_gid)
    return tuple(sorted(groups))


def sandbox_account(configured: str) -> tuple[int, int, tuple[int, ...]] | str:
    """(uid, gid, groups) that root runs sandboxes as, or why there is none."""
    name = configured or FALLBACK_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return f"[sandbox] user {name!r} does not exist"
    if entry.pw_uid == 0:
        return f"[sandbox] user {name!r} is root"
    return entry.pw_uid, entry.pw_gid, device_groups()


@functools.cache
def probe(isolation: str, user: str) -> Isolation:
    """The isolation sandboxes get under ``[sandbox] isolation`` and ``user``, decided once per
    process (it starts one ``unshare``)."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    root = os.geteuid() == 0
    if isolation == "none" and not (root and user):
        return Isolation("none", (), f"none: sandboxes run as {me}, in no namespace",
                         warning=f'[sandbox] isolation = "none": candidates run as {me} and can '
                                 "signal, trace or read kernelab's processes and files")
    account = sandbox_account(user) if root else None
    if isinstance(account, str):
        return Isolation("unavailable", (), account)
    if isolation == "none":
        return _separate_user(account, 'namespaces are off ([sandbox] isolation = "none")')
    failure = _namespace_failure(shutil.which("unshare"), root)
    filters = seccomp_problem()
    if failure is None:
        fences = ("pid", "mount", "net", "ipc", "filesystem", *(() if filters else ("seccomp",)))
        who = f"as {pwd.getpwuid(account[0]).pw_name}" if account else f"as {me} (user namespace)"
        detail = f"{'root' if root else 'userns'}: {', '.join(fences)} {who}"
        return Isolation("root" if root else "userns", (*fences, *(("user",) if root else ())),
                         detail + (f"; {filters}" if filters else ""), account, filters or "")
    if account is not None:
        return _separate_user(account, failure)
    switch = userns_switch()
    cause = f"user namespaces are disabled ({switch})" if switch else failure
    return Isolation("unavailable", (), f"no sandbox isolation: {cause}; enable user namespaces "
                     f"(sysctl), run kernelab as root with [sandbox] user, or set [sandbox] "
                     f'isolation = "none" to run candidates as {me} unfenced')


def _separate_user(account: tuple[int, int, tuple[int, ...]], why: str) -> Isolation:
    """Root's fallback: sandboxes as the sandbox user, in no namespace."""
    name = pwd.getpwuid(account[0]).pw_name
    return Isolation("user", ("user",), f"user: separate user {name} only ({why})", account,
                     warning=f"{why}: sandboxes run as {name} without PID, mount or network "
                             "namespaces (they see this machine's processes, files and network)")


def gpu_devices() -> list[str]:
    """The NVIDIA device files a GPU sandbox needs (control, each GPU, UVM, MIG capabilities)."""
    return sorted(str(p) for p in Path("/dev").glob("nvidia*"))


def _sandbox_sys_path() -> list[str]:
    """``sys.path`` as a ``python -P`` with this environment computes it: this one's, less the
    script's directory or working directory that a plain ``python`` puts first."""
    return sys.path if sys.flags.safe_path else sys.path[1:]


def kernelab_packages() -> list[Path]:
    """Where the packages that sandboxes import from kernelab live (``store`` for the figures
    that fingerprints share with the trusted side)."""
    import kernelabd
    import store

    return [Path(module.__file__).resolve().parent for module in (kernelabd, store)]


def environment_paths(extra_env: dict[str, str]) -> list[str]:
    """What a sandbox sees read-only: system directories, the interpreter and its packages, the
    libraries the environment points at, and kernelab's own packages. A source tree holding
    kernelab (an editable install, a checkout on ``PYTHONPATH``) shows only those packages, not
    the rest of the tree, where homes and results may live."""
    packages = kernelab_packages()
    trees = {p.parent for p in packages}
    wanted = [*SYSTEM_DIRS, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              *site.getsitepackages(), *map(str, packages)]
    wanted += [p for p in _sandbox_sys_path() if p and Path(p).resolve() not in trees]
    for key in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"):
        wanted += [p for p in extra_env.get(key, "").split(":") if p]
    for key in ("TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH"):
        if extra_env.get(key):
            wanted.append(str(Path(extra_env[key]).parent))
    return _outermost([p for p in wanted if os.path.lexists(p) and os.path.abspath(p) != "/"])


def _outermost(paths: list[str]) -> list[str]:
    """Absolute paths without duplicates or paths inside another one, parents first."""
    kept: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths}):
        if not any(Path(path).is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def jail_plan(iso: Isolation, *, root: Path, workdir: Path, argv: list[str], device: str,
              env: dict[str, str]) -> dict[str, Any]:
    """What the jail builds: the JSON it is given."""
    account = [iso.account[0], iso.account[1], list(iso.account[2])] if iso.mode == "root" and iso.account \
        else None
    return {"root": str(root), "ro": environment_paths(env), "rw": [str(workdir)],
            "devices": gpu_devices() if device != "cpu" else [], "user": account,
            "seccomp": seccomp_filter().hex() if "seccomp" in iso.fences else None,
            "workdir": str(workdir), "argv": argv}


def launch_argv(iso: Isolation, plan: dict[str, Any]) -> list[str]:
    """The command that starts a sandbox: through ``unshare`` and the jail when namespaced,
    else the entry module directly."""
    if not iso.namespaced:
        return plan["argv"]
    unshare = shutil.which("unshare")
    assert unshare is not None, "probe() found it"
    return [unshare, *unshare_flags(iso.mode == "root"), "--", sys.executable, "-I", "-S", str(JAIL), json.dumps(plan)]
