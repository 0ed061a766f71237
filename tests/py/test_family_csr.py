"""The csr family: plan/unpack, search space and its constraints, rendering
(immediates and __constant__ tables read back exactly), NVRTC compiles for
sm_80 and sm_90a; on a GPU, correctness across configurations, shapes,
epilogues and the DLMC subset."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from sparseforge.generator.families import csr as csr_mod
from sparseforge.generator.families import get_family
from sparseforge.generator.kernel import ConfigError, Epilogue, Operation
from sparseforge.generator.matrix import SparseMatrix, round_to_dtype

FAM = get_family("csr")
FM = Operation(dtype="fp32", layout="fm")
TM = Operation(dtype="fp32", layout="tm")
REPO = Path(__file__).resolve().parents[2]


def random_matrix(m, k, density, seed=0, empty_rows=(), dtype="fp32"):
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((m, k)).astype(np.float32)
    d[rng.random((m, k)) >= density] = 0
    for r in empty_rows:
        d[r] = 0
    return SparseMatrix.from_dense(d, dtype=dtype)


def same_matrix(a: SparseMatrix, b: SparseMatrix):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(round_to_dtype(a.values, a.dtype).view(np.uint32),
                                  b.values.view(np.uint32))
    if a.perm is None:
        assert b.perm is None
    else:
        np.testing.assert_array_equal(a.perm, b.perm)


def cfg(tables="global", vec=4, rows=4, unroll=None, split=1, rb=None):
    c = {"tables": tables, "vec": vec, "rows": rows, "split": split,
         "unroll": unroll if unroll is not None else (1 if tables == "imm" else 4)}
    if rb is not None:
        c["rb"] = rb
    return c


# ---- plan / unpack -----------------------------------------------------------

SHAPES = [
    ("odd", lambda: random_matrix(37, 53, 0.3, seed=1, empty_rows=(0, 5, 36))),
    ("one_row", lambda: random_matrix(1, 7, 0.9, seed=2)),
    ("one_col", lambda: random_matrix(9, 1, 0.5, seed=3)),
    ("all_zero", lambda: SparseMatrix.from_dense(np.zeros((13, 17), np.float32))),
    ("dense", lambda: random_matrix(5, 6, 1.01, seed=4)),
    ("fp16", lambda: random_matrix(21, 30, 0.4, seed=5, dtype="fp16")),
]


@pytest.mark.parametrize("name,make", SHAPES, ids=[s[0] for s in SHAPES])
def test_plan_unpack_round_trip(name, make):
    m = make()
    for tables in FAM.tables_allowed(m):
        p = FAM.plan(m, FM, {}, cfg(tables, vec=2))
        same_matrix(m, FAM.unpack(p))
        # the schedule: a permutation, nonzero counts non-increasing
        assert sorted(p.order.tolist()) == list(range(m.rows))
        counts = np.diff(p.ptr)
        assert np.all(counts[:-1] >= counts[1:])
        np.testing.assert_array_equal(counts, m.row_nnz()[p.order])
        for off in p.offsets.values():
            assert off % 16 == 0
        assert len(p.packed) % 16 == 0


def test_round_trip_keeps_permutation_and_bias():
    m = random_matrix(24, 40, 0.25, seed=7, empty_rows=(3,))
    perm = np.random.default_rng(0).permutation(24)
    m = SparseMatrix(m.shape, m.indptr, m.indices, m.values, perm=perm, name="w")
    bias = np.linspace(-1, 1, 24).astype(np.float32)
    op = Operation(dtype="fp32", layout="fm", epilogue=Epilogue(bias=True))
    p = FAM.plan(m, op, {}, cfg(), bias=bias)
    back = FAM.unpack(p)
    same_matrix(m, back)
    assert back.name == "w"
    mat2, bias2 = csr_mod.unpack_packed(p.packed)
    np.testing.assert_array_equal(bias2, bias)
    assert csr_mod.unpack_packed(FAM.plan(m, FM, {}, cfg()).packed)[1] is None


def test_plan_rejects_bad_bias():
    m = random_matrix(8, 8, 0.5)
    op = Operation(dtype="fp32", layout="fm", epilogue=Epilogue(bias=True))
    with pytest.raises(ValueError, match="none was given"):
        FAM.plan(m, op, {}, cfg())
    with pytest.raises(ValueError, match="expected M = 8"):
        FAM.plan(m, op, {}, cfg(), bias=np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="epilogue adds none"):
        FAM.plan(m, FM, {}, cfg(), bias=np.zeros(8, np.float32))


# ---- search space and constraints ------------------------------------------------

def test_search_space_small_matrix_has_every_table_kind():
    m = random_matrix(37, 53, 0.3)
    for op, lo, hi in ((FM, 60, 80), (TM, 60, 100)):
        space = FAM.search_space(m, op, {})
        assert lo <= len(space) <= hi
        staged = [c for c in space if c.get("rb", 0)]
        assert bool(staged) == (op is TM)
        assert all(c["tables"] == "global" and c["vec"] in (1, 2) for c in staged)
        assert {c["tables"] for c in space} == {"global", "const", "imm"}
        assert len({tuple(sorted(c.items())) for c in space}) == len(space)
        for c in space:
            FAM.check_config(c, m, op, {})
            if c["tables"] == "imm":
                assert c["unroll"] == 1 and c["vec"] in (1, 2)
        assert {c["split"] for c in space} == {1, 2, 4, 8}
        assert {c["split"] for c in space if c["tables"] == "imm"} == {1, 4}


def test_fp32_hints_are_the_measured_winners_in_the_space():
    """The DLMC winners (FP32_*): in the space, the small-N shapes first up
    to about a thousand columns of N, the large-N ones above, in turn when
    N is unknown (the untuned default is the first of those); token-major
    its own; a device's thread limit drops what it cannot run."""
    m = random_matrix(300, 400, 0.1, seed=11)
    for op in (FM, TM):
        space = FAM.search_space(m, op, {})
        for n in (None, 49, 784, 2048, 25088):
            hints = FAM.hint_configs(m, op, {}, None, n)
            assert len(hints) >= 4 and all(h in space for h in hints)
            assert len({str(sorted(h.items())) for h in hints}) == len(hints)
    small, large = (FAM.hint_configs(m, FM, {}, None, n)[0] for n in (784, 2048))
    assert (small["rows"], small["split"], small["vec"]) == (2, 2, 4)
    assert (large["rows"], large["split"], large["vec"]) == (16, 1, 4)
    # blocks of many rows only where the matrix holds at least 8 of them
    assert not [c for c in FAM.search_space(random_matrix(100, 400, 0.1, seed=12), FM, {})
                if c["rows"] > 8]
    assert FAM.hint_configs(m, FM, {}, None, None)[:2] == [small, large]
    assert FAM.default_config(m, FM, {}) == small
    assert all(h["vec"] in (1, 2) for h in FAM.hint_configs(m, TM, {}))
    few = FAM.hint_configs(m, FM, {}, {"max_threads_per_block": 128}, 2048)
    assert few and all(h["rows"] * h["split"] <= 4 for h in few) and len(few) < 8
    assert FAM.default_config(m, FM, {}, {"max_threads_per_block": 128}) in \
        FAM.search_space(m, FM, {}, {"max_threads_per_block": 128})


