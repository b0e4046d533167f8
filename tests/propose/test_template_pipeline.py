"""Template pipelines: graphs no one template covers (a convolution or matmul followed by a
softmax, a norm or a reduction, and what follows those) are cut into stages that one template
each computes, and the composed candidate passes the real gate on CPU (Triton interpreter);
a later stage may read any earlier stage's stored result, not only the one before it. Shapes
are KernelBench level 2's, at tiny sizes."""

from __future__ import annotations

import pytest

from kernelabd.propose.template.proposer import instantiate
from kernelabd.propose.tune import apply_edit, parse_tunables
from tests.gating import assert_passes, gate
from tests.propose.test_template import reference

# name -> (init, forward, inputs, init arguments and values, the stages the edit names in order)
PIPELINES = {
    "conv_transpose2d_softmax_sigmoid": (   # KernelBench L2 #91
        "self.conv = nn.ConvTranspose2d(c_in, c_out, 3, stride=2, padding=1, output_padding=1)\n"
        "self.bias = nn.Parameter(torch.randn(c_out, 1, 1))\n",
        "def forward(self, x):\n    x = self.conv(x)\n    x = torch.softmax(x, dim=1)\n"
        "    x = x + self.bias\n    x = x * 2.0\n    return torch.sigmoid(x)\n",
        "torch.randn(2, 3, 5, 6)", (", c_in, c_out", "3, 6"),
        ["conv_transpose2d", "softmax", "elementwise chain of 3 ops (add → mul → sigmoid)"]),
    "linear_sigmoid_sum": (                 # L2 #56
        "self.linear = nn.Linear(d_in, d_out)\n",
        "def forward(self, x):\n    x = torch.sigmoid(self.linear(x))\n    return torch.sum(x, dim=1, keepdim=True)\n",
        "torch.randn(6, 10)", (", d_in, d_out", "10, 12"),
        ["matmul (linear + bias + sigmoid)", "sum over dim 1"]),
    "matmul_div_sum_scale": (               # L2 #14
        "self.weight = nn.Parameter(torch.randn(d_out, d_in))\n",
        "def forward(self, x):\n    x = torch.matmul(x, self.weight.T)\n    x = x / 2\n"
        "    x = torch.sum(x, dim=1, keepdim=True)\n    return x * 1.5\n",
        "torch.randn(6, 10)", (", d_in, d_out", "10, 12"),
        ["matmul (matmul + div)", "sum over dim 1", "elementwise chain of 1 ops (mul)"]),
    "conv3d_instancenorm_max": (            # L2 #79
        "self.conv = nn.Conv3d(c_in, c_out, 3)\nself.norm = nn.InstanceNorm3d(c_out)\n"
        "self.scale = nn.Parameter(torch.randn(c_out, 1, 1, 1))\n",
        "def forward(self, x):\n    x = self.conv(x) * self.scale\n    x = self.norm(x)\n"
        "    x = torch.clamp(x, -1.0, 1.0) * self.scale\n    return torch.max(x, dim=1)[0]\n",
        "torch.randn(2, 3, 6, 5, 6)", (", c_in, c_out", "3, 4"),
        ["conv3d (conv3d + bias + mul)", "LayerNorm", "max over dim 1 of an elementwise prologue"]),
    "linear_maxpool_of_a_view_sum": (       # L2 #55: views of a stage's result between stages
        "self.linear = nn.Linear(d_in, d_out)\nself.pool = nn.MaxPool1d(2)\n",
        "def forward(self, x):\n    x = self.pool(self.linear(x).unsqueeze(1)).squeeze(1)\n"
        "    return torch.sum(x, dim=1) * 0.5\n",
        "torch.randn(6, 10)", (", d_in, d_out", "10, 12"),
        ["matmul (linear + bias)", "max pool 1-D, window 2", "sum over dim 1", "(mul)"]),
    "conv_transpose_min_of_a_number_tensor": (    # L2 #93: torch.tensor(0.0) made in forward
        "self.conv = nn.ConvTranspose2d(c_in, c_out, 3, stride=2)\n",
        "def forward(self, x):\n    x = self.conv(x) + 0.5\n    x = torch.min(x, torch.tensor(0.0, device=x.device))\n"
        "    return torch.softmax(F.gelu(x), dim=1)\n",
        "torch.randn(2, 3, 5, 6)", (", c_in, c_out", "3, 6"),
        ["conv_transpose2d (conv_transpose2d + bias + add + minimum + gelu)", "softmax"]),
    "sdpa_plus_the_query": (                # attention, then a residual of an input
        "", "def forward(self, q, k, v):\n    return q + F.scaled_dot_product_attention(q, k, v)\n",
        "torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)", ("", ""),
        ["attention (scaled_dot_product_attention", "elementwise chain of 1 ops (add)"]),
    "linear_softmax_times_an_input": (      # the tail reads an input beside the stage's result
        "self.linear = nn.Linear(d_in, d_out)\n",
        "def forward(self, x, y):\n    return torch.softmax(self.linear(x), dim=-1).sum(dim=0) * y\n",
        "torch.randn(6, 10), torch.randn(12)", (", d_in, d_out", "10, 12"),
        ["matmul (linear + bias) with fused epilogue, then softmax", "sum over dim 0",
         "elementwise chain of 1 ops (mul)"]),
    "softmax_of_the_conv_plus_the_conv": (  # the last stage reads the first stage's result
        "self.conv = nn.Conv2d(c_in, c_out, 3)\n",
        "def forward(self, x):\n    h = self.conv(x)\n    return torch.softmax(torch.relu(h), dim=1) + h\n",
        "torch.randn(2, 3, 6, 6)", (", c_in, c_out", "3, 4"),
        ["conv2d (conv2d + bias)", "softmax", "elementwise chain of 1 ops (add)"]),
    "linear_minus_its_row_mean": (          # L2 #80's x - x.mean(1, keepdim=True), not degenerate
        "self.linear = nn.Linear(d_in, d_out)\n",
        "def forward(self, x):\n    y = self.linear(x)\n    return F.gelu(y - y.mean(dim=1, keepdim=True))\n",
        "torch.randn(6, 10)", (", d_in, d_out", "10, 12"),
        ["matmul (linear + bias)", "mean over dim 1", "elementwise chain of 2 ops (sub → gelu)"]),
    "conv_groupnorm_residual_logsumexp": (  # L2 #92: a residual of the convolution after the norm
        "self.conv = nn.Conv2d(c_in, c_out, 3)\nself.norm = nn.GroupNorm(2, c_out)\n",
        "def forward(self, x):\n    h = self.conv(x)\n    y = torch.tanh(self.norm(h))\n"
        "    return torch.logsumexp(h + y, dim=1, keepdim=True)\n",
        "torch.randn(2, 3, 6, 6)", (", c_in, c_out", "3, 4"),
        ["conv2d (conv2d + bias)", "GroupNorm", "logsumexp over dim 1 of an elementwise prologue"]),
    "conv_clamp_softmax_over_a_flattened_view": (   # L2 #38: sizes read off a stage's result
        "self.conv = nn.Conv2d(c_in, c_out, 3)\nself.lo = 0.0\nself.hi = 1.0\n",
        "def forward(self, x):\n    x = torch.clamp(self.conv(x), self.lo, self.hi)\n    b, c, h, w = x.shape\n"
        "    x = torch.softmax(x.view(b, c, -1), dim=2)\n    return x.view(b, c, h, w) * 2.0\n",
        "torch.randn(2, 3, 6, 6)", (", c_in, c_out", "3, 4"),
        ["conv2d (conv2d + bias + clamp)", "softmax", "elementwise chain of 1 ops (mul)"]),
    "sequential_mlp": (                     # L3 #1: the layers are nn.Sequential's children 0, 2, 4
        "self.network = nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU(), nn.Linear(d_out, d_out), nn.ReLU(),\n"
        "                             nn.Linear(d_out, 5))\n",
        "def forward(self, x):\n    return self.network(x)\n",
        "torch.randn(6, 10)", (", d_in, d_out", "10, 12"),
        ["matmul (linear + bias + relu)", "matmul (linear + bias + relu)", "matmul (linear + bias)"]),
}


