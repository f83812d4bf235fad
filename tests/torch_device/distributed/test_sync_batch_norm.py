"""The statistics ops of nn.SyncBatchNorm on the hologram device: two ranks simulated in
one process (two parts of a batch, their statistics gathered as SyncBatchNorm's
all_gather and all_reduce would) give the CPU's batch norm over the whole batch —
output, running statistics and gradients."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hologram_torch  # noqa: E402

F = torch.nn.functional
TOL = {"rtol": 1e-5, "atol": 1e-5}
EPS, MOMENTUM = 1e-5, 0.1


def _sync_batch_norm(parts, weight, bias, running_mean, running_var, grad_parts):
    """SyncBatchNorm's forward and backward (torch/nn/modules/_functions.py) over ranks
    holding ``parts``; the collectives are a stack and a sum."""
    stats = [torch.batch_norm_stats(x, EPS) for x in parts]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = [x.numel() // x.shape[1] for x in parts]
    counts_t = torch.tensor(counts, dtype=mean_all.dtype, device=mean_all.device)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        parts[0], mean_all, invstd_all, running_mean, running_var, MOMENTUM, EPS, counts_t)
    outs = [torch.batch_norm_elemt(x, weight, bias, mean, invstd, EPS) for x in parts]

    reduced = [torch.batch_norm_backward_reduce(dy, x, mean, invstd, weight, True, True,
                                                True) for dy, x in zip(grad_parts, parts)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    count = torch.tensor(counts, dtype=torch.int32, device=parts[0].device)
    grads = [torch.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                             count) for dy, x in zip(grad_parts, parts)]
    return (torch.cat(outs), torch.cat(grads), sum(r[2] for r in reduced),
            sum(r[3] for r in reduced))


@pytest.mark.parametrize("shape, split", [((6, 3, 4, 5), [2, 4]), ((8, 4, 7), [4, 4]),
                                          ((5, 2, 3, 2, 2), [3, 2])])
def test_two_ranks_equal_batch_norm_over_the_batch(shape, split):
    torch.manual_seed(sum(shape))
    x = torch.randn(*shape) * 3 + 1
    dy = torch.randn(*shape)
    weight = torch.rand(shape[1]) + 0.5
    bias = torch.randn(shape[1])
    running = (torch.randn(shape[1]), torch.rand(shape[1]) + 0.5)

    xr = x.clone().requires_grad_()
    wr = weight.clone().requires_grad_()
    br = bias.clone().requires_grad_()
    rm, rv = (t.clone() for t in running)
    ref = F.batch_norm(xr, rm, rv, wr, br, training=True, momentum=MOMENTUM, eps=EPS)
    ref.backward(dy)

    device = [t.to("hologram") for t in (x, dy, weight, bias, *running)]
    dx, ddy, dw, db, drm, drv = device
    hologram_torch.reset_fallback_stats()
    out, grad, grad_w, grad_b = _sync_batch_norm(
        list(dx.split(split)), dw, db, drm, drv, list(ddy.split(split)))
    assert hologram_torch.fallback_stats(lacking=False) == {}
    for got, want in ((out, ref), (grad, xr.grad), (grad_w, wr.grad), (grad_b, br.grad),
                      (drm, rm), (drv, rv)):
        torch.testing.assert_close(got.cpu(), want.detach(), **TOL)


def test_equal_counts_without_the_counts_tensor():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 5)
    rm, rv = torch.zeros(3), torch.ones(3)
    parts = list(x.to("hologram").split(2))
    stats = [torch.batch_norm_stats(p, EPS) for p in parts]
    drm, drv = rm.to("hologram"), rv.to("hologram")
    mean, invstd = torch.batch_norm_gather_stats(
        parts[0], torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]),
        drm, drv, MOMENTUM, EPS, 10)
    ref = F.batch_norm(x, rm, rv, training=True, momentum=MOMENTUM, eps=EPS)
    torch.testing.assert_close(mean.cpu(), x.mean((0, 2)), **TOL)
    torch.testing.assert_close(invstd.cpu(), (x.var((0, 2), unbiased=False) + EPS).rsqrt(),
                               **TOL)
    torch.testing.assert_close(drv.cpu(), rv, **TOL)
    out = torch.batch_norm_elemt(parts[0], None, None, mean, invstd, EPS)
    torch.testing.assert_close(out.cpu(), ref[:2], **TOL)


def test_without_weight_and_masked_gradients():
    torch.manual_seed(2)
    x = torch.randn(4, 3, 2, device="hologram")
    dy = torch.randn(4, 3, 2, device="hologram")
    mean, invstd = torch.batch_norm_stats(x, EPS)
    sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(dy, x, mean, invstd, None,
                                                                  False, False, True)
    assert sum_dy is None and sum_dy_xmu is None and gw is None
    torch.testing.assert_close(gb.cpu(), dy.cpu().sum((0, 2)), **TOL)