def test_search_space_large_matrix_is_global_only():
    m = random_matrix(600, 500, 0.2, seed=3)          # ~60k nonzeros
    assert m.nnz > csr_mod.IMM_MAX_NNZ
    space = FAM.search_space(m, FM, {})
    assert space and {c["tables"] for c in space} == {"global"}
    with pytest.raises(ConfigError, match="nnz <= 8192: straight-line code compiles"):
        FAM.check_config(cfg("imm", 2), m, FM, {})
    with pytest.raises(ConfigError, match="the tables fit the 64 KB constant bank"):
        FAM.check_config(cfg("const"), m, FM, {})


def test_search_space_respects_device_thread_limit():
    m = random_matrix(37, 53, 0.3)
    space = FAM.search_space(m, FM, {}, device={"max_threads_per_block": 128})
    assert space and max(c["rows"] * c["split"] for c in space) == 4
    with pytest.raises(ConfigError, match="threads <= max_threads: the block fits the GPU"):
        FAM.check_config(cfg(rows=2, split=4), m, FM, {}, device={"max_threads_per_block": 128})


@pytest.mark.parametrize("bad,match", [
    ({"vec": 3}, r"vec in \(1, 2, 4, 8\)"),
    ({"rows": 0}, "rows and split are >= 1"),
    ({"rows": 33}, "with at most 32 warps a block"),
    ({"rows": 8, "split": 8}, "with at most 32 warps a block"),
    ({"split": 0}, "rows and split are >= 1"),
    ({"tables": "imm", "unroll": 1, "vec": 4}, "wider loads spill in straight-line code"),
    ({"unroll": 3}, "unroll divides the warp's staged chunk of 32 nonzeros"),
    ({"tables": "shared"}, "tables: must be one of"),
    ({"tables": "imm", "unroll": 4}, "straight-line code is fully unrolled"),
    ({"vec": "4"}, "vec must be an integer"),
    ({"rb": 4}, "rb == 0 or tm == 1: X is staged in token-major only"),
    ({"rb": 3}, r"rb in \(0, 1, 2, 4, 8, 16, 32\)"),
    ({"rb": True}, "rb must be an integer"),
])
def test_invalid_configs_name_the_constraint(bad, match):
    m = random_matrix(37, 53, 0.3)
    c = cfg()
    c.update(bad)
    with pytest.raises(ConfigError, match=match):
        FAM.check_config(c, m, FM, {})


