"""The inference fast paths of attention on the device against PyTorch's CPU kernels:
``nn.TransformerEncoderLayer`` in eval mode (``_transformer_encoder_layer_fwd``: post- and
pre-norm, ReLU and GELU, no mask, an attention mask (boolean and float), a key padding
mask, both) and ``_native_multi_head_attention`` called directly (self- and
cross-attention, every mask type, with and without the attention weights, averaged or
per head, a row masked whole), composed of device ops: no CPU fallback."""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import hologram_torch  # noqa: E402

D = "hologram"
TOL = {"rtol": 1e-5, "atol": 1e-5}


class _Ops(TorchDispatchMode):
    """The aten ops dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(str(func))
        return func(*args, **(kwargs or {}))


def _masks(batch, length):
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, length - 2:] = True
    causal = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)
    additive = torch.zeros(length, length).masked_fill(causal, -math.inf)
    return [{}, {"src_key_padding_mask": padding}, {"src_mask": causal},
            {"src_mask": additive}, {"src_mask": causal, "src_key_padding_mask": padding}]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_an_encoder_layer_in_eval_mode_runs_its_fast_path_on_the_device(norm_first,
                                                                        activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                             norm_first=norm_first,
                                             activation=activation).eval()
    on_device = copy.deepcopy(layer).to(D)
    x = torch.randn(3, 7, 16)
    for masks in _masks(3, 7):
        hologram_torch.reset_fallback_stats()
        with torch.no_grad():
            want = layer(x, **masks)
            with _Ops() as ops:
                got = on_device(x.to(D), **{k: m.to(D) for k, m in masks.items()})
        assert "aten._transformer_encoder_layer_fwd.default" in ops.seen
        torch.testing.assert_close(got.cpu(), want, **TOL)
        assert hologram_torch.fallback_stats(lacking=False) == {}


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("average", [False, True])
def test_native_multi_head_attention_matches_the_cpu_kernel(need_weights, average):
    torch.manual_seed(1)
    embed, heads, batch, length = 16, 4, 2, 5
    source = length  # (the CPU kernel takes key and value of the query's shape only)
    weights = [torch.randn(3 * embed, embed) * 0.3, torch.randn(3 * embed),
               torch.randn(embed, embed) * 0.3, torch.randn(embed)]
    q, kv = torch.randn(batch, length, embed), torch.randn(batch, source, embed)
    padding = torch.zeros(batch, source, dtype=torch.bool)
    padding[0, 3:] = True
    padding[1, :] = True  # every key of one item masked: NaN rows, as on the CPU
    attn = torch.rand(length, source) > 0.7
    merged = torch.randn(batch, heads, length, source)
    cases = [((q, q, q), None, None), ((q, kv, kv), None, None), ((q, kv, kv), padding, 1),
             ((q, kv, kv), attn, 0), ((q, kv, kv), merged, 2)]
    op = torch.ops.aten._native_multi_head_attention.default
    for (query, key, value), mask, mask_type in cases:
        want = op(query, key, value, embed, heads, *weights, mask, need_weights, average,
                  mask_type)
        device = {id(t): t.to(D) for t in (query, key, value)}  # the same tensor stays so
        hologram_torch.reset_fallback_stats()
        got = op(device[id(query)], device[id(key)], device[id(value)], embed, heads,
                 *(w.to(D) for w in weights), None if mask is None else mask.to(D),
                 need_weights, average, mask_type)
        torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True, **TOL)
        if want[1] is None:
            assert got[1] is None
        else:
            torch.testing.assert_close(got[1].cpu(), want[1], equal_nan=True, **TOL)
        assert hologram_torch.fallback_stats(lacking=False) == {}


def test_an_encoder_in_eval_mode_recorded_matches_eager():
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    encoder = encoder.to(D)
    x = torch.randn(2, 6, 16).to(D)
    with torch.no_grad():
        with hologram_torch.set_lazy(False):
            want = encoder(x).cpu()
        with hologram_torch.set_lazy(True):
            got = [encoder(x).cpu() for _ in range(3)]
    for g in got:
        torch.testing.assert_close(g, want, **TOL)


def test_attention_refuses_what_the_cpu_kernel_refuses():
    w = [torch.randn(48, 16), torch.randn(48), torch.randn(16, 16), torch.randn(16)]
    q, k = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    op = torch.ops.aten._native_multi_head_attention.default
    errors = []
    for device in ("cpu", D):
        with pytest.raises(RuntimeError) as info:
            op(q.to(device), k.to(device), k.to(device), 16, 4, *(t.to(device) for t in w))
        errors.append(str(info.value))
    assert errors[1] == errors[0]
