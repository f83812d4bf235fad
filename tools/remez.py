"""Weighted minimax polynomial fits (Remez exchange, mpmath at 50 digits), for the
coefficient tables of ``hologram/codegen/mathlib.py``.

``python tools/remez.py`` prints the fits of f32 pow's two polynomials (``pow_log`` and
``pow_exp2``) with their errors; :func:`remez` fits any other function the same way.
Only the even degrees of ``pow_exp2`` converge with this simple exchange (a node lands
on the symmetric point), which is all that table needs.
"""

from __future__ import annotations

from collections.abc import Callable

import mpmath as mp

mp.mp.dps = 50


def remez(f: Callable, weight: Callable, a: float, b: float, degree: int,
          iterations: int = 40, grid: int = 6000) -> tuple[list, mp.mpf]:
    """Coefficients c0..c_degree minimizing max |weight(x) (f(x) - sum c_j x^j)| on
    [a, b], and that maximum (found on a grid of ``grid`` + 1 points)."""
    a, b = mp.mpf(a), mp.mpf(b)
    n = degree + 2
    nodes = [(a + b) / 2 - (b - a) / 2 * mp.cos(mp.pi * i / (n - 1)) for i in range(n)]
    points = [a + (b - a) * i / grid for i in range(grid + 1)]
    values = {x: f(x) for x in points}
    worst = mp.inf
    for _ in range(iterations):
        # c(x_i) + (-1)^i E / w(x_i) = f(x_i): the error alternates with equal weighted size
        system, rhs = mp.matrix(n, n), mp.matrix(n, 1)
        for i, x in enumerate(nodes):
            for j in range(degree + 1):
                system[i, j] = x ** j
            system[i, degree + 1] = (-1) ** i / weight(x)
            rhs[i] = values[x] if x in values else f(x)
        solution = mp.lu_solve(system, rhs)
        coeffs = [solution[j] for j in range(degree + 1)]
        errors = [weight(x) * (values[x] - mp.polyval(coeffs[::-1], x)) for x in points]
        worst = max(abs(v) for v in errors)
        # the new nodes: the largest error of each run of one sign
        extrema, start = [], 0
        for i in range(1, len(points) + 1):
            if i == len(points) or mp.sign(errors[i]) != mp.sign(errors[start]):
                extrema.append(max(range(start, i), key=lambda j: abs(errors[j])))
                start = i
        while len(extrema) > n:
            extrema.pop(0 if abs(errors[extrema[0]]) < abs(errors[extrema[-1]]) else -1)
        if len(extrema) < n or abs(worst - abs(solution[degree + 1])) < worst * mp.mpf(1e-6):
            break
        nodes = [points[k] for k in extrema]
    return coeffs, worst


def _pow_log(z):
    """P(z) of log(1+f) = 2s + s z P(z), s = f/(2+f), z = s^2."""
    if z == 0:
        return mp.mpf(2) / 3
    s = mp.sqrt(z)
    return (2 * mp.atanh(s) - 2 * s) / (s * z)


def _pow_exp2(r):
    """Q(r) of 2^r = 1 + r Q(r)."""
    return mp.log(2) if r == 0 else (mp.power(2, r) - 1) / r


def main() -> None:
    s_max = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)  # |s| for m in [sqrt(1/2), sqrt(2))
    # the relative error of log(1+f) is z P's error over 2 (log(1+f) ~ 2s)
    coeffs, err = remez(_pow_log, lambda z: max(z, mp.mpf(1e-30)) / 2, 0, s_max ** 2, 5)
    print(f"pow_log: 2^{float(mp.log(err, 2)):.1f}", [float(c) for c in coeffs])
    coeffs, err = remez(_pow_exp2, lambda r: mp.mpf(1), -0.5, 0.5, 8)
    print(f"pow_exp2: 2^{float(mp.log(err, 2)):.1f}", [float(c) for c in coeffs])


if __name__ == "__main__":
    main()
