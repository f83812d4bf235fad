"""The fused LSTM and GRU cells PyTorch picks for the device, and their backward ops.

PyTorch's LSTM/GRU cells (``nn.LSTM``, ``nn.GRU``, ``LSTMCell``, ``GRUCell``) compute a
device tensor's gates as two matrix products and hand them to ``_thnn_fused_lstm_cell`` /
``_thnn_fused_gru_cell``, which have CUDA kernels only (the CPU takes a composite path
instead), so the CPU fallback has nothing to run. Here each cell, and the backward ops
autograd calls for it, is one program: the device's own elementwise ops (their lowering
entries, so each value is rounded as the op-by-op composition rounds it) fused, where the
composition dispatched 15 to 25 small ops a time step. Operands no program takes (dtypes
outside the ISA, shapes that do not fit) run the same composition op by op, which raises
torch's errors.

The workspace is this module's own layout (only its backward ops read it): the LSTM's
activated gates ``[i, f, g, o]`` (``batch x 4H``); the GRU's ``[r, z, n, hx, hn]``
(``batch x 5H``), ``hn`` being the hidden part of the new gate before the reset gate.
With grad mode on during backward (``create_graph=True``) autograd uses PyTorch's
``_thnn_differentiable_*_backward`` composites instead.
"""

from __future__ import annotations

import types

import torch

from hologram.errors import HologramError
from hologram_torch.aten import runner
from hologram_torch.aten.registry import aten, composed
from hologram_torch.lowering import Unsupported, lower
from hologram_torch.lowering.common import cast


def _lowered(g) -> types.SimpleNamespace:
    """The elementwise ops a cell composes, on graph values, as the eager ops lower them."""
    return types.SimpleNamespace(
        add=lambda a, b: lower(aten.add.Tensor, g, a, b),
        sub=lambda a, b: lower(aten.sub.Tensor, g, a, b),
        mul=lambda a, b: lower(aten.mul.Tensor, g, a, b),
        sigmoid=lambda a: lower(aten.sigmoid.default, g, a),
        tanh=lambda a: lower(aten.tanh.default, g, a),
        cat=lambda parts: lower(aten.cat.default, g, list(parts), 1),
        sum0=lambda a: lower(aten.sum.dim_IntList, g, a, [0]))


def _chunks(x, n: int) -> list:
    """``x.chunk(n, 1)`` of a graph value whose dimension 1 divides by ``n``."""
    width = x.shape[1] // n
    return [x[:, k * width:(k + 1) * width] for k in range(n)]


def _one_program(name: str, build, operands, present, fallback, *args):
    """``build`` over the present operands in one program, or ``fallback(*args)`` (the
    op-by-op composition) where no program takes them. The program's results are filed
    with the front kernel running the call (:func:`runner.file_front`): the cell ops'
    kernels return them as they are."""
    tensors = [t for t in operands if t is not None]
    if tensors[0].dim() == 2 and runner.supported(*tensors):
        try:
            results = runner.run(name, build, tensors, (present,))
        except (Unsupported, runner.Unsupported, HologramError):
            pass
        else:
            runner.file_front(name, (present,), tensors, results)
            return results
    return fallback(*args)


def _zeros(g, like):
    """Zeros shaped and typed as the graph value ``like``."""
    return cast(g.arange(1), like.dtype).broadcast_to(like.shape)


def _operands(g, inputs, present):
    """Graph values in the argument order, None where ``present`` says absent."""
    values = iter(inputs)
    return [next(values) if p else None for p in present]


def _added(ops, gates, *biases):
    for b in biases:
        if b is not None:
            gates = ops.add(gates, b)
    return gates


def _lstm_cell_build(g, *inputs):
    *inputs, present = inputs
    input_gates, hidden_gates, cx, input_bias, hidden_bias = _operands(g, inputs, present)
    ops = _lowered(g)
    gates = _added(ops, ops.add(input_gates, hidden_gates), input_bias, hidden_bias)
    i, f, c, o = _chunks(gates, 4)
    i, f, c, o = ops.sigmoid(i), ops.sigmoid(f), ops.tanh(c), ops.sigmoid(o)
    cy = ops.add(ops.mul(f, cx), ops.mul(i, c))
    hy = ops.mul(o, ops.tanh(cy))
    return hy, cy, ops.cat((i, f, c, o))


