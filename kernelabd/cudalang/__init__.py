"""CUDA C++ as a target language: the loader a CUDA candidate carries, and how it is emitted."""

from __future__ import annotations

from pathlib import Path

BEGIN = "# ---- kernelab CUDA loader: torch + cuda-python only (kernelabd/cudalang/loader.py) ----"
END = "# ---- end of the kernelab CUDA loader ----"


def loader_text() -> str:
    """The loader's code as a candidate carries it: the module after its docstring and its
    ``__future__`` import, between markers, so a ``best.py`` needs no kernelab."""
    source = (Path(__file__).with_name("loader.py")).read_text()
    body = source.split("from __future__ import annotations\n", 1)[1].strip("\n")
    return f"{BEGIN}\n{body}\n{END}\n"


def carried_loader(candidate_source: str) -> str | None:
    """The loader text a candidate carries, markers included; None when it carries none."""
    start = candidate_source.find(BEGIN)
    end = candidate_source.find(END)
    if start < 0 or end < start:
        return None
    return candidate_source[start:end + len(END)] + "\n"


def with_loader(candidate_source: str) -> str:
    """``candidate_source`` with its loader replaced by (or, at ``# {LOADER}``, set to) the
    current one: how templates and examples are written."""
    old = carried_loader(candidate_source)
    if old is not None:
        return candidate_source.replace(old, loader_text())
    return candidate_source.replace("# {LOADER}\n", loader_text())
