"""The row and reduction templates at every slice width, in Triton's interpreter: several narrow
rows a program, whole slices in registers, slices split into chunks whose statistics are chained
through tickets (wider than a program holds, or too few to fill the GPU), strided slices along a
middle dim, inputs far from zero mean; reductions split across programs when their outputs are
few. Each setting is held to float64 and the kernel it took is read off its launches."""

from __future__ import annotations

import pytest

from kernelabd.propose.template.proposer import TemplateProposer
from kernelabd.propose.templates import rowwise
from tests.gating import assert_passes, gate
from tests.propose.template_sweep import assert_accurate, sweep
from tests.propose.test_template import context, reference

SPLIT = [{"SPLIT": 1, "CHUNK": 512, "TILE": 256}, {"SPLIT": 1, "CHUNK": 4096, "TILE": 1024, "SPLIT_STAGES": 3},
         {"SPLIT": 1, "CHUNK": 64, "TILE": 64, "PER_THREAD": 4, "SPLIT_PER_SM": 8}]
"""Chunks of several tiles, one tile, and many small chunks (the lead then spans many slices,
taken by many programs)."""


def test_narrow_rows_take_several_rows_a_program(tmp_path):
    """37-wide softmax rows: a 256-element tile holds four of them side by side."""
    source = reference("def forward(self, x):\n    return torch.softmax(x, dim=-1)\n", inputs="torch.randn(50, 37)")
    runs = sweep(tmp_path, source, [], [[50, 37]], [{"TILE": 256}, {"TILE": 1024, "PER_SM": 0}, {}])
    assert_accurate(runs)
    assert runs[0].launched("softmax_kernel", BLOCK_R=64, BLOCK_C=4)
    assert runs[1].launched("softmax_kernel", BLOCK_C=16)


def test_a_slice_wider_than_a_program_holds_is_split_by_itself(tmp_path):
    """20001-wide rows pass the in-register limit (``MAX_SLICE``): the split kernel takes them
    whatever ``SPLIT`` says; its last chunk is a partial one."""
    assert rowwise.MAX_SLICE < 20001
    source = reference("def forward(self, x):\n    return torch.log_softmax(x, dim=1)\n",
                       inputs="torch.randn(3, 20001)")
    runs = sweep(tmp_path, source, [], [[3, 20001]], [{}, {"CHUNK": 16384, "TILE": 8192}], scale=4.0)
    assert_accurate(runs)
    assert all(r.launched("log_softmax_split_kernel") and not r.launched("log_softmax_kernel") for r in runs)


def test_layer_norm_split_or_whole_holds_far_from_zero_mean(tmp_path):
    """LayerNorm with weight and bias over 3000-wide rows centred at 150 (the gate's offset
    inputs): the statistics are of the shifted slice, Chan-merged across tiles and chunks."""
    source = reference("def forward(self, x):\n    return self.ln(x)\n", init="self.ln = nn.LayerNorm(n)\n",
                       init_args=", n: int", inputs="torch.randn(5, 3000)", init_values="3000")
    runs = sweep(tmp_path, source, [3000], [[5, 3000]], [{}, *SPLIT], offset=150.0, scale=2.0)
    assert_accurate(runs)
    assert runs[0].launched("layer_norm_kernel")
    assert all(r.launched("layer_norm_split_kernel", NSTAT=2) for r in runs[1:])


@pytest.mark.parametrize(("forward", "kernel", "shape"), [
    ("return F.log_softmax(x, dim=1)", "log_softmax", [4, 700, 5]),
    ("return F.softmax(x, dim=0)", "softmax", [300, 33]),
])
def test_strided_slices_split_into_column_blocks(tmp_path, forward, kernel, shape):
    """Slices along a middle or leading dim (``inner > 1``): chunks of ``BLOCK_C`` neighbouring
    columns, the statistics a vector a column."""
    source = reference(f"def forward(self, x):\n    {forward}\n", inputs=f"torch.randn({shape})")
    runs = sweep(tmp_path, source, [], [shape], [{}, *SPLIT])
    assert_accurate(runs)
    assert all(r.launched(f"{kernel}_split_kernel") for r in runs[1:])
    assert any(launch.get("BLOCK_C", 1) > 1 for r in runs[1:] for launch in r.launches)


