"""The package version, the one place it is written: ``pyproject.toml`` reads it
(``[tool.setuptools.dynamic]``), the program cache keys every artifact by it
(:func:`hologram.compiler.cache.compiler_version`), and ``hologram info`` reports it.

Semantic versioning: a release that breaks a public API (``hologram``, ``hologram.sdk``,
``hologram_torch``) raises the major version, one that adds to it the minor version, a fix
the patch version; while the major version is 0 a minor release may still break an API,
and CHANGELOG.md says so. Kept in a module of its own so that modules inside the package
can read it without importing the package root (``hologram/__init__.py``).
"""

__version__ = "0.2.0"

#: The name on the package index (``pip install hologram-tensor``): ``hologram`` there is
#: an unrelated project. The import names stay ``hologram`` and ``hologram_torch``.
DISTRIBUTION = "hologram-tensor"
