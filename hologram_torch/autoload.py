"""The ``torch.backends`` entry point: ``import torch`` calls :func:`load` when the package
is installed (``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off).

It lives in its own module, not in ``hologram_torch/__init__.py``: when a program imports
``hologram_torch`` first, the package's own ``import torch`` runs torch's autoload while
the package is still half-initialized, and an entry point naming an attribute of the
package would not resolve yet (torch's import would then fail). This module always
resolves; the package finishes registering the device once torch's import returns.
"""


def load() -> None:
    import hologram_torch  # noqa: F401  (importing registers the device)
