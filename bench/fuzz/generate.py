"""Malformed inputs for a daemon's inbox, every kind issue 21 lists, generated from a seed.

A ``Case`` is what one user drops: one to three inbox entries (a reference, its sidecar, a
starting candidate, or an odd entry: a link, a FIFO, a directory, a name no file system or
terminal should hold) and what the daemon must make of it: a job that ends, or an event, whose
reason names the culprit file and, where the kind says, the cause. ``KINDS`` maps each kind to
its builder; ``COST`` says what each costs a CPU daemon, so that a CI run can take a seeded
sample of the cheap and the dear alike (``sample``) and the benchmark many of each (``cases``).

Faults are planted in a small reference (an affine map on a 4 x 64 tensor, cheap on the Triton
interpreter) and its Triton port, at import or in ``forward``: raising, a missing module,
``sys.exit``, ``os._exit``, SIGSEGV, ``KeyboardInterrupt``, a loop, a sleep, a flood of printed
output, writes into the home directory. Mutated real problems are the shipped examples with a
few random edits (a line dropped, duplicated or swapped, a number changed, the text cut short,
a byte flipped). Nothing generated allocates more than a few tens of megabytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("softmax", "layernorm", "gelu_gate", "matmul")

REFERENCE = '''import torch
import torch.nn as nn

rows = 4
cols = 64
{import_fault}

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{forward_fault}        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl
{import_fault}

@triton.jit
def _affine(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{forward_fault}        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _affine[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
        return out
'''

# Code that misbehaves, at import or in forward, with what a reason must say about it (any of).
FAULTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "raises": ("raise ValueError('fuzz: raised on purpose')", ("ValueError",)),
    "missing_module": ("import kernelab_fuzz_no_such_module", ("ModuleNotFoundError", "No module")),
    "sys_exit": ("import sys; sys.exit(3)", ("exit",)),
    "os_exit": ("import os; os._exit(4)", ("exit",)),
    "sigsegv": ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", ("segmentation", "SIGSEGV")),
    "keyboard_interrupt": ("raise KeyboardInterrupt", ("KeyboardInterrupt", "interrupt")),
    "loop": ("while True: pass", ("did not return", "deadline", "within")),
    "sleep": ("import time; time.sleep(3600)", ("did not return", "deadline", "within")),
    "print_flood": ("import os, sys; sys.stdout.write('x' * (20 << 20) + '\\n'); sys.stdout.flush(); "
                    "os.write(1, bytes(range(256)) * 5000)", ()),
    "writes_home": ("import os, tempfile; [open(os.path.join(d, 'kernelab-fuzz-escape'), 'w').write('x') "
                    "for d in (os.path.expanduser('~'), tempfile.gettempdir())]", ()),
}
HANGS = frozenset({"loop", "sleep"})
FLOOD_IN_FORWARD = ("import sys; sys.stdout.write('y' * (1 << 20) + '\\n'); sys.stdout.flush()", ())

OK_SIDECAR = "tf32 = false\n"


@dataclass
class Entry:
    """One inbox entry: a file (``data``), a symbolic link (``data`` is its target), a FIFO or a
    directory; ``in_place`` writes a file where it lands instead of renaming it in."""

    name: bytes
    kind: str = "file"            # file | symlink | fifo | dir
    data: bytes = b""
    in_place: bool = False


@dataclass
class Case:
    kind: str
    name: str                      # the problem name (or the odd entry's shown name)
    entries: list[Entry]
    expect: str = "job"            # job: a job for NAME.py ends; event: an inbox event names it
    culprit: str = ""              # the file name the reason must contain
    cause: tuple[str, ...] = ()    # the reason must contain one of these (case-insensitive)
    may_pass: bool = False         # a job that may end done (a harmless mutation, a valid name)
    hang: bool = False             # reference code that never returns


def _src(template: str, at_import: str = "", in_forward: str = "") -> bytes:
    forward = f"        {in_forward}\n" if in_forward else ""
    return template.format(import_fault=at_import, forward_fault=forward).encode()


def _problem(name: str, reference: bytes, sidecar: bytes | None = None, start: bytes | None = None,
             in_place: bool = False) -> list[Entry]:
    entries = [Entry(f"{name}.py".encode(), data=reference, in_place=in_place)]
    if sidecar is not None:
        entries.insert(0, Entry(f"{name}.toml".encode(), data=sidecar))
    if start is not None:
        entries.insert(0, Entry(f"{name}.new.py".encode(), data=start))
    return entries


def _good_start(rng: random.Random) -> bytes | None:
    """Half the reference faults come with a valid port, so that the gate runs the reference."""
    return _src(CANDIDATE) if rng.random() < 0.5 else None


# -- builders: (name, rng) -> Case ------------------------------------------------------------

def reference_fault(fault: str, where: str) -> Callable[[str, random.Random], Case]:
    code, cause = FAULTS[fault]
    if where == "forward" and fault == "print_flood":
        code, cause = FLOOD_IN_FORWARD

    def build(name: str, rng: random.Random) -> Case:
        source = _src(REFERENCE, code, "") if where == "import" else _src(REFERENCE, "", code)
        return Case(f"reference.{where}.{fault}", name, _problem(name, source, start=_good_start(rng)),
                    culprit=f"{name}.py", cause=cause, hang=fault in HANGS,
                    may_pass=fault in ("print_flood", "writes_home"))
    return build


def candidate_fault(fault: str, where: str) -> Callable[[str, random.Random], Case]:
    code, cause = FAULTS[fault]
    if where == "forward" and fault == "print_flood":
        code, cause = FLOOD_IN_FORWARD

    def build(name: str, rng: random.Random) -> Case:
        start = _src(CANDIDATE, code, "") if where == "import" else _src(CANDIDATE, "", code)
        return Case(f"candidate.{where}.{fault}", name, _problem(name, _src(REFERENCE), start=start),
                    culprit=f"{name}.new.py", cause=cause, may_pass=fault in ("print_flood", "writes_home"))
    return build


def _static_reference(kind: str, text: Callable[[random.Random], bytes],
                      cause: tuple[str, ...]) -> Callable[[str, random.Random], Case]:
    def build(name: str, rng: random.Random) -> Case:
        return Case(f"reference.static.{kind}", name,
                    _problem(name, text(rng), in_place=rng.random() < 0.3),
                    culprit=f"{name}.py", cause=cause)
    return build


def _random_bytes(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))


STATIC_REFERENCES = {
    "syntax_error": (lambda rng: _src(REFERENCE).replace(b"def forward(self, x):", b"def forward(self, x)"),
                     ("syntax error",)),
    "null_bytes": (lambda rng: _src(REFERENCE) + b"\x00\n", ("null bytes",)),
    "not_utf8": (lambda rng: _src(REFERENCE) + b"# \xff\xfe\n", ("not UTF-8",)),
    "random_bytes": (lambda rng: b"\xff" + _random_bytes(rng), ()),
    "empty": (lambda rng: b"", ("missing Model",)),
    "no_model": (lambda rng: _src(REFERENCE).replace(b"class Model(", b"class Modle("), ("missing Model",)),
    "over_size": (lambda rng: _src(REFERENCE) + b"#" * (1 << 20), ("over the inbox's limit",)),
    "deep_nesting": (lambda rng: _src(REFERENCE) + b"y = " + b"-" * 300_000 + b"1\n", ("nested too deeply",)),
}

BUILDER_FAULTS = {   # a reference whose builders or model are wrong: found by running it
    "inputs_none": (b"    return [torch.randn(rows, cols)]\n\n\ndef get_init", b"    return None\n\n\ndef get_init"),
    "inputs_string": (b"    return [torch.randn(rows, cols)]\n\n\ndef get_init", b"    return 'x'\n\n\ndef get_init"),
    "negative_shape": (b"torch.randn(rows, cols)", b"torch.randn(-rows, cols)"),
    "init_arity": (b"def get_init_inputs():\n    return []", b"def get_init_inputs():\n    return [1, 2, 3]"),
    "not_a_module": (b"class Model(nn.Module):", b"class Model:"),
    "not_a_tensor": (b"        return x * 2.0 + 1.0", b"        return 3.0"),
    "nan_output": (b"        return x * 2.0 + 1.0", b"        return x * float('nan')"),
    "empty_output": (b"        return x * 2.0 + 1.0", b"        return x[:0]"),
    "zero_d_input": (b"torch.randn(rows, cols)", b"torch.randn(())"),
}


def builder_fault(kind: str) -> Callable[[str, random.Random], Case]:
    old, new = BUILDER_FAULTS[kind]

    def build(name: str, rng: random.Random) -> Case:
        source = _src(REFERENCE).replace(old, new)
        return Case(f"reference.run.{kind}", name, _problem(name, source, start=_good_start(rng)),
                    culprit=f"{name}.py", may_pass=kind == "zero_d_input")
    return build


SIDECARS = {
    "nan_tolerance": (b"tolerance = nan\n", ("tolerance",)),
    "inf_tol_factor": (b"tol_factor = inf\n", ("tol_factor",)),
    "negative_tolerance": (b"tolerance = -1.0\n", ("tolerance",)),
    "wrong_type": (b"tf32 = 'yes'\n", ("tf32",)),
    "unknown_key": (b"tolerence = 1e-3\n", ("tolerence",)),
    "unknown_constant": (b"[[extra_shapes]]\nrows = 2\nnot_a_constant = 3\n", ("not_a_constant",)),
    "constant_of_another_kind": (b"[sizes.cpu]\ncols = 'sixty-four'\n", ("cols",)),
    "unknown_device": (b"[sizes.gpu]\ncols = 32\n", ("sizes.gpu",)),
    "toml_syntax": (b"[sizes\ncols = 1\n", ("TOMLDecodeError",)),
    "not_utf8": (b"tf32 = false # \xff\n", ("not UTF-8",)),
    "deep_nesting": (b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n", ()),
}


def sidecar_fault(kind: str) -> Callable[[str, random.Random], Case]:
    text, cause = SIDECARS[kind]

    def build(name: str, rng: random.Random) -> Case:
        return Case(f"sidecar.{kind}", name, _problem(name, _src(REFERENCE), sidecar=text,
                                                      start=_good_start(rng)),
                    culprit=f"{name}.toml", cause=cause)
    return build


def sidecar_link(name: str, rng: random.Random) -> Case:
    entries = _problem(name, _src(REFERENCE))
    entries.insert(0, Entry(f"{name}.toml".encode(), "symlink", b"/etc/passwd"))
    return Case("sidecar.symlink", name, entries, culprit=f"{name}.toml", cause=("symbolic link",))


STATIC_CANDIDATES = {
    "empty": (lambda rng: b"", ("missing ModelNew",)),
    "random_bytes": (lambda rng: b"\xff" + _random_bytes(rng), ()),
    "syntax_error": (lambda rng: _src(CANDIDATE).replace(b"def forward(self, x):", b"def forward(self, x"),
                     ("syntax error",)),
    "no_modelnew": (lambda rng: _src(CANDIDATE).replace(b"class ModelNew(", b"class Model("), ("missing ModelNew",)),
    "null_bytes": (lambda rng: b"\x00" + _src(CANDIDATE), ("null bytes",)),
}


def static_candidate(kind: str) -> Callable[[str, random.Random], Case]:
    text, cause = STATIC_CANDIDATES[kind]

    def build(name: str, rng: random.Random) -> Case:
        return Case(f"candidate.static.{kind}", name, _problem(name, _src(REFERENCE), start=text(rng)),
                    culprit=f"{name}.new.py", cause=cause)
    return build


# -- names and file types ---------------------------------------------------------------------

def odd_entry(kind: str, entry: Callable[[str], Entry], shown: Callable[[str], str],
              cause: tuple[str, ...]) -> Callable[[str, random.Random], Case]:
    def build(name: str, rng: random.Random) -> Case:
        made = entry(name)
        return Case(f"entry.{kind}", shown(name), [made], expect="event", culprit=shown(name), cause=cause)
    return build


ODD_ENTRIES = {
    "symlink_to_passwd": (lambda n: Entry(f"{n}.py".encode(), "symlink", b"/etc/passwd"),
                          lambda n: f"{n}.py", ("symbolic link (to /etc/passwd)",)),
    "dangling_symlink": (lambda n: Entry(f"{n}.py".encode(), "symlink", b"/nonexistent/kernelab-fuzz.py"),
                         lambda n: f"{n}.py", ("symbolic link",)),
    "looping_symlink": (lambda n: Entry(f"{n}.py".encode(), "symlink", f"{n}.py".encode()),
                        lambda n: f"{n}.py", ("symbolic link",)),
    "fifo": (lambda n: Entry(f"{n}.py".encode(), "fifo"), lambda n: f"{n}.py", ("FIFO",)),
    "directory": (lambda n: Entry(f"{n}.py".encode(), "dir"), lambda n: f"{n}.py", ("directory",)),
    "name_not_utf8": (lambda n: Entry(f"{n}".encode() + b"\xff.py", data=_src(REFERENCE)),
                      lambda n: f"{n}\\udcff.py", ("not UTF-8",)),
    "name_control_chars": (lambda n: Entry(f"{n}\x1b[31m.py".encode(), data=_src(REFERENCE)),
                           lambda n: f"{n}\\x1b[31m.py", ("control characters",)),
    "name_newline": (lambda n: Entry(f"{n}\nrm -rf.py".encode(), data=_src(REFERENCE)),
                     lambda n: f"{n}\\nrm -rf.py", ("control characters",)),
    "other_extension": (lambda n: Entry(f"{n}.txt".encode(), data=b"hello\n"),
                        lambda n: f"{n}.txt", ("not NAME.py",)),
    "lone_sidecar": (lambda n: Entry(f"{n}.toml".encode(), data=OK_SIDECAR.encode()),
                     lambda n: f"{n}.toml", ("not in the inbox yet",)),
    "lone_start": (lambda n: Entry(f"{n}.new.py".encode(), data=_src(CANDIDATE)),
                   lambda n: f"{n}.new.py", ("not in the inbox yet",)),
}


def long_name(name: str, rng: random.Random) -> Case:
    """251 characters and .py: its NAME.toml would be 256 bytes (the crash loop of issue 21)."""
    long = (name + "_" + "x" * 251)[:251]
    return Case("entry.name_too_long", long, [Entry(f"{long}.py".encode(), data=_src(REFERENCE), in_place=True)],
                culprit=f"{long}.py", cause=("too long",))


def unicode_name(name: str, rng: random.Random) -> Case:
    """An odd but valid name: a job like any other."""
    odd = f"{name} ünï cødé"
    return Case("entry.unicode_name", odd, _problem(odd, _src(REFERENCE), start=_src(CANDIDATE)),
                culprit=f"{odd}.py", may_pass=True)


# -- mutated real problems --------------------------------------------------------------------

def _mutate(text: bytes, rng: random.Random) -> bytes:
    lines = text.split(b"\n")
    how = rng.choice(["drop", "duplicate", "swap", "number", "truncate", "flip"])
    i = rng.randrange(len(lines))
    if how == "drop":
        del lines[i]
    elif how == "duplicate":
        lines.insert(i, lines[i])
    elif how == "swap" and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif how == "number":
        digits = [j for j, line in enumerate(lines) if any(c in b"0123456789" for c in line)]
        if digits:
            j = rng.choice(digits)
            lines[j] = bytes(c if c not in b"123456789" else rng.choice(b"0-13") for c in lines[j])
    elif how == "truncate" and text:
        return text[: rng.randrange(len(text))]
    elif how == "flip" and text:
        pos = rng.randrange(len(text))
        return text[:pos] + bytes([text[pos] ^ (1 << rng.randrange(8))]) + text[pos + 1:]
    return b"\n".join(lines)


def mutated(target: str) -> Callable[[str, random.Random], Case]:
    """A shipped example with one to three random edits to its ``target`` file."""
    def build(name: str, rng: random.Random) -> Case:
        example = rng.choice(EXAMPLES)
        files = {s: (ROOT / "examples" / f"{example}{s}").read_bytes() for s in (".py", ".toml", ".new.py")}
        for _ in range(rng.randrange(1, 4)):
            files[target] = _mutate(files[target], rng)
        return Case(f"mutated.{target.lstrip('.').replace('.', '_')}", name,
                    _problem(name, files[".py"], files[".toml"], files[".new.py"]),
                    culprit=f"{name}{target}", may_pass=True)
    return build


def _kinds() -> dict[str, Callable[[str, random.Random], Case]]:
    kinds: dict[str, Callable[[str, random.Random], Case]] = {}
    for fault in FAULTS:
        for where in ("import", "forward"):
            kinds[f"reference.{where}.{fault}"] = reference_fault(fault, where)
            kinds[f"candidate.{where}.{fault}"] = candidate_fault(fault, where)
    for kind, (text, cause) in STATIC_REFERENCES.items():
        kinds[f"reference.static.{kind}"] = _static_reference(kind, text, cause)
    for kind in BUILDER_FAULTS:
        kinds[f"reference.run.{kind}"] = builder_fault(kind)
    for kind in SIDECARS:
        kinds[f"sidecar.{kind}"] = sidecar_fault(kind)
    kinds["sidecar.symlink"] = sidecar_link
    for kind in STATIC_CANDIDATES:
        kinds[f"candidate.static.{kind}"] = static_candidate(kind)
    for kind, (entry, shown, cause) in ODD_ENTRIES.items():
        kinds[f"entry.{kind}"] = odd_entry(kind, entry, shown, cause)
    kinds["entry.name_too_long"] = long_name
    kinds["entry.unicode_name"] = unicode_name
    for target in (".py", ".toml", ".new.py"):
        kinds[f"mutated.{target.lstrip('.').replace('.', '_')}"] = mutated(target)
    return kinds


KINDS = _kinds()


def cost(kind: str) -> str:
    """What a kind costs a CPU daemon: ``static`` (decided by the watcher, or before any
    sandbox starts), ``hang`` (code that never returns: only a deadline ends it) or ``run``
    (the worker runs the reference, and the gate the candidate when there is one)."""
    if kind.rsplit(".", 1)[-1] in HANGS:
        return "hang"
    static = ("entry.", "reference.static.", "candidate.static.", "sidecar.")
    return "static" if kind.startswith(static) and kind != "entry.unicode_name" else "run"


COST = {kind: cost(kind) for kind in KINDS}


def build(kind: str, index: int, rng: random.Random) -> Case:
    """The case of ``kind`` numbered ``index`` (its problem name is unique in a run)."""
    return KINDS[kind](f"f{index:04d}_{kind.replace('.', '_')}"[:60], rng)


def cases(seed: int, count: int, weights: dict[str, float] | None = None) -> list[Case]:
    """``count`` cases. Each is of a cost class drawn by ``weights`` (``COST``'s classes; None:
    in proportion to their kinds), and within its class of the next kind in a seeded order
    that visits every kind of the class before any again."""
    rng = random.Random(seed)
    pools = {klass: sorted(k for k, c in COST.items() if c == klass) for klass in sorted(set(COST.values()))}
    weights = weights or {klass: len(kinds) for klass, kinds in pools.items()}
    queues: dict[str, list[str]] = {klass: [] for klass in pools}
    out: list[Case] = []
    for index in range(count):
        klass = rng.choices(sorted(weights), [weights[k] for k in sorted(weights)])[0]
        if not queues[klass]:
            queues[klass] = rng.sample(pools[klass], len(pools[klass]))
        out.append(build(queues[klass].pop(), index, rng))
    return out


def sample(seed: int, per_cost: dict[str, int]) -> list[Case]:
    """A seeded sample of distinct kinds, ``per_cost[c]`` of each cost class (CI's run)."""
    rng = random.Random(seed)
    chosen: list[str] = []
    for klass, n in per_cost.items():
        pool = sorted(k for k, c in COST.items() if c == klass)
        chosen += rng.sample(pool, min(n, len(pool)))
    return [build(k, i, rng) for i, k in enumerate(chosen)]
