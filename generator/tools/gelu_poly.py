"""The FMA-pipe GELU of fp16 pairs (sf::sm80::gelu_poly_f16x2): its
coefficients and an exact emulation of its fp16 arithmetic.

The tanh GELU, gelu(x) = x/2 (1 + tanh(s(x))), s(x) = sqrt(2/pi) (x +
0.044715 x^3), is odd-symmetric around relu:

    gelu(x) = relu(x) - t q(t),   t = |x|,   q(t) = (1 - tanh(s(t))) / 2,

and q falls from 1/2 at 0 to 1.3e-5 at 3.75.  The device code clamps t to
T = 3.75 (beyond it t q(t) < 5e-5, below an fp16 ulp of relu(x)), maps it
to u = t (2/T) - 1 in [-1, 1] and evaluates -q as a degree-6 polynomial in u
by Horner's rule in f16x2 (a Chebyshev fit: on [-1, 1] its monomial
coefficients stay small, so fp16 rounding does not cancel), then
y = fma(t, -q, relu(x)): 11 f16x2 instructions for two values, none of them
on the MUFU pipe, where tanh.approx.f16x2 costs two MUFU.TANH.F16.  Its
error is that of the tanh.approx path (see `errors`).

Run `python -m sparseforge.generator.tools.gelu_poly` to print the
constants (fp16 bit patterns) and the errors.
"""
from __future__ import annotations

import numpy as np

T = 3.75        # t is clamped here
DEGREE = 6
F16 = np.float16
K = 0.7978845608028654   # sqrt(2/pi)
C = 0.044715


def _s(x: np.ndarray) -> np.ndarray:
    return K * (x + C * x ** 3)


def gelu_ref(x) -> np.ndarray:
    """The reference tanh GELU in float64."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(_s(x)))


def coefficients() -> tuple[F16, F16, list]:
    """(a, b, c): u = t a + b, and -q(t) ~ c[0] u^6 + ... + c[6], in fp16."""
    a, b = F16(2.0 / T), F16(-1.0)
    t = np.cos(np.pi * (np.arange(2000) + 0.5) / 2000) * T / 2 + T / 2  # Chebyshev nodes
    q = 0.5 * (1.0 - np.tanh(_s(t)))
    fit = np.polynomial.chebyshev.Chebyshev.fit(t * float(a) + float(b), q, DEGREE, domain=[-1, 1])
    mono = np.polynomial.chebyshev.cheb2poly(fit.coef)[::-1]  # highest power first
    return a, b, [F16(-v) for v in mono]


def bits(v: F16) -> int:
    return int(np.asarray(v, F16).view(np.uint16))


def pair(v: F16) -> str:
    """The f16x2 constant with v in both halves, as the device code spells it."""
    return f"0x{bits(v):04x}{bits(v):04x}u"


def _fma(a, b, c) -> np.ndarray:
    """fma.rn.f16x2 on one half: the exact a*b+c rounded once to fp16."""
    return (np.asarray(a, F16).astype(np.float64) * np.asarray(b, F16).astype(np.float64)
            + np.asarray(c, F16).astype(np.float64)).astype(F16)


def emulate(x) -> np.ndarray:
    """What the device computes for fp16 inputs x, instruction by instruction
    (min.NaN / max.NaN keep a NaN input NaN)."""
    x = np.asarray(x, F16)
    a, b, c = coefficients()
    with np.errstate(invalid="ignore"):
        ax = np.abs(x)
        t = np.where(np.isnan(ax), ax, np.minimum(ax, F16(T)))
        u = _fma(t, a, b)
        q = _fma(c[0], u, c[1])
        for ck in c[2:]:
            q = _fma(q, u, ck)
        r = np.where(np.isnan(x), x, np.maximum(x, F16(0)))
        return _fma(t, q, r)


def emulate_tanh_path(x) -> np.ndarray:
    """The tanh.approx.f16x2 form (sf::sm80::gelu_f16x2) with an exact tanh."""
    x = np.asarray(x, F16)
    x2 = _fma(x, x, F16(0))
    p = _fma(x2, F16(K * C), F16(K))
    u = _fma(x, p, F16(0))
    th = np.tanh(u.astype(np.float64)).astype(F16)
    h = _fma(x, F16(0.5), F16(0))
    return _fma(h, th, h)


def errors(x=None) -> dict:
    """Max and Gaussian-weighted RMS absolute error against the reference,
    over every fp16 value in [-10, 10) in steps of 2^-10 (or x), for the
    polynomial and for the tanh path."""
    if x is None:
        x = np.arange(-10, 10, 1 / 1024).astype(F16)
    ref = gelu_ref(np.asarray(x, F16).astype(np.float64))
    w = np.exp(-0.125 * np.asarray(x, np.float64) ** 2)
    out = {}
    for name, y in (("poly", emulate(x)), ("tanh", emulate_tanh_path(x))):
        err = np.abs(y.astype(np.float64) - ref)
        out[name] = {"max": float(err.max()), "wrms": float(np.sqrt((w * err ** 2).sum() / w.sum()))}
    return out


def main() -> None:
    a, b, c = coefficients()
    print(f"T = {pair(F16(T))}  a = {pair(a)}  b = {pair(b)}")
    print("c (highest power first) = " + ", ".join(pair(v) for v in c))
    for name, e in errors().items():
        print(f"{name}: max abs error {e['max']:.2e}, weighted rms {e['wrms']:.2e}")


if __name__ == "__main__":
    main()
