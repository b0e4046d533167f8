"""``nn.MultiheadAttention`` in its plain self-attention form, and the encoder layers built on
it, are written out (``transformer``) and ported as pipelines through the attention template;
any other use of the module stays the module, which no template knows."""

from __future__ import annotations

import pytest

from kernelabd.propose.base import Decline
from kernelabd.propose.template.proposer import NO_MATCH, TemplateProposer, instantiate
from tests.gating import assert_passes, gate
from tests.propose.test_template import context, reference

INIT = "self.attn = nn.MultiheadAttention(32, 4{})\nself.norm = nn.LayerNorm(32)\n"


@pytest.mark.parametrize(("batch_first", "inputs", "forward"), [
    # KernelBench L3 #31: pixels as the sequence, (L, N, E), the weights discarded
    (False, "torch.randn(2, 32, 5, 7)",
     "def forward(self, x):\n"
     "    B, C, H, W = x.shape\n"
     "    x = x.view(B, C, H * W).permute(2, 0, 1)\n"
     "    out, _ = self.attn(x, x, x)\n"
     "    return self.norm(out + x).permute(1, 2, 0).view(B, C, H, W)\n"),
    (True, "torch.randn(3, 29, 32)",
     "def forward(self, x):\n    return self.attn(x, x, x, need_weights=False)[0]\n"),
])
def test_self_attention_through_the_module_is_ported_and_passes_the_real_gate(tmp_path, batch_first, inputs, forward):
    source = reference(forward, init=INIT.format(", batch_first=True" if batch_first else ""), inputs=inputs)
    found = instantiate(source)
    assert found is not None and "attention (scaled_dot_product_attention;" in found.edit, found.edit if found else None
    assert found.edit.startswith("template: pipeline of matmul (linear + bias)")
    assert_passes(gate(tmp_path, "mha", source, None, found.source))


@pytest.mark.parametrize("forward", [
    "def forward(self, x, y):\n    return self.attn(x, y, y)[0]\n",                 # cross-attention
    "def forward(self, x, y):\n    out, w = self.attn(x, x, x)\n    return out + w.sum()\n",   # the weights
    "def forward(self, x, y):\n    return self.attn(x, x, x, attn_mask=self.mask)[0]\n",
])
def test_other_uses_of_the_module_stay_it_and_match_nothing(forward):
    source = reference(forward, init=INIT.format("") + "self.register_buffer('mask', torch.rand(16, 16) > 0.5)\n",
                       inputs="torch.randn(16, 2, 32), torch.randn(16, 2, 32)")
    declined = TemplateProposer().propose(context(source))
    assert isinstance(declined, Decline) and declined.reason.startswith(NO_MATCH), declined
    assert "nn.MultiheadAttention (attn) is an op no template knows" in declined.reason


@pytest.mark.parametrize(("init", "inputs"), [
    # KernelBench L3 #32's layers: post-norm, ReLU, (L, N, E)
    ("self.layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=48, dropout=0.0)\n",
     "torch.randn(9, 2, 32)"),
    # a whole encoder: pre-norm, GELU by name, batch first, a final norm
    ("self.layer = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 48, 0.0, 'gelu', batch_first=True,\n"
     "    norm_first=True), num_layers=2, norm=nn.LayerNorm(32), enable_nested_tensor=False)\n",
     "torch.randn(2, 9, 32)"),
])
def test_encoder_layers_are_written_out_and_pass_the_real_gate(tmp_path, init, inputs):
    source = reference("def forward(self, x):\n    return self.layer(x)\n", init=init, inputs=inputs)
    found = instantiate(source)
    assert found is not None and "attention (scaled_dot_product_attention;" in found.edit, found.edit if found else None
    assert found.edit.count("LayerNorm") >= 2 and "Transformer" not in found.edit
    assert_passes(gate(tmp_path, "encoder", source, None, found.source))
