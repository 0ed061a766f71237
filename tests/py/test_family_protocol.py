"""A family lives in one package: a toy dense "family" with one
configuration, written into a temporary package and nothing else, is
parsed, detected, pruned, synthesized, analyzed, swept and tuned (compile
only here; verified on a GPU) through the registry alone.  And no module
outside generator/families/ compares against a family's name."""
from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseforge.generator import families as registry

ROOT = Path(__file__).resolve().parents[2]

TOY = '''
"""toydense: every entry stored, one configuration (a test's family)."""
import numpy as np

from sparseforge.generator.families import register
from sparseforge.generator.family import Family, Fit, PatternError, Pruned
from sparseforge.generator.kernel import ConfigError, Kernel, config_name, make_launch
from sparseforge.generator.matrix import to_device_bytes
from sparseforge.generator.space import Constraint, Space

SOURCE = r"""
extern "C" __global__ void NAME(const unsigned char *packed, const void *X, void *Y, int N) {
  const float *w = (const float *)packed, *x = (const float *)X;
  float *y = (float *)Y;
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < KK; k++) acc += w[m * KK + k] * x[k * N + n];
  y[m * N + n] = acc;
}
"""
SPACE = Space(choices={"threads": (64,)},
              constraints=[Constraint("threads % 32 == 0", "whole warps")])


class ToyDense(Family):
    name = "toydense"
    syntax = "toydense"
    summary = "every entry stored (a test family)"
    dtypes = ("fp32",)
    auto_rank = 1

    def parse_params(self, arg):
        if arg:
            raise PatternError("toydense takes no parameter")
        return {}

    def tag(self, params):
        return "toydense"

    def spec(self, params):
        return "toydense"

    def fits(self, matrix, params):
        return matrix.nnz == matrix.rows * matrix.cols

    def analyze(self, matrix):
        fits = self.fits(matrix, {})
        return [Fit("toydense", "toydense", fits, 0.0 if fits else 1.0, "-", "dense?", {})]

    def detect(self, matrix):
        return {} if self.fits(matrix, {}) and matrix.dtype == "fp32" else None

    def prune(self, w, params, sparsity, rng):
        return Pruned(np.ones(w.shape, dtype=bool))

    def synth(self, params, m, k, density, rng):
        return np.ones((m, k), dtype=bool), None

    def densities(self, params, asked):
        return [1.0]

    def search_space(self, matrix, op, params, device=None):
        return [c for c in SPACE.enumerate() if not SPACE.violations(c, {})]

    def check_config(self, config, matrix, op, params, device=None):
        self.check_op(op)
        SPACE.check(config, {})

    def plan(self, matrix, op, params, config, bias=None):
        self.check_config(config, matrix, op, params)
        return (matrix, config, op)

    def render(self, plan, op, config):
        matrix = plan[0]
        name = config_name("toydense", config, op)
        source = SOURCE.replace("NAME", name).replace("KK", str(matrix.cols))
        launch = make_launch(grid=(1, matrix.rows), block=(config["threads"],), n_axis=0,
                             n_tile=config["threads"])
        packed = to_device_bytes(matrix.to_dense().ravel(), "fp32")
        return Kernel(name, source, packed, launch, config=dict(config))

    def unpack(self, plan):
        return plan[0]


register(ToyDense())
'''


@pytest.fixture
def toy(tmp_path):
    """The toy family's package, in a folder of its own on the families'
    search path; the registry forgets it afterwards."""
    pkg = tmp_path / "fams" / "toydense"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(TOY)
    registry.__path__.append(str(pkg.parent))
    registry._loaded = False
    try:
        yield registry.get_family("toydense")
    finally:
        registry.__path__.remove(str(pkg.parent))
        registry._FAMILIES.pop("toydense", None)
        sys.modules.pop("sparseforge.generator.families.toydense", None)
        registry._loaded = False


