"""Builds the one native extension, hologram._native (hologram/csrc/native.c: the host
pool's core and the SDK ops' allocating fast path); everything else is in pyproject.toml.
A C compiler and Python's headers are needed to install from source (`make venv` installs
them on Debian)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hologram._native", ["hologram/csrc/native.c"],
                             depends=["hologram/csrc/native_api.h"],
                             extra_compile_args=["-O2", "-Wall"])])
