"""Read a fingerprint from compiled code: cuobjdump and ptxas from Triton's wheel, on a cubin and
its PTX. Nothing here needs a GPU."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from kernelabd.fingerprint import KernelPrint

TENSOR_CORE = ("HGMMA", "HMMA", "IMMA", "QGMMA", "IGMMA", "BGMMA", "DMMA", "UTCHMMA", "UTCQMMA")
ASYNC_COPIES = ("LDGSTS", "LDGDEPBAR", "UTMALDG", "UTMASTG", "UTMAPF", "UBLKCP", "UBLKRED")
BARRIERS = ("BAR", "SYNCS", "MEMBAR", "DEPBAR", "WARPSYNC", "WARPGROUP", "ARRIVES", "ERRBAR")
WIDE_MEMORY = ("LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "ATOM", "RED", "ATOMS")
ARITHMETIC = ("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2", "DFMA", "MUFU", "FMNMX", "IMAD",
              "SHFL", "F2F", "F2FP", "LDSM", "STSM")
WIDTHS = {"U8": 8, "S8": 8, "8": 8, "U16": 16, "S16": 16, "16": 16, "64": 64, "128": 128}
TIMEOUT_S = 120

_ENCODING = re.compile(r"/\* 0x[0-9a-f]{16} \*/")   # cuobjdump's hex column: kept out of storage
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")


def tool(name: str) -> str:
    """Path of one of the CUDA binaries Triton's wheel carries (cuobjdump, nvdisasm, ptxas)."""
    import triton

    return str(getattr(triton.knobs.nvidia, name).path)


def _run(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout + done.stderr


def category(opcode: str, modifiers: str) -> str | None:
    """The name an instruction is counted under, or None when it does not explain speed.

    Memory instructions are counted by width (``LDG.128``: 16-byte vector loads), so a port
    that lost its vectorisation shows it."""
    if opcode in TENSOR_CORE or opcode in ASYNC_COPIES or opcode in BARRIERS or opcode in ARITHMETIC:
        return opcode
    if opcode in WIDE_MEMORY:
        mods = modifiers.strip(".").split(".")
        width = next((WIDTHS[m] for m in mods if m in WIDTHS), 32)
        return f"{opcode}.{width}"
    return None


def instruction_mix(sass: str) -> dict[str, int]:
    """Counts of the instructions that explain speed in one function's SASS, and ``total``."""
    counts: Counter[str] = Counter()
    for match in _INSTR.finditer(sass):
        opcode, modifiers = match.groups()
        if opcode == "NOP":
            continue
        counts["total"] += 1
        name = category(opcode, modifiers)
        if name:
            counts[name] += 1
    return dict(sorted(counts.items()))


def functions_sass(cubin: Path) -> dict[str, str]:
    """Each function's SASS, by name, from ``cuobjdump -sass``."""
    text = _run([tool("cuobjdump"), "-sass", str(cubin)])
    text = "\n".join(line.rstrip() for line in _ENCODING.sub("", text).splitlines() if line.strip())
    parts = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def resource_usage(cubin: Path) -> dict[str, dict[str, int]]:
    """REG/STACK/SHARED/LOCAL of each function, as ``cuobjdump --dump-resource-usage`` prints."""
    text = _run([tool("cuobjdump"), "--dump-resource-usage", str(cubin)])
    found: dict[str, dict[str, int]] = {}
    for name, fields in re.findall(r"Function (\S+):\s*\n\s*(.*)", text):
        found[name] = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", fields)}
    return found


def ptxas_figures(ptxas_log: str) -> dict[str, dict[str, int]]:
    """Spill store and load bytes and static shared memory of each entry, from ``ptxas -v``'s
    report (cuobjdump's SHARED also counts the 1 KiB the system reserves per block)."""
    found: dict[str, dict[str, int]] = {}
    for block in re.split(r"Compiling entry function ", ptxas_log)[1:]:
        name = block.split("'")[1]
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        smem = re.search(r"Used \d+ registers.*?(\d+) bytes smem", block)
        if spill is None:
            raise RuntimeError(f"ptxas reported no spill figures for {name}")
        found[name] = {"spills": int(spill.group(1)), "spill_loads": int(spill.group(2)),
                       "smem": int(smem.group(1)) if smem else 0}
    return found


def ptxas_report(ptx: str) -> str:
    """``ptxas -v``'s report on Triton's PTX, for the target the PTX names (``sm_90a`` where it
    uses wgmma), from the ptxas that Triton itself assembles with."""
    target = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, flags=re.M)
    if target is None:
        raise RuntimeError("the PTX names no .target")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        return _run([tool("ptxas"), f"--gpu-name={target.group(1)}", "-v", "-o",
                     str(Path(tmp) / "k.cubin"), str(src)])


def fingerprints(cubin: bytes, ptx: str, ptxas_log: str, arch: str,
                 launch: dict[str, dict] | None = None,
                 dynamic_shared: dict[str, int] | None = None) -> list[KernelPrint]:
    """Every kernel of one cubin, with spill figures from ``ptxas -v``'s report on it;
    ``launch`` and ``dynamic_shared`` (by kernel name) add what only the launch knows."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        codes, usage = functions_sass(path), resource_usage(path)
    reported = ptxas_figures(ptxas_log)
    kernels = []
    for name, sass in codes.items():
        use = usage.get(name, {})
        if name not in reported:
            raise RuntimeError(f"ptxas reported nothing for kernel {name}")
        figures = reported[name]
        static = figures["smem"]
        kernels.append(KernelPrint(
            name=name, arch=arch, registers=use.get("REG", 0), spills=figures["spills"],
            spill_loads=figures["spill_loads"],
            local_bytes=use.get("STACK", 0) + use.get("LOCAL", 0),
            shared_bytes=static + (dynamic_shared or {}).get(name, 0), static_shared_bytes=static,
            launch=dict((launch or {}).get(name, {})), instructions=instruction_mix(sass),
            ptx=ptx, sass=sass.strip()))
    return kernels
