"""Memory that two processes map at once, handed over as a file descriptor: how tensors travel
between sandboxes and the trusted process without a copy through host sockets.

On a GPU an arena is device memory made with CUDA's virtual memory management (``cuMemCreate``
with a POSIX file-descriptor handle). Its descriptor crosses the sandbox's socket (SCM_RIGHTS)
and the other side maps the same physical memory. Legacy CUDA IPC handles, which
``torch.multiprocessing`` uses, cannot be opened across PID namespaces, and sandboxes run in
their own; a descriptor can. On a CPU an arena is a memfd that both sides map.

Tensors are views of an arena at offsets a ``Layout`` assigns; a description (offset, dtype,
shape) travels in the message header. Whoever maps an arena decides what it is for: the trusted
process maps the reference's read-only, and never hands a candidate a descriptor of anything
but fresh copies of its own inputs and parameters.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelabd.harness.wire import DTYPE_NAMES, DTYPES

ALIGN = 512                     # every tensor starts this aligned (vector loads, TMA)


class ArenaError(RuntimeError):
    """An arena could not be made, exported or mapped; the message says which call failed."""


def _align(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass
class Slot:
    """Where one tensor lives in an arena (what travels in a message header)."""

    offset: int
    dtype: str
    shape: list[int]

    @property
    def nbytes(self) -> int:
        numel = 1
        for s in self.shape:
            numel *= s
        return numel * torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Any, arena_bytes: int) -> Slot:
        """A slot described by a peer, checked against the arena it claims to live in."""
        if not isinstance(data, dict) or data.get("dtype") not in DTYPES:
            raise ArenaError(f"bad slot {data!r:.200}")
        shape, offset = data.get("shape"), data.get("offset")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise ArenaError("bad slot shape")
        if not isinstance(offset, int) or offset < 0 or offset % ALIGN:
            raise ArenaError("bad slot offset")
        slot = cls(offset, data["dtype"], shape)
        if offset + slot.nbytes > arena_bytes:
            raise ArenaError("slot lies outside its arena")
        return slot


@dataclass
class Layout:
    """Offsets for a list of tensors packed one after another."""

    slots: list[Slot] = field(default_factory=list)
    nbytes: int = 0

    def add(self, dtype: torch.dtype, shape: list[int] | torch.Size) -> Slot:
        slot = Slot(self.nbytes, DTYPE_NAMES[dtype], list(shape))
        self.slots.append(slot)
        self.nbytes = _align(self.nbytes + slot.nbytes)
        return slot


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver
        except ImportError as exc:
            raise ArenaError("cuda-python is not installed: no shareable device memory") from exc
    return driver


def _check(result: Any, what: str) -> Any:
    """Unwrap a cuda-python return tuple, raising with the call's name on failure."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise ArenaError(f"{what} failed: {getattr(err, 'name', err)}")
    return rest[0] if len(rest) == 1 else rest


def _create(cu: Any, size: int, prop: Any) -> Any:
    """Physical device memory for an arena. An arena is made beside torch's caching allocator,
    which keeps what a process freed (a forward's outputs and temporaries) for itself: that
    memory is given back to the driver first, or a plan that fits on paper fails here. Out of
    memory even so, the error says how much was asked and how much was free."""
    torch.cuda.empty_cache()
    result = cu.cuMemCreate(size, prop, 0)
    if getattr(result[0], "name", "") == "CUDA_ERROR_OUT_OF_MEMORY":
        free, _ = torch.cuda.mem_get_info()
        raise ArenaError(f"out of GPU memory: an arena of {size / 2**30:.2f} GiB does not fit "
                         f"({free / 2**30:.2f} GiB free; cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY)")
    return _check(result, "cuMemCreate")


