"""Module conversions keep Parameter objects on the hologram device, as they do on CUDA:
weights tied by sharing one Parameter stay tied through every path that moves or rebuilds
a module (``.to``, ``.cpu()``, ``.half()``/``.float()``, ``load_state_dict``, ``deepcopy``,
optimizer state, checkpoints)."""

from __future__ import annotations

import copy
import io
import warnings

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402,F401


class Tied(torch.nn.Module):
    """A language-model head sharing the token embedding's weight."""

    def __init__(self, vocab=10, dim=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(self.emb(tokens))


def _tied(m: Tied) -> bool:
    return m.head.weight is m.emb.weight and len(list(m.parameters())) == 1


def test_to_device_keeps_the_parameter_object():
    m = Tied()
    w = m.emb.weight
    values = w.detach().clone()
    assert m.to("hologram") is m
    assert _tied(m) and m.emb.weight is w
    assert type(w) is torch.nn.Parameter and w.requires_grad and w.is_leaf
    assert w.device.type == "hologram"
    torch.testing.assert_close(w.detach().cpu(), values, rtol=0, atol=0)


@pytest.mark.parametrize("move", [
    lambda m: m.hologram(),
    lambda m: m.to(torch.device("hologram", 0)),
    lambda m: m.to("hologram", torch.float64),
    lambda m: m.to_empty(device="hologram"),
])
def test_every_move_to_the_device_keeps_ties(move):
    m = Tied()
    w = m.emb.weight
    move(m)
    assert _tied(m) and m.emb.weight is w and w.device.type == "hologram"


def test_dtype_changes_on_the_device_and_the_way_back_keep_ties():
    m = Tied()
    w = m.emb.weight
    m.to("hologram").half()
    assert _tied(m) and m.emb.weight is w and w.dtype == torch.float16
    m.float()
    assert _tied(m) and w.dtype == torch.float32 and w.device.type == "hologram"
    m.cpu()
    assert _tied(m) and m.emb.weight is w and w.device.type == "cpu"


def test_gradient_and_attributes_move_with_the_parameter():
    m = Tied()
    w = m.emb.weight
    w.note = "kept"  # attributes users hang on parameters stay
    m(torch.tensor([1, 2])).sum().backward()
    grad = w.grad.clone()
    m.to("hologram")
    assert w.grad.device.type == "hologram" and w.note == "kept"
    torch.testing.assert_close(w.grad.cpu(), grad, rtol=0, atol=0)


def test_tensor_hooks_move_with_the_parameter():
    m = torch.nn.Linear(3, 2)
    calls = []
    m.weight.register_hook(lambda g: calls.append("hook") or g * 2)
    m.weight.register_post_accumulate_grad_hook(lambda p: calls.append("accumulated"))
    m.to("hologram")
    m(torch.ones(1, 3, device="hologram")).sum().backward()
    assert calls == ["hook", "accumulated"]
    torch.testing.assert_close(m.weight.grad.cpu(), torch.full((2, 3), 2.0))


def test_shared_gradient_is_the_sum_of_both_uses():
    torch.manual_seed(0)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    m = Tied()
    d = copy.deepcopy(m).to("hologram")
    m(tokens).square().mean().backward()
    d(tokens.to("hologram")).square().mean().backward()
    torch.testing.assert_close(d.emb.weight.grad.cpu(), m.emb.weight.grad, rtol=1e-5,
                               atol=1e-6)


def test_optimizer_built_before_the_move_updates_the_module():
    m = Tied()
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    m.to("hologram")
    before = m.emb.weight.detach().cpu()
    m(torch.tensor([1, 2], device="hologram")).sum().backward()
    optimizer.step()
    assert not torch.equal(m.emb.weight.detach().cpu(), before)


def test_load_state_dict_keeps_ties_and_copies_values():
    source = Tied()
    m = Tied().to("hologram")
    w = m.emb.weight
    m.load_state_dict(source.state_dict())
    assert _tied(m) and m.emb.weight is w and w.device.type == "hologram"
    torch.testing.assert_close(w.detach().cpu(), source.emb.weight.detach(), rtol=0, atol=0)


def test_deepcopy_of_a_device_model_keeps_ties():
    m = Tied().to("hologram")
    c = copy.deepcopy(m)
    assert _tied(c) and c.emb.weight is not m.emb.weight
    assert c.emb.weight.device.type == "hologram"
    torch.testing.assert_close(c.emb.weight.detach().cpu(), m.emb.weight.detach().cpu())


def test_checkpoint_of_module_and_state_dicts_round_trips():
    m = Tied().to("hologram")
    optimizer = torch.optim.Adam(m.parameters(), lr=0.01)
    m(torch.tensor([1, 2], device="hologram")).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save({"model": m, "state": m.state_dict(), "opt": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    assert _tied(saved["model"]) and saved["model"].emb.weight.device.type == "hologram"

    # Restore on the CPU, then move: the model and the optimizer state both follow.
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu", weights_only=False)
    restored = Tied()
    restored.load_state_dict(on_cpu["state"])
    restored.to("hologram")
    opt2 = torch.optim.Adam(restored.parameters(), lr=0.01)
    opt2.load_state_dict(on_cpu["opt"])
    state = opt2.state[restored.emb.weight]
    assert state["exp_avg"].device.type == "hologram"
    for model, opt in ((m, optimizer), (restored, opt2)):
        opt.zero_grad()
        model(torch.tensor([3, 4], device="hologram")).sum().backward()
        opt.step()
    torch.testing.assert_close(restored.emb.weight.detach().cpu(),
                               m.emb.weight.detach().cpu(), rtol=0, atol=0)


def test_a_live_graph_keeps_torch_behaviour_with_a_warning():
    m = Tied()
    loss = m(torch.tensor([1])).sum()  # the graph holds the weight
    with pytest.warns(UserWarning, match="no longer shared"):
        m.to("hologram")
    assert m.emb.weight.device.type == "hologram"
    del loss


def test_torch_future_flags_are_respected():
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        m = Tied()
        w = m.emb.weight
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            m.to("hologram")
        assert m.emb.weight is not w  # the user asked for new Parameters
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)


def test_fake_tensor_conversions_are_left_to_torch():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    m = Tied()
    w = m.emb.weight
    with FakeTensorMode(allow_non_fake_inputs=True):
        m.to("hologram")
    assert isinstance(m.emb.weight, FakeTensor) and m.emb.weight.device.type == "hologram"
    assert w.device.type == "cpu" and not isinstance(w, FakeTensor)
