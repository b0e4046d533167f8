"""Forwards that read their tensors' sizes in Python (minGPT's ``B, T, C = x.size()`` and its
causal mask ``self.bias[:, :, :T, :T]``): torch.fx cannot trace them, ``sized`` traces them at
the reference's sizes, the mask keeps its values, and the templates port such layers whole."""

from __future__ import annotations

import pytest
from torch import fx

from kernelabd.propose.template import graph
from kernelabd.propose.template.canon import NotRecognised
from kernelabd.propose.template.proposer import instantiate
from tests.gating import assert_passes, gate

ATTENTION_LAYER = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = {score}
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return {out}


def get_inputs():
    return [torch.rand(2, 37, 32)]


def get_init_inputs():
    return [32, 4, 64]
'''


def _layer(score: str, out: str) -> str:
    return ATTENTION_LAYER.format(score=score, out=out)


def test_a_forward_slicing_with_a_traced_size_is_traced_at_its_sizes_and_its_mask_keeps_its_values():
    source = _layer("F.softmax(att, dim=-1)", "self.c_proj(y)")
    namespace: dict = {}
    exec(compile(source, "<reference>", "exec"), namespace)
    with pytest.raises(Exception, match=r"slice indices|integer"):
        fx.symbolic_trace(namespace["Model"](*namespace["get_init_inputs"]()))
    g = graph.trace(source)
    assert g.known or g.cuttable, g.unknown
    kinds = [op.kind for op in g.ops]
    assert kinds.count("linear") == 2 and "causal" in kinds and "softmax" in kinds
    (mask,) = g.causal_masks
    assert getattr(g.gm, str(mask.target)).shape == (1, 1, 37, 37)


@pytest.mark.parametrize(("score", "out", "words"), [
    ("F.softmax(att, dim=-1)", "self.c_proj(y)",
     "matmul (linear + bias) with fused epilogue → attention (written-out softmax(q @ k^T * scale) @ v, causal;"),
    # KernelBench L3 #50: ReLU for the softmax, and the heads' transpose is the output's own view
    ("F.relu(att)", "y", "attention (written-out relu(q @ k^T * scale) @ v, causal; flash-style, key blocks summed)"
                         "; output viewed as it returns it"),
])
def test_mingpt_attention_layers_are_ported_whole_and_pass_the_real_gate(tmp_path, score, out, words):
    source = _layer(score, out)
    found = instantiate(source)
    assert found is not None and found.edit.startswith("template: pipeline of matmul") and words in found.edit, \
        found.edit if found else None
    assert_passes(gate(tmp_path, "mingpt", source, None, found.source))


def test_a_loop_over_a_traced_size_is_declined_with_the_reason_not_unrolled_into_stages():
    """An RNN's steps (KernelBench L3 #34) unroll into hundreds of stages at the traced sizes:
    declined at once with why, not left to the pipeline search's deadline."""
    source = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(8, 8)

    def forward(self, x):
        h = x[0]
        for t in range(x.size(0)):
            h = torch.tanh(self.i2h(h + x[t]))
        return h


def get_inputs():
    return [torch.rand(100, 2, 8)]


def get_init_inputs():
    return []
'''
    with pytest.raises(NotRecognised, match=r"calls i2h 100 times at the traced sizes"):
        graph.trace(source)


def test_a_device_check_and_an_optional_argument_trace_as_the_reference_runs(tmp_path):
    """NetVLAD (KernelBench L3 #46) compares ``x.device`` with its parameter's before computing,
    and takes ``mask=None``: the check passes while tracing, the mask is bound to its default
    (so ``if mask is not None`` takes the branch the reference runs), and the candidate's forward
    takes the inputs the reference is called with."""
    source = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(24, 12))

    def forward(self, x, mask=None):
        if x.device != self.w.device:
            raise ValueError("devices differ")
        y = torch.matmul(x, self.w)
        if mask is not None:
            y = y * mask
        return F.softmax(y, dim=-1)


def get_inputs():
    return [torch.rand(5, 24)]


def get_init_inputs():
    return []
'''
    found = instantiate(source)
    assert found is not None and "softmax" in found.edit and "mask" not in found.source.split("class ModelNew")[-1]
    assert_passes(gate(tmp_path, "device_check", source, None, found.source))


def test_an_input_given_for_a_parameter_with_a_default_stays_in_the_candidates_forward(tmp_path):
    """Only parameters past the inputs the reference is called with are bound to their defaults:
    one that ``get_inputs`` fills keeps its place in the candidate's forward, used or not."""
    source = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, scale=None):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, 33), torch.randn(4, 33)]


def get_init_inputs():
    return []
'''
    found = instantiate(source)
    assert found is not None and "relu" in found.edit
    assert_passes(gate(tmp_path, "given_default", source, None, found.source))
