"""Machine-code fingerprints: how each kernel of a candidate runs on the machine.

A fingerprint is what ptxas made of a kernel (registers, spills, shared memory), how it is
launched where that is known, and the mix of instructions in its SASS that explains speed:
tensor-core instructions, FMAs, load and store widths, asynchronous and bulk-tensor copies,
barriers. ``sass`` reads them from compiled code, ``build`` compiles candidate files for a
named architecture without a GPU, ``sandboxed`` does that for the daemon in a sandbox; the
data model and its comparison live in ``store.fingerprints`` (the TUI shows them too).
"""

from store.fingerprints import FIGURES, KernelPrint, differences, render, render_pair, to_json

__all__ = ["FIGURES", "KernelPrint", "differences", "render", "render_pair", "to_json"]
