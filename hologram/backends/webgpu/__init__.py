"""The ``webgpu`` backend (``metal`` and ``vulkan`` on such adapters): WGSL through wgpu.
See :mod:`.backend` and docs/webgpu.md."""
