"""Static checks of references, candidates and sidecars: what is refused, and that every
refusal is one line naming the file, the line or the key, and the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelabd.harness.problem import ProblemError, load_candidate, load_problem, one_line

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = """import torch
batch_size = 16
dim = 64
scale = 0.5
shape = (2, 3)
causal = False
if torch.cuda.is_available():
    block = 128
size = batch_size * dim

class Model(torch.nn.Module):
    def forward(self, x):
        return x * scale

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return []
"""


def problem(tmp_path: Path, sidecar: str | None, source: str = REFERENCE) -> Path:
    ref = tmp_path / "k.py"
    ref.write_text(source)
    if sidecar is not None:
        ref.with_suffix(".toml").write_text(sidecar)
    return ref


def refusal(path: Path) -> str:
    with pytest.raises(ProblemError) as info:
        load_problem(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_null_bytes_are_a_syntax_error_without_a_line_number(tmp_path):
    message = refusal(problem(tmp_path, None, REFERENCE + "x = 1\0\n"))
    assert message.endswith("k.py: syntax error: source code string cannot contain null bytes")
    assert "None" not in message


def test_a_syntax_error_names_the_line(tmp_path):
    assert refusal(problem(tmp_path, None, REFERENCE + "def broken(:\n")).endswith(
        f"k.py:{REFERENCE.count(chr(10)) + 1}: syntax error: invalid syntax")


def test_source_nested_past_the_parser_is_a_refusal_not_a_crash(tmp_path):
    message = refusal(problem(tmp_path, None, REFERENCE + "y = " + "-" * 200_000 + "1\n"))
    assert "k.py: nested too deeply for Python's parser" in message


@pytest.mark.parametrize("sidecar, cause", [
    ("tolerance = nan\n", "tolerance must be a finite positive number, got nan"),
    ("tolerance = -1e-3\n", "tolerance must be a finite positive number, got -0.001"),
    ("tol_factor = inf\n", "tol_factor must be a finite positive number, got inf"),
    ("tol_factor = '10'\n", "tol_factor must be a number, got '10'"),
    ("tolerance = true\n", "tolerance must be a number, got True"),
    ("tf32 = 1\n", "tf32 must be true or false, got 1"),
    ("target = 3\n", "target must be a string, got 3"),
    ("variants = 'base'\n", "variants must be a list, got 'base'"),
    ("variants = [1]\n", "variants must be a non-empty subset of ['base', 'scaled', 'heavy'], got [1]"),
    ("proposers = []\n", "proposers must be a non-empty list of proposer names"),
    ("sizes = 3\n", "sizes must be a table, got 3"),
    ("extra_shapes = 'x'\n", "extra_shapes must be a list, got 'x'"),
    ("extra_shapes = [1]\n", "[[extra_shapes]] #1 must be a table of module constants, got 1"),
    ("[sizes.gpu]\ndim = 4\n", "[sizes.gpu]: the device kind must be one of cpu, cuda"),
    ("[sizes.cuda]\nbatchsize = 4\n",
     "[sizes.cuda] sets batchsize, which k.py does not define at module level (it defines batch_size, "
     "block, causal, dim, scale, shape, size)"),
    ("[[extra_shapes]]\ndim = 8\n[[extra_shapes]]\nDIM = 8\n",
     "[[extra_shapes]] #2 sets DIM, which k.py does not define at module level"),
    ("[sizes.cuda]\nbatch_size = '8192'\n", "[sizes.cuda] batch_size = '8192': k.py sets it to 16 (int)"),
    ("[sizes.cuda]\nbatch_size = 8.5\n", "[sizes.cuda] batch_size = 8.5: k.py sets it to 16 (int)"),
    ("[sizes.cpu]\ncausal = 1\n", "[sizes.cpu] causal = 1: k.py sets it to False (bool)"),
    ("[sizes.cpu]\nshape = 3\n", "[sizes.cpu] shape = 3: k.py sets it to (2, 3) (tuple)"),
    ("[sizes.cpu]\nscale = nan\n", "[sizes.cpu] scale = nan: a constant must be a finite number"),
    ("[sizes.cpu]\ndim = {a = 1}\n", "[sizes.cpu] dim = {'a': 1}: a constant must be a finite number"),
    ("tolerance = \n", "TOMLDecodeError: Invalid value (at line 1, column 13)"),
])
def test_a_sidecar_off_its_schema_is_refused_naming_the_file_and_the_key(tmp_path, sidecar, cause):
    message = refusal(problem(tmp_path, sidecar))
    assert message.startswith(f"{tmp_path / 'k.toml'}: ")
    assert cause in message


@pytest.mark.parametrize("sidecar", [
    "tolerance = 1e-4\ntol_factor = 4\n",
    "[sizes.cuda]\nbatch_size = 8192\ndim = 4096\nscale = 2\nshape = [4, 5]\nblock = 256\nsize = 7\n",
    "[[extra_shapes]]\nbatch_size = 3\ndim = 77\n",
])
def test_a_sidecar_within_the_schema_loads(tmp_path, sidecar):
    assert load_problem(problem(tmp_path, sidecar)).sidecar is not None


def test_every_shipped_sidecar_follows_the_schema():
    sidecars = [p for p in ROOT.glob("**/*.toml")
                if p.with_suffix(".py").is_file() and ".venv" not in p.parts]
    assert len(sidecars) >= 20
    for sidecar in sidecars:
        load_problem(sidecar.with_suffix(".py"))


def test_a_candidate_is_refused_naming_what_it_lacks(tmp_path):
    for text, cause in [("", "missing ModelNew (a candidate defines ModelNew)"),
                        ("class Model: pass\n", "missing ModelNew"),
                        ("class ModelNew(:\n", ":1: syntax error: ")]:
        path = tmp_path / "c.new.py"
        path.write_text(text)
        with pytest.raises(ProblemError, match=cause.replace("(", r"\(").replace(")", r"\)")):
            load_candidate(path)


def test_a_name_the_file_system_cannot_hold_is_a_refusal_not_an_oserror(tmp_path):
    ref = tmp_path / ("a" * 251 + ".py")
    ref.write_text(REFERENCE)
    with pytest.raises(ProblemError, match="File name too long"):
        load_problem(ref)


def test_one_line_keeps_the_whole_message_past_its_colons_and_line_breaks():
    exc = TypeError("randn() received an invalid combination of arguments - got (str), but expected one of:\n"
                    " * (tuple of ints size, *, torch.dtype dtype = None)\n")
    assert one_line(exc) == ("TypeError: randn() received an invalid combination of arguments - got (str), "
                             "but expected one of: * (tuple of ints size, *, torch.dtype dtype = None)")
    assert one_line(MemoryError()) == "MemoryError"