def test_rms_norm_few_slices_split_to_fill_the_gpu(tmp_path):
    """Two 12000-wide weighted RMSNorm rows, which one program each could hold: too few to give
    every SM a slice, so they are split when a row is at least two chunks, and not otherwise."""
    source = reference(
        "def forward(self, x):\n    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w\n",
        init="self.w = nn.Parameter(torch.randn(n))\n", init_args=", n: int", inputs="torch.randn(2, 12000)",
        init_values="12000")
    runs = sweep(tmp_path, source, [12000], [[2, 12000]], [{"CHUNK": 4096}, {"CHUNK": 8192}])
    assert_accurate(runs)
    assert runs[0].launched("rms_norm_split_kernel", NSTAT=1) and not runs[0].launched("rms_norm_kernel")
    assert runs[1].launched("rms_norm_kernel") and not runs[1].launched("rms_norm_split_kernel")


LOOP = [{"SPLIT": 2, "TILE": 256}, {"SPLIT": 2, "TILE": 1024, "PER_SM": 0, "STAGES": 2}]
"""The looped kernel: a slice in several tiles, read twice; persistent programs and one a block."""


@pytest.mark.parametrize(("forward", "init", "init_values", "kernel", "shape", "offset"), [
    ("return torch.softmax(x, dim=-1)", "", None, "softmax", [5, 3000], 0.0),
    ("return F.log_softmax(x, dim=1)", "", None, "log_softmax", [4, 700, 5], 0.0),
    ("return self.ln(x)", "self.ln = nn.LayerNorm(n)\n", "3000", "layer_norm", [5, 3000], 150.0),
    ("return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w",
     "self.w = nn.Parameter(torch.randn(n))\n", "1500", "rms_norm", [3, 1500], 0.0),
])
def test_the_looped_kernel_reads_a_slice_twice_in_tiles_and_holds_to_float64(tmp_path, forward, init, init_values,
                                                                              kernel, shape, offset):
    """SPLIT = 2: every row operation by the looped kernel (the statistics on a first pass over
    the slice's tiles, the result on a second), rows and strided slices, LayerNorm far from
    zero mean; the in-register kernel is not launched."""
    extra = {"init": init, "init_args": ", n: int", "init_values": init_values} if init else {}
    source = reference(f"def forward(self, x):\n    {forward}\n", inputs=f"torch.randn({shape})", **extra)
    runs = sweep(tmp_path, source, [int(init_values)] if init_values else [], [shape], [{}, *LOOP],
                 offset=offset, scale=2.0 if offset else 1.0)
    assert_accurate(runs)
    assert all(r.launched(f"{kernel}_loop_kernel") and not r.launched(f"{kernel}_kernel") for r in runs[1:])
    assert runs[1].launched(f"{kernel}_loop_kernel", STAGES=1) and runs[2].launched(f"{kernel}_loop_kernel", STAGES=2)


@pytest.mark.parametrize(("forward", "init", "init_values", "kernel", "shape"), [
    ("return self.ln(x + r)", "self.ln = nn.LayerNorm(n)\n", "3000", "layer_norm", [5, 3000]),
    ("return torch.softmax(torch.tanh(x) - r * 0.5, dim=1)", "", None, "softmax", [4, 700, 5]),
])
def test_an_elementwise_prologue_is_computed_as_slices_load_in_every_kernel(tmp_path, forward, init, init_values,
                                                                           kernel, shape):
    """The row op of ``x + r`` (and of a longer chain): its operands are loaded and the chain
    computed wherever a kernel reads the slice (LayerNorm's shift included), by the in-register,
    split and looped kernels alike; nothing is materialised between them."""
    extra = {"init": init, "init_args": ", n: int", "init_values": init_values} if init else {}
    source = reference(f"def forward(self, x, r):\n    {forward}\n", inputs=f"torch.randn({shape}), "
                       f"torch.randn({shape})", **extra)
    runs = sweep(tmp_path, source, [int(init_values)] if init_values else [], [shape, shape], [{}, *SPLIT, *LOOP],
                 offset=150.0 if init else 0.0, scale=2.0 if init else 1.0)
    assert_accurate(runs)
    assert any(r.launched(f"{kernel}_split_kernel") for r in runs) and runs[-1].launched(f"{kernel}_loop_kernel")