def test_a_family_in_its_own_package_serves_every_loop(toy, tmp_path):
    from sparseforge.generator import analysis
    from sparseforge.generator.prune import prune
    from sparseforge.generator.synth import random_matrix
    from sparseforge.tuner.model import op_for
    from sparseforge.tuner.sweep import sweep_matrices
    assert registry.parse_pattern("toydense") == ("toydense", {})
    assert "toydense" in registry.pattern_syntax()
    dense = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    mat, stats = prune(dense, "toydense", 0.0)
    assert mat.nnz == 12 and stats.kept_l1 == 1.0
    assert registry.auto_pattern(mat) == "toydense"     # auto_rank 1: asked first
    assert "toydense" in analysis.analyze(mat).exact_fits()
    assert random_matrix("toydense", 5, 6, 0.3, "fp32").nnz == 30
    op = op_for("toydense", mat)
    assert op.dtype == "fp32"
    spec = {"families": ["toydense"], "densities": [0.5], "shapes": [[8, 8]], "n": [16],
            "dtype": "fp16", "seed": 0, "activation": "none", "layout": "fm"}
    [(name, pattern, m)] = list(sweep_matrices(spec))
    assert pattern == "toydense" and m.density == 1.0 and m.dtype == "fp32"
    k = toy.generate(mat, op, {}, toy.default_config(mat, op, {}))
    assert k.launch_config(100)["grid"] == (2, 3, 1)


def test_the_toy_family_tunes_without_a_gpu(toy, tmp_path):
    """Compile-only tuning (no GPU here): the kernel is generated, compiled
    for the named arch and stored."""
    from sparseforge.cache import Cache
    from sparseforge.tuner.driver import Tuner
    from sparseforge.tuner.model import tune_model
    mat = registry.get_family("toydense")
    dense = np.ones((4, 8), np.float32)
    from sparseforge.generator.matrix import SparseMatrix
    m = SparseMatrix.from_dense(dense)
    with Cache(tmp_path / "t.db") as cache:
        tuner = Tuner(cache, arch="sm_80")
        if tuner.gpu:
            pytest.skip("a GPU answers: test_tuner_gpu covers tuning there")
        rows = tune_model([("toy", m)], tuner, [16], pattern="toydense")
        assert rows[0].result.family_tag == "toydense" and not rows[0].result.measured
        assert tuner.compiled == 1 and cache.summary()["binaries"] == 1
    del mat


@pytest.mark.gpu
def test_the_toy_family_runs_and_verifies(toy):
    from sparseforge.generator.kernel import Operation
    from sparseforge.generator.matrix import SparseMatrix
    from sparseforge.tuner.execute import verify
    m = SparseMatrix.from_dense(np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32))
    res = verify(toy, m, Operation("fp32", "fm"), {}, {"threads": 64}, 70)
    assert res["ok"], res


def _compares_family_name(tree: ast.AST, names: set) -> list:
    """Comparisons (==, !=, in) of anything with a family's name as a string."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for part in [node.left] + node.comparators:
                consts = [part] if isinstance(part, ast.Constant) else (
                    part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [])
                for c in consts:
                    if isinstance(c, ast.Constant) and c.value in names:
                        hits.append((node.lineno, c.value))
    return hits


def test_no_module_outside_the_families_compares_a_family_name():
    names = set(registry.families())
    offenders = []
    for top in ("generator", "tuner", "sparseforge", "bench", "examples"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "families" in path.relative_to(ROOT).parts:
                continue
            for line, name in _compares_family_name(ast.parse(path.read_text()), names):
                offenders.append(f"{path.relative_to(ROOT)}:{line} compares {name!r}")
    assert not offenders, "\n".join(offenders)


def test_every_family_implements_the_protocol():
    from sparseforge.generator.family import Family
    for name, fam in registry.families().items():
        assert isinstance(fam, Family) and fam.name == name
        assert fam.syntax.split(":")[0] == name and fam.summary and fam.dtypes
        params = registry.parse_pattern(fam.syntax.split(":")[0] + (
            ":16" if ":" in fam.syntax else ""))[1]
        assert registry.parse_pattern(fam.spec(params)) == (name, params)
    json.dumps(list(registry.families()))
    importlib.import_module("sparseforge.generator.families")
