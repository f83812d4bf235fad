"""Recorded execution on the torch device (hologram_torch.lazy): ops recorded into regions,
run op by op the first time a region's structure is seen and as one fused program after,
with every result, alias and error as eager execution gives it.

The references are the same code run eagerly on the device (``set_lazy(False)``) and on
the CPU. Fused programs are compiled on a background thread; the tests wait for them
(:func:`lazy.wait_for_compiles`) so that later steps do run fused."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import hologram  # noqa: E402
import hologram_torch  # noqa: E402
from hologram.runtime import compile_process  # noqa: E402
from hologram_torch import lazy  # noqa: E402
from hologram_torch.aten import runner  # noqa: E402

DEV = torch.device("hologram", 0)
pytestmark = pytest.mark.filterwarnings("ignore::hologram_torch.FallbackWarning")


@pytest.fixture(autouse=True)
def recorded():
    with hologram_torch.set_lazy(True):
        # (an earlier test's pending ops, or a compile it submitted, would be counted in
        # this test's stats)
        torch.hologram.synchronize()
        assert lazy.wait_for_compiles(120)
        lazy.reset_stats()
        yield
    assert not lazy.pending()  # switching off ran what was pending


def repeat(fn, times=4):
    """``fn()`` ``times`` times, its fused programs compiled in between; the results."""
    results = []
    for _ in range(times):
        results.append(fn())
        assert lazy.wait_for_compiles(120)
    return results


def matches_eager(run, times=3):
    """``run()`` recorded ``times`` times (op by op, then fused) gives what it gives run
    eagerly, tensor for tensor (dtype, shape, strides and bits)."""
    with hologram_torch.set_lazy(False):
        want = run()
    for got in repeat(run, times):
        for a, b in zip(got, want):
            same(a, b)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)


def test_a_chain_runs_op_by_op_then_fused_with_eager_results():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(33, 17, generator=g)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), -0.0

    def chain(t):
        y = (t * 2 + 1).relu()
        return (y.exp() - y.sin()).sum(1), y.t().mean(0), (y > 1).sum()

    want = chain(x)
    runs = repeat(lambda: [r.cpu() for r in chain(x.to(DEV))])
    stats = lazy.stats()
    assert stats["op_by_op_runs"] == 2 and stats["fused_runs"] == 2, stats
    assert stats["compiles"] == 1
    # On the cpu backend (with a disk cache) the helper process built it.
    helped = runner.backend() in compile_process.BACKENDS and hologram.config.get().disk_cache
    assert stats["compiled_elsewhere"] == int(helped), stats
    for got in runs:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, equal_nan=True)
    for got in runs[2:]:  # fused and op by op: the same bits
        for a, b in zip(got, runs[0]):
            same(a, b)


def test_regions_of_the_same_ops_wired_or_kept_differently_get_their_own_programs():
    """The memo tells regions apart by their entries and by their structure: how operands
    connect and which results outlive the cut. Here all four regions are the same two
    launches (an add and a mul of (7, 5) floats); a fused program of one run for another
    would read the wrong operand or leave a kept result unwritten."""
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(7, 5, generator=g), torch.randn(7, 5, generator=g)
    da, db = a.to(DEV), b.to(DEV)

    def run(swap, keep):
        y = da + db
        z = y * (da if swap else db)
        if keep:
            return y.cpu(), z.cpu()
        del y  # a temporary by the cut: the fused program need not write it
        return (z.cpu(),)

    for _ in range(4):
        for swap in (False, True):
            for keep in (False, True):
                y = a + b
                want = (y, y * (a if swap else b)) if keep else (y * (a if swap else b),)
                for got, w in zip(run(swap, keep), want):
                    torch.testing.assert_close(got, w, rtol=0, atol=0)
        assert lazy.wait_for_compiles(120)
    stats = lazy.stats()
    assert stats["compiles"] == 4 and stats["fused_runs"] >= 4, stats


def test_results_keep_eager_layouts_and_views_of_pending_results_read_them():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)

    def run(t):
        y = t + 1  # channels_last, as on the CPU
        z = y.permute(0, 2, 3, 1)[:, 1:, ::2] * 3  # a view of a pending result
        w = (t.sum((2, 3)) + 1).t()  # contiguous pending result, read transposed
        return y, z, w * 2

    matches_eager(lambda: run(x.to(DEV)), 4)


def test_in_place_ops_and_aliases_see_every_write():
    def run():
        base = torch.arange(24.0, device=DEV).reshape(4, 6)
        view = base[1:3, ::2]
        view.mul_(10)  # a write through a view, seen by base
        base.add_(1)
        row = base[0]
        total = base.sum()
        row.fill_(-1)  # after total: total keeps the earlier value
        base.t()[0].sub_(5)  # another alias
        return base.cpu(), view.cpu(), total.cpu()

    matches_eager(run)


def test_in_place_updates_of_memory_the_region_reads_are_staged():
    """An optimizer-like chain on tensors that exist before the region: every update reads
    the memory the next one writes (contiguous and strided targets alike)."""
    g = torch.Generator().manual_seed(3)
    start = [torch.randn(5, 6, generator=g), torch.randn(6, generator=g)]

    def run():
        w, b = (t.to(DEV) for t in start)
        state = torch.zeros(5, 6, device=DEV)
        torch.hologram.synchronize()
        for step in range(3):
            grad = (w * 0.5 + b).tanh()  # reads w and b
            state.mul_(0.9).add_(grad, alpha=0.1)  # in place, read back at once
            w.sub_(state * 0.01 * (step + 1))
            w.t()[2].add_(b[:5])  # a strided in-place write of memory read above
            b.mul_(0.99)
            total = w.sum() + b.sum()
        return w.cpu(), b.cpu(), state.cpu(), total.cpu()

    matches_eager(run)
    assert lazy.stats()["fused_runs"] >= 1 and lazy.stats()["staged"] >= 1


def test_updates_read_only_at_their_own_elements_are_written_in_place():
    """An optimizer's updates (``m = 0.9 m + g``, ``w -= lr m``) read the memory they write
    only element for element, or in kernels before the write (the product reads ``w``
    transposed, and the loss's sum ends its kernel): the fused program writes them in
    place, nothing staged. A transposed read in the writing kernel (a GPU's threads would
    see written elements) is staged."""
    g = torch.Generator().manual_seed(4)
    start = [torch.randn(8, 8, generator=g) for _ in range(3)]

    def update():
        w, m, x = (t.to(DEV) for t in start)
        torch.hologram.synchronize()
        lazy.reset_stats()
        for _ in range(3):
            loss = torch.tanh(x @ w.t()).sum()
            m.mul_(0.9).add_(x * loss)
            w.sub_(m, alpha=0.01)
            torch.hologram.synchronize()
        return w.cpu(), m.cpu()

    matches_eager(update)
    assert lazy.stats()["fused_runs"] >= 1 and lazy.stats()["staged"] == 0

    def crossed():
        w = start[0].to(DEV)
        torch.hologram.synchronize()
        lazy.reset_stats()
        y = w.t() * 2
        w.add_(y)  # w + 2 w.t(), one kernel: its transposed read of w must see the old w
        return y.cpu(), w.cpu()

    matches_eager(crossed)
    assert lazy.stats()["fused_runs"] == 1 and lazy.stats()["staged"] == 1


def test_strided_writes_over_memory_the_region_reads_are_staged():
    """A diagonal or a column written over memory the region reads before it: the fused
    program writes such a result contiguously, so it goes to a scratch block copied into
    place through the view's strides (it was written in place, contiguously from the
    view's first element: a row instead of the diagonal)."""
    def run():
        a, b = torch.zeros(4, 4, device=DEV), torch.ones(3, 5, device=DEV)
        torch.hologram.synchronize()
        d = a.diagonal().clone()
        a.diagonal().fill_(9)  # reads nothing; writes memory read before it
        c = b.sum(1)
        b[:, 1].fill_(7)
        return a.cpu(), d.cpu(), b.cpu(), c.cpu()

    matches_eager(run)
    assert lazy.stats()["fused_runs"] >= 1 and lazy.stats()["staged"] >= 2


def test_zero_fills_of_memory_the_region_does_not_touch_are_memsets_at_once():
    start = torch.randn(6, 5, generator=torch.Generator().manual_seed(5))

    def run():
        a, c = start.to(DEV), start.to(DEV)
        torch.hologram.synchronize()
        b = a + 1  # pending: reads a
        recorded = lazy.stats()["recorded"]
        a.zero_()  # recorded after the read
        c[1].zero_()  # untouched by the region: a memset now
        assert lazy.stats()["recorded"] == recorded + lazy.active()
        return b.cpu(), a.cpu(), c.cpu()

    matches_eager(run)


def test_views_of_dense_results_and_whole_reshaped_writes_do_not_cut():
    """A result in a permuted dense layout (a pointwise op on a transposed operand keeps
    its strides) read through another view, and a contiguous result written in place
    whole through a reshape (attention's projection and its bias): one region, as eager
    gives."""
    g = torch.Generator().manual_seed(6)
    a, b, c = (torch.randn(*s, generator=g) for s in ((4, 6, 5), (12, 8), (8,)))

    def run():
        x, w, bias = a.to(DEV), b.to(DEV), c.to(DEV)
        torch.hologram.synchronize()
        lazy.reset_stats()
        p = x.transpose(1, 2) * 2  # strides of the transposed x: dense, not contiguous
        q = p.transpose(1, 2) + 1  # a view of p's memory in another order
        y = x.reshape(2, 12, 5).transpose(1, 2) @ w  # (2, 5, 8), contiguous
        y.view(10, 8).add_(bias)  # the same memory, written whole through a reshape
        out = (p.cpu(), q.cpu(), y.cpu())
        if lazy.active():
            assert lazy.stats()["regions"] == 1, lazy.stats()
        return out

    matches_eager(run)


def test_an_attention_training_step_is_one_region():
    """A transformer layer's step (attention splits its packed projection with
    ``select``: the gradient is ``select_backward``, one program, not a fill and copies
    into views) records into one region, cut only at the synchronize; the loss and
    weights as eager gives them."""
    def run():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                                 batch_first=True).to(DEV)
        opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
        x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1)).to(DEV)
        losses = []
        for _ in range(3):
            torch.hologram.synchronize()
            lazy.reset_stats()
            opt.zero_grad()
            loss = layer(x).square().mean()
            loss.backward()
            opt.step()
            torch.hologram.synchronize()
            if lazy.active():
                assert lazy.stats()["cuts"] == {"synchronize": 1}, lazy.stats()
            losses.append(loss.detach())
        return (*losses, *(p.detach() for p in layer.parameters()))

    with hologram_torch.set_lazy(False):
        want = run()
    for got in repeat(run, 2):
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-6)


