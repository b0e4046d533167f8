"""Capture of a reference: FLOPs from the flop counter, minimum bytes, launch records on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelabd.service.capture import CPU_NOTE, capture_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_matmul_flops_and_bytes_at_the_module_sizes():
    cap = capture_reference(EXAMPLES / "matmul.py", "cpu")
    assert cap["flops"] == 2 * 64 ** 3
    assert cap["bytes"] == {"inputs": 2 * 64 * 64 * 4, "parameters": 0, "outputs": 64 * 64 * 4}
    assert cap["min_bytes"] == 3 * 64 * 64 * 4
    assert cap["launches"] == [] and cap["note"] == CPU_NOTE


def test_parameters_count_as_bytes_moved():
    cap = capture_reference(EXAMPLES / "layernorm.py", "cpu")
    assert cap["bytes"]["parameters"] == 2 * 512 * 4          # weight and bias
    assert cap["min_bytes"] == 2 * 16 * 512 * 4 + 2 * 512 * 4
    assert cap["flops"] == 0                                    # the counter counts matmul-like ops


def test_the_sidecar_sizes_for_the_device_apply(tmp_path):
    ref = tmp_path / "mm.py"
    ref.write_text((EXAMPLES / "matmul.py").read_text())
    ref.with_suffix(".toml").write_text("[sizes.cpu]\nN = 32\n[sizes.cuda]\nN = 3072\n")
    cap = capture_reference(ref, "cpu")
    assert cap["sizes"] == {"N": 32} and cap["flops"] == 2 * 32 ** 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_launch_records_name_the_eager_kernels():
    cap = capture_reference(EXAMPLES / "gelu_gate.py", "cuda")
    assert cap["note"] is None and cap["launches"]
    assert all(r["count"] >= 1 and r["device_us"] >= 0 for r in cap["launches"])
    assert sum(r["count"] for r in cap["launches"]) >= 3       # add, gelu, sigmoid, mul unfused
