"""The ``cpu`` backend: LLVM code generation for the host (render.py), the vectorizable math
library (mathlib.py), LLVM plumbing (llvm.py), the worker pool (threads.py), BLAS
(blas.py), and the backend class that ties them together (backend.py)."""