def test_foreach_calls_seen_before_record_their_rows_straight_away():
    """An optimizer's foreach calls: from the second call of a signature the rows are
    recorded without the per-row kernels (their scalar lists change every step: runtime
    operands); the same signature on overlapping memory takes PyTorch's path, as eagerly."""
    g = torch.Generator().manual_seed(7)
    start = [torch.randn(5, 4, generator=g), torch.randn(7, generator=g)]

    def outcome(fn):
        try:
            return fn()
        except RuntimeError as e:
            return str(e)

    def run():
        ps = [t.to(DEV) for t in start]
        ms = [torch.zeros_like(p) for p in ps]
        base = torch.arange(12.0, device=DEV)
        c, d = torch.zeros(5, device=DEV), torch.ones(5, device=DEV)
        got = []
        for step in range(4):
            torch._foreach_mul_(ms, 0.9)
            torch._foreach_add_(ms, ps, alpha=0.1)
            roots = torch._foreach_sqrt(torch._foreach_add(ms, 1.0))
            torch._foreach_addcdiv_(ps, ms, roots, [-0.1 * (step + 1), 0.2 / (step + 1)])
            torch._foreach_add_([c], [d])  # files the signature of the next call
            got.append(outcome(lambda: torch._foreach_add_([base[1:6]], [base[0:5]])))
        return [*ps, *ms, base, c, str(got)]

    with hologram_torch.set_lazy(False):
        want = run()
    for _ in range(3):
        got = run()
        assert got[-1] == want[-1]
        for a, b in zip(got[:-1], want[:-1]):
            same(a, b)


