"""The CUDA loader a candidate carries: NVRTC compiles without a GPU, caches on disk, and a
source that does not compile raises with the compiler's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelabd.cudalang import carried_loader, loader_text, with_loader
from kernelabd.cudalang.loader import CACHE_ENV, CompileError, compile_cubin
from tests.conftest import EXAMPLES, ROOT

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(BLOCK) twice(float* o, const float* x, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) o[i] = 2.f * x[i];
}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_compiles_for_sm90_without_a_gpu_and_caches_by_source_and_defines(cache: Path) -> None:
    cubin = compile_cubin(SOURCE, "sm_90", {"BLOCK": 256})
    assert cubin[:4] == b"\x7fELF"
    assert len(list(cache.glob("*.cubin"))) == 1
    assert compile_cubin(SOURCE, "sm_90", {"BLOCK": 256}) == cubin   # from the cache
    assert len(list(cache.glob("*.cubin"))) == 1
    compile_cubin(SOURCE, "sm_90", {"BLOCK": 128})                    # another macro value
    compile_cubin(SOURCE, "sm_80", {"BLOCK": 256})                    # another architecture
    assert len(list(cache.glob("*.cubin"))) == 3


def test_a_source_that_does_not_compile_raises_with_the_log(cache: Path) -> None:
    with pytest.raises(CompileError) as caught:
        compile_cubin(SOURCE.replace("2.f * x[i]", "2.f * y[i]"), "sm_90", {"BLOCK": 256})
    assert 'identifier "y" is undefined' in caught.value.log
    assert caught.value.kernelab_rule == "compile"
    assert not list(cache.glob("*.cubin"))


def test_examples_carry_the_current_loader() -> None:
    """A CUDA candidate carries the loader's text; an example that drifted from
    kernelabd/cudalang/loader.py would run other code than kernelab fingerprints."""
    paths = [*(EXAMPLES / "cuda").glob("*.new.py"), *(ROOT / "bench").glob("**/cuda/*.new.py")]
    assert len(paths) >= 2
    for path in paths:
        source = path.read_text()
        assert carried_loader(source) == loader_text(), f"{path}: rewrite it with with_loader()"
        assert with_loader(source) == source


def test_a_program_without_macros_compiles(cache: Path) -> None:
    assert compile_cubin(SOURCE.replace("BLOCK", "256"), "sm_90", {})[:4] == b"\x7fELF"
