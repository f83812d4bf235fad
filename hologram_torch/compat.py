"""Paths of torch that need help from a Python device: serialization, storage copies,
deep copies, pinned memory and autocast (see the module functions)."""
