"""sparseforge.torch without a GPU: SparseLinear computes F.linear with the
pruned weight for every family, dtype and odd shape; its state (weights,
packed buffers, the cubins of each architecture) round-trips through
torch.save / torch.load(weights_only=True) into an empty layer and into
the dense model; sparsify converts what is sparse, keeps what is dense
and reports it; the custom op has a fake implementation; torch.compile
traces the module with no graph break; every error says what is wrong.

Kernels here are compiled without a GPU (the untuned default
configuration, as `sparseforge tune` does on a machine without one);
tests/py/test_torch_gpu.py runs them.  Skipped where torch is missing
(scripts/test.sh installs it)."""
from __future__ import annotations

import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from sparseforge.generator.families import families, family_of  # noqa: E402
from sparseforge.generator.prune import prune  # noqa: E402
from sparseforge.torch import (MissingLayersError, SparseLinear, load_state_dict,  # noqa: E402
                               sparsify)

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
M, K = 37, 52          # odd sizes: neither a multiple of 8 nor of a block


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """These tests compile without measuring, on any machine (a GPU's own
    path is tests/py/test_torch_gpu.py)."""
    from sparseforge import native
    monkeypatch.setattr(native, "gpu_available", lambda: (False, "CPU tests: no GPU used"))


def pruned_weight(pattern: str, dtype: torch.dtype, m: int = M, k: int = K, density=0.3,
                  seed: int = 0) -> torch.Tensor:
    """A dense weight holding a random pattern of the family (its synth)."""
    fam, params = family_of(pattern)
    rng = np.random.default_rng(seed)
    mask, _ = fam.synth(params, m, k, density, rng)
    w = rng.standard_normal((m, k)).astype(np.float32) * mask
    return torch.from_numpy(w).to(dtype)


def family_cases():
    """(pattern, dtype) for every registered family and dtype: the first
    pattern `inspect` reports for it."""
    rng = np.random.default_rng(1)
    from sparseforge.generator.matrix import SparseMatrix
    probe = SparseMatrix.from_dense(rng.standard_normal((64, 64)), dtype="fp16")
    out = []
    for fam in families().values():
        spec = fam.analyze(probe)[0].spec
        out += [(spec, d) for d in fam.dtypes]
    return out


