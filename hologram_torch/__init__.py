"""PyTorch device integration for Hologram.

This package is a placeholder: the PyTorch device integration arrives in a later release.
"""

__all__: list[str] = []
