"""Compile options. They change generated code, so they are part of every cache key."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hologram import config


@dataclass(frozen=True)
class CompileOptions:
    """Options of the pass pipeline and backends.

    ``fast_math`` allows rewrites that are not exact under IEEE 754 (``x + 0.0 -> x``,
    ``x * 0 -> 0``, ``a * b + c -> fma``): results may differ for NaN, ±inf and -0.0 and
    in the last bits.
    """

    fast_math: bool = False

    @classmethod
    def from_env(cls) -> CompileOptions:
        return cls(fast_math=config.get().fast_math)

    def key(self) -> str:
        """Canonical text of the options, for cache keys."""
        return ",".join(f"{k}={v!r}" for k, v in sorted(asdict(self).items()))