def _lstm_cell_backward_build(g, *inputs):
    *inputs, present = inputs
    grad_hy, grad_cy, cx, cy, workspace = _operands(g, inputs, present[:5])
    has_bias = present[5]
    ops = _lowered(g)
    i, f, c, o = _chunks(workspace, 4)

    def rising(x):  # x * (1 - x), a sigmoid's derivative
        return ops.mul(x, ops.sub(1, x))

    tanh_cy = ops.tanh(cy)
    grad_c = grad_cy if grad_cy is not None else _zeros(g, cy)
    if grad_hy is not None:
        grad_c = ops.add(grad_c, ops.mul(ops.mul(grad_hy, o),
                                         ops.sub(1, ops.mul(tanh_cy, tanh_cy))))
        grad_o = ops.mul(ops.mul(ops.mul(grad_hy, tanh_cy), o), ops.sub(1, o))
    else:
        grad_o = _zeros(g, o)
    grad_gates = ops.cat((ops.mul(ops.mul(ops.mul(grad_c, c), i), ops.sub(1, i)),
                          ops.mul(ops.mul(ops.mul(grad_c, cx), f), ops.sub(1, f)),
                          ops.mul(ops.mul(grad_c, i), ops.sub(1, ops.mul(c, c))),
                          grad_o))
    results = (grad_gates, ops.mul(grad_c, f))
    return (*results, ops.sum0(grad_gates)) if has_bias else results


def _gru_cell_build(g, *inputs):
    *inputs, present = inputs
    input_gates, hidden_gates, hx, input_bias, hidden_bias = _operands(g, inputs, present)
    ops = _lowered(g)
    ir, iz, in_ = _chunks(_added(ops, input_gates, input_bias), 3)
    hr, hz, hn = _chunks(_added(ops, hidden_gates, hidden_bias), 3)
    r = ops.sigmoid(ops.add(ir, hr))
    z = ops.sigmoid(ops.add(iz, hz))
    n = ops.tanh(ops.add(in_, ops.mul(r, hn)))
    hy = ops.add(n, ops.mul(z, ops.sub(hx, n)))
    return hy, ops.cat((r, z, n, hx, hn))


def _gru_cell_backward_build(g, grad_hy, workspace, has_bias):
    ops = _lowered(g)
    r, z, n, hx, hn = _chunks(workspace, 5)
    grad_n = ops.mul(ops.mul(grad_hy, ops.sub(1, z)), ops.sub(1, ops.mul(n, n)))
    grad_z = ops.mul(ops.mul(ops.mul(grad_hy, ops.sub(hx, n)), z), ops.sub(1, z))
    grad_r = ops.mul(ops.mul(ops.mul(grad_n, hn), r), ops.sub(1, r))
    grad_input_gates = ops.cat((grad_r, grad_z, grad_n))
    grad_hidden_gates = ops.cat((grad_r, grad_z, ops.mul(grad_n, r)))
    results = (grad_input_gates, grad_hidden_gates, ops.mul(grad_hy, z))
    if not has_bias:
        return results
    return (*results, ops.sum0(grad_input_gates), ops.sum0(grad_hidden_gates))


def _cell(name: str, build, fallback, *operands):
    """A cell's forward (gates, state, optional biases) in one program, or ``fallback``;
    which operands are present is part of the program's key."""
    return _one_program(name, build, operands, tuple(t is not None for t in operands),
                        fallback, *operands)


@composed("_thnn_fused_lstm_cell", hot=True)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    return _cell("lstm_cell", _lstm_cell_build, _lstm_cell,
                 input_gates, hidden_gates, cx, input_bias, hidden_bias)


@composed("_thnn_fused_lstm_cell_backward_impl", hot=True)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    operands = (grad_hy, grad_cy, cx, cy, workspace)
    present = (*(t is not None for t in operands), bool(has_bias))
    results = _one_program("lstm_cell_backward", _lstm_cell_backward_build, operands,
                           present, _lstm_cell_backward, *operands, has_bias)
    return results if len(results) == 3 else (*results, None)


@composed("_thnn_fused_gru_cell", hot=True)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    return _cell("gru_cell", _gru_cell_build, _gru_cell,
                 input_gates, hidden_gates, hx, input_bias, hidden_bias)


@composed("_thnn_fused_gru_cell_backward", hot=True)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    tensors = (grad_hy, workspace)
    if workspace.dim() == 2 and runner.supported(*tensors):
        try:
            static = (bool(has_bias),)
            results = runner.run("gru_cell_backward", _gru_cell_backward_build, tensors,
                                  static)
            if not has_bias:
                return (*results, None, None)
            runner.file_front("gru_cell_backward", static, tensors, results)
            return results
        except (Unsupported, runner.Unsupported, HologramError):
            pass
    return _gru_cell_backward(grad_hy, workspace, has_bias)


# --- the same cells op by op (operands no program takes) ---------------------------------

def _added_eager(gates: torch.Tensor, *biases: torch.Tensor | None) -> torch.Tensor:
    for b in biases:
        if b is not None:
            gates = gates + b
    return gates


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _added_eager(input_gates + hidden_gates, input_bias, hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat((i, f, g, o), 1)


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
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


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, iz, in_ = _added_eager(input_gates, input_bias).chunk(3, 1)
    hr, hz, hn = _added_eager(hidden_gates, hidden_bias).chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat((r, z, n, hx, hn), 1)


def _gru_cell_backward(grad_hy, workspace, has_bias):
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
