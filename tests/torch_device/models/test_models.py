"""End-to-end training on the hologram device against the same run on the CPU: an MLP
regression and a small transformer (nn.TransformerEncoderLayer) on a synthetic token task,
20 Adam steps each; the losses must agree within 1e-4 relative at every step. Then the
models of issue 17 (tied weights, LSTM/GRU, CNN) with SGD, and every model of the suite
under bfloat16 and float16 autocast against the CPU's autocast run."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402

STEPS = 20
RTOL = 1e-4


class TokenModel(torch.nn.Module):
    """Embedding -> 2 encoder layers -> vocabulary logits."""

    def __init__(self, vocab=16, d_model=32, heads=4, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=64,
                                                 dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def _train(model, batches, loss_fn, device, method="adam"):
    """A copy of ``model`` on ``device`` trained one step per batch with Adam (lr 1e-3) or
    ``"sgd"`` (lr 0.05, momentum 0.9): (the losses, the trained copy)."""
    model = copy.deepcopy(model).to(device)
    if method == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


def _token_task(vocab, shape, target, steps):
    """``steps`` batches of random token ids (``shape``, below ``vocab``) with the ids
    ``target(x)`` to predict, and the loss: cross-entropy over every position."""
    batches = []
    for _ in range(steps):
        x = torch.randint(0, vocab, shape)
        batches.append((x, target(x)))

    def loss_fn(logits, y):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))

    return batches, loss_fn


def _assert_same_run(model, batches, loss_fn, compare_parameters=True):
    cpu_losses, cpu_model = _train(model, batches, loss_fn, "cpu")
    device_losses, device_model = _train(model, batches, loss_fn, "hologram")
    for step, (d, c) in enumerate(zip(device_losses, cpu_losses)):
        assert abs(d - c) <= RTOL * abs(c), f"step {step}: hologram {d} vs cpu {c}"
    assert device_losses[-1] < device_losses[0]  # it learned something
    if not compare_parameters:
        return
    for (name, p), q in zip(device_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-3, atol=1e-4,
                                   msg=f"parameter {name}")


def test_mlp_regression_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    w = torch.randn(16, 1)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(64, 16)
        batches.append((x, x @ w + 0.1 * torch.randn(64, 1)))
    _assert_same_run(model, batches, torch.nn.functional.mse_loss)


def test_transformer_matches_cpu():
    torch.manual_seed(0)
    vocab = 16
    model = TokenModel(vocab)
    # predict the next token id
    batches, loss_fn = _token_task(vocab, (8, 12), lambda x: (x + 1) % vocab, STEPS)
    # Parameters are not compared: the attention's key bias has a zero true gradient
    # (softmax ignores a shift shared by all keys), so Adam turns rounding noise of either
    # run into full-size steps there. The losses are the meaningful check.
    _assert_same_run(model, batches, loss_fn, compare_parameters=False)


# --- models of issue 17: 5 SGD steps, losses within 1e-5 of the CPU run -----------------

SGD_STEPS = 5
SGD_RTOL = 1e-5


def assert_sgd_matches_cpu(model, batches, loss_fn):
    """Inference equal within 1e-5, then 5 SGD steps with equal losses (1e-5 relative)."""
    x = batches[0][0]
    with torch.no_grad():
        ref = model(x)
        got = copy.deepcopy(model).to("hologram")(x.to("hologram"))
    got, ref = (got, ref) if isinstance(ref, torch.Tensor) else (got[0], ref[0])
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    cpu, _ = _train(model, batches, loss_fn, "cpu", "sgd")
    device, trained = _train(model, batches, loss_fn, "hologram", "sgd")
    for step, (d, c) in enumerate(zip(device, cpu)):
        assert abs(d - c) <= SGD_RTOL * abs(c), f"step {step}: hologram {d} vs cpu {c}"
    assert device[-1] < device[0]
    return trained


class TiedLM(torch.nn.Module):
    """Token embedding shared with the output layer (as most language models do)."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mix = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def test_tied_weights_train_like_cpu():
    torch.manual_seed(0)
    vocab = 32
    batches, loss_fn = _token_task(vocab, (8, 6), lambda x: (x * 3 + 1) % vocab, SGD_STEPS)
    trained = assert_sgd_matches_cpu(TiedLM(vocab), batches, loss_fn)
    assert trained.head.weight is trained.embed.weight