def small_model(dtype=torch.float16) -> nn.Module:
    """Three Linears: one pruned to 2:4, one to 16 x 16 blocks, one dense."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 128, bias=False),
                          nn.Linear(128, 32)).to(dtype)
    with torch.no_grad():
        for i, (pattern, sparsity) in ((0, ("nm24", 0.5)), (2, ("bsr:16x16", 0.75))):
            w = model[i].weight.float().numpy()
            m, _ = prune(w, pattern, sparsity, dtype={torch.float16: "fp16",
                                                      torch.bfloat16: "bf16"}[dtype])
            model[i].weight.copy_(torch.from_numpy(m.to_dense()).to(dtype))
    return model


@pytest.mark.parametrize("pattern,dtype", family_cases())
def test_matches_f_linear_for_every_family(pattern, dtype):
    torch_dtype = DT[dtype]
    w = pruned_weight(pattern, torch_dtype)
    bias = torch.randn(M).to(torch_dtype)
    for b in (bias, None):
        layer = SparseLinear.from_dense(w, b, pattern=pattern, name="w")
        assert (layer.in_features, layer.out_features) == (K, M)
        assert layer.pattern == pattern and layer.density == pytest.approx(
            float((w != 0).float().mean()))
        torch.testing.assert_close(layer.dense_weight(), w, rtol=0, atol=0)
        for shape in ((K,), (5, K), (2, 3, K), (0, K), (1, 1, 1, K)):
            x = torch.randn(shape).to(torch_dtype)
            with torch.no_grad():
                y = layer(x)
            assert y.shape == (*shape[:-1], M) and y.dtype == torch_dtype
            assert torch.equal(y, F.linear(x, w, b)), (pattern, dtype, shape)


def test_auto_takes_the_family_the_weight_fits():
    w = pruned_weight("bsr:16x16", torch.float16, m=64, k=48)
    assert SparseLinear.from_dense(w).pattern == "bsr:16x16"
    assert SparseLinear.from_dense(pruned_weight("nm24", torch.bfloat16, density=0.5)).pattern == "nm24"
    assert SparseLinear.from_dense(pruned_weight("csr", torch.float32)).pattern == "csr"


def test_sparsify_converts_the_sparse_layers_and_keeps_the_dense(tmp_path):
    model = small_model()
    x = torch.randn(3, 5, 96).half()
    with torch.no_grad():
        want = model(x)
    report = sparsify(model, db=tmp_path / "m.db", n=(16, 256), budget="1", archs="sm_90a",
                      progress=False)
    assert [type(m).__name__ for m in model] == ["SparseLinear", "ReLU", "SparseLinear",
                                                 "Linear"]
    assert [(r.name, r.pattern, r.dense) for r in report.layers] == [
        ("0", "nm24", ""), ("2", "bsr:16x16", ""), ("3", "", "density 1.00")]
    assert report.converted[0].gpu == "untuned (sm_90a)"
    assert sorted(report.converted[1].buckets) == [16, 256]
    assert report.database == str(tmp_path / "m.db")
    table = str(report)
    assert "3                                    stays dense: density 1.00" in table
    assert "2 of 3 Linear layers converted" in table
    assert model[0].name == "0.weight" and sorted(model[0].kernels) == ["sm_90a"]
    variants = model[2].kernels["sm_90a"]["variants"]
    assert [v["n_bucket"] for v in variants] == [16, 256]
    assert variants[0]["kernel"].startswith("sf_bsr16x16_fp16_tm_plain_")
    with torch.no_grad():
        assert torch.equal(model(x), want)
    # served from the database: nothing is tuned again, and tune=False finds it
    again = sparsify(small_model(), db=tmp_path / "m.db", n=(16, 256), tune=False,
                     archs="sm_90a", progress=False)
    assert [r.tuned_now for r in again.converted] == [False, False]


def test_a_layer_the_database_lacks_is_named_with_tune_false(tmp_path):
    with pytest.raises(MissingLayersError) as e:
        sparsify(small_model(), db=tmp_path / "empty.db", tune=False, progress=False)
    assert e.value.names == ["0.weight", "2.weight"]
    assert str(e.value) == (f"the database {tmp_path / 'empty.db'} holds no tuned layer for "
                            "any architecture of 2 layer(s): 0.weight, 2.weight; tune them "
                            "first (tune=True, or `sparseforge tune`)")


def sixteen_bit_family():
    """(family, its first pattern) of a token-major family without fp32."""
    fam = next(f for f in families().values() if "fp32" not in f.dtypes and "tm" in f.layouts)
    return fam, fam.analyze(SparseLinear.from_dense(pruned_weight("csr", torch.float32)).matrix())[0].spec


def test_a_named_pattern_without_kernels_for_the_dtype_is_refused(tmp_path):
    fam, spec = sixteen_bit_family()
    model = nn.Sequential(nn.Linear(K, M))
    with torch.no_grad():
        model[0].weight.copy_(pruned_weight("csr", torch.float32))
    with pytest.raises(ValueError, match=rf"^sparsify: {spec} computes in "
                                         rf"{', '.join(fam.dtypes)}, the layer is fp32: 0$"):
        sparsify(model, db=tmp_path / "x.db", pattern=spec, progress=False)


def test_state_dict_round_trips_with_the_kernels(tmp_path):
    model = small_model()
    sparsify(model, db=tmp_path / "m.db", n=(16, 4096), budget="1", archs="sm_80,sm_90a",
             progress=False)
    x = torch.randn(7, 96).half()
    with torch.no_grad():
        want = model(x)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert [k for k in state if k.startswith("2.")] == [
        "2.weight_indptr", "2.weight_indices", "2.weight_values", "2.packed_0",
        "2._extra_state"]
    extra = state["2._extra_state"]
    assert sorted(extra["kernels"]) == ["sm_80", "sm_90a"]
    assert all(c[:4] == b"\x7fELF" for c in extra["cubins"])

    # into the dense model it came from: the Linears become SparseLinears
    fresh = nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 128, bias=False),
                          nn.Linear(128, 32)).half()
    result = load_state_dict(fresh, state)
    assert not result.missing_keys and not result.unexpected_keys
    assert isinstance(fresh[0], SparseLinear) and isinstance(fresh[3], nn.Linear)
    assert fresh[2].kernels == model[2].kernels
    for k, v in fresh.state_dict().items():
        if not k.endswith("_extra_state"):
            assert torch.equal(v, model.state_dict()[k]), k
    with torch.no_grad():
        assert torch.equal(fresh(x), want)

    # into an empty layer (no nonzeros, no kernels): shaped as the state
    empty = SparseLinear(96, 64, bias=True, dtype=torch.float16)
    empty.load_state_dict({k[2:]: v for k, v in state.items() if k.startswith("0.")})
    assert empty.pattern == "nm24" and empty.name == "0.weight"
    with torch.no_grad():
        assert torch.equal(empty(torch.ones(96).half()), model[0](torch.ones(96).half()))

    # a copy is independent of the original
    twin = copy.deepcopy(model)
    assert twin[2].kernels == model[2].kernels and twin[2].packed_0 is not model[2].packed_0


def test_a_state_of_another_shape_or_kind_is_refused():
    layer = SparseLinear.from_dense(pruned_weight("nm24", torch.float16, density=0.5), name="a")
    other = SparseLinear(K, M + 1, dtype=torch.float16, name="b")
    with pytest.raises(RuntimeError, match=r"SparseLinear 'b': the state is of a 37 x 52 "
                                           r"layer, this one is 38 x 52"):
        other.load_state_dict(layer.state_dict())
    state = layer.state_dict()
    state["_extra_state"] = {"format": 99}
    with pytest.raises(RuntimeError, match=r"SparseLinear 'a': not a SparseLinear state"):
        layer.load_state_dict(state)


def test_forward_errors_say_what_is_wrong():
    layer = SparseLinear.from_dense(pruned_weight("nm24", torch.float16, density=0.5),
                                    torch.zeros(M).half(), name="enc.fc.weight")
    with pytest.raises(TypeError, match=r"^SparseLinear 'enc.fc.weight' computes in "
                                        r"torch.float16, the input is torch.float32$"):
        layer(torch.randn(2, K))
    with pytest.raises(ValueError, match=r"^SparseLinear 'enc.fc.weight': the input's last "
                                         r"dimension must be in_features = 52, got shape "
                                         r"\(2, 51\)$"):
        layer(torch.randn(2, K - 1).half())
    x = torch.randn(2, K).half().requires_grad_()
    with pytest.raises(RuntimeError, match=r"^SparseLinear 'enc.fc.weight' is for inference "
                                           r"only: its input requires grad; run it under "
                                           r"torch.no_grad\(\) or torch.inference_mode\(\)$"):
        layer(x)
    with torch.no_grad():
        assert layer(x).shape == (2, M)
    with pytest.raises(TypeError, match="sparseforge computes float32, float16 and bfloat16, "
                                        "not torch.float64"):
        SparseLinear.from_dense(torch.zeros(3, 4, dtype=torch.float64))


def test_load_kernels_on_one_layer(tmp_path):
    w = pruned_weight("bsr:16x16", torch.bfloat16)
    fam, spec = sixteen_bit_family()
    fp32 = SparseLinear.from_dense(w.float(), pattern=spec, name="solo.weight")
    with pytest.raises(ValueError, match=rf"^SparseLinear 'solo.weight': {spec} computes in "
                                         rf"{', '.join(fam.dtypes)}, the layer is fp32$"):
        fp32.load_kernels(tmp_path / "one.db", tune=False)
    layer = SparseLinear.from_dense(w, torch.randn(M).bfloat16(), pattern="bsr:16x16",
                                    name="solo.weight")
    assert layer.kernels == {}
    layer.load_kernels(tmp_path / "one.db", n=(64,), budget="1", archs="sm_80")
    (v,) = layer.kernels["sm_80"]["variants"]
    assert v["n_bucket"] == 64 and v["kernel"].startswith("sf_bsr16x16_bf16_tm_bias_")
    assert "kernels=sm_80" in repr(layer)


def test_the_op_has_a_fake_implementation():
    x = torch.empty(2, 3, K, dtype=torch.float16, device="meta")
    packed = [torch.empty(100, dtype=torch.uint8, device="meta")]
    y = torch.ops.sparseforge.linear(x, packed, 1, M)
    assert y.shape == (2, 3, M) and y.dtype == torch.float16 and y.device.type == "meta"


def test_compile_traces_the_module_in_one_graph():
    layer = SparseLinear.from_dense(pruned_weight("bsr:16x16", torch.float32), torch.randn(M))
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    x = torch.randn(4, K)
    with torch.no_grad():
        assert torch.equal(compiled(x), layer(x))


def test_the_route_of_n_is_the_runtime_s_choice_of_bucket():
    """The op's layout for n tokens comes from the bucket sf_layer_run
    picks: nearest in ratio, the first on ties, the first below 1 token."""
    from sparseforge.torch._op import route
    buckets = [(16, "tm"), (256, "tm"), (4096, "fm")]
    assert [route(buckets, n) for n in (1, 16, 63, 65, 600, 1024, 1100, 3000, 10**6)] == \
        ["tm", "tm", "tm", "tm", "tm", "tm", "fm", "fm", "fm"]
    assert route([(16, "fm"), (64, "tm")], 32) == "fm"      # a tie: the first
    assert route([(16, "fm"), (64, "tm")], 0) == "fm"
    assert route([(64, "tm"), (16, "fm")], 32) == "tm"


def test_a_bucket_s_second_variant_serves_it_under_torch_compile():
    """route_fm: whether the bucket that runs n tokens has a feature-major
    variant, first (its route) or second (for torch.compile alone)."""
    from sparseforge.torch._op import route, route_fm
    buckets = [(16, "tm"), (16, "fm"), (256, "tm"), (4096, "fm")]
    assert [route(buckets, n) for n in (1, 16, 40, 300, 5000)] == ["tm", "tm", "tm", "tm", "fm"]
    assert [route_fm(buckets, n) for n in (1, 16, 63, 65, 300, 5000)] == \
        [True, True, True, False, False, True]
    assert not route_fm([], 16) and not route_fm([(16, "tm")], 16)


def test_buckets_losing_to_cublas_and_decode_buckets_try_the_feature_major_route():
    """A layer's buckets whose token-major kernel was slower than cuBLAS
    when tuned on this GPU, and its measured decode buckets (at most 64
    tokens), are the ones tried feature-major, under the layer's name +
    '#fm' with the same dtype and epilogue; untuned records, unmeasured
    buckets, families without feature-major kernels and those whose
    token-major kernels are as fast (csr in 16 bits) try nothing."""
    import math

    from sparseforge.generator.kernel import Epilogue, Operation
    from sparseforge.torch.convert import _fm_candidates
    from sparseforge.tuner.model import Entry
    from sparseforge.tuner.resolve import ArchCode, LayerCode, VariantCode

    def code(pattern, times, gpu="NVIDIA H100", dtype="fp16"):
        w = pruned_weight(pattern, torch.float16 if dtype == "fp16" else torch.float32, 64, 64)
        from sparseforge.torch.linear import matrix_of
        entry = Entry(0, f"l.{pattern}", matrix_of(w), pattern=pattern,
                      op=Operation(dtype, "tm", Epilogue(bias=True, activation="gelu")))
        variants = [VariantCode(n, "k", {}, {}, b"", b"", ours, peer, "tm")
                    for n, (ours, peer) in times.items()]
        return LayerCode(entry, {"sm_90a": ArchCode("sm_90a", gpu, variants)})

    times = {16: (0.01, 0.02), 256: (0.02, 0.03), 4096: (0.5, 0.2)}
    codes = [code("shflbw:64", times), code("bsr:16x16", {16: (0.01, 0.02)}),
             code("shflbw:64", {16: (math.nan, 0.02), 4096: (0.3, math.nan)}),
             code("shflbw:64", times, gpu="untuned (sm_90a)"),
             code("csr", times), code("csr", times, dtype="fp32")]
    got = _fm_candidates(codes, "sm_90a")
    assert [(i, ns) for i, _, ns in got] == [(0, [16, 4096]), (1, [16]), (5, [16, 4096])]
    fm = got[0][1]
    assert fm.name == "l.shflbw:64#fm" and fm.op.layout == "fm"
    assert fm.op.epilogue == codes[0].entry.op.epilogue and fm.op.dtype == "fp16"
    assert _fm_candidates(codes, "sm_80") == []


def untuned_layer(pattern: str, name: str, db, archs: str):
    """(a 64 x 48 fp16 SparseLinear with a bias, given untuned kernels for
    N = 8 and 512 in `db` for `archs`, its pruned weight, its bias, its
    tuner Entry)."""
    from sparseforge.torch.convert import _entry
    w = pruned_weight(pattern, torch.float16, 64, 48)
    bias = torch.randn(64).half()
    layer = SparseLinear.from_dense(w, bias, pattern=pattern, name=name)
    layer.load_kernels(db, n=(8, 512), archs=archs)
    return layer, w, bias, _entry(0, layer)


def test_a_feature_major_bucket_carries_its_transposes_through_the_state(tmp_path):
    """A bucket given the feature-major kernel (as sparsify's route does on
    a GPU) keeps its layout, and its architecture the transposes' cubin,
    through state_dict into an empty layer; a token-major-only
    architecture carries no transpose cubin; on CPU the layer is still
    F.linear."""
    from sparseforge.cache import Cache
    from sparseforge.torch.convert import _fm_entry
    from sparseforge.tuner.driver import QUICK_TIMING, Tuner
    from sparseforge.tuner.resolve import ArchCode, LayerCode, resolve
    db = tmp_path / "fm.db"
    layer, w, bias, entry = untuned_layer("shflbw:16", "route.weight", db, "sm_80,sm_90a")
    assert all("transpose" not in k for k in layer.kernels.values())
    with Cache(db) as cache:
        (tm,) = resolve(cache, [entry], [8, 512], False, archs=["sm_80", "sm_90a"])
        (fm,) = resolve(cache, [_fm_entry(entry)], [512], True, archs=["sm_90a"],
                        make_tuner=lambda: Tuner(cache, arch="sm_90a", budget="1",
                                                 timing=QUICK_TIMING))
    fm_v = fm.archs["sm_90a"].variants[0]
    assert fm_v.layout == "fm" and fm_v.kernel_name.startswith("sf_shflbw16_fp16_fm_bias")
    ac = tm.archs["sm_90a"]
    tm.archs["sm_90a"] = ArchCode(ac.arch, ac.gpu_name, [ac.variants[0], fm_v])
    layer.attach(LayerCode(entry, tm.archs))
    k = layer.kernels
    assert [v["layout"] for v in k["sm_90a"]["variants"]] == ["tm", "fm"]
    assert "transpose" in k["sm_90a"] and "transpose" not in k["sm_80"]
    fresh = SparseLinear(48, 64, dtype=torch.float16)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.kernels == k
    cubin = fresh.get_extra_state()["cubins"][k["sm_90a"]["transpose"]]
    assert cubin[:4] == b"\x7fELF"
    x = torch.randn(5, 48).half()
    assert torch.equal(fresh(x), F.linear(x, w, bias))


def measured_code(pattern, times, gpu="NVIDIA H100", dtype="fp16"):
    """A LayerCode of a 64 x 64 layer as if tuned on `gpu` (sm_90a): one
    variant a bucket per entry of `times`, n -> (ours ms, cuBLAS ms) or a
    list of (ours, cuBLAS, layout) variants."""
    from sparseforge.generator.kernel import Epilogue, Operation
    from sparseforge.torch.linear import matrix_of
    from sparseforge.tuner.model import Entry
    from sparseforge.tuner.resolve import ArchCode, LayerCode, VariantCode
    w = pruned_weight(pattern, torch.float16 if dtype == "fp16" else torch.float32, 64, 64)
    entry = Entry(0, f"l.{pattern}", matrix_of(w), pattern=pattern,
                  op=Operation(dtype, "tm", Epilogue(bias=True)))
    variants = []
    for n, t in times.items():
        for ours, peer, layout in (t if isinstance(t, list) else [(*t, "tm")]):
            variants.append(VariantCode(n, f"k{n}{layout}", {"n": n}, {"bn": 16}, b"p", b"c",
                                        ours, peer, layout))
    return LayerCode(entry, {"sm_90a": ArchCode("sm_90a", gpu, variants)})


def test_buckets_whose_kernels_lose_to_cublas_run_cublas():
    """_dense_buckets: a bucket whose best variant measured on this GPU
    (its kernel, route or compiled variant) is below min_speedup x
    cuBLAS becomes one "dense" variant (cuBLAS's time, the kernel's kept
    as sparse_ms); where only its first (eager) variant loses, that one
    alone becomes "dense" and the winning variant for torch.compile
    stays second; buckets that win, buckets measured nowhere, untuned
    records and other architectures keep their kernels; None changes
    nothing.  A layer all of whose buckets went dense is named by
    _slower_everywhere with its best speedup."""
    import math

    from sparseforge.torch.convert import _dense_buckets, _slower_everywhere
    times = {16: (0.01, 0.02), 256: [(0.04, 0.03, "tm"), (0.02, 0.03, "fm")],
             4096: (0.5, 0.2)}
    codes = [measured_code("shflbw:64", times),
             measured_code("shflbw:64", {16: (math.nan, 0.02), 4096: (0.3, math.nan)}),
             measured_code("shflbw:64", times, gpu="untuned (sm_90a)"),
             measured_code("csr", {16: (0.03, 0.02), 4096: (0.6, 0.3)})]
    before = [[(v.n_bucket, v.layout) for v in c.archs["sm_90a"].variants] for c in codes]
    _dense_buckets(codes, "sm_90a", None)
    _dense_buckets(codes, "sm_80", 1.0)
    assert [[(v.n_bucket, v.layout) for v in c.archs["sm_90a"].variants]
            for c in codes] == before
    _dense_buckets(codes, "sm_90a", 1.0)
    got = [[(v.n_bucket, v.layout) for v in c.archs["sm_90a"].variants] for c in codes]
    assert got == [[(16, "tm"), (256, "dense"), (256, "fm"), (4096, "dense")],
                   before[1], before[2], [(16, "dense"), (4096, "dense")]]
    v = codes[0].archs["sm_90a"].variants
    assert (v[3].median_ms, v[3].peer_ms, v[3].sparse_ms, v[3].speedup) == (0.2, 0.2, 0.5, 1.0)
    assert (v[3].kernel_name, v[3].packed, v[3].cubin, v[3].config) == ("", b"", b"", {})
    assert (v[1].median_ms, v[1].sparse_ms, v[2].median_ms, v[2].kernel_name) == \
        (0.03, 0.04, 0.02, "k256fm")
    assert [_slower_everywhere(c) for c in codes[:3]] == ["", "", ""]
    assert _slower_everywhere(codes[3]) == (
        "its kernels lose to cuBLAS at every N (best 0.67x, N = 16; min_speedup=None "
        "converts it)")


def test_a_dense_bucket_goes_through_the_state_without_a_kernel(tmp_path):
    """A bucket cuBLAS serves has no kernel, cubin or packed buffer; it
    keeps its times through state_dict (format 2, where a state without
    one stays format 1) into an empty layer; on CPU the layer is still
    F.linear."""
    import dataclasses

    from sparseforge.cache import Cache
    from sparseforge.torch.convert import _dense_buckets
    from sparseforge.tuner.resolve import LayerCode, resolve
    db = tmp_path / "d.db"
    layer, w, bias, entry = untuned_layer("bsr:16x16", "dense.weight", db, "sm_90a")
    assert layer.get_extra_state()["format"] == 1
    with Cache(db) as cache:
        (code,) = resolve(cache, [entry], [8, 512], False, archs=["sm_90a"])
    ac = code.archs["sm_90a"]
    ac.gpu_name = "NVIDIA H100"                    # as if measured there: 512 loses
    ac.variants = [dataclasses.replace(v, median_ms=0.01 if v.n_bucket == 8 else 0.4,
                                       peer_ms=0.02 if v.n_bucket == 8 else 0.2)
                   for v in ac.variants]
    _dense_buckets([code], "sm_90a", 1.0)
    layer.attach(LayerCode(entry, {"sm_90a": ac}))
    k = layer.kernels["sm_90a"]["variants"]
    assert [(v["n_bucket"], v["layout"], v["blob"], v["cubin"]) for v in k] == \
        [(8, "tm", 0, 0), (512, "dense", -1, -1)]
    assert (k[1]["median_ms"], k[1]["peer_ms"], k[1]["sparse_ms"], k[1]["kernel"]) == \
        (0.2, 0.2, 0.4, "")
    state = layer.state_dict()
    assert state["_extra_state"]["format"] == 2 and len(state["_extra_state"]["cubins"]) == 1
    assert [key for key in state if key.startswith("packed_")] == ["packed_0"]
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    fresh = SparseLinear(48, 64, dtype=torch.float16)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.kernels == layer.kernels
    x = torch.randn(5, 48).half()
    assert torch.equal(fresh(x), F.linear(x, w, bias))


def test_sparsify_keeps_a_layer_whose_kernels_lose_everywhere(tmp_path, monkeypatch):
    """A layer every measured bucket of which went to cuBLAS stays an
    nn.Linear, named in the report with its best speedup; a layer with
    one such bucket is converted, and the report shows cuBLAS in that
    bucket with the kernel's speedup."""
    import dataclasses

    from sparseforge.torch import convert
    real = convert.kernels_for

    def measured(layers, *args, min_speedup=convert.MIN_SPEEDUP, **kw):
        codes, where, _ = real(layers, *args, min_speedup=min_speedup, **kw)
        for i, code in enumerate(codes):    # as if tuned on a GPU: layer 0 loses everywhere
            ac = code.archs["sm_90a"]
            ac.gpu_name = "NVIDIA H100"
            ac.variants = [dataclasses.replace(v, median_ms=0.3 if i == 0 or v.n_bucket == 256
                                               else 0.1, peer_ms=0.2) for v in ac.variants]
        convert._dense_buckets(codes, "sm_90a", min_speedup)
        for layer, code in zip(layers, codes):
            layer.attach(code)
        return codes, where, "NVIDIA H100"

    monkeypatch.setattr(convert, "kernels_for", measured)
    model = small_model()
    report = sparsify(model, db=tmp_path / "m.db", n=(16, 256), budget="1", archs="sm_90a",
                      progress=False)
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "SparseLinear", "Linear"]
    assert [(r.name, r.pattern, r.dense) for r in report.layers] == [
        ("0", "nm24", "its kernels lose to cuBLAS at every N (best 0.67x, N = 16; "
                      "min_speedup=None converts it)"),
        ("2", "bsr:16x16", ""), ("3", "", "density 1.00")]
    assert [v["layout"] for v in model[2].kernels["sm_90a"]["variants"]] == ["tm", "dense"]
    table = str(report)
    assert "cuBLAS (the kernel: 0.67x)" in table and "1 of 3 Linear layers converted" in table
    assert report.layers[1].cublas_bytes == 128 * 64 * 2          # bsr:16x16 128 x 64, no bias
    assert "1 of them run cuBLAS at some N: their dense weights take 16 KiB more" in table
    again = small_model()
    sparsify(again, db=tmp_path / "m.db", n=(16, 256), archs="sm_90a", progress=False,
             min_speedup=None)
    assert [type(m).__name__ for m in again] == ["SparseLinear", "ReLU", "SparseLinear",
                                                 "Linear"]


def test_forward_takes_the_op_only_when_compiling():
    """SparseLinear.forward calls the op's implementation directly unless
    torch.compile traces it (then the op, which the compiler sees)."""
    from sparseforge.torch.linear import _compiling

    def f(x):
        return x + (1 if _compiling() else 0)

    t = torch.zeros(3)
    assert torch.equal(f(t), t)
    assert torch.equal(torch.compile(f, backend="eager", fullgraph=True)(t), t + 1)