def pipeline_reference(name: str) -> str:
    init, forward, inputs, (args, values), _ = PIPELINES[name]
    return reference(forward, init=init, init_args=args, inputs=inputs, init_values=values)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_pipeline_of_templates_passes_the_gate(tmp_path, name):
    source = pipeline_reference(name)
    found = instantiate(source)
    assert found is not None, f"no pipeline for {name}"
    assert found.edit.startswith("template: pipeline of ")
    stages = found.edit.removeprefix("template: pipeline of ").split(" → ")
    for want in PIPELINES[name][4]:
        assert any(want in s for s in stages) or want in found.edit, (want, found.edit)
    names = [t.name for t in parse_tunables(found.source)]
    assert len(names) == len(set(names)) and any(n.startswith("s1_") for n in names), \
        "each later stage's tunables are its own, renamed"
    assert_passes(gate(tmp_path, name, source, None, found.source))


def test_a_later_stage_is_given_the_earlier_results_it_reads():
    """In ``softmax(relu(h)) + h`` the add reads the convolution's result, two stages back: the
    composed forward passes it (``v0``) to the last stage beside the softmax's (``v1``)."""
    found = instantiate(pipeline_reference("softmax_of_the_conv_plus_the_conv"))
    forward = found.source.split("def forward(self, x):")[-1]
    assert "v2 = self._s2_forward(v1, v0, x)" in forward, forward


