"""``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` as
the ops they compute, so that the templates port them.

Self-attention through the module (KernelBench L3 #31's vision attention block) is one input
projection, the heads as views, scaled dot-product attention and the output projection.
Eager PyTorch runs it, with ``need_weights=True`` (the module's default), as the math path:
the ``(batch·heads, L, L)`` scores are materialised, and averaged over the heads for a second
output that the reference usually discards. Written out as those ops, the graph is a pipeline
of the matmul template, the flash-style attention template and the matmul template again.

An encoder layer is its own forward in evaluation mode, written out: the attention block and
the feed-forward block, each with its residual and LayerNorm (before or after, ``norm_first``);
an encoder, its layers one after another and its final norm. The attention module they call is
then written out as above.

Only the plain form of attention is rewritten: self-attention (one tensor as query, key and value), the
packed input projection, no masks, no ``bias_k``/``bias_v`` or zero attention, evaluation mode,
a batched input, and the attention weights unused. Anything else stays the module, which no
template knows, so the graph is declined with it as the reason.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.nn as nn
import torch.nn.functional as F
from torch import fx

from kernelabd.propose.template.canon import arg_of, meta_of, rewrite

PLAIN_KWARGS = {"need_weights", "attn_mask", "key_padding_mask", "average_attn_weights", "is_causal"}


ENCODER_KWARGS = {"src_mask", "src_key_padding_mask", "mask", "is_causal"}


def decompose_encoders(gm: fx.GraphModule) -> bool:
    """Every ``nn.TransformerEncoder`` and ``nn.TransformerEncoderLayer`` call of ``gm`` without
    masks, in evaluation mode, written out as its submodules' calls (``_encoder``, ``_layer``);
    True if any was."""
    return rewrite(gm, lambda graph, node: _written_encoder(gm, graph, node))


def _written_encoder(gm: fx.GraphModule, graph: fx.Graph, node: fx.Node) -> fx.Node | None:
    """``node``'s encoder or layer written out before it; None (nothing inserted) for any other
    node, masks, training mode, or an activation other than ReLU, GELU or a module."""
    module = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
    if not isinstance(module, nn.TransformerEncoder | nn.TransformerEncoderLayer) or module.training:
        return None
    if len(node.args) != 1 or set(node.kwargs) - ENCODER_KWARGS or any(node.kwargs.values()):
        return None
    layers = module.layers if isinstance(module, nn.TransformerEncoder) else [module]
    if not all(isinstance(layer.activation, nn.Module) or layer.activation in (F.relu, F.gelu) for layer in layers):
        return None
    write = _encoder if isinstance(module, nn.TransformerEncoder) else _layer
    return write(graph, node.args[0], str(node.target), module)


def _encoder(graph: fx.Graph, x: Any, path: str, module: nn.TransformerEncoder) -> fx.Node:
    for i, layer in enumerate(module.layers):
        x = _layer(graph, x, f"{path}.layers.{i}", layer)
    return graph.call_module(f"{path}.norm", (x,)) if module.norm is not None else x


def _layer(graph: fx.Graph, x: Any, path: str, layer: nn.TransformerEncoderLayer) -> fx.Node:
    """``TransformerEncoderLayer.forward`` without masks: ``x + sa(norm1(x))``, then ``x +
    ff(norm2(x))`` with ``norm_first``; else ``norm1(x + sa(x))``, then ``norm2(x + ff(x))``."""
    def attention(y: Any) -> fx.Node:
        out = graph.call_module(f"{path}.self_attn", (y, y, y), {"need_weights": False})
        return graph.call_function(operator.getitem, (out, 0))

    def feed_forward(y: Any) -> fx.Node:
        hidden = graph.call_module(f"{path}.linear1", (y,))
        if isinstance(layer.activation, nn.Module):
            hidden = graph.call_module(f"{path}.activation", (hidden,))
        else:
            hidden = graph.call_function(layer.activation, (hidden,))
        return graph.call_module(f"{path}.linear2", (hidden,))

    def norm(i: int, y: Any) -> fx.Node:
        return graph.call_module(f"{path}.norm{i}", (y,))

    if layer.norm_first:
        x = graph.call_function(operator.add, (x, attention(norm(1, x))))
        return graph.call_function(operator.add, (x, feed_forward(norm(2, x))))
    x = norm(1, graph.call_function(operator.add, (x, attention(x))))
    return norm(2, graph.call_function(operator.add, (x, feed_forward(x))))


def decompose_mha(gm: fx.GraphModule) -> bool:
    """Every plain ``nn.MultiheadAttention`` call of ``gm`` written out; True if any was (the
    shapes then need propagating again)."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or type(gm.get_submodule(str(node.target))) is not nn.MultiheadAttention:
            continue
        outputs = _outputs(node)
        if outputs is None or not _plain(node, gm.get_submodule(str(node.target))):
            continue
        with gm.graph.inserting_before(node):
            out = _written(gm.graph, node, gm.get_submodule(str(node.target)))
        for user in list(node.users):
            if user in outputs:
                user.replace_all_uses_with(out)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _outputs(node: fx.Node) -> list[fx.Node] | None:
    """The users that read the attention output (``out, _ = mha(…)``); None when any reads the
    attention weights or the pair itself."""
    found = []
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.args[1] not in (0, 1):
            return None
        if user.args[1] == 1 and user.users:
            return None
        if user.args[1] == 0:
            found.append(user)
    return found