def test_out_and_overlapping_writes_behave_as_eagerly():
    def run():
        a = torch.linspace(-2, 2, 12, device=DEV)
        out = torch.empty(12, device=DEV)
        torch.mul(a, 3, out=out)
        torch.add(out, a, out=a)  # out read, a written
        b = a.clone()
        b[2:].copy_(b[:-2].clone())
        return a.cpu(), out.cpu(), b.cpu()

    matches_eager(run)


def test_numbers_and_cpu_scalars_are_runtime_operands():
    x = torch.randn(64).to(DEV)
    results = []
    for step in range(6):
        scale = torch.tensor(step + 0.5)  # a CPU scalar, changed after recording
        y = (x * scale + step * 0.25).abs()
        scale += 100
        results.append(y.sum().cpu())
        assert lazy.wait_for_compiles(120)
        if step == 2:
            compiled = lazy.stats()["compiles"]
    assert lazy.stats()["compiles"] == compiled  # no compile after the third step
    for step, got in enumerate(results):
        want = (x.cpu() * (step + 0.5) + step * 0.25).abs().sum()
        torch.testing.assert_close(got, want)


def test_calls_with_numbers_are_recorded_by_the_front_kernels():
    """A call with a Scalar argument whose signature the front kernel serves (ReLU6's
    ``hardtanh``, ``x * 0.5``, ``x.add_(1)``) is recorded natively, as it is launched
    eagerly: no Python kernel runs (hardtanh took ~60 µs through Python), and the numbers
    stay runtime operands (other values, the same structure: no compile after the third
    step)."""
    from hologram_torch import native

    if not native.fast_active():
        pytest.skip("needs the device's native library")
    x0 = torch.linspace(-8, 8, 96).reshape(8, 12)
    x0[0, 0], x0[0, 1], x0[0, 2] = float("nan"), -0.0, float("inf")

    def step(x, k):
        y = torch.nn.functional.hardtanh(x, 0.0, 6.0) * (0.5 + k)
        return y.add_(k).cpu()

    def served(steps):
        """``steps``'s results, and the front kernels' hits and misses over them."""
        before = native.fast_stats()
        results = steps()
        after = native.fast_stats()
        return results, (after["hits"] - before["hits"], after["misses"] - before["misses"])

    x = x0.to(DEV)
    with hologram_torch.set_lazy(False):
        step(x, 0)  # files each call's signature
        want, eager = served(lambda: [step(x, k) for k in range(6)])

    def recorded():
        results = []
        for k in range(6):
            results.append(step(x, k))
            assert lazy.wait_for_compiles(120)
            if k == 2:
                results.append(lazy.stats()["compiles"])
        return results

    got, counts = served(recorded)
    assert counts == eager, (counts, eager)
    if runner.host_memory():  # (the front kernels serve host memory only)
        assert eager[0] == 3 * 6, eager
    compiled = got.pop(3)
    assert lazy.stats()["compiles"] == compiled and lazy.stats()["fused_runs"] >= 2
    for a, b in zip(got, want):
        same(a, b)