def test_a_dim_or_an_index_is_never_read_from_a_model_attribute_of_equal_value():
    """``x.shape`` unpacked as ``b, c, h, w`` is indexed by 0 and 1, which equal the model's
    ``lo = 0.0`` and ``hi = 1.0``: the candidate indexes by the numbers (it once wrote
    ``shape[self.lo]``, a TypeError on every call)."""
    found = instantiate(pipeline_reference("conv_clamp_softmax_over_a_flattened_view"))
    assert "shape[self." not in found.source and "shape[0]" in found.source


def test_the_tuner_moves_a_later_stage_apart_and_every_start_sets_every_tunable(tmp_path):
    """A pipeline's ``TUNABLES`` are its stages', renamed: a later stage's block size is edited
    without touching the head's, the edited candidate still passes, and each merged start (the
    head's and the tail's) sets every tunable, the other stages at their current values."""
    source = pipeline_reference("linear_sigmoid_sum")
    found = instantiate(source)
    tunables = {t.name: t for t in parse_tunables(found.source)}
    assert {"BLOCK_M", "s1_TILE", "s1_num_warps"} <= set(tunables)
    namespace: dict = {}
    exec(compile("\n".join(line for line in found.source.splitlines() if line.startswith("STARTS = ")),
                 "<starts>", "exec"), namespace)
    assert namespace["STARTS"] and all(set(start) == set(tunables) for start in namespace["STARTS"])
    tile = tunables["s1_TILE"]
    edited = apply_edit(found.source, tile, next(v for v in tile.values if v != tile.current))
    assert parse_tunables(edited)[0].current == tunables["BLOCK_M"].current
    assert_passes(gate(tmp_path, "edited", source, None, edited))


def test_a_constructor_is_copied_with_the_helpers_it_calls(tmp_path):
    """KernelBench L3 #27's RegNet builds its stages with a method of ``Model``
    (``_make_stage``), its ResNets with a module-level block class and a class attribute
    (``expansion``): the candidate's constructor finds all three, in a pipeline whose methods
    are renamed a stage at a time too."""
    source = reference("def forward(self, x):\n    return torch.softmax(self.head(self.layers(x)), dim=1)\n\n"
                       "def _head(self, d):\n    return nn.Linear(d, 5)\n",
                       init="self.layers = _stack(d_in, d_out * self.width)\nself.head = self._head(d_out * 2)\n",
                       init_args=", d_in, d_out", inputs="torch.randn(6, 10)", init_values="10, 12")
    source = source.replace("\n\nclass Model(nn.Module):\n", "\n\ndef _stack(d_in, d_out):\n"
                            "    return nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU())\n\n\n"
                            "class Model(nn.Module):\n    width = 2\n\n", 1)
    assert "    width = 2" in source
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: pipeline of "), found
    assert_passes(gate(tmp_path, "helpers", source, None, found.source))


