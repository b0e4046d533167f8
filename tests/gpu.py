"""Whether this machine has a working NVIDIA driver, for tests that need one."""

from __future__ import annotations


def nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True