def test_temporaries_are_not_written():
    x = torch.randn(100).to(DEV)

    def run():
        a = x * 2
        b = a.exp()
        total = (b + 1).sum()
        del a, b
        return total.cpu()

    repeat(run, 3)
    (plan,) = [p for p in _plans(run)]
    _, nodes, outputs = plan
    assert len(nodes) == 4 and len(outputs) == 1  # only the sum is live at the cut


def _plans(fn):
    plans = []
    submit = lazy._compiler.submit
    lazy._compiler.submit = lambda memo, plan, aliases: plans.append(plan)
    lazy._memo.clear()
    try:
        fn()
        fn()
    finally:
        lazy._compiler.submit = submit
    return plans


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_training_matches_eager_and_compiles_nothing_after_step_three(opt):
    """An MLP trained with a cosine schedule (a new learning rate every step): the same
    losses and weights as eager execution, and no compile after the third step."""
    import hologram

    def train(steps=8):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 1)).to(DEV)
        o = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt == "sgd"
             else torch.optim.AdamW(model.parameters(), lr=1e-2))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(o, steps)
        g = torch.Generator().manual_seed(1)
        losses = []
        for step in range(steps):
            x, y = torch.randn(16, 12, generator=g), torch.randn(16, 1, generator=g)
            loss = torch.nn.functional.mse_loss(model(x.to(DEV)), y.to(DEV))
            o.zero_grad()
            loss.backward()
            o.step()
            sched.step()
            losses.append(loss.item())
            assert lazy.wait_for_compiles(120)
            if step == 2:
                before = (lazy.stats()["compiles"], hologram.cache_info()["misses"])
        after = (lazy.stats()["compiles"], hologram.cache_info()["misses"])
        return losses, [p.detach().cpu() for p in model.parameters()], before, after

    with hologram_torch.set_lazy(False):
        want_losses, want_params, _, _ = train()
    losses, params, before, after = train()
    assert losses == want_losses
    for a, b in zip(params, want_params):
        same(a, b)
    assert before == after
    assert lazy.stats()["fused_runs"] > 0


