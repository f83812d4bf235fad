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
    h = gates.shape[1] // 4
    # The workspace is written in place, chunk by chunk: fewer launches than activating
    # each chunk and concatenating.
    workspace = gates.sigmoid()
    torch.tanh(gates[:, 2 * h:3 * h], out=workspace[:, 2 * h:3 * h])
    i, f, g, o = workspace.chunk(4, 1)
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, workspace


@composed("_thnn_fused_lstm_cell_backward_impl")
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    h = i.shape[1]
    grad_gates = torch.empty_like(workspace)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        torch.mul(grad_hy * tanh_cy, o * (1 - o), out=grad_gates[:, 3 * h:])
    else:
        grad_gates[:, 3 * h:].zero_()
    torch.mul(grad_c * g, i * (1 - i), out=grad_gates[:, :h])
    torch.mul(grad_c * cx, f * (1 - f), out=grad_gates[:, h:2 * h])
    torch.mul(grad_c * i, 1 - g * g, out=grad_gates[:, 2 * h:3 * h])
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@composed("_thnn_fused_gru_cell")
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig = _added(input_gates, input_bias)
    hg = _added(hidden_gates, hidden_bias)
    h = hx.shape[1]
    workspace = torch.empty((hx.shape[0], 5 * h), dtype=ig.dtype, device=ig.device)
    torch.sigmoid(ig[:, :2 * h] + hg[:, :2 * h], out=workspace[:, :2 * h])
    r, z = workspace[:, :h], workspace[:, h:2 * h]
    hn = hg[:, 2 * h:]
    torch.tanh(ig[:, 2 * h:] + r * hn, out=workspace[:, 2 * h:3 * h])
    n = workspace[:, 2 * h:3 * h]
    workspace[:, 3 * h:4 * h].copy_(hx)
    workspace[:, 4 * h:].copy_(hn)
    hy = n + z * (hx - n)
    return hy, workspace


@composed("_thnn_fused_gru_cell_backward")
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    h = r.shape[1]
    grad_input_gates = torch.empty_like(workspace[:, :3 * h])
    grad_n = grad_input_gates[:, 2 * h:]
    torch.mul(grad_hy * (1 - z), 1 - n * n, out=grad_n)
    torch.mul(grad_hy * (hx - n), z * (1 - z), out=grad_input_gates[:, h:2 * h])
    torch.mul(grad_n * hn, r * (1 - r), out=grad_input_gates[:, :h])
    grad_hidden_gates = grad_input_gates.clone()
    grad_hidden_gates[:, 2 * h:].mul_(r)
    grad_hx = grad_hy * z
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0),
            grad_hidden_gates.sum(0))
