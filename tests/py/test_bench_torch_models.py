"""bench/torch_models.py without a GPU: --dry-run builds and prunes the
model, converts it with sparsify (kernels compiled untuned) and checks the
sparse forward against the dense one on the CPU; a family without
token-major kernels is reported skipped; the Llama-style stack (here at a
small size) runs its decode phase over a KV cache."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import torch_models  # noqa: E402

from sparseforge.generator.families import families  # noqa: E402
from sparseforge.generator.matrix import SparseMatrix  # noqa: E402


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """These tests compile without measuring, on any machine (a GPU's own
    path is tests/py/test_torch_gpu.py)."""
    from sparseforge import native
    monkeypatch.setattr(native, "gpu_available", lambda: (False, "CPU tests: no GPU used"))


def test_a_dry_run_converts_bert_and_checks_it_on_the_cpu(tmp_path, capsys):
    probe = SparseMatrix.from_dense(np.ones((64, 64)), dtype="fp16")
    lacking = [f.analyze(probe)[0].spec for f in families().values() if "tm" not in f.layouts]
    patterns = ["nm24"] + lacking
    argv = ["--dry-run", "--model", "bert", "--layers", "1", "--patterns", ",".join(patterns),
            "--arch", "sm_90a", "--quiet", "--db", str(tmp_path / "b.db")]
    assert torch_models.main(argv) == 0
    out = capsys.readouterr().out
    assert ("| bert | prefill 8x512 | nm24 | fp16 | 6/6 | 0 | - | - | - | - | - | - | - | - | - "
            "| 0.00e+00 | - |" in out)
    for p in patterns[1:]:
        assert f"| bert | prefill 8x512 | {p} | | skipped: {p}: no token-major kernel yet" in out


def test_the_llama_stack_prefills_and_decodes_over_its_cache(tmp_path):
    args = argparse.Namespace(seed=0, db=str(tmp_path / "l.db"), budget="1", quick=False,
                              arch="sm_90a", quiet=True, dry_run=True, dry_tokens=8, reps=1,
                              no_route=True, phases=None, compile=False, per_shape=False)
    small = torch_models.Config(1, 256, 4, 512, {"prefill 2048": (1, 2048, 0),
                                                 "decode 16": (1, 16, 2048)})
    rows = torch_models.run(args, "llama", small, "nm24")
    assert [(r["phase"], r["converted"], r["linears"], r["dtype"]) for r in rows] == [
        ("prefill 2048", 7, 7, "fp16"), ("decode 16", 7, 7, "fp16")]
    assert all(r["error"] == 0.0 and math.isfinite(r["tune_s"]) for r in rows)


def test_phases_filter_the_rows_and_compile_needs_a_gpu(tmp_path, capsys):
    args = argparse.Namespace(seed=0, db=str(tmp_path / "d.db"), budget="1", quick=False,
                              arch="sm_90a", quiet=True, dry_run=True, dry_tokens=8, reps=1,
                              no_route=True, phases=["decode"], compile=False, per_shape=False)
    small = torch_models.Config(1, 256, 4, 512, {"prefill 2048": (1, 2048, 0),
                                                 "decode 16": (1, 16, 2048)})
    assert [r["phase"] for r in torch_models.run(args, "llama", small, "nm24")] == ["decode 16"]
    with pytest.raises(SystemExit):
        torch_models.main(["--dry-run", "--compile", "--model", "bert"])
    assert "--dry-run has none" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        torch_models.main(["--dry-run", "--phases", "decode", "--model", "bert"])
    assert "bert has none of them" in capsys.readouterr().err


def test_the_static_cache_attends_as_the_concatenated_one():
    """The new tokens' k and v written into the cache in place give the
    attention over the earlier tokens and the new ones (causal among
    them), as concatenating them would."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)
    b, t, p, h, heads = 2, 5, 7, 32, 4
    q, k, v = (torch.randn(b, t, h, generator=g) for _ in range(3))
    pk, pv = (torch.randn(b, p, h, generator=g) for _ in range(2))
    kc, vc = (torch.cat([z, torch.full((b, t, h), float("nan"))], dim=1) for z in (pk, pv))
    got = torch_models.attention(q, k, v, heads, True, (kc, vc))
    assert torch.equal(kc[:, p:], k) and torch.equal(vc[:, :p], pv)
    split = lambda z: z.view(b, z.shape[1], heads, h // heads).transpose(1, 2)  # noqa: E731
    s = split(q) @ split(torch.cat([pk, k], 1)).transpose(-1, -2) / math.sqrt(h // heads)
    allowed = torch.ones(t, p + t, dtype=torch.bool).tril(diagonal=p)
    ref = (s.masked_fill(~allowed, float("-inf")).softmax(-1) @ split(torch.cat([pv, v], 1)))
    torch.testing.assert_close(got, ref.transpose(1, 2).reshape(b, t, h), rtol=1e-5, atol=1e-5)


def test_the_table_lists_each_weight_shape_when_timed_apart():
    args = argparse.Namespace(reps=5, db_note="an empty database", quick=True, budget="4",
                              no_route=False, compile=False)
    row = {"model": "bert", "phase": "prefill 8x512", "pattern": "bsr:64x64@0.75",
           "dtype": "fp16", "converted": 72, "linears": 72, "fm_route": 0, "error": 0.0,
           "tune_s": 10.0, "dense_linear_ms": 1.2, "sparse_linear_ms": 0.8,
           "dense_forward_ms": 2.0, "sparse_forward_ms": 1.6,
           "per_shape": {(768, 768): (48, 0.60, 0.45), (3072, 768): (12, 0.30, 0.20)}}
    out = torch_models.table([row], "GPU", "abc", args)
    assert "| bert | prefill 8x512 | bsr:64x64@0.75 | 768 x 768 | 48 | 0.600 | 0.450 | 1.33x |" in out
    assert "| bert | prefill 8x512 | bsr:64x64@0.75 | 3072 x 768 | 12 | 0.300 | 0.200 | 1.50x |" in out
    assert "--per-shape" in out and "| 1.50x | 2.000 | 1.600 | 1.25x | - | - | - |" in out


def test_the_table_counts_the_feature_major_layers_eager_and_compiled():
    """With --compile the route column gives the layers that run the
    feature-major kernel in eager and under torch.compile."""
    args = argparse.Namespace(reps=5, db_note="an empty database", quick=True, budget="4",
                              no_route=False, compile=True)
    row = {"model": "llama", "phase": "decode 16", "pattern": "shflbw:64@0.75",
           "dtype": "fp16", "converted": 14, "linears": 14, "fm_route": 2, "fm_compiled": 14,
           "error": 0.0, "tune_s": 10.0, "dense_compiled_ms": 0.5, "sparse_compiled_ms": 0.25,
           "compiled_error": 0.0, "prune_s": 66.3}
    out = torch_models.table([row], "GPU", "abc", args)
    assert "| llama | decode 16 | shflbw:64@0.75 | fp16 | 14/14 | 2 / 14 |" in out
    assert out.rstrip().endswith("| 0.00e+00 | 0.00e+00 | 10 | 66 |")   # tuning s, pruning s
    assert "eager / under torch.compile" in out
    args.compile = False
    assert "| 14/14 | 2 |" in torch_models.table([row], "GPU", "abc", args)


def test_the_dense_peer_with_gelu_in_the_epilogue_and_its_table(monkeypatch):
    """--dense-gelu-epilogue's peer: a BERT layer with its GELU in the
    matrix product's epilogue (torch._addmm_activation; on a GPU, cuBLASLt
    and GELU's tanh form) computes the layer; the table gives its time and
    the compiled sparse model's speedup over it."""
    import torch
    torch.manual_seed(0)
    c = torch_models.Config(1, 64, 4, 256, {"prefill": (2, 8, 0)})
    layer = torch_models.BertLayer(c).eval()
    x = torch.randn(2, 8, 64)
    calls = []
    real = torch._addmm_activation

    def spy(*a, **kw):
        calls.append(kw.get("use_gelu"))
        return real(*a, **kw)

    monkeypatch.setattr(torch, "_addmm_activation", spy)
    with torch.no_grad():
        want = layer(x)
        layer.lt_gelu = True
        got = layer(x)
    assert calls == [True]
    torch.testing.assert_close(got, want, rtol=0, atol=2e-3)
    args = argparse.Namespace(reps=5, db_note="an empty database", quick=True, budget="4",
                              no_route=False, compile=True, approximate_gelu=True)
    row = {"model": "bert", "phase": "prefill 8x512", "pattern": "bsr:64x64@0.75",
           "dtype": "fp16", "converted": 48, "linears": 48, "fm_route": 0, "fm_compiled": 0,
           "error": 0.0, "tune_s": 10.0, "dense_compiled_ms": 1.8, "sparse_compiled_ms": 1.2,
           "compiled_error": 4e-4, "dense_lt_compiled_ms": 1.5, "lt_error": 5e-4}
    out = torch_models.table([row], "GPU", "abc", args)
    assert "| bert | prefill 8x512 | bsr:64x64@0.75 | 1.500 | 5.00e-04 | 1.200 | 1.25x |" in out
    assert "--approximate-gelu" in out and "torch._addmm_activation" in out


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_the_fused_layout_computes_the_separate_layout(name):
    """bert-fused and llama-fused hold the projections that read one input
    as one Linear layer: with the separate layers' weights stacked into
    them, the forwards agree (the prefill and the decode over a cache)."""
    import torch
    small = torch_models.Config(1, 64, 4, 96, {"decode 16": (2, 3, 5)})
    fused_c = torch_models.replace(small, fused=True)
    sep, fused = torch_models.build(name, small), torch_models.build(f"{name}-fused", fused_c)
    stacks = ({"qkv": ("query", "key", "value")} if name == "bert" else
              {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")})
    with torch.no_grad():
        for ls, lf in zip(sep.layers, fused.layers):
            for n, p in ls.named_parameters():
                if n.split(".")[0] not in sum(stacks.values(), ()):
                    lf.get_parameter(n).copy_(p)
            for f, parts in stacks.items():
                for kind in ("weight", "bias"):
                    if getattr(getattr(lf, f), kind) is not None:
                        getattr(getattr(lf, f), kind).copy_(
                            torch.cat([getattr(getattr(ls, q), kind) for q in parts]))
    assert sum(type(m) is torch.nn.Linear for m in fused.modules()) == 4
    x, past = torch_models.inputs(small, (2, 3, 5 if name == "llama" else 0), torch.float32, "cpu")
    past2 = None if past is None else [tuple(z.clone() for z in kv) for kv in past]
    with torch.no_grad():
        ref, got = sep(x, past), fused(x, past2)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_dry_run_of_the_fused_llama_stack_converts_its_four_layers_a_block(tmp_path, capsys):
    argv = ["--dry-run", "--model", "llama-fused", "--layers", "1", "--patterns", "nm24",
            "--phases", "decode", "--arch", "sm_90a", "--quiet", "--db", str(tmp_path / "f.db")]
    small = torch_models.Config(1, 256, 4, 512, {"decode 16": (1, 16, 2048)}, fused=True)
    import unittest.mock as um
    with um.patch.dict(torch_models.MODELS, {"llama-fused": small}):
        assert torch_models.main(argv) == 0
    assert "| llama-fused | decode 16 | nm24 | fp16 | 4/4 |" in capsys.readouterr().out


def test_the_compiled_kernels_table_splits_linear_layers_from_the_rest(capsys):
    """--kernels: the compiled forwards' kernel time, Linear layers against
    the rest, as a second table; it needs --compile."""
    args = argparse.Namespace(reps=5, db_note="an empty database", quick=True, budget="4",
                              no_route=False, compile=True)
    row = {"model": "llama", "phase": "decode 16", "pattern": "shflbw:64@0.75",
           "dtype": "fp16", "converted": 8, "linears": 8, "fm_route": 2, "fm_compiled": 8,
           "error": 0.0, "tune_s": 10.0, "dense_compiled_ms": 0.5, "sparse_compiled_ms": 0.25,
           "compiled_error": 0.0, "prune_s": 66.3,
           "kernels": ({"linear_us": 300.0, "other_us": 100.0,
                        "others": {"sdpa": (1.0, 60.0), "norm|a": (2.0, 3.5)}},
                       {"linear_us": 120.0, "other_us": 130.0,
                        "others": {"sf_rmsnorm_t_2": (2.0, 7.8)}})}
    out = torch_models.table([row], "GPU", "abc", args)
    assert ("| llama | decode 16 | shflbw:64@0.75 | 300.0 | 120.0 | 2.50x | 100.0 | 130.0 "
            "| 400.0 | 250.0 | 1.60x |") in out
    # the other kernels by name, longest first, a table's bar not taken for a column
    assert ("| dense | `sdpa` | 1 | 60.0 |\n| llama | decode 16 | shflbw:64@0.75 | dense "
            "| `norm/a` | 2 | 3.5 |") in out
    assert "| sparse | `sf_rmsnorm_t_2` | 2 | 7.8 |" in out
    del row["kernels"]
    assert "--kernels" not in torch_models.table([row], "GPU", "abc", args)
    with pytest.raises(SystemExit):
        torch_models.main(["--kernels", "--model", "llama"])
    assert "needs --compile" in capsys.readouterr().err
