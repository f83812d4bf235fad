"""LSTM and GRU on the hologram device against the CPU: nn.LSTM, nn.GRU, LSTMCell and
GRUCell, forward and backward, run through the fused cells PyTorch picks for the device
(composed of device ops: no fallback)."""

from __future__ import annotations

import copy
import os

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 1e-5}


#: Absolute errors allowed, relative to a tensor's largest magnitude: 1e-6, and 5e-6 on
#: webgpu, whose workgroup trees sum the batch and time terms of a gradient in another
#: order than the CPU's loops (on lavapipe, an element that cancels to 5e-4 of a gradient
#: of 2.5 came out 1.04e-5 off).
SCALE = 5e-6 if os.environ.get("HOLOGRAM_TORCH_BACKEND") == "webgpu" else 1e-6


def _close(got, ref, msg=None):
    """Within 1e-5, absolute errors relative to the tensor's largest magnitude: the device's
    fused cell adds the four gate terms in another order than the CPU's two linears, and
    PyTorch's module samples reach gradients of ~250, where elements that cancel to near 0
    carry ~1e-4 of rounding either way."""
    atol = max(1e-5, SCALE * ref.abs().max().item()) if ref.numel() else 1e-5
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=atol, msg=msg)


def _leaves(tree) -> list:
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _compare(module, *inputs):
    """Outputs, input gradients and parameter gradients of ``module`` on both devices;
    ``inputs`` may hold tuples of tensors (an LSTM's state)."""
    for t in _leaves(inputs):
        t.grad = None
    device_module = copy.deepcopy(module).to("hologram")
    device_inputs = torch.utils._pytree.tree_map(
        lambda t: t.detach().to("hologram").requires_grad_(t.requires_grad)
        if isinstance(t, torch.Tensor) else t, inputs)
    hologram_torch.reset_fallback_stats()
    flat_got = _leaves(device_module(*device_inputs))
    flat_ref = _leaves(module(*inputs))
    assert len(flat_got) == len(flat_ref)
    for g, r in zip(flat_got, flat_ref):
        _close(g, r)
    # A weighted sum of every output, so that each output's gradient path is exercised.
    sum(((i + 1) * r.square()).sum() for i, r in enumerate(flat_ref)).backward()
    sum(((i + 1) * g.square()).sum() for i, g in enumerate(flat_got)).backward()
    assert hologram_torch.fallback_stats(lacking=False) == {}
    for d, c in zip(_leaves(device_inputs), _leaves(inputs)):
        if c.requires_grad:
            _close(d.grad, c.grad)
    for (name, p), q in zip(device_module.named_parameters(), module.parameters()):
        _close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("kwargs", [
    {"num_layers": 2, "batch_first": True},
    {"bidirectional": True, "bias": False},
    {"proj_size": 3},
])
def test_lstm_matches_cpu(kwargs):
    torch.manual_seed(0)
    module = torch.nn.LSTM(5, 6, **kwargs)
    x = torch.randn(4, 3, 5, requires_grad=True)
    _compare(module, x)


def test_lstm_with_initial_state_matches_cpu():
    torch.manual_seed(1)
    module = torch.nn.LSTM(4, 5)
    x = torch.randn(3, 2, 4, requires_grad=True)
    h = torch.randn(1, 2, 5, requires_grad=True)
    c = torch.randn(1, 2, 5, requires_grad=True)
    _compare(_WithState(module), x, h, c)


class _WithState(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h, c=None):
        return self.rnn(x, h if c is None else (h, c))


@pytest.mark.parametrize("kwargs", [
    {"num_layers": 2},
    {"bidirectional": True, "bias": False, "batch_first": True},
])
def test_gru_matches_cpu(kwargs):
    torch.manual_seed(2)
    module = torch.nn.GRU(5, 6, **kwargs)
    x = torch.randn(4, 3, 5, requires_grad=True)
    _compare(module, x)


def test_gru_with_initial_state_matches_cpu():
    torch.manual_seed(3)
    x = torch.randn(3, 2, 4, requires_grad=True)
    h = torch.randn(1, 2, 5, requires_grad=True)
    _compare(_WithState(torch.nn.GRU(4, 5)), x, h)


