"""The inference fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
(``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``), from device ops.

In eval mode (or without autograd) PyTorch hands a whole attention block or encoder layer
of a CPU, CUDA or PrivateUse1 tensor to one fused op, which has CPU and CUDA kernels only:
on the device it ran through the CPU fallback, copies included. Here each is the same
math as its CPU kernel, composed of the device's ops (projections, attention scores and
their softmax, layer norm, the feed-forward block), so it runs on the device and, recorded
(``HOLOGRAM_LAZY=1``), fuses with its neighbours.

Masks arrive as PyTorch's fast path merges them (``mask_type`` 0: an attention mask
``L x S``; 1: a key padding mask ``B x S``; 2: a mask broadcastable to ``B x H x L x S``);
True (for a float mask, as the CPU kernel reads it: nonzero) where a position is masked
out. The attention weights, when asked for, are the softmax of the scaled scores,
averaged over the heads if ``average_attn_weights``; a row whose every position is
masked is NaN, as on the CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hologram_torch.aten.registry import composed


def _mask(mask, mask_type, batch: int, length: int):
    """The merged mask as booleans broadcastable to ``B x H x L x S``, True where a
    position is masked out. The CPU kernel reads a float mask as booleans too (nonzero:
    masked), not as an additive mask."""
    if mask is None:
        return None
    if mask_type == 1:  # key padding: one row per batch item
        mask = mask.view(batch, 1, 1, mask.shape[-1])
    elif mask.dim() == 2:  # attention mask: one matrix for every batch item and head
        mask = mask.view(1, 1, length, mask.shape[-1])
    return mask if mask.dtype == torch.bool else mask != 0


def _heads(x, batch: int, heads: int):
    return x.view(batch, -1, heads, x.shape[-1] // heads).transpose(1, 2)


@composed("_native_multi_head_attention")
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight,
                                qkv_bias, proj_weight, proj_bias, mask=None,
                                need_weights=True, average_attn_weights=True,
                                mask_type=None):
    if not query.shape == key.shape == value.shape:
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")  # PyTorch's
    batch, length = query.shape[0], query.shape[1]
    # The CPU kernel's rounding: the projections without their bias, then the bias added
    # and the queries scaled at float precision at least, rounded once to the dtype.
    if query is key and key is value:  # self-attention: one projection
        qkv = F.linear(query, qkv_weight)
    else:
        wq, wk, wv = qkv_weight.chunk(3)
        qkv = torch.cat([F.linear(query, wq), F.linear(key, wk), F.linear(value, wv)], -1)
    dtype = qkv.dtype
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v = (qkv.to(wide) + qkv_bias.to(wide)).chunk(3, dim=-1)
    q = q * (1.0 / math.sqrt(embed_dim // num_head))
    q, k, v = (_heads(t.to(dtype), batch, num_head) for t in (q, k, v))
    masked = _mask(mask, mask_type, batch, length)
    # The CPU kernel's softmax: a row masked whole is NaN there, so it is here too.
    scores = q @ k.transpose(-2, -1)
    if masked is not None:
        scores = scores.masked_fill(masked, -math.inf)
    weights = torch.softmax(scores, -1)
    attended = weights @ v
    out = F.linear(attended.transpose(1, 2).reshape(batch, length, embed_dim), proj_weight,
                   proj_bias)
    if not need_weights:
        return out, None  # (an undefined tensor, as the CPU kernel returns)
    return out, weights.mean(dim=1) if average_attn_weights else weights


@composed("_transformer_encoder_layer_fwd")
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias,
                                  proj_weight, proj_bias, use_gelu, norm_first, eps,
                                  norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
                                  mask=None, mask_type=None):
    def attend(x):
        return native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight,
                                           qkv_bias, proj_weight, proj_bias, mask, False,
                                           True, mask_type)[0]

    def feed_forward(x):
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2,
                        ffn_bias_2)

    shape = (embed_dim,)
    x = src
    if norm_first:
        x = x + attend(F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps))
        return x + feed_forward(F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps))
    x = F.layer_norm(x + attend(x), shape, norm_weight_1, norm_bias_1, eps)
    return F.layer_norm(x + feed_forward(x), shape, norm_weight_2, norm_bias_2, eps)
