"""Load and validate a reference file (KernelBench convention) and its optional sidecar.

Only static checks happen here, in trusted code, without running anything: the file parses,
defines ``Model``, ``get_inputs`` and ``get_init_inputs``, and its ``NAME.toml`` follows the
sidecar's schema (known keys of the right types, finite positive tolerances, and size tables
naming only constants the reference defines at module level, with values of their kind). What
can only be learnt by running it (``get_inputs`` raising, non-tensor or degenerate outputs) is
found by the reference sandbox and reported with the same one-line style.

The checks work on text as well as on files: the inbox reads each dropped file once (regular
files only) and validates what it read, so nothing is read twice or through a link.
"""

from __future__ import annotations

import ast
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelabd.pysource import parse

REQUIRED = ("Model", "get_inputs", "get_init_inputs")
VARIANTS = ("base", "scaled", "heavy")
TARGETS = ("triton", "cuda")
DEVICE_KINDS = ("cpu", "cuda")              # the tables of [sizes.DEVICE]
SHOWN_NAMES = 12                            # constants listed when a sidecar names another
ANY = object()                              # a constant whose value is not a literal
KIND_NAMES = {bool: "true or false", str: "a string", list: "a list", dict: "a table",
              (int, float): "a number"}


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


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """``Type: message`` on one line with the whole message: the part after a line break or a
    colon ("expected one of:") is often the part that says what was wrong. ``limit`` caps it
    where it goes into a record or a message that must stay short."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if limit is None else line[:limit]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set(module_constants(tree))
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Names assigned at module level (inside top-level ``if``/``try``/``with`` too): what a
    sidecar's size tables may set, each with its literal value, or ``ANY`` when it is computed."""
    found: dict[str, Any] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
                    value = _literal(node.value) if len(names) == 1 else ANY
                    found.update({n.id: value for n in names if isinstance(n, ast.Name)})
            elif isinstance(node, ast.If | ast.With | ast.Try):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ANY


def parse_text(source: str, where: str, required: tuple[str, ...]) -> ast.Module:
    """Parse Python source read from ``where``, checking that it defines ``required`` at top
    level; every failure is one line naming ``where`` (and the line, when Python knows it)."""
    try:
        tree = parse(source, filename=where)
    except (SyntaxError, ValueError) as exc:   # ValueError: null bytes, on older Pythons
        line = f":{exc.lineno}" if getattr(exc, "lineno", None) else ""
        message = getattr(exc, "msg", None) or str(exc)
        raise ProblemError(f"{where}{line}: syntax error: {message}") from exc
    except (MemoryError, RecursionError) as exc:
        raise ProblemError(f"{where}: nested too deeply for Python's parser ({one_line(exc)})") from exc
    missing = [n for n in required if n not in _top_level_names(tree)]
    if missing:
        raise ProblemError(f"{where}: missing {', '.join(missing)} (a "
                           f"{'reference' if required == REQUIRED else 'candidate'} defines "
                           f"{', '.join(required)})")
    return tree


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"{path}: cannot read: {one_line(exc)}") from exc


