"""The FMA-pipe GELU (sf::sm80::gelu_poly_f16x2): the header's constants are
the fit's, and the emulated fp16 arithmetic is as accurate as the
tanh.approx path's (no GPU needed; the GPU tests run both in the kernels)."""
import re
from pathlib import Path

import numpy as np

from sparseforge.generator.tools import gelu_poly

HEADER = Path(__file__).resolve().parents[2] / "templates" / "include" / "sf" / "common.cuh"


def _device_constants():
    src = HEADER.read_text()
    body = src[src.index("unsigned gelu_poly_f16x2"):]
    body = body[:body.index("return y;")]
    return re.findall(r'"r"\((0x[0-9a-f]{8}u)\)', body)


def test_header_constants_are_the_fit():
    a, b, c = gelu_poly.coefficients()
    want = [gelu_poly.pair(np.float16(gelu_poly.T)), gelu_poly.pair(a), gelu_poly.pair(b)]
    want += [gelu_poly.pair(v) for v in c]
    assert len(c) == gelu_poly.DEGREE + 1
    assert _device_constants() == want


def test_error_matches_the_tanh_path():
    e = gelu_poly.errors()
    # both are dominated by the fp16 rounding of y (half an ulp of 4 is 9.8e-4)
    assert e["tanh"]["max"] < 1.4e-3 and e["poly"]["max"] < 1.5e-3
    assert e["poly"]["wrms"] < 1.2 * e["tanh"]["wrms"]
    # near zero the product form keeps the error to about an fp16 ulp of y
    small = np.arange(-0.25, 0.25, 1 / 4096).astype(np.float16)
    err = np.abs(gelu_poly.emulate(small).astype(np.float64) - gelu_poly.gelu_ref(small))
    assert err.max() < 2.5e-4


def test_special_values():
    y = gelu_poly.emulate(np.array([np.inf, -np.inf, 65504, -65504, np.nan, 0.0], np.float16))
    assert y[0] == np.inf and y[2] == np.float16(65504)
    assert abs(float(y[1])) < 1e-4 and abs(float(y[3])) < 1e-4    # gelu(-big) ~ 0
    assert np.isnan(y[4]) and y[5] == 0
