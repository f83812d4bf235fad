"""The device-neutral lowering between the scheduled Atlas program and the renderers:
what every backend decides the same way before it emits code for its device.

- :mod:`.loops`: each kernel's loop plan (where every value is computed, store nests,
  accumulators, split reductions), dumped as the ``loops`` stage;
- :mod:`.schedule`: how many chunks long reductions and matrix products are cut into, and
  fission of kernels whose reductions need each other, from the target's capabilities;
- :mod:`.mathlib`: the transcendental functions, written once against the
  :class:`~hologram.codegen.mathlib.MathEmitter` interface each renderer implements;
- :mod:`.numerics`: the other numeric rules (bf16 rounding, total-order keys, rounding to
  odd), written against the same interface;
- :mod:`.gpu_kernel`: the walk over a kernel's loop plan that the GPU renderers share
  (:class:`~hologram.codegen.gpu_kernel.KernelWriter`), each supplying its language.
"""