@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_cpu(bias):
    torch.manual_seed(4)
    x = torch.randn(3, 4, requires_grad=True)
    h = torch.randn(3, 5, requires_grad=True)
    c = torch.randn(3, 5, requires_grad=True)
    _compare(torch.nn.LSTMCell(4, 5, bias=bias), x)
    _compare(_Cell(torch.nn.LSTMCell(4, 5, bias=bias)), x, h, c)
    _compare(torch.nn.GRUCell(4, 5, bias=bias), x)
    _compare(torch.nn.GRUCell(4, 5, bias=bias), x, h)


class _Cell(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, x, h, c):
        return self.cell(x, (h, c))


def test_only_the_cell_state_gets_a_gradient():
    # Backward from cy alone: the fused backward gets no grad_hy.
    torch.manual_seed(5)
    cell = torch.nn.LSTMCell(3, 4)
    x = torch.randn(2, 3, requires_grad=True)
    _compare(_Second(cell), x)


class _Second(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, x):
        return self.cell(x)[1]


def test_double_backward_matches_cpu():
    # create_graph=True: autograd differentiates PyTorch's differentiable cell backward.
    torch.manual_seed(6)
    for cell in (torch.nn.LSTMCell(3, 4), torch.nn.GRUCell(3, 4)):
        x = torch.randn(2, 3, requires_grad=True)
        results = []
        for device in ("cpu", "hologram"):
            m = copy.deepcopy(cell).to(device)
            xd = x.detach().to(device).requires_grad_()
            out = m(xd)
            out = out[0] if isinstance(out, tuple) else out
            (g,) = torch.autograd.grad(out.square().sum(), xd, create_graph=True)
            (gg,) = torch.autograd.grad(g.sum(), xd)
            results.append((g.detach().cpu(), gg.cpu()))
        for got, ref in zip(results[1], results[0]):
            torch.testing.assert_close(got, ref, **TOL)


def test_packed_sequence_matches_cpu():
    torch.manual_seed(7)
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    x = torch.randn(3, 5, 3)
    lengths = torch.tensor([5, 3, 2])
    outs = []
    for device in ("cpu", "hologram"):
        m = copy.deepcopy(lstm).to(device)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x.to(device), lengths,
                                                         batch_first=True)
        out, _ = m(packed)
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        outs.append(padded.detach().cpu())
    torch.testing.assert_close(outs[1], outs[0], **TOL)


def test_out_forms_of_the_fused_cells():
    ig, hg = torch.randn(2, 16, device="hologram"), torch.randn(2, 16, device="hologram")
    cx = torch.randn(2, 4, device="hologram")
    outs = [torch.empty(0, device="hologram") for _ in range(3)]
    hy, cy, ws = torch.ops.aten._thnn_fused_lstm_cell.out(ig, hg, cx, out0=outs[0],
                                                          out1=outs[1], out2=outs[2])
    assert hy is outs[0] and ws.shape == (2, 16)
    ref = torch.ops.aten._thnn_fused_lstm_cell(ig, hg, cx)
    for a, b in zip((hy, cy, ws), ref):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)


def _module_cases():
    # Imported here, after hologram_torch: the database must see the device registered.
    from torch.testing._internal.common_modules import module_db

    wanted = ("LSTM", "LSTMCell", "GRU", "GRUCell")
    return [pytest.param(m, id=m.module_cls.__name__) for m in module_db
            if m.module_cls.__name__ in wanted]


@pytest.mark.parametrize("info", _module_cases())
def test_module_db_samples_match_cpu(info):
    """Every sample of PyTorch's ModuleInfo database for the recurrent modules: outputs and
    the gradients of inputs and parameters, against the CPU."""
    samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                      requires_grad=True, training=True)
    for sample in samples:
        if sample.forward_input is None:
            continue
        args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
        torch.manual_seed(0)
        module = info.module_cls(*args, **kwargs)
        _compare(_Positional(module, sample.forward_input.kwargs),
                 *sample.forward_input.args)


class _Positional(torch.nn.Module):
    """``module(*tensors, **kwargs)`` with tuples of tensors (an LSTM's state) flattened
    into the positional arguments _compare passes."""

    def __init__(self, module, kwargs):
        super().__init__()
        self.module = module
        self.kwargs = kwargs

    def forward(self, *args):
        return self.module(*args, **self.kwargs)
