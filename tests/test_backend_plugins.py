"""Backends declared by installed packages (entry points of ``hologram.backends``) join
the registry like built-in ones: named, selectable, and loaded only when first used."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import types

import numpy as np
import pytest

import hologram as hg
from hologram import backends
from hologram.backends.interp.backend import InterpBackend
from hologram.errors import DeviceError


class PluginBackend(InterpBackend):
    """The interpreter under another name: a plug-in as a package would ship it."""

    name = "plugintest"


@pytest.fixture
def plugins(monkeypatch):
    """Installed entry points replaced by the ones a test declares (the module
    ``plugin_pkg`` stands in for an installed package)."""
    module = types.ModuleType("plugin_pkg")
    module.PluginBackend = PluginBackend
    module.NotABackend = object
    monkeypatch.setitem(sys.modules, "plugin_pkg", module)
    declared: list[importlib.metadata.EntryPoint] = []

    def entry_points(group):
        assert group == backends.ENTRY_POINT_GROUP
        return [e for e in declared if e.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(backends, "_plugins_loaded", False)
    saved = dict(backends._registered)
    yield lambda name, value: declared.append(
        importlib.metadata.EntryPoint(name, value, backends.ENTRY_POINT_GROUP))
    backends._registered.clear()
    backends._registered.update(saved)
    backends._instances.pop("plugintest", None)
    backends._plugins_loaded = False


def test_entry_point_backend_is_named_available_and_runs(plugins):
    plugins("plugintest", "plugin_pkg:PluginBackend")
    assert "plugintest" in backends.names()
    # Loaded lazily: the registry holds the entry point until the backend is asked for.
    assert isinstance(backends._registered["plugintest"], importlib.metadata.EntryPoint)
    assert "plugintest" in backends.available()
    assert backends.backend_class("plugintest") is PluginBackend
    assert backends.resolve("auto") == "cpu"  # built-in backends are preferred
    x = np.arange(5, dtype=np.float32)
    with hg.Executor("plugintest") as ex:
        out = hg.ops.vector_add(ex.from_numpy(x), ex.from_numpy(x))
        np.testing.assert_array_equal(out.to_numpy(), 2 * x)


def test_entry_point_cannot_take_a_builtin_name(plugins):
    plugins("cpu", "plugin_pkg:PluginBackend")
    with pytest.warns(UserWarning, match=r"'cpu'.*taken"):
        names = backends.names()
    assert names.count("cpu") == 1
    assert backends.backend_class("cpu") is not PluginBackend


def test_entry_point_that_is_not_a_backend_is_refused(plugins):
    plugins("notbackend", "plugin_pkg:NotABackend")
    with pytest.raises(DeviceError, match=r"notbackend.*not a hologram\.backends\.base\.Backend"):
        backends.backend_class("notbackend")


def test_first_registry_call_of_a_process_can_be_get():
    """get() and builder() hold the registry lock while the plug-ins load on first use: a
    fresh process whose first call is one of them must not deadlock."""
    code = ("import hologram.backends as b; b.get('interp'); "
            "import hologram.backends as c; c._plugins_loaded = False; c.builder('cpu')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
