"""The fused LSTM and GRU cells PyTorch picks for the device, and their backward ops.

PyTorch's LSTM/GRU cells (``nn.LSTM``, ``nn.GRU``, ``LSTMCell``, ``GRUCell``) compute a
device tensor's gates as two matrix products and hand them to ``_thnn_fused_lstm_cell`` /
``_thnn_fused_gru_cell``, which have CUDA kernels only (the CPU takes a composite path
instead), so the CPU fallback has nothing to run. Here each cell, and the backward ops
autograd calls for it, is composed of the device's own elementwise ops.

The workspace is this module's own layout (only its backward ops read it): the LSTM's
activated gates ``[i, f, g, o]`` (``batch x 4H``); the GRU's ``[r, z, n, hx, hn]``
(``batch x 5H``), ``hn`` being the hidden part of the new gate before the reset gate.
With grad mode on during backward (``create_graph=True``) autograd uses PyTorch's
``_thnn_differentiable_*_backward`` composites instead.
"""

from __future__ import annotations

import torch

from hologram_torch.aten.registry import composed


def _added(gates: torch.Tensor, *biases: torch.Tensor | None) -> torch.Tensor:
    for b in biases:
        if b is not None:
            gates = gates + b
    return gates


@composed("_thnn_fused_lstm_cell")
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _added(input_gates + hidden_gates, input_bias, hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat((i, f, g, o), 1)


@composed("_thnn_fused_lstm_cell_backward_impl")
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy * o * (1 - o)
    else:
        grad_o = torch.zeros_like(o)
    grad_gates = torch.cat((grad_c * g * i * (1 - i),
                            grad_c * cx * f * (1 - f),
                            grad_c * i * (1 - g * g),
                            grad_o), 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@composed("_thnn_fused_gru_cell")
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, iz, in_ = _added(input_gates, input_bias).chunk(3, 1)
    hr, hz, hn = _added(hidden_gates, hidden_bias).chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat((r, z, n, hx, hn), 1)


@composed("_thnn_fused_gru_cell_backward")
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = torch.cat((grad_r, grad_z, grad_n), 1)
    grad_hidden_gates = torch.cat((grad_r, grad_z, grad_n * r), 1)
    grad_hx = grad_hy * z
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0),
            grad_hidden_gates.sum(0))
