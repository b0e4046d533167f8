"""The first code a sandbox runs: its view of the machine is built, its privileges dropped and
its system calls filtered here, before any evaluated code exists; then it becomes the
namespace's init, and the entry module runs as PID 2.

It runs as PID 1 of new PID, mount, network and IPC namespaces made by ``unshare``: as root of a
new user namespace (mapped onto the unprivileged user who started it), or, when real root started
it, as root that drops to the sandbox user once the mounts are made. Its plan comes from the
trusted launcher (``kernelabd.harness.isolation``) as one JSON argument, the system-call filter
in it already compiled there. It is started as a script (``python -I -S jail.py``) and imports
only the standard library's smallest modules: it adds its start-up to every sandbox's.

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
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# statvfs flags that a read-only remount of a bind must keep (same bit values as MS_*): the kernel
# refuses to clear them on a mount inherited from another user namespace.
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096   # + NOATIME, NODIRATIME, RELATIME
PR_SET_PDEATHSIG, SIGKILL = 1, 9
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECUREBITS = 28
SECBIT_NOROOT_AND_LOCKED = 0x3       # uid 0 gains no capabilities at exec, and cannot undo that
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
FENCE_FAILED = 125                   # exit status when the fence cannot be built

_libc = ctypes.CDLL(None, use_errno=True)


class SockFprog(ctypes.Structure):
    """``struct sock_fprog``: a classic BPF program, as seccomp takes it."""

    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _placeholder(target: str, like: str) -> None:
    """A directory or an empty file at ``target`` to mount ``like`` onto."""
    if os.path.isdir(like):
        os.makedirs(target, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))


def bind(source: str, root: str, writable: bool = False) -> None:
    """Show ``source`` at the same path under ``root``; a symlink stays a symlink (``/bin`` on a
    merged-/usr system), so that what it points to resolves inside as it does outside."""
    target = root + source
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return
    _placeholder(target, source)
    mount(source, target, None, MS_BIND | MS_REC)
    if not writable:
        kept = os.statvfs(target).f_flag & KEPT_FLAGS
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def make_dev(root: str, gpu_devices: list[str]) -> None:
    dev = root + "/dev"
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    for name in DEVICES:
        bind(f"/dev/{name}", root, writable=True)
    for path in gpu_devices:
        bind(path, root, writable=True)
    os.mkdir(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777")
    os.symlink("/proc/self/fd", dev + "/fd")
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", f"{dev}/{name}")
    mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def build_root(plan: dict) -> None:
    """Make the allow-listed tree at ``plan["root"]`` and turn it into ``/``."""
    root = plan["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)           # nothing below propagates to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for path in plan["ro"]:
        bind(path, root)
    for path in plan["rw"]:
        bind(path, root, writable=True)
    make_dev(root, plan["devices"])
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(root + "/sys")
    mount("sysfs", root + "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    pivot(root)
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def pivot(root: str) -> None:
    """``root`` becomes ``/`` and the host's tree is detached: nothing can reach it again."""
    machine = os.uname().machine
    if machine not in SYS_PIVOT_ROOT:
        raise OSError(errno.ENOSYS, f"pivot_root: no system call number for {machine}")
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT[machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the host's root")
    os.chdir("/")


def drop_privileges(user: list | None) -> None:
    """Real root becomes the sandbox user; the root of a user namespace keeps uid 0 there but
    gains no capability at the exec that follows (and nothing it runs can regain one)."""
    if user is not None:
        uid, gid, groups = user
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        return
    _check(_libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_AND_LOCKED, 0, 0, 0), "securebits")


def die_with_parent() -> None:
    """Killed when the launcher is, as it was before the privileges were dropped: changing
    credentials clears the parent-death signal, and without it a killed owner's sandbox, its
    candidate spinning and never reading the socket's end, ran on as an orphan."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "parent-death signal")


def load_filter(program: bytes) -> None:
    """Load the compiled system-call filter for this process and all it starts; with no new
    privileges (which the filter needs, and nothing may lift), no capability is needed."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    code = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.addressof(code))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def serve_as_init(entry: int) -> None:
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
        die_with_parent()
        if plan["seccomp"]:
            load_filter(bytes.fromhex(plan["seccomp"]))
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