WIDE = {
    "softmax_wide": reference("def forward(self, x):\n    return torch.softmax(x, dim=1)\n",
                              inputs="torch.randn(3, 20001)"),
    "layer_norm_wide": reference("def forward(self, x):\n    return self.ln(x)\n",
                                 init="self.ln = nn.LayerNorm((3, 40, 150))\n", inputs="torch.randn(2, 3, 40, 150)"),
    "l2_norm_wide": reference("def forward(self, x):\n    return x / x.norm(dim=-1, keepdim=True)\n",
                              inputs="torch.randn(2, 20001)"),
    "mean_dim0_split": reference("def forward(self, x):\n    return x.mean(dim=0)\n", inputs="torch.randn(6000, 2, 9)"),
}


@pytest.mark.parametrize("name", list(WIDE))
def test_split_rows_pass_the_real_gate(tmp_path, name):
    """The split kernels through the gate: inputs far from zero mean and heavy-tailed, each run
    twice (the tickets make the order of items, never the result, depend on timing; a split
    reduction sums its partials in a fixed order)."""
    proposal = TemplateProposer().propose(context(WIDE[name]))
    assert_passes(gate(tmp_path, name, WIDE[name], None, proposal.source))


@pytest.mark.parametrize(("forward", "shape", "settings"), [
    ("return torch.sum(x, dim=1)", [3, 1023, 7], [{}, {"SPLIT": 4}, {"STAGES": 2, "TILE": 512, "BLOCK_INNER": 16}]),
    ("return x.mean(dim=-1, keepdim=True)", [40, 37], [{}, {"TILE": 512}, {"SPLIT": 3, "TILE": 16}]),
    ("return torch.max(x, dim=0)[0]", [97, 3, 4], [{}, {"SPLIT": 5, "TILE": 256}, {"SPLIT": 1}]),
    ("return x.mean(dim=0)", [600, 2, 9], [{}, {"SPLIT": 1}]),
    ("return torch.logsumexp(x, dim=0)", [64, 300], [{"SPLIT": 5, "TILE": 64}]),
    ("return torch.sum(x * x)", [70, 33], [{}, {"SPLIT": 32, "TILE": 64}]),
])
def test_reductions_whole_or_split(tmp_path, forward, shape, settings):
    """sum over a middle dim (odd, unaligned columns), a mean of narrow rows (several a tile),
    max and mean over a long leading dim with few outputs (R split, partials combined); a
    logsumexp's partials combined two splits a step over 300 outputs (three steps, the last
    half masked), and a sum over every element to one value, its partials read in one tile."""
    source = reference(f"def forward(self, x):\n    {forward}\n", inputs=f"torch.randn({shape})")
    runs = sweep(tmp_path, source, [], [shape], settings)
    assert_accurate(runs)
    for run in runs:
        if run.settings.get("SPLIT", 0) > 1:
            assert run.launched("combine_kernel"), run.settings
        if run.settings.get("SPLIT") == 1:
            assert not run.launched("combine_kernel"), run.settings


def test_a_reduction_to_few_outputs_splits_by_itself(tmp_path):
    """A bf16 mean over 6000 rows to 18 outputs: the columns alone give few programs, so R is
    split across programs (``SPLIT = 0``) and the partials combined in order."""
    source = reference("def forward(self, x):\n    return x.mean(dim=0)\n",
                       inputs="torch.randn(6000, 2, 9, dtype=torch.bfloat16)")
    runs = sweep(tmp_path, source, [], [[6000, 2, 9]], [{}], "bfloat16")
    assert_accurate(runs, "bfloat16")
    assert runs[0].launched("mean_kernel") and runs[0].launched("combine_kernel")