def test_cuts_offer_heads_the_tail_does_not_reach_into_of_at_most_four_products_or_reductions():
    """A deep network's search builds only heads some template could compute: a 12-convolution
    chain (each with a ReLU) offers cuts only within its first four convolutions, longest first, and
    in branches joined by a concatenation none where a later branch reads an earlier value."""
    from kernelabd.propose.template import pipeline
    from kernelabd.propose.template.proposer import recognise_graph

    chain = reference("def forward(self, x):\n    for conv in self.convs:\n        x = torch.relu(conv(x))\n"
                      "    return x\n", init="self.convs = nn.ModuleList([nn.Conv2d(3, 3, 1) for _ in range(12)])\n",
                      inputs="torch.randn(1, 3, 4, 4)")
    g = recognise_graph(chain)
    assert pipeline.cuts(g) == [8, 7, 6, 5, 4, 3, 2, 1]
    branches = reference("def forward(self, x):\n    a = self.a(x)\n    b = torch.relu(self.b(x))\n"
                         "    return torch.cat([a, b, a + 1.0], 1)\n",
                         init="self.a = nn.Conv2d(3, 2, 1)\nself.b = nn.Conv2d(3, 2, 1)\n",
                         inputs="torch.randn(1, 3, 4, 4)")
    g = recognise_graph(branches)
    assert [g.ops[k - 1].kind for k in pipeline.cuts(g)] == ["conv2d"]


def test_the_ieee_fallback_of_a_pipeline_takes_the_seeds_stages_and_equals_a_fresh_search():
    """Recognition answers the 3xTF32 seed and its IEEE fallback; the fallback re-matches the
    seed's stages instead of searching the graph again, and is the candidate a search finds."""
    from kernelabd.harness.problem import Sidecar
    from kernelabd.propose.template.proposer import TF32X3, match_graph, recognise_graph

    init, forward, inputs, (args, values), _ = PIPELINES["linear_sigmoid_sum"]
    source = reference(forward, init=init, init_args=args, inputs=inputs, init_values=values)
    g = recognise_graph(source)
    seed = match_graph(g, source, Sidecar())
    assert seed.dots == TF32X3 and len(seed.plan) == 2
    fallback = match_graph(g, source, Sidecar(), exact=True, plan=seed.plan)
    assert fallback.dots == "ieee" and fallback.source == match_graph(g, source, Sidecar(), exact=True).source


REPEATED = reference(
    "def forward(self, x):\n    x = torch.relu(self.a(x))\n    x = torch.softmax(x, dim=1)\n"
    "    return torch.relu(self.b(x))\n",
    init="self.a = nn.Conv2d(4, 4, 3, padding=1)\nself.b = nn.Conv2d(4, 4, 3, padding=1)\n",
    inputs="torch.randn(2, 4, 6, 5)")
"""Two convolutions of one shape and epilogue around a softmax: a network's repeated block."""


def test_stages_of_one_template_and_shape_share_their_kernels_and_keep_their_own_tunables(tmp_path):
    """A deep network's stages define each kernel once (GoogLeNet's 200 kernel definitions,
    3.1 MB of source, became 19): the second convolution launches the first's kernel, yet
    tuning its block size leaves the first's alone and the edited candidate still passes."""
    found = instantiate(REPEATED)
    assert found is not None and found.edit.count("conv2d (conv2d + bias + relu)") == 2, found
    assert found.source.count("def conv2d_kernel(") == 1 and "def s2_conv2d_kernel(" not in found.source
    tunables = {t.name: t for t in parse_tunables(found.source)}
    block = tunables["s2_BLOCK_M"]
    edited = apply_edit(found.source, block, next(v for v in block.values if v != block.current))
    assert {t.name: t.current for t in parse_tunables(edited)}["BLOCK_M"] == tunables["BLOCK_M"].current
    assert_passes(gate(tmp_path, "edited", REPEATED, None, edited))


SHUFFLE = reference(
    "def forward(self, x):\n    x = torch.relu(self.a(x))\n    b, c, h, w = x.size()\n"
    "    x = x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, -1, h, w)\n"
    "    return torch.relu(self.b(x))\n",
    init="self.a = nn.Conv2d(3, 4, 1)\nself.b = nn.Conv2d(4, 4, 3, padding=1)\n",
    inputs="torch.randn(2, 3, 5, 6)")
"""ShuffleNet's channel shuffle between two convolutions: a view that needs the copy the
reference's ``.contiguous()`` makes."""


def test_a_channel_shuffle_between_stages_passes_the_gate(tmp_path):
    found = instantiate(SHUFFLE)
    assert found is not None and found.edit.startswith("template: pipeline of "), found
    assert_passes(gate(tmp_path, "shuffle", SHUFFLE, None, found.source))
