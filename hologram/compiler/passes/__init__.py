"""The compiler's passes, each a pure ``Program -> Program`` rewrite (or, for
:mod:`.library_calls`, a split of a program between its kernels and a backend's library).
:mod:`hologram.compiler.pipeline` runs them in order."""