def test_a_region_runs_the_faster_way_and_keeps_checking():
    """Once its fused program has had its first runs, a region runs whichever way (fused
    or op by op) has been faster, the other way one run in ``RESAMPLE``; both give the
    eager results."""
    import hologram

    g = torch.Generator().manual_seed(9)
    a = torch.randn(64, 32, generator=g)

    def run():
        x = a.to(DEV)
        return (((x * 3 + 1).relu() * x).sum(1),)

    with hologram_torch.set_lazy(False):
        (want,) = run()
    lazy._memo.clear()  # (only this test's region)
    runs = hologram.config.get().promote_after + 4
    for got in repeat(run, runs):
        same(got[0].cpu(), want.cpu())
    (memo,) = [m for m in lazy._memo.values() if m.launch is not None]
    assert memo.fused > hologram.config.get().promote_after
    memo.seconds = [1e-9, 1.0]  # op by op far faster from now on
    memo.seen = lazy.RESAMPLE  # (so the last of the next RESAMPLE runs is the fused one)
    lazy.reset_stats()
    for got in repeat(run, lazy.RESAMPLE):
        same(got[0].cpu(), want.cpu())
    stats = lazy.stats()
    assert (stats["fused_runs"], stats["op_by_op_runs"]) == (1, lazy.RESAMPLE - 1), stats


def test_op_by_op_is_timed_on_full_builds_before_it_is_compared():
    """A region that runs fused never calls its ops' own programs, which stay quick
    builds: their time is no measure. After the fused program's first runs the region
    asks for the ops' full builds and runs fused until they are in; only op-by-op runs
    on final builds count towards the comparison, from the second on."""

    class Executable:
        def __init__(self):
            self.final, self.asked = False, 0

        def promote_now(self):
            self.asked += 1

    class Node:
        def __init__(self):
            self.launch = types.SimpleNamespace(executable=Executable())

    import hologram

    nodes = (Node(), Node())
    memo = lazy._Memo()
    memo.timed(False, 5.0, nodes)  # the first sighting, on quick builds: not counted
    nodes[0].launch.executable.final = nodes[1].launch.executable.final = True
    memo.timed(False, 5.0, nodes)  # nor on full builds, before there is a fused program
    assert memo.seconds == [None, None]
    nodes[0].launch.executable.final = nodes[1].launch.executable.final = False
    memo.launch = object()  # (its fused program compiled)
    for _ in range(hologram.config.get().promote_after + 1):
        assert memo.fused_now(nodes)
        memo.timed(True, 2.0, nodes)
    assert memo.fused_now(nodes)  # full builds asked for, not in yet: still fused
    assert [n.launch.executable.asked for n in nodes] == [1, 1]
    for n in nodes:
        n.launch.executable.final = True
    assert not memo.fused_now(nodes)  # now op by op: a first run, which is not timed
    memo.timed(False, 66.0, nodes)
    assert memo.seconds == [None, 2.0]
    assert not memo.fused_now(nodes)  # then timed, once
    memo.timed(False, 1.0, nodes)
    assert memo.seconds == [1.0, 2.0]
    memo.seen = 1
    assert not memo.fused_now(nodes)  # op by op was faster


