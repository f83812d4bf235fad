"""The cuda backend: Triton kernels from the loop plan (docs/cuda.md)."""
