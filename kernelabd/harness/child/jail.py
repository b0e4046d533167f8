"""The first code a sandbox runs: its view of the machine is built, its privileges dropped and
its system calls filtered here, before any evaluated code exists; then it becomes the entry module.

It runs as PID 1 of new PID, mount, network and IPC namespaces made by ``unshare``: as root of a
new user namespace (mapped onto the unprivileged user who started it), or, when real root started
it, as root that drops to the sandbox user once the mounts are made. Its plan comes from the
trusted launcher (``kernelabd.harness.isolation``) as one JSON argument. It then stays as the
namespace's init, and the entry module runs as PID 2.

The filesystem is an allow-list. A fresh tmpfs becomes the root, read-only once built, holding
read-only binds of the system and Python directories, a minimal ``/dev`` (null, zero, random, the
GPU's device files, a private ``/dev/shm``), a fresh ``/proc`` of its own PID namespace, a fresh
read-only ``/sys``, and the work directory: the only place it can write. Nothing else of the host
is there: no home directory, no kernelab database, results or configuration, no other job's
directory, no ``/tmp``, no socket under ``/run``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, NoReturn

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# statvfs flags that a read-only remount of a bind must keep (same bit values as MS_*): the kernel
# refuses to clear them on a mount inherited from another user namespace.
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096   # + NOATIME, NODIRATIME, RELATIME
PR_SET_DUMPABLE = 4
PR_SET_SECUREBITS = 28
SECBIT_NOROOT_AND_LOCKED = 0x3       # uid 0 gains no capabilities at exec, and cannot undo that
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
FENCE_FAILED = 125                   # exit status when the fence cannot be built

# What no kernel, harness or profiler needs, and what would undo the fence: tracing and reading
# other processes, loading kernel code, mounting, entering or making namespaces, kernel keyrings,
# io_uring (whose operations bypass this filter). torch.profiler's CPU activities need none.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load", "bpf",
    "perf_event_open", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "syslog", "iopl", "ioperm",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "quotactl",
)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _placeholder(target: Path, like: Path) -> None:
    """A directory or an empty file at ``target`` to mount ``like`` onto."""
    if like.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)


def bind(source: str, root: Path, writable: bool = False) -> None:
    """Show ``source`` at the same path under ``root``; a symlink stays a symlink (``/bin`` on a
    merged-/usr system), so that what it points to resolves inside as it does outside."""
    target = root / source.lstrip("/")
    if os.path.islink(source):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.readlink(source))
        return
    _placeholder(target, Path(source))
    mount(source, str(target), None, MS_BIND | MS_REC)
    if not writable:
        kept = os.statvfs(target).f_flag & KEPT_FLAGS
        mount(None, str(target), None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def make_dev(root: Path, gpu_devices: list[str]) -> None:
    dev = root / "dev"
    dev.mkdir()
    mount("tmpfs", str(dev), "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    for name in DEVICES:
        bind(f"/dev/{name}", root, writable=True)
    for path in gpu_devices:
        bind(path, root, writable=True)
    (dev / "shm").mkdir()
    mount("tmpfs", str(dev / "shm"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777")
    (dev / "fd").symlink_to("/proc/self/fd")
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        (dev / name).symlink_to(f"/proc/self/fd/{fd}")
    mount(None, str(dev), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def build_root(plan: dict[str, Any]) -> None:
    """Make the allow-listed tree at ``plan["root"]`` and turn it into ``/``."""
    root = Path(plan["root"])
    mount(None, "/", None, MS_REC | MS_PRIVATE)           # nothing below propagates to the host
    mount("tmpfs", str(root), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for path in plan["ro"]:
        bind(path, root)
    for path in plan["rw"]:
        bind(path, root, writable=True)
    make_dev(root, plan["devices"])
    (root / "proc").mkdir()
    mount("proc", str(root / "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    (root / "sys").mkdir()
    mount("sysfs", str(root / "sys"), "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    pivot(root)
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def pivot(root: Path) -> None:
    """``root`` becomes ``/`` and the host's tree is detached: nothing can reach it again."""
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: no system call number for {platform.machine()}")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the host's root")
    os.chdir("/")


def drop_privileges(user: list[Any] | None) -> None:
    """Real root becomes the sandbox user; the root of a user namespace keeps uid 0 there but
    gains no capability at the exec that follows (and nothing it runs can regain one)."""
    if user is not None:
        uid, gid, groups = user
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        return
    _check(_libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_AND_LOCKED, 0, 0, 0), "securebits")


def filter_syscalls() -> None:
    """Refuse ``DENIED_SYSCALLS`` with EPERM from here on, for this process and all it starts.
    A name this libseccomp does not know is a call this machine's kernel predates."""
    import pyseccomp

    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):
            continue
    rules.load()


def serve_as_init(entry: int) -> NoReturn:
    """PID 1 of the namespace: reap orphans until the entry module (PID 2) ends, then end with
    its status (``128 + N`` for signal N, as shells report it), which takes every process left
    in the namespace down with it. The entry module is not PID 1 itself because PID 1 ignores
    the signals its own namespace sends it: a candidate's ``os.kill(os.getpid(), SIGSEGV)``
    must crash it as it would anywhere else."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)     # nothing in the namespace may read or trace it
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))   # the entry module's socket is its own
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == entry:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def main() -> None:
    plan = json.loads(sys.argv[1])
    try:
        build_root(plan)
        drop_privileges(plan["user"])
        if plan["seccomp"]:
            filter_syscalls()
        os.chdir(plan["workdir"])
    except OSError as exc:
        print(f"kernelab sandbox: cannot build its fence: {exc}", file=sys.stderr, flush=True)
        os._exit(FENCE_FAILED)
    entry = os.fork()
    if entry == 0:
        os.execv(plan["argv"][0], plan["argv"])
    serve_as_init(entry)


if __name__ == "__main__":
    main()