class Recurrent(torch.nn.Module):
    """Embedding -> LSTM -> GRU -> per-step logits."""

    def __init__(self, vocab=16, dim=12, hidden=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.lstm = torch.nn.LSTM(dim, hidden, batch_first=True)
        self.gru = torch.nn.GRU(hidden, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        x, _ = self.lstm(self.embed(tokens))
        x, _ = self.gru(x)
        return self.head(x)


def test_lstm_gru_model_trains_like_cpu():
    torch.manual_seed(0)
    vocab = 16
    # recall the previous token
    batches, loss_fn = _token_task(vocab, (4, 7), lambda x: x.roll(1, 1), SGD_STEPS)
    hologram_torch.reset_fallback_stats()
    assert_sgd_matches_cpu(Recurrent(vocab), batches, loss_fn)
    assert not any("thnn" in op for op in hologram_torch.fallback_stats())


class SmallCNN(torch.nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1, groups=2), torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def test_cnn_trains_like_cpu():
    torch.manual_seed(0)
    batches = [(torch.randn(8, 3, 12, 12), torch.randint(0, 5, (8,)))
               for _ in range(SGD_STEPS)]
    model = SmallCNN()
    loss_fn = torch.nn.functional.cross_entropy
    hologram_torch.reset_fallback_stats()
    trained = assert_sgd_matches_cpu(model, batches, loss_fn)
    # convolutions, batch norm, pooling and the rest all run on the device
    assert hologram_torch.fallback_stats(lacking=False) == {}
    _, reference = _train(model, batches, loss_fn, "cpu", "sgd")
    for (name, b), c in zip(trained.named_buffers(), reference.buffers()):
        torch.testing.assert_close(b.cpu(), c, rtol=1e-5, atol=1e-6, msg=name)
    # Inference with the running statistics the training left.
    x = batches[0][0]
    with torch.no_grad():
        torch.testing.assert_close(trained.eval()(x.to("hologram")).cpu(),
                                   reference.eval()(x), rtol=1e-5, atol=1e-5)


# --- every model of the suite under autocast, against the CPU's autocast run ------------

def _mlp_case():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    batches = [(x, x.sum(1, keepdim=True)) for x in torch.randn(SGD_STEPS, 64, 16)]
    return model, batches, torch.nn.functional.mse_loss


def _token_case(make_model, vocab, shape, target):
    """One batch learned by heart: over a few steps, fresh batches of random tokens leave
    a small recurrent model's loss where it started (2.78 -> 2.80 in 5 steps)."""
    torch.manual_seed(0)  # (before the model: its initial weights must not depend on the
    model = make_model()  # tests that ran before in the process)
    x = torch.randint(0, vocab, shape)
    batches = [(x, target(x))] * SGD_STEPS

    def loss_fn(logits, y):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(),
                                                 y.reshape(-1))

    return model, batches, loss_fn


def _cnn_case():
    """One batch of random labels, learned by heart."""
    torch.manual_seed(0)
    return (SmallCNN(), [(torch.randn(8, 3, 12, 12), torch.randint(0, 5, (8,)))] * SGD_STEPS,
            torch.nn.functional.cross_entropy)


AUTOCAST_MODELS = {
    "mlp": _mlp_case,
    "transformer": lambda: _token_case(lambda: TokenModel(16), 16, (8, 12),
                                       lambda x: (x + 1) % 16),
    "tied": lambda: _token_case(lambda: TiedLM(32), 32, (8, 6), lambda x: (x * 3 + 1) % 32),
    "lstm_gru": lambda: _token_case(lambda: Recurrent(16), 16, (4, 7), lambda x: x.roll(1, 1)),
    "cnn": _cnn_case,
}



def _autocast_losses(model, batches, loss_fn, device, dtype):
    """SGD steps under ``torch.autocast(device, dtype)`` (off for float32) with a
    GradScaler (float16's gradients need it; bfloat16 runs it too)."""
    torch.manual_seed(1)
    model = copy.deepcopy(model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(AUTOCAST_MODELS))
def test_every_model_trains_like_the_cpu_under_autocast(name, dtype):
    """The products (and convolutions) in the low dtype on both sides, the rest in float32:
    the losses agree within a few units of the low dtype's last place per step."""
    model, batches, loss_fn = AUTOCAST_MODELS[name]()
    # PyTorch's CPU has no float16 LSTM (oneDNN refuses the primitive): the reference is
    # the CPU's float32 run there.
    reference = torch.float32 if (name, dtype) == ("lstm_gru", torch.float16) else dtype
    cpu = _autocast_losses(model, batches, loss_fn, "cpu", reference)
    device = _autocast_losses(model, batches, loss_fn, "hologram", dtype)
    torch.testing.assert_close(torch.tensor(device), torch.tensor(cpu), rtol=3e-2,
                               atol=3e-2)
    assert device[-1] < device[0]
