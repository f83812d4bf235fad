"""The tests of ``torch.device('hologram')``, a folder per topic (as PyTorch's OpenReg
groups its own): ``device`` (the device, its devices, streams, DLPack, errors, native
hooks, custom ops, autocast), ``memory`` (storage, layouts, tied weights), ``ops`` (the
op families, OpInfo, the lowering table), ``autograd`` (gradients of models), ``models``
(training and inference of the test models), ``lazy`` (recorded execution), ``compile``
(``torch.compile``) and ``distributed`` (process groups, SyncBatchNorm)."""
