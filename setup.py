"""Builds the native parts; everything else is in pyproject.toml.

- ``hologram._native`` (hologram/csrc: native.c and a file per concern beside it, the host
  pool's core, registries, launcher and the SDK ops' allocating fast path), always. A C
  compiler and Python's headers are needed to build from source (`make venv` installs
  them on Debian); wheels carry it built.
- The torch device's C++ hooks (hologram_torch/csrc), prebuilt into the wheel when torch
  is importable at build time (``pip wheel --no-build-isolation`` or ``python -m build
  --no-isolation`` in an environment with the supported torch): hologram_torch/native.py
  loads them when the running torch is that same build, and otherwise builds its own on
  first use. An editable install (``pip install -e .``) never prebuilds them: `make venv`
  builds them into torch's extension directory instead.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Run in a child with the freshly built packages first on its path: importing
# hologram_torch builds the hooks (hologram_torch.native.register) into
# TORCH_EXTENSIONS_DIR, a temporary folder, from which setup copies the one library.
_BUILD_HOOKS = """
import json, pathlib, sys
import torch
import hologram_torch.native as native
assert native.__file__.startswith(sys.argv[1]), native.__file__  # not an installed copy
path = native.build()
print(json.dumps({"library": str(path), "torch": torch.__version__,
                  "git_version": torch.version.git_version}))
"""


class BuildExt(build_ext):
    def run(self):
        super().run()
        if not self.inplace:
            self._prebuild_torch_hooks()

    def _prebuild_torch_hooks(self):
        if importlib.util.find_spec("torch") is None:
            print("setup.py: torch is not importable at build time: the torch device's hooks "
                  "are built on first use instead (needs g++ and ninja)", flush=True)
            return
        build_lib = os.path.abspath(self.build_lib)
        with tempfile.TemporaryDirectory() as extensions:
            # The autoload entry point of an installed copy must not load that copy first.
            env = {**os.environ, "PYTHONPATH": build_lib, "TORCH_EXTENSIONS_DIR": extensions,
                   "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
            # cwd: "-c" puts it first on the path, and the source tree's copy has no
            # hologram._native (setup builds it into build_lib).
            done = subprocess.run([sys.executable, "-c", _BUILD_HOOKS, build_lib], env=env,
                                  cwd=extensions, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"building the torch device's hooks for the wheel failed:\n"
                                   f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
            import json

            built = json.loads(done.stdout.strip().splitlines()[-1])
            target = os.path.join(build_lib, "hologram_torch", "_prebuilt")
            os.makedirs(target, exist_ok=True)
            library = os.path.basename(built["library"])
            shutil.copyfile(built["library"], os.path.join(target, library))
            with open(os.path.join(target, "hooks.json"), "w") as f:
                json.dump({"library": library, "torch": built["torch"],
                           "git_version": built["git_version"]}, f)
        print(f"setup.py: prebuilt the torch device's hooks for torch {built['torch']}: "
              f"{library}", flush=True)


_NATIVE = [f"hologram/csrc/{name}.c" for name in ("native", "pool", "registry", "launcher",
                                                   "arrays", "fastop")]
setup(ext_modules=[Extension("hologram._native", _NATIVE,
                             depends=["hologram/csrc/native_api.h",
                                      "hologram/csrc/native_internal.h"],
                             extra_compile_args=["-O2", "-Wall"])],
      cmdclass={"build_ext": BuildExt})
