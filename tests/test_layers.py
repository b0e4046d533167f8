"""The layers as ARCHITECTURE.md draws them, read from the imports of the tree itself: arrows
point down only, and the harness never reaches into the service around it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(folder: str) -> dict[str, set[str]]:
    """Every module a package's files import (absolute names, relative ones resolved)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        package = ".".join(rel.parts[:-1])
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
        found[str(rel)] = names
    return found


def offending(folder: str, allowed: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for module, names in imports_of(folder).items():
        for name in sorted(names):
            if name.startswith(forbidden) and not name.startswith(allowed):
                bad.append(f"{module} imports {name}")
    return bad


def test_the_harness_never_imports_the_service() -> None:
    assert offending("kernelabd/harness", (), ("kernelabd.service", "kernelabd.commands",
                                               "kernelabd.propose", "tui")) == []


def test_the_tui_imports_nothing_of_kernelabs_but_the_store() -> None:
    assert offending("tui", ("tui",), ("kernelabd", "tests", "bench")) == []


def test_the_store_imports_nothing_of_kernelabs() -> None:
    assert offending("store", ("store",), ("kernelabd", "tui", "tests", "bench")) == []


@pytest.mark.parametrize("module", ["tui.app", "kernelabd.service.daemon", "kernelabd.harness.gate"])
def test_the_reader_sees_each_layer(module: str) -> None:
    """The reader above must see real imports: a parser that found none would pass vacuously."""
    rel = module.replace(".", "/")
    assert imports_of(rel.rsplit("/", 1)[0])[rel]