class _DevicePointer:
    """What ``torch.as_tensor`` reads a raw device address from (CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


class Arena:
    """One shareable allocation mapped in this process; ``tensor(slot)`` views it."""

    def __init__(self, device: str, nbytes: int, base: torch.Tensor, fd: int,
                 release: list[Any]) -> None:
        self.device = device
        self.nbytes = nbytes
        self.base = base            # uint8 view of the whole arena
        self.fd = fd                # ours; dup() it to hand over
        self._release = release     # what close() undoes, in order

    # ----- making and opening ------------------------------------------------------------
    @classmethod
    def allocate(cls, device: str, nbytes: int) -> Arena:
        """A new arena of at least ``nbytes`` on ``device`` (``cpu`` or ``cuda:N``)."""
        nbytes = max(_align(nbytes), ALIGN)
        if device == "cpu":
            fd = os.memfd_create("kernelab-arena", os.MFD_CLOEXEC)
            os.ftruncate(fd, nbytes)
            return cls._map_host(fd, nbytes)
        return cls._device(device, nbytes, fd=None)

    @classmethod
    def open(cls, device: str, fd: int, nbytes: int, *, writable: bool = True) -> Arena:
        """Map an arena another process made; takes ownership of ``fd``."""
        if nbytes <= 0 or nbytes % ALIGN:
            os.close(fd)
            raise ArenaError(f"bad arena size {nbytes}")
        if device == "cpu":
            if os.fstat(fd).st_size < nbytes:
                os.close(fd)
                raise ArenaError("arena is smaller than announced")
            return cls._map_host(fd, nbytes)
        return cls._device(device, nbytes, fd=fd, writable=writable)

    @classmethod
    def _map_host(cls, fd: int, nbytes: int) -> Arena:
        mm = mmap.mmap(fd, nbytes)
        base = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)
        return cls("cpu", nbytes, base, fd, [("mmap", mm)])

    @classmethod
    def _device(cls, device: str, nbytes: int, fd: int | None, writable: bool = True) -> Arena:
        cu = _driver()
        index = torch.device(device).index or 0
        torch.cuda.init()
        torch.cuda.set_device(index)
        torch.empty(1, device=device)      # the primary context, current on this thread
        fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = index
        prop.requestedHandleTypes = fd_type
        gran = int(_check(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity"))
        size = _align(nbytes, gran)
        release: list[Any] = []
        try:
            if fd is None:
                handle = _create(cu, size, prop)
                release.append(("handle", handle))
                fd = int(_check(cu.cuMemExportToShareableHandle(handle, fd_type, 0),
                                "cuMemExportToShareableHandle"))
            else:
                handle = _check(cu.cuMemImportFromShareableHandle(fd, fd_type),
                                "cuMemImportFromShareableHandle")
                release.append(("handle", handle))
            ptr = _check(cu.cuMemAddressReserve(size, gran, 0, 0), "cuMemAddressReserve")
            release.insert(0, ("va", (ptr, size)))
            _check(cu.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
            release.insert(0, ("map", (ptr, size)))
            access = cu.CUmemAccessDesc()
            access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = index
            access.flags = (cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE if writable
                            else cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)
            _check(cu.cuMemSetAccess(ptr, size, [access], 1), "cuMemSetAccess")
        except Exception:
            _undo(release)
            if fd is not None:
                os.close(fd)
            raise
        base = torch.as_tensor(_DevicePointer(int(ptr), nbytes), device=f"cuda:{index}")
        return cls(device, nbytes, base, fd, release)

    # ----- using ---------------------------------------------------------------------------
    def tensor(self, slot: Slot) -> torch.Tensor:
        """The tensor a slot describes, a view of this arena's memory."""
        dtype = DTYPES[slot.dtype]
        raw = self.base[slot.offset:slot.offset + slot.nbytes]
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=dtype, device=self.base.device)
        return raw.view(dtype).view(slot.shape)

    def export(self) -> int:
        """A descriptor to send (the receiver takes ownership of its copy)."""
        return os.dup(self.fd)

    def close(self) -> None:
        """Unmap and release; the memory is freed once every process that mapped it has."""
        release, self._release = self._release, []
        self.base = torch.empty(0, dtype=torch.uint8)
        if self.device != "cpu":
            torch.cuda.synchronize()
        _undo(release)
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _undo(release: list[Any]) -> None:
    """Undo mappings and reservations, then release handles (the order close() needs)."""
    for kind, what in release:
        with contextlib.suppress(Exception):
            if kind == "mmap":
                what.close()
                continue
            cu = _driver()
            if kind == "map":
                cu.cuMemUnmap(*what)
            elif kind == "va":
                cu.cuMemAddressFree(*what)
            elif kind == "handle":
                cu.cuMemRelease(what)


def pack(tensors: list[torch.Tensor], device: str) -> tuple[Arena, list[Slot]]:
    """A new arena on ``device`` holding a copy of each tensor, and where each one is."""
    layout = Layout()
    for t in tensors:
        layout.add(t.dtype, list(t.shape))
    arena = Arena.allocate(device, layout.nbytes)
    for t, slot in zip(tensors, layout.slots, strict=True):
        arena.tensor(slot).copy_(t)
    return arena, layout.slots


def views(arena: Arena, slots: list[Slot]) -> list[torch.Tensor]:
    return [arena.tensor(s) for s in slots]


def shareable_device_memory(device: str) -> str | None:
    """Why ``device`` cannot share memory through file descriptors, or None when it can."""
    if device == "cpu":
        return None
    try:
        with Arena.allocate(device, ALIGN) as arena:
            os.close(arena.export())
    except (ArenaError, RuntimeError) as exc:
        return str(exc)
    return None
