"""The ``hologram`` dynamo backend: ``torch.compile(model, backend="hologram")``.

Dynamo hands the backend a Torch-level FX graph; AOTAutograd (``aot_autograd``) traces it
to functional ATen graphs, a forward and a backward one when gradients are needed (one
inference graph otherwise), decomposed by PyTorch's core ATen decompositions except for
the ops the lowering table lowers whole (softmax, layer norm, GELU, the losses and their
backward ops stay one node each: their lowerings are written to fuse); attention is traced
in its math form (see :func:`hologram`). Each ATen graph is
partitioned (:mod:`.partition`): supported regions become one Hologram program each, the
rest runs as PyTorch runs it. Compiled functions use AOTAutograd's boxed calling
convention.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so
``torch._dynamo.list_backends()`` lists ``hologram`` without importing this package.
"""

from __future__ import annotations

import functools
import logging
import time

import torch
import torch.fx
from functorch.compile import make_boxed_func
from torch._decomp import _core_aten_decompositions_post_autograd, get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch.nn.attention import SDPBackend, sdpa_kernel

from hologram_torch.compile import graph_lowerings, stats
from hologram_torch.compile.options import Options
from hologram_torch.compile.partition import partition

log = logging.getLogger(__name__)


#: Ops whose ``.default`` core decompositions are not among the post-autograd ones: with
#: them, the table is ``core_aten_decompositions()``'s less its CompositeImplicitAutograd
#: entries (tests/torch_device/compile/test_compile.py checks it).
_NEAREST = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
            "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d")


@functools.cache
def decompositions() -> dict:
    """PyTorch's core ATen decompositions, less those of ops lowered as they are.

    Without ``core_aten_decompositions()``'s ~500 entries for CompositeImplicitAutograd
    ops: those decompose while AOTAutograd traces anyway (each entry calls the op's own
    decomposition), and building that table took 60-80 ms of every process's first
    compile, about a fifth of a warm-cache first call."""
    aten = torch.ops.aten
    table = {**_core_aten_decompositions_post_autograd(),
             **get_decompositions([getattr(aten, name).default for name in _NEAREST])}
    return {op: fn for op, fn in table.items() if graph_lowerings.get(op) is None}


def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, kind: str, options: Options):
    """AOTAutograd's forward/backward/inference compiler: ``gm`` partitioned, boxed."""
    stats.add("graphs")
    start = time.perf_counter()
    try:
        compiled = partition(gm, f"{kind}{stats.compile_stats()['graphs']}", options)
    except Exception as e:  # never fail a user's model for our sake
        log.warning("hologram: the %s graph runs eagerly, partitioning failed: %s", kind, e)
        stats.add("graph_fallbacks")
        compiled = gm
    stats.add_time(time.perf_counter() - start)
    return make_boxed_func(compiled.forward)


def hologram(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
             mode: str | None = None):
    """The dynamo backend. ``options`` (``torch.compile(..., options=...)``): see
    :data:`hologram_torch.compile.options.DOCUMENTED`. ``mode`` (Inductor's tuning modes)
    has no meaning here and is ignored."""
    parsed = Options.parse(options)
    compilers = {kind: functools.partial(compile_graph, kind=kind, options=parsed)
                 for kind in ("forward", "backward", "inference")}
    backend = aot_autograd(fw_compiler=compilers["forward"], bw_compiler=compilers["backward"],
                           inference_compiler=compilers["inference"],
                           decompositions=decompositions())
    # AOTAutograd traces forward and backward here. Attention traced with its math form is
    # matmuls, softmax and their gradients, all lowered; CPU's fused flash attention would
    # leave its forward decomposed but its backward one opaque, eager op.
    with sdpa_kernel([SDPBackend.MATH]):
        return backend(gm, example_inputs)
