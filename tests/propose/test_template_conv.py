"""The conv template: an implicit-GEMM convolution with its epilogue passes the real gate on
CPU (Triton interpreter) for the bench problem, for an odd-sized strided, padded case, and for
1-D, 3-D, grouped and transposed convolutions (strided, dilated, output-padded, in module and
functional form), depthwise-like ones as a direct convolution, and a convolution it does not
implement (reflect-padded, a depthwise-like transposed one, a transposed one given an
``output_size``) matches nothing rather than being ported wrong. Sizes
are tiny: the interpreter runs every program in Python."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelabd.propose.template.proposer import instantiate
from kernelabd.propose.templates.conv import GEOMETRY_HELPER, INSIDE_HELPER, ROWS_HELPER
from kernelabd.propose.tune import apply_edit, known_good, parse_tunables
from tests.gating import assert_passes, gate
from tests.propose.test_template import reference, sidecar_of

PROBLEMS = Path(__file__).resolve().parents[2] / "bench" / "port" / "problems"


def conv_reference(conv: str, forward: str = "return self.conv(x)", inputs: str = "torch.randn(2, 3, 13, 11)",
                   extra_init: str = "") -> str:
    return reference(f"def forward(self, x):\n    {forward}\n", init=f"self.conv = {conv}\n{extra_init}",
                     inputs=inputs)


def test_bench_problem_conv2d_relu_biasadd_passes_the_gate(tmp_path):
    source = (PROBLEMS / "conv2d_relu_biasadd.py").read_text()
    sidecar = (PROBLEMS / "conv2d_relu_biasadd.toml").read_text()
    found = instantiate(source, sidecar_of(sidecar))
    assert found is not None, "no template matched the bench convolution"
    candidate, edit = found.source, found.edit
    assert found.dots == "tf32x3"
    assert edit == ("template: conv2d (conv2d + bias + relu + add) as implicit GEMM with fused epilogue; "
                    "3xTF32 dots")
    assert ', "tf32x3")' in candidate and "_operand(" not in candidate, "TF32 off; (C_out, 1, 1) read per channel"
    assert [t.name for t in parse_tunables(candidate)] == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages",
                                                           "CHANNELS_LAST", "DIRECT"]
    assert_passes(gate(tmp_path, "conv2d_relu_biasadd", source, sidecar, candidate))


@pytest.mark.parametrize("settings", [{}, {"CHANNELS_LAST": 0}, {"DIRECT": 1, "CHANNELS_LAST": 0},
                                      {"DIRECT": 1, "CHANNELS_LAST": 1}], ids=["seed", "gemm", "direct", "direct_cl"])
def test_strided_padded_conv_on_an_odd_size_passes_the_gate(tmp_path, settings):
    """Three input channels: the seed's implicit GEMM in both K orders, (kh, kw, ci) over
    channels-last copies and (ci, kh, kw) over the operands as given, and the direct loop the
    tuner starts with over few channels, over the operands as given and over the copies."""
    source = conv_reference("nn.Conv2d(3, 5, 3, stride=2, padding=1, dilation=1)")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv2d (conv2d + bias) as implicit GEMM")
    tunables = {t.name: t for t in parse_tunables(found.source)}
    assert {name: tunables[name].current for name in ("DIRECT", "CHANNELS_LAST")} == {"DIRECT": 0, "CHANNELS_LAST": 1}
    first, then = known_good(found.source)[:2]
    assert first == {name: t.current for name, t in tunables.items()}, "the seed first"
    assert (then["DIRECT"], then["CHANNELS_LAST"]) == (1, 0), "then the direct loop over the operands as given"
    candidate = found.source
    for name, value in settings.items():
        candidate = apply_edit(candidate, tunables[name], value)
    assert_passes(gate(tmp_path, "conv_s2_p1", source, None, candidate))


def test_functional_dilated_conv_with_a_residual_passes_the_gate(tmp_path):
    """``F.conv2d`` with literal geometry (pairs, dilation 2, no bias), then a full-size residual
    read through ``_operand`` and a per-channel scale read per column."""
    source = reference(
        "def forward(self, x, r):\n"
        "    return F.conv2d(x, self.w, None, (1, 2), (2, 1), 2) * self.scale + r\n",
        init="self.w = nn.Parameter(torch.randn(4, 3, 3, 2))\nself.scale = nn.Parameter(torch.randn(4, 1, 1))\n",
        inputs="torch.randn(2, 3, 9, 10), torch.randn(2, 4, 9, 5)")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv2d (conv2d + mul + add)")
    assert "_operand(r, _y.shape)" in found.source and "self.scale.stride(-3)" in found.source
    assert_passes(gate(tmp_path, "conv_functional", source, None, found.source))


# (module, input, forward, what the edit names): each of the kernel's shapes of index math; the
# transposed ones decompose by phase: stride 2 with dilation 2 leaves every other phase without a
# tap (bias only), stride 3 with dilation 2 (coprime) gives each phase every third tap
OTHER_CONVS = {
    "conv1d_strided_dilated": ("nn.Conv1d(3, 5, 3, stride=2, padding=1, dilation=2)", "torch.randn(2, 3, 17)",
                               "return torch.relu(self.conv(x))", "conv1d (conv1d + bias + relu)"),
    "conv3d_asymmetric": ("nn.Conv3d(3, 5, (3, 2, 3), padding=(1, 0, 1))", "torch.randn(2, 3, 5, 6, 7)",
                          "return self.conv(x) * 2.0", "conv3d (conv3d + bias + mul)"),
    "conv2d_grouped": ("nn.Conv2d(4, 6, 3, groups=2)", "torch.randn(2, 4, 9, 9)", "return self.conv(x)",
                       "conv2d (conv2d + bias)"),
    # no padding, yet the last pixel's last tap on each axis is past the input: border masks
    "conv2d_same_even_kernel": ("nn.Conv2d(3, 5, (2, 4), padding='same')", "torch.randn(2, 3, 7, 9)",
                                "return self.conv(x)", "conv2d (conv2d + bias)"),
    "transpose1d_output_padded": ("nn.ConvTranspose1d(3, 5, 3, stride=2, padding=1, output_padding=1, dilation=2)",
                                  "torch.randn(2, 3, 9)", "return self.conv(x)",
                                  "conv_transpose1d (conv_transpose1d + bias)"),
    "transpose2d_grouped_strided": ("nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(1, 0), groups=2)",
                                    "torch.randn(2, 4, 5, 6)", "return torch.tanh(self.conv(x))",
                                    "conv_transpose2d (conv_transpose2d + bias + tanh)"),
    "transpose2d_phases_without_taps": ("nn.ConvTranspose2d(3, 4, 3, stride=(3, 2), padding=(2, 1), dilation=2, "
                                        "output_padding=1)", "torch.randn(2, 3, 4, 5)", "return self.conv(x) - 0.5",
                                        "conv_transpose2d (conv_transpose2d + bias + sub)"),
    "transpose3d_grouped_no_bias": ("nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, "
                                    "bias=False)", "torch.randn(2, 4, 3, 4, 5)", "return self.conv(x)",
                                    "conv_transpose3d (conv_transpose3d)"),
}


@pytest.mark.parametrize("name", list(OTHER_CONVS))
def test_every_rank_grouping_and_transposition_passes_the_gate(tmp_path, name):
    conv, inputs, forward, what = OTHER_CONVS[name]
    source = conv_reference(conv, forward=forward, inputs=inputs)
    found = instantiate(source)
    assert found is not None and found.edit.startswith(f"template: {what} as implicit GEMM"), found and found.edit
    assert_passes(gate(tmp_path, name, source, None, found.source))


@pytest.mark.parametrize("name", [name for name in OTHER_CONVS if not name.startswith("transpose")])
def test_every_rank_and_grouping_passes_the_gate_as_a_direct_convolution_too(tmp_path, name):
    """The convolutions above over few input channels, in the direct loop (``DIRECT`` 1, which
    the tuner screens first there): each rank, groups, strides, dilation and "same" padding."""
    conv, inputs, forward, _ = OTHER_CONVS[name]
    source = conv_reference(conv, forward=forward, inputs=inputs)
    found = instantiate(source)
    (flag,) = [t for t in parse_tunables(found.source) if t.name == "DIRECT"]
    assert_passes(gate(tmp_path, name, source, None, apply_edit(found.source, flag, 1)))


@pytest.mark.parametrize(("conv", "channels", "direct"), [("nn.Conv2d(8, 5, 3)", 8, True),
                                                         ("nn.Conv2d(9, 5, 3)", 9, False),
                                                         ("nn.Conv2d(16, 8, 3, groups=4)", 16, True),
                                                         ("nn.Conv2d(8, 5, 1)", 8, False),
                                                         ("nn.ConvTranspose2d(3, 5, 3)", 3, False)])
def test_the_direct_loop_is_declared_only_over_few_input_channels_a_group(conv, channels, direct):
    """Over more channels a group, or one tap, or transposed, a direct loop would cost the
    tuner a screening slot for a loop no faster than the implicit GEMM: there the kernel has
    no direct loop and no tunable names it."""
    found = instantiate(conv_reference(conv, inputs=f"torch.randn(2, {channels}, 9, 9)"))
    assert found is not None
    assert ("DIRECT" in {t.name for t in parse_tunables(found.source)}) is direct
    assert ("DIRECT=bool(DIRECT)" in found.source) is direct
    assert ("tl.static_range" in found.source) is direct


def test_a_pointwise_conv_starts_channels_first_and_passes_the_gate(tmp_path):
    """A 1×1 convolution's seed reads the input as given (its K run, one channel a pixel, is
    coalesced along the pixels), rather than paying for channels-last copies."""
    source = conv_reference("nn.Conv2d(6, 5, 1)", forward="return self.conv(x) * 0.5", inputs="torch.randn(2, 6, 7, 9)")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv2d (conv2d + bias + mul)")
    assert {t.name: t.current for t in parse_tunables(found.source)}["CHANNELS_LAST"] == 0
    assert_passes(gate(tmp_path, "pointwise", source, None, found.source))


def test_batchnorm_after_a_conv_reads_its_statistics_per_output_channel(tmp_path):
    """BatchNorm in eval decomposes into ``self.bn.running_mean.view(-1, 1, 1)`` and its like:
    per-channel vectors the epilogue reads once a column tile, not through ``_operand``'s flat
    index (an integer division per element, and a warp's stores across channels: KernelBench
    L2 #73 compiled for sm_90 to 246 divisions and scalar stores)."""
    source = conv_reference("nn.Conv2d(3, 8, 3)", forward="return self.bn(self.conv(x)) * 2.0",
                            extra_init="self.bn = nn.BatchNorm2d(8)\n")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv2d (conv2d + bias + sub")
    assert "_operand(" not in found.source and "self.bn.running_var.reshape(-1, 1, 1).stride(-3)" in found.source
    assert_passes(gate(tmp_path, "conv_batchnorm", source, None, found.source))


CONV_BN_SIZED = """import torch
import torch.nn as nn

H = 10


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)) * 2.0


def get_inputs():
    return [torch.randn(2, 3, H, H)]


def get_init_inputs():
    return []
"""


def test_an_output_whose_sides_are_not_multiples_of_16_is_stored_in_vectors_on_sm90(tmp_path):
    """Compiled for sm_90 without a GPU at 30×30 (a 28×28 output: 784 pixels an image, a
    multiple of 16 whose sides are not), the store runs along the pixels in 16-byte vectors
    (``RUN``): before, Triton saw no contiguity, and a warp stored one channel's pixel apart
    from the next 4 bytes at a time (``STG.32``)."""
    ref, cand = tmp_path / "cbn.py", tmp_path / "cbn.new.py"
    ref.write_text(CONV_BN_SIZED)
    (tmp_path / "cbn.toml").write_text("[sizes.cuda]\nH = 30\n")
    found = instantiate(CONV_BN_SIZED)
    assert found is not None
    cand.write_text(found.source)
    run = subprocess.run([sys.executable, "-m", "kernelabd", "fingerprint", str(cand), "--arch", "sm_90", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (kernel,) = json.loads(run.stdout)["kernels"]
    stores = {name: n for name, n in kernel["instructions"].items() if name.startswith("STG")}
    assert stores.get("STG.128", 0) > 0 and "STG.32" not in stores, stores
    assert kernel["spills"] == 0


CONV3D_FEW = CONV_BN_SIZED.replace("nn.Conv2d(3, 8, 3)", "nn.Conv3d(3, 24, 3, padding=1)").replace(
    "self.bn = nn.BatchNorm2d(8)", "self.bn = nn.BatchNorm3d(24)").replace("torch.randn(2, 3, H, H)",
                                                                           "torch.randn(2, 3, 6, H, H)")
"""A 3×3×3 convolution over 3 input channels, padded (border masks on every tap), then BatchNorm:
KernelBench's level 2 convolutions over few channels."""


def test_the_direct_loop_compiles_for_sm90_without_spills_and_without_tensor_cores(tmp_path):
    """The direct loop as the tuner first screens it (the second of ``STARTS``) for a padded 3-D
    convolution over 3 channels, compiled for sm_90 without a GPU: its 27 taps unroll into fp32
    FMAs (no MMA: the sum is exact fp32) and nothing spills (at 8 warps it did)."""
    found = instantiate(CONV3D_FEW)
    assert found is not None
    tunables = {t.name: t for t in parse_tunables(found.source)}
    candidate = found.source
    for name, value in known_good(found.source)[1].items():
        candidate = apply_edit(candidate, tunables[name], value)
    assert "DIRECT = 1" in candidate
    ref, cand = tmp_path / "c3.py", tmp_path / "c3.new.py"
    ref.write_text(CONV3D_FEW)
    (tmp_path / "c3.toml").write_text("[sizes.cuda]\nH = 30\n")
    cand.write_text(candidate)
    run = subprocess.run([sys.executable, "-m", "kernelabd", "fingerprint", str(cand), "--arch", "sm_90", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (kernel,) = json.loads(run.stdout)["kernels"]
    ops = kernel["instructions"]
    assert kernel["spills"] == 0 and ops.get("FFMA", 0) >= 27, ops
    assert not any(name.startswith(("HMMA", "WGMMA", "HGMMA")) for name in ops), ops


CONV_ODD = CONV_BN_SIZED.replace("H = 10", "H = 13").replace("self.bn(self.conv(x)) * 2.0", "torch.relu(self.conv(x))")
"""A 13×13 input: an 11×11 output, 121 pixels an image, odd."""

COMPILED_SM90 = """
import os, re, sys, importlib.util
os.environ.pop("TRITON_INTERPRET", None)
import torch
from kernelabd.fingerprint.build import TritonCompileOnly, use_target
use_target("sm_90")
spec = importlib.util.spec_from_file_location("candidate", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
with TritonCompileOnly() as compiled:
    module.ModelNew()(torch.randn(3, 3, 13, 13))
(kernel, _), = compiled.kernels
"""
"""Compiles the candidate at ``argv[1]`` for sm_90 (no GPU): ``kernel`` is its one kernel."""

STORE_LAYOUT = COMPILED_SM90 + """ir = kernel.asm["ttgir"]
(layout,) = re.findall(r"tt\\.store .*#(blocked\\d*)>", ir)
print(re.search(rf"#{layout} = .*threadsPerWarp = \\[(\\d+), (\\d+)\\]", ir).groups())
"""
"""Compiles the candidate at ``argv[1]`` for sm_90 (no GPU) and prints its store's threads a
warp along (pixels, channels), read off the TTGIR."""


def test_an_odd_pixel_count_takes_one_image_a_program_and_stores_along_the_pixels(tmp_path):
    """121 pixels an image: no power of two divides it, so a flat row index leaves Triton no
    proof that a tile's pixels are contiguous, and the compiled store put 16 of a warp's
    threads on 16 channels (16 segments a store). One image a program (``PER_IMAGE``) puts the
    warp's 32 threads on 32 consecutive pixels; a 7×7 extra shape (49 pixels, most of a tile
    idle) stays flat, and both pass the gate."""
    found = instantiate(CONV_ODD)
    assert found is not None and "PER_IMAGE=_per" in found.source
    assert_passes(gate(tmp_path, "conv_odd", CONV_ODD, "[[extra_shapes]]\nH = 9\n", found.source))
    cand = tmp_path / "conv_odd.new.py"
    run = subprocess.run([sys.executable, "-c", STORE_LAYOUT, str(cand)], capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["('32',", "'1')"], run.stdout


GATHER_COPIES = COMPILED_SM90 + """
print(sorted(set(re.findall(r"cp\\.async\\.\\w+\\.shared\\.global \\[[^\\]]*\\], \\[[^\\]]*\\], (0x\\w+)",
                           kernel.asm["ptx"]))))
"""
"""Compiles the candidate at ``argv[1]`` for sm_90 (no GPU) and prints the byte sizes of its
asynchronous global-to-shared copies."""


def test_three_input_channels_are_padded_to_four_and_gathered_in_16_byte_copies_on_sm90(tmp_path):
    """Channels-last, a tap's 3 input channels were 3 copies of 4 bytes (``cp.async`` 0x4 only;
    the gather bound the kernel: bench/port/results/2026-12-07-h100-s25). Padded to 4 with zeros
    (``PAD_CHANNELS``) and with the strides derived from a constant channel count, they are one
    16-byte copy; the zeros leave the sum as it was, at the timed shape and an odd one."""
    found = instantiate(CONV_ODD)
    assert found is not None and "CHANNELS_LAST = 1" in found.source
    assert_passes(gate(tmp_path, "conv_pad", CONV_ODD, "[[extra_shapes]]\nH = 9\n", found.source))
    run = subprocess.run([sys.executable, "-c", GATHER_COPIES, str(tmp_path / "conv_pad.new.py")],
                         capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "'0x10'" in run.stdout, run.stdout


def test_rows_tile_each_image_only_where_a_flat_index_hides_the_pixels_and_little_idles():
    scope = {"math": math, "triton": __import__("triton")}
    exec(ROWS_HELPER, scope)
    rows = scope["_rows"]
    assert rows(3, 121, 128) == (3, 1, True)            # 7 of 128 rows idle
    assert rows(3, 49, 128) == (2, 1, False)            # 79 of 128 idle: flat
    assert rows(2, 900, 128) == (15, 4, False)          # 4 divides it: RUN says so
    assert rows(16, 3025, 128) == (16 * 24, 1, True)    # AlexNet's 55×55


def _taps_outside(ins, outs, ks, strides, pads, dils) -> bool:
    """Whether some output pixel's tap reads outside the input, by visiting every one (the
    axes' sizes in ``_geometry``'s order)."""
    axes = zip(ins, ks, strides, pads, dils, outs, strict=True)
    return any(not 0 <= o * s - p + k * d < i for i, kk, s, p, d, oo in axes for o in range(oo) for k in range(kk))


def test_border_masks_are_dropped_only_where_every_tap_reads_inside_the_input():
    """``_inside`` (the generated kernel's ``BORDERS`` switch) against every tap of every pixel,
    over geometries with and without padding, "same" padding with even kernels and strides that
    leave the last input rows unread."""
    scope = {"math": math, "torch": torch}
    exec(GEOMETRY_HELPER + INSIDE_HELPER, scope)
    rng, seen = random.Random(0), set()
    for _ in range(400):
        n = rng.choice([1, 2])
        ks = tuple(rng.randint(1, 4) for _ in range(n))
        ins = tuple(rng.randint(k + 2, 12) for k in ks)
        if rng.random() < 0.25:
            padding, stride, dil = "same", 1, tuple(rng.randint(1, 2) for _ in range(n))
        else:
            padding, stride, dil = (tuple(rng.choice([0, 0, 1]) for _ in range(n)),
                                    tuple(rng.randint(1, 3) for _ in range(n)), 1)
        x, w = torch.empty(1, 1, *ins), torch.empty(1, 1, *ks)
        g = scope["_geometry"](x, w, stride, padding, dil, 1)
        outside = _taps_outside(*(g[4 + j * n:4 + (j + 1) * n] for j in range(6)))
        assert scope["_inside"](g, n) is not outside, g
        seen.add(outside)
    assert seen == {True, False}


def test_a_transposed_grouped_conv_with_operands_as_given_passes_the_gate(tmp_path):
    """The (ci, k...) K order over the operands as stored, where the transposed weight's input
    channels are its first dim rather than its second."""
    conv, inputs, forward, _ = OTHER_CONVS["transpose2d_grouped_strided"]
    source = conv_reference(conv, forward=forward, inputs=inputs)
    found = instantiate(source)
    (flag,) = [t for t in parse_tunables(found.source) if t.name == "CHANNELS_LAST"]
    assert_passes(gate(tmp_path, "transpose_as_given", source, None, apply_edit(found.source, flag, 0)))


def test_functional_transposed_conv_with_literal_geometry_and_a_per_channel_bias_passes_the_gate(tmp_path):
    """``F.conv_transpose2d``'s own argument order (output_padding before groups, dilation
    last), then a per-channel term read per column."""
    source = reference(
        "def forward(self, x):\n"
        "    return F.conv_transpose2d(x, self.w, None, 2, 1, 1, 1, (1, 2)) + self.shift\n",
        init="self.w = nn.Parameter(torch.randn(3, 4, 3, 3))\nself.shift = nn.Parameter(torch.randn(4, 1, 1))\n",
        inputs="torch.randn(2, 3, 5, 7)")
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: conv_transpose2d (conv_transpose2d + add)")
    assert "self.shift.stride(-3)" in found.source, "read per channel"
    assert_passes(gate(tmp_path, "transpose_functional", source, None, found.source))


# (module, input, forward, what the edit names): groups of one input channel (depthwise, with a
# channel multiplier) or of one output channel, each rank, strided, padded and dilated
DEPTHWISE = {
    "depthwise2d_relu": ("nn.Conv2d(4, 4, 3, padding=1, groups=4)", "torch.randn(2, 4, 9, 11)",
                         "return torch.relu(self.conv(x))", "depthwise-like conv2d (conv2d + bias + relu)"),
    "depthwise2d_multiplier_strided_dilated": (
        "nn.Conv2d(3, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=3, bias=False)",
        "torch.randn(2, 3, 10, 7)", "return self.conv(x) * self.scale",
        "depthwise-like conv2d (conv2d + mul)"),
    "one_output_channel_a_group_1d": ("nn.Conv1d(6, 3, 3, stride=2, groups=3)", "torch.randn(2, 6, 19)",
                                      "return self.conv(x) - 1.0", "depthwise-like conv1d (conv1d + bias + sub)"),
    "depthwise3d": ("nn.Conv3d(2, 2, 3, padding=(0, 1, 1), groups=2)", "torch.randn(2, 2, 5, 4, 6)",
                    "return self.conv(x)", "depthwise-like conv3d (conv3d + bias)"),
}


@pytest.mark.parametrize("name", list(DEPTHWISE))
def test_a_depthwise_like_conv_is_a_direct_convolution_that_passes_the_gate(tmp_path, name):
    conv, inputs, forward, what = DEPTHWISE[name]
    source = conv_reference(conv, forward=forward, inputs=inputs,
                            extra_init="self.scale = nn.Parameter(torch.randn(6, 1, 1))\n")
    found = instantiate(source)
    assert found is not None and found.edit == f"template: {what} as direct convolution with fused epilogue", \
        found and found.edit
    assert found.dots is None and "tl.dot" not in found.source, "no dot tile spent on one useful column"
    assert_passes(gate(tmp_path, name, source, None, found.source))


@pytest.mark.parametrize(("conv", "inputs", "forward"), [
    ("nn.Conv2d(4, 6, 3, padding=1, padding_mode='reflect')", "torch.randn(2, 4, 9, 9)", "return self.conv(x)"),
    ("nn.ConvTranspose2d(4, 4, 3, groups=4)", "torch.randn(2, 4, 9, 9)", "return self.conv(x)"),
    ("nn.ConvTranspose2d(4, 6, 3, stride=2)", "torch.randn(2, 4, 9, 9)", "return self.conv(x, output_size=(20, 20))"),
])
def test_a_conv_the_template_does_not_implement_matches_nothing(conv, inputs, forward):
    assert instantiate(conv_reference(conv, forward=forward, inputs=inputs)) is None


def test_a_conv_followed_by_an_unknown_op_matches_nothing():
    source = conv_reference("nn.Conv2d(3, 4, 3)", forward="return torch.cumsum(self.conv(x), 1)")
    assert instantiate(source) is None
