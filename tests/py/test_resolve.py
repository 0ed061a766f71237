"""tuner/resolve.py, the kernels a framework runs for a model's layers
(no torch needed): which record serves an architecture, what is tuned
(compiled, without a GPU) and what is only read, a layer the database
lacks, and kernels made for the layer's own bias.  And torch stays out of
everything but sparseforge/torch/."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import numpy as np
import pytest

from sparseforge.cache import Cache
from sparseforge.generator.prune import prune
from sparseforge.tuner.driver import Tuner
from sparseforge.tuner.model import plan_model
from sparseforge.tuner.resolve import MissingLayersError, record_for_arch, resolve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """These tests compile without measuring, on any machine (a GPU's own
    path is tests/py/test_torch_gpu.py)."""
    from sparseforge import native
    monkeypatch.setattr(native, "gpu_available", lambda: (False, "CPU tests: no GPU used"))


def test_the_record_for_an_architecture():
    env_arch = {"NVIDIA H100": "sm_90a", "NVIDIA H200": "sm_90a", "NVIDIA A100": "sm_80"}
    recs = [{"gpu_name": "untuned (sm_90a)"}, {"gpu_name": "NVIDIA H100"},
            {"gpu_name": "NVIDIA A100"}, {"gpu_name": "untuned (sm_80)"}]
    assert record_for_arch(recs, "sm_90a", env_arch)["gpu_name"] == "NVIDIA H100"
    assert record_for_arch(recs, "sm_90a", env_arch, "NVIDIA H200")["gpu_name"] == "NVIDIA H100"
    assert record_for_arch(recs + [{"gpu_name": "NVIDIA H200"}], "sm_90a", env_arch,
                           "NVIDIA H200")["gpu_name"] == "NVIDIA H200"
    assert record_for_arch(recs, "sm_80", env_arch)["gpu_name"] == "NVIDIA A100"
    assert record_for_arch(recs[:1], "sm_90a", env_arch)["gpu_name"] == "untuned (sm_90a)"
    assert record_for_arch(recs, "sm_100", env_arch) is None


def _entries(bias_seed: int):
    rng = np.random.default_rng(0)
    a, _ = prune(rng.standard_normal((64, 96)).astype(np.float16), "nm24", 0.5)
    b, _ = prune(rng.standard_normal((128, 64)).astype(np.float16), "bsr:16x16", 0.75)
    bias = np.random.default_rng(bias_seed).standard_normal(64).astype(np.float32)
    return plan_model([("a.weight", a), ("b.weight", b)], layout="tm",
                      biases={"a.weight": bias})


def test_resolve_compiles_what_lacks_then_reads_it(tmp_path):
    entries = _entries(1)
    assert [e.op.tag("x") for e in entries] == ["x.fp16.tm.bias", "x.fp16.tm.plain"]
    with Cache(tmp_path / "r.db") as cache:
        with pytest.raises(MissingLayersError) as e:
            resolve(cache, entries, [16, 256], tune=False)
        assert e.value.names == ["a.weight", "b.weight"]
        made = []

        def make():
            made.append(Tuner(cache, arch="sm_80", budget="1"))
            return made[-1]

        log = io.StringIO()
        codes = resolve(cache, entries, [16, 256], tune=True, make_tuner=make, log=log)
        assert len(made) == 1 and [c.tuned_now for c in codes] == [True, True]
        assert log.getvalue().splitlines() == [
            "tuning a.weight: 64x96 density 0.500 as nm24 (fp16)",
            "tuning b.weight: 128x64 density 0.250 as bsr:16x16 (fp16)"]
        (ac,) = codes[0].archs.values()
        assert ac.arch == "sm_80" and ac.gpu_name == "untuned (sm_80)" and not ac.tuned
        assert [v.n_bucket for v in ac.variants] == [16, 256]
        assert ac.variants[0].cubin[:4] == b"\x7fELF" and np.isnan(ac.variants[0].speedup)
        again = resolve(cache, entries, [16, 256], tune=True, archs=["sm_80"],
                        make_tuner=lambda: pytest.fail("nothing lacks: no tuner"))
        assert [c.tuned_now for c in again] == [False, False]
        # another bias, the same weights: the same records, packed for this bias
        other = resolve(cache, _entries(2), [16, 256], tune=False)
        p1 = codes[0].archs["sm_80"].variants[0].packed
        p2 = other[0].archs["sm_80"].variants[0].packed
        assert len(p1) == len(p2) and p1 != p2
        assert other[1].archs["sm_80"].variants[0].packed == \
            codes[1].archs["sm_80"].variants[0].packed


def test_only_sparseforge_torch_imports_torch():
    """The package's other modules never import torch (it is an extra)."""
    offenders = []
    for top in ("sparseforge", "generator", "tuner", "templates"):
        for path in (ROOT / top).rglob("*.py"):
            if path.is_relative_to(ROOT / "sparseforge" / "torch"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and
                         node.level == 0 else [])
                if any(n == "torch" or n.startswith("torch.") for n in names):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