def test_threads_using_the_device_at_once_get_eager_results():
    """Four threads train their own models at once, recording into the process's one
    region (each op records under its lock; a thread's host read cuts the region, so the
    others' pending ops run with it): every thread's losses and weights are its eager
    ones."""
    import copy
    import threading

    initial = []
    for seed in range(4):  # made here: the global generator is shared by the threads
        torch.manual_seed(seed)
        initial.append(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                           torch.nn.Linear(16, 1)))

    def train(seed, out):
        model = copy.deepcopy(initial[seed]).to(DEV)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(6):
            x, y = torch.randn(8, 6, generator=g).to(DEV), torch.randn(8, 1, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), y.to(DEV))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[seed] = (losses, [p.detach().cpu() for p in model.parameters()])

    def run_all():
        out = {}
        threads = [threading.Thread(target=train, args=(seed, out)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    with hologram_torch.set_lazy(False):
        want = run_all()
    for _ in range(2):
        got = run_all()
        assert lazy.wait_for_compiles(120)
        for seed in range(4):
            assert got[seed][0] == pytest.approx(want[seed][0], rel=1e-5)
            for a, b in zip(got[seed][1], want[seed][1]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert lazy.stats()["recorded"] > 0


def test_errors_are_raised_at_the_op_as_eagerly():
    a, b = torch.ones(3, device=DEV), torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    with pytest.raises(RuntimeError, match="result type Float can't be cast"):
        torch.ones(3, dtype=torch.long, device=DEV).add_(a)
    assert (a + 1).sum().item() == 6


def test_every_host_read_runs_the_region():
    x = torch.arange(6.0).to(DEV)
    for read in (lambda t: t.item(), lambda t: t.tolist(), lambda t: repr(t),
                 lambda t: t.cpu(), lambda t: bool(t), lambda t: t.nonzero()):
        y = x.sum() * 0 + 2
        assert lazy.pending()
        read(y)  # printing reads (and computes) more than once
        assert lazy.stats()["cuts"]["host"] >= 1 and not lazy.pending()
    y = x * 3
    torch.hologram.synchronize()
    assert not lazy.pending()
    y = x + 1
    torch.cumprod(y, 0)  # an op without a device kernel (CPU fallback) reads y
    assert not lazy.pending()


def test_a_region_is_cut_at_its_size_bound():
    x = torch.zeros(4, device=DEV)
    for _ in range(lazy.MAX_NODES + 5):
        x = x + 1
    assert lazy.stats()["cuts"].get("size") == 1
    assert x.cpu().tolist() == [lazy.MAX_NODES + 5.0] * 4
    lazy.set_max_nodes(3)
    try:
        for _ in range(7):
            x = x + 1
        assert lazy.stats()["cuts"].get("size") == 3
    finally:
        lazy.set_max_nodes(lazy.MAX_NODES)
    assert x.cpu().tolist() == [lazy.MAX_NODES + 12.0] * 4


def test_switching_off_runs_the_pending_region_and_the_environment_sets_the_mode():
    x = torch.ones(3, device=DEV) * 5
    assert lazy.pending()
    with hologram_torch.set_lazy(False):
        assert not lazy.pending() and not lazy.active()
        assert x.tolist() == [5.0] * 3
    assert lazy.active()
    # recorded: the fill of ones() and the add
    code = ("import torch, hologram_torch; from hologram_torch import lazy; "
            "print(lazy.active()); x = torch.ones(2, device='hologram') + 1; "
            "print(len(lazy.pending()), x.tolist())")
    for value, want in (("1", "True\n2 [2.0, 2.0]\n"), ("0", "False\n0 [2.0, 2.0]\n")):
        env = {**os.environ, "HOLOGRAM_LAZY": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout == want


def test_an_error_at_a_cut_names_the_recorded_ops_and_drops_the_region(monkeypatch):
    x = torch.ones(3, device=DEV)
    torch.hologram.synchronize()
    y = x * 7  # recorded; its launch fails at the cut
    (entry,) = lazy.pending()

    def fail(addresses):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(entry, "launch", fail)
    with pytest.raises(RuntimeError, match="launch failed") as info:
        y.cpu()
    assert "1 recorded ops (mul)" in " ".join(info.value.__notes__)
    assert not lazy.pending()
    monkeypatch.undo()
    assert (x * 7).tolist() == [7.0] * 3
