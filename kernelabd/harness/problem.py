"""Load and validate a reference file (KernelBench convention) and its optional sidecar.

Only static checks happen here, in trusted code, without running anything: the file parses,
defines ``Model``, ``get_inputs`` and ``get_init_inputs``, and its ``NAME.toml`` is well formed.
What can only be learnt by running it (``get_inputs`` raising, non-tensor or degenerate
outputs) is found by the reference sandbox and reported with the same one-line style.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelabd.pysource import parse

REQUIRED = ("Model", "get_inputs", "get_init_inputs")
VARIANTS = ("base", "scaled", "heavy")
TARGETS = ("triton", "cuda")


class ProblemError(ValueError):
    """A reference or candidate that cannot be evaluated; the message is one line."""


@dataclass
class Sidecar:
    """Per-problem settings from ``NAME.toml``; every key is optional."""

    target: str = "triton"
    tf32: bool = False
    tolerance: float | None = None          # fixed normwise tolerance, overrides calibration
    tol_factor: float | None = None         # overrides [gate] tol_factor
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)   # device kind -> constants
    extra_shapes: list[dict[str, Any]] = field(default_factory=list)  # gate-only shapes
    proposers: list[str] | None = None      # the job's proposers in order, over [jobs] proposers

    def constants_for(self, device: str) -> dict[str, Any]:
        """Module constants to override for ``device`` (``cuda:1`` uses ``[sizes.cuda]``)."""
        return dict(self.sizes.get(device.split(":")[0], {}))


@dataclass
class Problem:
    name: str
    path: Path
    source: str
    sidecar: Sidecar
    sidecar_path: Path | None = None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def parse_source(path: Path, required: tuple[str, ...]) -> tuple[str, ast.Module]:
    """Read and parse a Python file, checking that it defines ``required`` at top level."""
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"{path}: cannot read: {_one_line(exc)}") from exc
    try:
        tree = parse(source, filename=str(path))
    except SyntaxError as exc:
        raise ProblemError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    missing = [n for n in required if n not in _top_level_names(tree)]
    if missing:
        raise ProblemError(f"{path}: missing {', '.join(missing)} (a reference defines "
                           f"{', '.join(required)})")
    return source, tree


def _check_keys(data: dict[str, Any], path: Path) -> None:
    allowed = set(Sidecar.__dataclass_fields__)
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ProblemError(f"{path}: unknown key(s): {', '.join(unknown)}")


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    value = data[key]
    if isinstance(value, bool) and kind is not bool:
        raise ProblemError(f"{path}: {key} must be {kind}, got {value!r}")
    if not isinstance(value, kind):
        raise ProblemError(f"{path}: {key} has the wrong type: {value!r}")
    return value


def load_sidecar(path: Path) -> Sidecar:
    """Parse ``NAME.toml``; unknown keys are errors so that a typo never silently does nothing."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProblemError(f"{path}: {_one_line(exc)}") from exc
    _check_keys(data, path)
    side = Sidecar()
    if "target" in data:
        side.target = _typed(data, "target", str, path)
        if side.target not in TARGETS:
            raise ProblemError(f"{path}: target {side.target!r} is not one of {', '.join(TARGETS)}")
    if "tf32" in data:
        side.tf32 = _typed(data, "tf32", bool, path)
    for key in ("tolerance", "tol_factor"):
        if key in data:
            value = float(_typed(data, key, (int, float), path))
            if value <= 0:
                raise ProblemError(f"{path}: {key} must be positive")
            setattr(side, key, value)
    if "variants" in data:
        side.variants = _typed(data, "variants", list, path)
        bad = [v for v in side.variants if v not in VARIANTS]
        if bad or not side.variants:
            raise ProblemError(f"{path}: variants must be a non-empty subset of {list(VARIANTS)}")
    if "sizes" in data:
        side.sizes = _typed(data, "sizes", dict, path)
        if not all(isinstance(v, dict) for v in side.sizes.values()):
            raise ProblemError(f"{path}: [sizes.DEVICE] tables map constant names to values")
    if "proposers" in data:
        side.proposers = _typed(data, "proposers", list, path)
        if not side.proposers or not all(isinstance(v, str) for v in side.proposers):
            raise ProblemError(f"{path}: proposers must be a non-empty list of proposer names")
    if "extra_shapes" in data:
        side.extra_shapes = _typed(data, "extra_shapes", list, path)
        if not all(isinstance(v, dict) for v in side.extra_shapes):
            raise ProblemError(f"{path}: [[extra_shapes]] entries map constant names to values")
    return side


def sidecar_path_for(reference: Path) -> Path:
    return reference.with_suffix(".toml")


def load_problem(path: str | Path) -> Problem:
    """Statically validate a reference file and load its sidecar."""
    path = Path(path)
    if not path.is_file():
        raise ProblemError(f"{path}: no such file")
    source, _ = parse_source(path, REQUIRED)
    side_path = sidecar_path_for(path)
    sidecar = load_sidecar(side_path) if side_path.is_file() else Sidecar()
    return Problem(name=path.stem, path=path.resolve(), source=source, sidecar=sidecar,
                   sidecar_path=side_path if side_path.is_file() else None)


def load_candidate(path: str | Path) -> str:
    """Statically validate a candidate file: it parses and defines ``ModelNew``."""
    path = Path(path)
    if not path.is_file():
        raise ProblemError(f"{path}: no such file")
    source, _ = parse_source(path, ("ModelNew",))
    return source