def _plain(node: fx.Node, module: nn.MultiheadAttention) -> bool:
    query = node.args[0] if node.args else node.kwargs.get("query")
    shape = getattr(meta_of(query), "shape", None)
    given = set(node.kwargs) - {"query", "key", "value"}
    return (not module.training and module._qkv_same_embed_dim and module.bias_k is None
            and module.bias_v is None and not module.add_zero_attn and shape is not None and len(shape) == 3
            and arg_of(node, 1, "key") is query and arg_of(node, 2, "value") is query and len(node.args) <= 3
            and given <= PLAIN_KWARGS and node.kwargs.get("attn_mask") is None
            and node.kwargs.get("key_padding_mask") is None and not node.kwargs.get("is_causal", False))


def _written(graph: fx.Graph, node: fx.Node, module: nn.MultiheadAttention) -> fx.Node:
    """``out_proj(sdpa(heads(in_proj(x))))`` inserted before ``node``: the heads as
    ``(batch, heads, L, head_dim)`` views, which the attention kernel reads through strides."""
    x, path = arg_of(node, 0, "query"), str(node.target)
    first, second, embed = meta_of(x).shape
    heads = module.num_heads
    weight = graph.get_attr(f"{path}.in_proj_weight")
    bias = graph.get_attr(f"{path}.in_proj_bias") if module.in_proj_bias is not None else None
    qkv = graph.call_function(F.linear, (x, weight, bias))
    chunks = graph.call_method("chunk", (qkv, 3, -1))
    order = (0, 2, 1, 3) if module.batch_first else (1, 2, 0, 3)    # → (batch, heads, L, head_dim)
    q, k, v = (graph.call_method("permute", (_heads(graph, chunks, i, first, second, heads, embed), *order))
               for i in range(3))
    y = graph.call_function(F.scaled_dot_product_attention, (q, k, v))
    back = (0, 2, 1, 3) if module.batch_first else (2, 0, 1, 3)
    y = graph.call_method("reshape", (graph.call_method("permute", (y, *back)), first, second, embed))
    out_bias = graph.get_attr(f"{path}.out_proj.bias") if module.out_proj.bias is not None else None
    return graph.call_function(F.linear, (y, graph.get_attr(f"{path}.out_proj.weight"), out_bias))


def _heads(graph: fx.Graph, chunks: fx.Node, i: int, first: int, second: int, heads: int, embed: int) -> Any:
    """The ``i``-th of query, key and value split into heads: ``(first, second, heads, head_dim)``."""
    part = graph.call_function(operator.getitem, (chunks, i))
    return graph.call_method("view", (part, first, second, heads, embed // heads))
