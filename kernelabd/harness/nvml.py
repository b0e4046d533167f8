"""NVML, the one way kernelab reaches it: the binding is optional and the driver may be absent,
and every caller (the device list, clocks, doctor, the service's clock release) must say so in
its own words rather than each guessing which exceptions mean "no GPU here"."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here. ``no_driver``: nothing is wrong, this machine has no NVIDIA
    driver (or no binding); otherwise a driver is there and NVML failed, which is worth a look."""

    def __init__(self, reason: str, *, no_driver: bool) -> None:
        super().__init__(reason)
        self.no_driver = no_driver


def init() -> Any:
    """The initialised ``pynvml`` module (initialising again is cheap and counted by NVML)."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed", no_driver=True) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        missing = isinstance(exc, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded))
        raise NvmlUnavailable(str(exc), no_driver=missing) from exc
    return pynvml


def init_or_none() -> Any | None:
    """``init()``, or None where NVML cannot be used (a CPU machine, a broken driver)."""
    try:
        return init()
    except NvmlUnavailable:
        return None


@contextlib.contextmanager
def opened() -> Iterator[Any]:
    """``pynvml`` initialised for the block and shut down after it."""
    nvml = init()
    try:
        yield nvml
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def text(value: bytes | str) -> str:
    """NVML's strings: bytes from older bindings, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)
