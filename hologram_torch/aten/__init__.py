"""aten kernels of the hologram device, by family. Importing this package registers them;
every op without a kernel here goes through :mod:`hologram_torch.fallback`. The math of
every op with a graph form is its entry in :mod:`hologram_torch.lowering` (launched through
:mod:`.from_table` and :mod:`.runner`); these modules add the eager parts.

- :mod:`.tensor`: creation, host transfers, copies, views, fills, resize, item
- :mod:`.elementwise`: arithmetic, comparisons, unary math, selection, activations
- :mod:`.foreach`: addcmul/addcdiv/lerp and the optimizers' ``_foreach_*`` ops
- :mod:`.reduction`: sum, mean, max/min, arg*, var/std, norms
- :mod:`.nn`: softmax, losses, layer norm, embedding, dropout (with backward ops)
- :mod:`.linalg`: matrix products (BLAS through the CPU backend's GEMM)
- :mod:`.shape`: cat and the index ops (gather, scatter, index_select, ...)
- :mod:`.random`: random draws (the CPU generator, into device memory) and arange
- :mod:`.conv`: convolutions (PyTorch's CPU kernels, counted as fallbacks)
- :mod:`.rnn`: the fused LSTM/GRU cells PyTorch picks for the device, from device ops
- :mod:`.attention`: the inference fast paths of multi-head attention and the transformer
  encoder layer, from device ops
- :mod:`.activation`: hardswish and hardsigmoid (with backward)
- :mod:`.indexing`: tril and triu
- :mod:`.generate`: linspace, logspace, eye, flip, roll
- :mod:`.pool`: max, average and adaptive average pooling (with backward)
- :mod:`.norm`: batch normalization (with backward)
- :mod:`.sync_batch_norm`: the statistics ops of ``nn.SyncBatchNorm``, from device ops
"""

from hologram_torch.aten import (  # noqa: F401  (importing registers the kernels)
    activation,
    attention,
    conv,
    elementwise,
    foreach,
    generate,
    indexing,
    linalg,
    nn,
    norm,
    pool,
    random,
    reduction,
    rnn,
    shape,
    sync_batch_norm,
    tensor,
)
from hologram_torch.aten.registry import COMPOSED, NATIVE

__all__ = ["COMPOSED", "NATIVE"]