def _check_keys(data: dict[str, Any], path: str) -> None:
    allowed = set(Sidecar.__dataclass_fields__)
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ProblemError(f"{path}: unknown key(s): {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    value = data[key]
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise ProblemError(f"{path}: {key} must be {KIND_NAMES[kind]}, got {_shown(value)}")
    return value


def _positive(data: dict[str, Any], key: str, path: str) -> float:
    value = float(_typed(data, key, (int, float), path))
    if not math.isfinite(value) or value <= 0:
        raise ProblemError(f"{path}: {key} must be a finite positive number, got {_shown(value)}")
    return value


def _scalar_ok(value: Any) -> bool:
    """A value a module constant may take from TOML: a finite number, a string, a boolean, or a
    list of them (a shape)."""
    if isinstance(value, list):
        return all(_scalar_ok(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, bool | int | str)


def _same_kind(expected: Any, value: Any) -> bool:
    """Whether ``value`` can stand in for the reference's literal ``expected``: ``batch_size =
    "8"`` for an ``int`` would fail only inside the reference, with torch's message."""
    if expected is ANY or expected is None:
        return True
    if isinstance(expected, bool) or isinstance(value, bool):
        return isinstance(expected, bool) and isinstance(value, bool)
    if isinstance(expected, int):
        return isinstance(value, int)
    if isinstance(expected, float):
        return isinstance(value, int | float)
    if isinstance(expected, list | tuple):
        return isinstance(value, list)
    return isinstance(value, type(expected))


def _check_constants(table: Any, label: str, path: str, constants: dict[str, Any] | None,
                     reference: str) -> dict[str, Any]:
    """One ``[sizes.DEVICE]`` table or ``[[extra_shapes]]`` entry: constant names to values."""
    if not isinstance(table, dict):
        raise ProblemError(f"{path}: {label} must be a table of module constants, got {_shown(table)}")
    for key, value in table.items():
        if not _scalar_ok(value):
            raise ProblemError(f"{path}: {label} {key} = {_shown(value)}: a constant must be a finite "
                               "number, a string, true/false or a list of them")
        if constants is None:
            continue
        if key not in constants:
            known = sorted(constants)
            listed = ", ".join(known[:SHOWN_NAMES]) + (", ..." if len(known) > SHOWN_NAMES else "")
            raise ProblemError(f"{path}: {label} sets {key}, which {reference} does not define at "
                               f"module level ({'it defines ' + listed if known else 'it defines none'})")
        if not _same_kind(constants[key], value):
            raise ProblemError(f"{path}: {label} {key} = {_shown(value)}: {reference} sets it to "
                               f"{_shown(constants[key])} ({type(constants[key]).__name__})")
    return table


def parse_sidecar(text: str, path: str, constants: dict[str, Any] | None = None,
                  reference: str = "the reference") -> Sidecar:
    """Validate a sidecar's text against the schema; ``constants`` (``module_constants`` of the
    reference) checks the size tables' names and kinds. Unknown keys are errors so that a typo
    never silently does nothing."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError) as exc:
        raise ProblemError(f"{path}: {one_line(exc)}") from exc
    _check_keys(data, path)
    side = Sidecar()
    if "target" in data:
        side.target = _typed(data, "target", str, path)
        if side.target not in TARGETS:
            raise ProblemError(f"{path}: target {_shown(side.target)} is not one of {', '.join(TARGETS)}")
    if "tf32" in data:
        side.tf32 = _typed(data, "tf32", bool, path)
    for key in ("tolerance", "tol_factor"):
        if key in data:
            setattr(side, key, _positive(data, key, path))
    if "variants" in data:
        side.variants = _typed(data, "variants", list, path)
        bad = [v for v in side.variants if v not in VARIANTS]
        if bad or not side.variants:
            raise ProblemError(f"{path}: variants must be a non-empty subset of {list(VARIANTS)}, "
                               f"got {_shown(side.variants)}")
    if "sizes" in data:
        side.sizes = _typed(data, "sizes", dict, path)
        for kind, table in side.sizes.items():
            if kind not in DEVICE_KINDS:
                raise ProblemError(f"{path}: [sizes.{kind}]: the device kind must be one of "
                                   f"{', '.join(DEVICE_KINDS)}")
            _check_constants(table, f"[sizes.{kind}]", path, constants, reference)
    if "proposers" in data:
        side.proposers = _typed(data, "proposers", list, path)
        if not side.proposers or not all(isinstance(v, str) for v in side.proposers):
            raise ProblemError(f"{path}: proposers must be a non-empty list of proposer names")
    if "extra_shapes" in data:
        side.extra_shapes = _typed(data, "extra_shapes", list, path)
        for i, entry in enumerate(side.extra_shapes, 1):
            _check_constants(entry, f"[[extra_shapes]] #{i}", path, constants, reference)
    return side


def load_sidecar(path: Path, constants: dict[str, Any] | None = None,
                 reference: str = "the reference") -> Sidecar:
    """Parse ``NAME.toml`` (see ``parse_sidecar``)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"{path}: {one_line(exc)}") from exc
    return parse_sidecar(text, str(path), constants, reference)


def validate_reference(source: str, where: str, sidecar: str | None = None,
                       sidecar_where: str = "") -> Sidecar:
    """The static checks of a reference and its sidecar, given as text (``where`` names them in
    messages); returns the parsed sidecar."""
    tree = parse_text(source, where, REQUIRED)
    if sidecar is None:
        return Sidecar()
    return parse_sidecar(sidecar, sidecar_where, module_constants(tree), Path(where).name)


def validate_candidate(source: str, where: str) -> None:
    """The static checks of a candidate given as text: it parses and defines ``ModelNew``."""
    parse_text(source, where, ("ModelNew",))


def sidecar_path_for(reference: Path) -> Path:
    return reference.with_suffix(".toml")


def _is_file(path: Path) -> bool:
    """``path.is_file()``, with a name the file system cannot hold (ENAMETOOLONG) an error
    naming it rather than an ``OSError`` out of a loader."""
    try:
        return path.is_file()
    except OSError as exc:
        raise ProblemError(f"{path}: {one_line(exc)}") from exc


def load_problem(path: str | Path) -> Problem:
    """Statically validate a reference file and load its sidecar."""
    path = Path(path)
    if not _is_file(path):
        raise ProblemError(f"{path}: no such file")
    source = read_text(path)
    side_path = sidecar_path_for(path)
    present = _is_file(side_path)
    sidecar = validate_reference(source, str(path), read_text(side_path) if present else None,
                                 str(side_path))
    return Problem(name=path.stem, path=path.resolve(), source=source, sidecar=sidecar,
                   sidecar_path=side_path if present else None)


def load_candidate(path: str | Path) -> str:
    """Statically validate a candidate file: it parses and defines ``ModelNew``."""
    path = Path(path)
    if not _is_file(path):
        raise ProblemError(f"{path}: no such file")
    source = read_text(path)
    validate_candidate(source, str(path))
    return source
