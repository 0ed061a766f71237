"""bench/nm24.py's choice of problems, without a GPU: the suites' shapes,
or exactly the shapes named (any shape, under the suite that holds it,
else "custom"), each in every layout asked; clear errors."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import nm24  # noqa: E402


def test_suites_and_layouts():
    got = nm24.problems("s1", "", "fm,tm")
    assert len(got) == 2 * len(nm24.S1_SHAPES)
    assert got[:2] == [("s1", nm24.S1_SHAPES[0], "fm"), ("s1", nm24.S1_SHAPES[0], "tm")]
    assert {s for s, _, _ in nm24.problems("s1,s2", "", "tm")} == {"s1", "s2"}


def test_named_shapes_in_and_out_of_the_suites():
    got = nm24.problems("s1", "3072x1536x4096,4096X4096x16,768x3072x4096", "tm")
    assert got == [("custom", (3072, 1536, 4096), "tm"), ("s2", (4096, 4096, 16), "tm"),
                   ("s1", (768, 3072, 4096), "tm")]


@pytest.mark.parametrize("suites,shapes,what", [
    ("s3", "", "unknown suite 's3'"),
    ("s1", "3x3", "shape '3x3': expected MxKxN"),
    ("s1", "0x4x4", "shape '0x4x4': expected MxKxN"),
    ("s1", "axbxc", "shape 'axbxc': expected MxKxN"),
])
def test_refusals(suites, shapes, what):
    with pytest.raises(ValueError, match=what):
        nm24.problems(suites, shapes, "fm")