def test_invalid_operation_and_keys():
    m = random_matrix(8, 8, 0.5)
    # fp16 and bf16 take the tensor-core kernels, whose keys differ
    with pytest.raises(ConfigError, match=r"csr \(fp16/bf16\) config needs the keys"):
        FAM.check_config(cfg(), m, Operation(dtype="fp16"), {})
    with pytest.raises(ConfigError, match="missing \\['unroll'\\]"):
        FAM.check_config({"tables": "global", "vec": 1, "rows": 4, "split": 1}, m, FM, {})
    with pytest.raises(ConfigError, match="no pattern parameters"):
        FAM.check_config(cfg(), m, FM, {"v": 64})


def test_const_limit_matches_bytes():
    # 16-bit columns: 4 M + 4 (M + 1) + 6 nnz bytes
    assert csr_mod.const_bytes(100, 1000, 1000) == 400 + 404 + 6000
    assert csr_mod.const_bytes(100, 70000, 1000) == 400 + 404 + 8000


# ---- rendering -------------------------------------------------------------------

@pytest.mark.parametrize("split", [1, 4])
def test_imm_source_holds_every_nonzero_exactly(split):
    m = random_matrix(37, 53, 0.3, seed=11, empty_rows=(4,))
    # awkward values: tiny, huge, negative zero-ish, many digits
    vals = m.values.copy()
    vals[:4] = [1e-38, 3.4e38, -1.17549435e-38, 0.1]
    m = m.with_values(vals)
    op = Operation(dtype="fp32", layout="fm", epilogue=Epilogue(bias=True, activation="relu"))
    bias = np.random.default_rng(0).standard_normal(37).astype(np.float32)
    k = FAM.generate(m, op, {}, cfg("imm", vec=2, rows=4 // split, split=split), bias=bias)
    body = k.source.split("struct Rows", 1)[1]
    cases = re.findall(r"(case (\d+)|default):  // row (\d+), (\d+) nonzeros\n(.*?)return (\d+);",
                       body, re.S)
    assert len(cases) == m.rows * split
    dense = np.zeros(m.shape, np.float32)
    got_bias = np.zeros(m.rows, np.float32)
    for _, _, row, nnz, text, ret in cases:
        r = int(row)
        assert int(ret) == r
        terms = re.findall(r"a\((\d+), ([^)]+)f\);", text)
        assert len(terms) == int(nnz)
        for c, v in terms:
            assert dense[r, int(c)] == 0          # every nonzero in one piece only
            dense[r, int(c)] = np.float32(v)
        got_bias[r] = np.float32(re.search(r"bias = ([^;]+)f;", text).group(1))
    np.testing.assert_array_equal(dense.view(np.uint32), m.to_dense().view(np.uint32))
    np.testing.assert_array_equal(got_bias, bias)
    assert k.name == f"sf_csr_fp32_fm_bias_relu_rows{4 // split}_split{split}_tablesimm_unroll1_vec2"
    assert k.launch["grid"] == (-(-37 // (4 // split)), 1, 1) and k.launch["block"] == (128, 1, 1)
    assert k.launch["n_axis"] == 1 and k.launch["n_tile"] == 64


def test_const_source_holds_the_tables():
    m = random_matrix(19, 70, 0.3, seed=12)
    k = FAM.generate(m, TM, {}, cfg("const", vec=2))
    p = FAM.plan(m, TM, {}, cfg("const", vec=2))

    def arr(name):
        text = re.search(name + r"\[\d+\] = \{(.*?)\};", k.source, re.S).group(1)
        return [t.strip() for t in text.split(",") if t.strip()]
    assert [int(v) for v in arr("c_order")] == p.order.tolist()
    assert [int(v) for v in arr("c_ptr")] == p.ptr.tolist()
    assert [int(v) for v in arr("c_col")] == p.col.tolist()
    np.testing.assert_array_equal(np.array([np.float32(v[:-1]) for v in arr("c_val")]), p.val)
    assert "unsigned short c_col" in k.source
    assert k.launch["n_tile"] == 64


def test_name_is_the_configuration():
    m = random_matrix(10, 10, 0.5)
    op = Operation(dtype="fp32", layout="tm", epilogue=Epilogue(activation="gelu", scale=0.5))
    k = FAM.generate(m, op, {}, cfg("global", vec=2, rows=2, unroll=8, split=4))
    assert k.name == "sf_csr_fp32_tm_s0_5_gelu_rows2_split4_tablesglobal_unroll8_vec2"
    assert k.launch["block"] == (256, 1, 1) and k.launch["grid"] == (5, 1, 1)
    assert f"void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)\n{k.name}(" in k.source
    assert '#include "sf/' not in k.source


# ---- NVRTC compiles ------------------------------------------------------------------

COMPILE_CASES = [  # layout, tables, vec, rows, split, unroll, epilogue
    ("fm", "global", 4, 4, 1, 8, Epilogue()),
    ("fm", "global", 8, 2, 2, 8, Epilogue(bias=True, activation="gelu")),
    ("fm", "const", 8, 4, 1, 8, Epilogue()),
    ("fm", "global", 1, 2, 4, 4, Epilogue(bias=True, activation="gelu", scale=0.5)),
    ("fm", "const", 2, 2, 2, 4, Epilogue(activation="relu")),
    ("fm", "imm", 2, 4, 1, 1, Epilogue(bias=True)),
    ("fm", "imm", 1, 8, 1, 1, Epilogue(activation="gelu")),
    ("tm", "global", 2, 4, 2, 8, Epilogue(bias=True, activation="relu")),
    ("tm", "const", 1, 8, 1, 4, Epilogue()),
    ("tm", "imm", 2, 4, 1, 1, Epilogue(scale=2.0)),
    ("tm", "global", 1, 4, 1, 8, Epilogue(bias=True, activation="gelu"), 16),   # X staged
    ("tm", "global", 2, 2, 2, 8, Epilogue(), 4),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_templates_compile_with_nvrtc(arch, nvrtc):
    m = random_matrix(45, 77, 0.2, seed=21, empty_rows=(2, 44))
    bias = np.ones(45, np.float32)
    for layout, tables, vec, rows, split, unroll, ep, *rb in COMPILE_CASES:
        op = Operation(dtype="fp32", layout=layout, epilogue=ep)
        k = FAM.generate(m, op, {}, cfg(tables, vec, rows, unroll, split, *rb),
                         bias=bias if ep.bias else None)
        res = nvrtc(k.source, arch, k.name + ".cu", options=("--ptxas-options=-v",))
        assert len(res.data) > 0 and k.name.encode() in res.data
        assert "0 bytes spill stores" in res.log and "warning" not in res.log.lower(), res.log


# ---- GPU ---------------------------------------------------------------------------------

def _verify(matrix, op, config, n, bias=None, seed=0):
    from sparseforge.tuner.execute import verify
    res = verify(FAM, matrix, op, {}, config, n, bias=bias, seed=seed)
    assert res["ok"], (config, n, res)
    return res


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_every_config(layout):
    """Every configuration of the space on an odd matrix with empty rows,
    for N = 1, an odd N (scalar path for vec > 1) and N past one tile."""
    m = random_matrix(37, 53, 0.3, seed=1, empty_rows=(0, 5, 36))
    op = Operation(dtype="fp32", layout=layout)
    for c in FAM.search_space(m, op, {}):
        for n in (1, 37, 260):
            _verify(m, op, c, n)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_epilogues(layout):
    m = random_matrix(29, 41, 0.25, seed=2, empty_rows=(7,))
    for ep in (Epilogue(bias=True), Epilogue(bias=True, activation="relu"),
               Epilogue(bias=True, activation="gelu", scale=0.5), Epilogue(activation="gelu")):
        op = Operation(dtype="fp32", layout=layout, epilogue=ep)
        for tables in ("global", "const", "imm"):
            for vec in (1, 2) if layout == "tm" or tables == "imm" else (1, 4, 8):
                for n in (3, 64):
                    _verify(m, op, cfg(tables, vec), n)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_all_zero_and_single_row(layout):
    op = Operation(dtype="fp32", layout=layout, epilogue=Epilogue(bias=True, activation="relu"))
    for m in (SparseMatrix.from_dense(np.zeros((13, 17), np.float32)),
              random_matrix(1, 300, 0.5, seed=3), random_matrix(70, 1, 0.5, seed=4)):
        for tables in FAM.tables_allowed(m):
            _verify(m, op, cfg(tables, 2), 5)
            _verify(m, op, cfg(tables, 1, rows=8 if tables != "imm" else 4), 33)
            if tables != "imm":
                _verify(m, op, cfg(tables, 4, rows=1, split=4), 7)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_large_n_and_long_rows(layout):
    op = Operation(dtype="fp32", layout=layout)
    m = random_matrix(300, 700, 0.15, seed=5)
    # one very long row and several empty ones
    d = m.to_dense()
    d[17] = np.random.default_rng(1).standard_normal(700)
    d[40:45] = 0
    m = SparseMatrix.from_dense(d)
    staged = [cfg("global", 1, 4, 8, rb=16), cfg("global", 2, 2, 8, split=2, rb=4)] \
        if layout == "tm" else []
    for c in [cfg("global", 4 if layout == "fm" else 2, 4, 8), cfg("global", 1, 8, 4),
              cfg("global", 2, 2, 8, split=4),
              cfg("global", 8 if layout == "fm" else 2, 2, 4, 2)] + staged:
        for n in (4096, 4093):
            _verify(m, op, c, n)
    if layout == "fm":
        # blocks of 16 and 32 rows (the feature-major space's larger shapes;
        # 300 rows: the last block partly empty), 8 columns a thread at 512
        for c in (cfg("global", 4, 16, 8), cfg("global", 4, 16, 8, split=2),
                  cfg("global", 2, 32, 8), cfg("global", 8, 8, 8, split=2)):
            for n in (4093, 520, 3):
                _verify(m, op, c, n)
    # straight-line code with a long row (imm allows up to 8192 nonzeros)
    d = random_matrix(40, 700, 0.15, seed=6).to_dense()
    d[3] = np.random.default_rng(2).standard_normal(700)
    small = SparseMatrix.from_dense(d)
    assert small.nnz <= csr_mod.IMM_MAX_NNZ
    _verify(small, op, cfg("imm", 2, 4), 4096)
    _verify(small, op, cfg("const", 1, 2, 8, split=2), 4093)


def _dlmc_dir():
    for cand in (os.environ.get("SPARSEFORGE_DLMC"), REPO.parent / "shared" / "data" / "dlmc",
                 REPO / "shared" / "data" / "dlmc"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


@pytest.mark.gpu
def test_gpu_dlmc_subset_n256():
    """Every DLMC matrix of the subset, N = 256, fm: the global kernel and
    the const / imm kernels where the matrix allows them; tm global."""
    from sparseforge.generator import io
    root = _dlmc_dir()
    if root is None:
        pytest.skip("DLMC subset not found (set SPARSEFORGE_DLMC)")
    files = sorted(root.rglob("*.smtx"))
    assert len(files) >= 18
    report = []
    for f in files:
        m = io.load_one(f)
        for tables in FAM.tables_allowed(m):
            t0 = time.perf_counter()
            res = _verify(m, FM, cfg(tables, 2 if tables == "imm" else 4, 4), 256)
            report.append(f"{f.parent.name}/{f.stem} {m.shape} nnz={m.nnz} {tables}: "
                          f"err {res['norm_rel_err']:.2e} ({time.perf_counter() - t0:.1f} s)")
        _verify(m, TM, cfg("global", 1, 4, 8), 256)
        staged = cfg("global", 1, 4, 8, rb=16)
        try:
            FAM.check_config(staged, m, TM, {})           # the staged tile fits (K <= 1760)
        except ConfigError:
            continue
        _verify(m, TM, staged, 256)
    print("\n".join(report))
