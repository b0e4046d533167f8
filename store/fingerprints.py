"""Machine-code fingerprints as kept and shown: the data model, its comparison and text, and
the ``fingerprints`` table (PTX and SASS compressed, for diffing).

Here rather than in ``kernelabd`` because the TUI shows them and imports only ``store``;
``kernelabd.fingerprint`` makes them.
"""

from __future__ import annotations

import json
import sqlite3
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

# The figures two fingerprints are compared on, in the order a person reads them.
FIGURES = ("registers", "spills", "spill_loads", "local_bytes", "shared_bytes")


@dataclass
class KernelPrint:
    """One compiled kernel. ``shared_bytes`` is static plus dynamic shared memory per block
    (dynamic only where the launch is known); ``spills``/``spill_loads`` are ptxas's bytes of
    spill stores/loads per thread; ``local_bytes`` the thread's stack frame."""

    name: str
    arch: str
    registers: int
    spills: int
    spill_loads: int
    local_bytes: int
    shared_bytes: int
    static_shared_bytes: int
    launch: dict[str, Any] = field(default_factory=dict)   # grid, block, num_warps, num_stages
    instructions: dict[str, int] = field(default_factory=dict)
    ptx: str = ""
    sass: str = ""

    def to_json(self, with_code: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_code:
            data.pop("ptx")
            data.pop("sass")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelPrint:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def to_json(kernels: list[KernelPrint], with_code: bool = False) -> dict[str, Any]:
    """The contract of ``kernelab fingerprint --json``: ``{"kernels": [...]}``."""
    return {"kernels": [k.to_json(with_code) for k in kernels]}


def pairs(a: list[KernelPrint], b: list[KernelPrint]) -> list[tuple[KernelPrint | None, KernelPrint | None]]:
    """Kernels matched by name, else by position (a port's kernels may be renamed)."""
    names_b = {k.name: k for k in b}
    if all(k.name in names_b for k in a):
        matched = [(k, names_b[k.name]) for k in a]
        rest = [k for k in b if k.name not in {x.name for x in a}]
        return [*matched, *((None, k) for k in rest)]
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


def _rows(ka: KernelPrint | None, kb: KernelPrint | None) -> list[tuple[str, Any, Any]]:
    rows: list[tuple[str, Any, Any]] = [("name", ka and ka.name, kb and kb.name)]
    for key in ("grid", "block", "num_warps", "num_stages"):
        va = ka.launch.get(key) if ka else None
        vb = kb.launch.get(key) if kb else None
        if va is not None or vb is not None:
            rows.append((key, va, vb))
    rows += [(f, getattr(ka, f) if ka else None, getattr(kb, f) if kb else None) for f in FIGURES]
    names = sorted(set(ka.instructions if ka else {}) | set(kb.instructions if kb else {}),
                   key=lambda n: (n == "total", n))
    rows += [(n, ka.instructions.get(n, 0) if ka else None, kb.instructions.get(n, 0) if kb else None)
             for n in names]
    return rows


def differences(a: list[KernelPrint], b: list[KernelPrint]) -> list[dict[str, Any]]:
    """What differs between two candidates' kernels, figure by figure: the data proposers get
    (``{"kernel", "figure", "a", "b"}``), and what ``fingerprint A B`` marks."""
    found = []
    for ka, kb in pairs(a, b):
        label = (kb or ka).name if kb or ka else "?"
        for figure, va, vb in _rows(ka, kb)[1:]:
            if va != vb:
                found.append({"kernel": label, "figure": figure, "a": va, "b": vb})
    return found


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list | tuple):
        return "×".join(map(str, value))
    return str(value)


def render(kernels: list[KernelPrint]) -> str:
    """One candidate's fingerprint as aligned text, one block per kernel."""
    blocks = []
    for k in kernels:
        lines = [f"{k.name}  ({k.arch})"]
        lines += [f"  {label:<18} {_cell(va)}" for label, va, _ in _rows(k, None)[1:]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no kernels"


def render_pair(a: list[KernelPrint], b: list[KernelPrint], label_a: str, label_b: str) -> str:
    """Two candidates side by side; a ``◀`` marks every figure that differs."""
    width = max(12, len(label_a), *(len(_cell(k.name)) for k in a)) + 2
    blocks = []
    for ka, kb in pairs(a, b):
        lines = [f"  {'':<18} {label_a:<{width}} {label_b}"]
        for figure, va, vb in _rows(ka, kb):
            mark = "  ◀" if va != vb else ""
            lines.append(f"  {figure:<18} {_cell(va):<{width}} {_cell(vb)}{mark}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no kernels"


def save(conn: sqlite3.Connection, candidate_id: int, found: dict[str, Any]) -> None:
    """Keep one candidate's fingerprint: ``{"arch", "kernels": [...with ptx and sass]}``, or
    ``{"error": why}`` when it could not be made. The code is stored compressed, apart."""
    kernels = [KernelPrint.from_json(k) for k in found.get("kernels", [])]
    code = json.dumps([{"name": k.name, "ptx": k.ptx, "sass": k.sass} for k in kernels])
    with conn:
        conn.execute("INSERT OR REPLACE INTO fingerprints (candidate_id, arch, kernels, code, error, "
                     "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                     (candidate_id, found.get("arch"), json.dumps(to_json(kernels)),
                      zlib.compress(code.encode(), 6), found.get("error"), time.time()))


def load(conn: sqlite3.Connection, candidate_id: int, with_code: bool = False) -> list[KernelPrint] | None:
    """One candidate's kernels, or None when it has no fingerprint (an error counts as none)."""
    row = conn.execute("SELECT kernels, code FROM fingerprints WHERE candidate_id = ? AND error IS NULL",
                       (candidate_id,)).fetchone()
    if row is None:
        return None
    kernels = [KernelPrint.from_json(k) for k in json.loads(row[0])["kernels"]]
    if with_code and row[1] is not None:
        for kernel, code in zip(kernels, json.loads(zlib.decompress(row[1])), strict=False):
            kernel.ptx, kernel.sass = code["ptx"], code["sass"]
    return kernels


def load_job(conn: sqlite3.Connection, job_id: int) -> dict[int, dict[str, Any]]:
    """Every fingerprinted candidate of a job: id → ``{"kernels": [...]}`` (no code)."""
    rows = conn.execute("SELECT f.candidate_id, f.kernels FROM fingerprints f JOIN candidates c "
                        "ON c.id = f.candidate_id WHERE c.job_id = ? AND f.error IS NULL",
                        (job_id,)).fetchall()
    return {int(r[0]): json.loads(r[1]) for r in rows}
