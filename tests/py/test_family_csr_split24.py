"""The csr family's split 2:4 format (fp16/bf16 on sm_90a, config key
`s24`): the split (a 2:4 part holding the two largest of every group of 4,
a residual holding the rest, their sum W), the packed buffer read back,
the configurations (the 2:4 family's TMA tiles), the hint order, NVRTC
compiles without spills; on a GPU, correctness over odd shapes, both
layouts, both dtypes, the epilogues, split K, clusters, N not a multiple
of 8, several K slices of a row's residual, and residuals from none to a
third of the nonzeros."""
from __future__ import annotations


import numpy as np
import pytest

from sparseforge.generator.families import get_family
from sparseforge.generator.families.csr import split24
from sparseforge.generator.families.nm24.pack import first_violation
from sparseforge.generator.kernel import ConfigError, Epilogue, Operation
from sparseforge.generator.matrix import SparseMatrix, round_to_dtype

FAM = get_family("csr")
H100 = {"smem_per_block_optin": 232448, "sm_count": 132, "cc_major": 9, "cc_minor": 0,
        "arch": "sm_90a"}
A100 = {"smem_per_block_optin": 166912, "sm_count": 108, "cc_major": 8, "cc_minor": 0,
        "arch": "sm_80"}
TILE = dict(bm=64, bn=16, bk=128, wm=1, wn=1, stages=12, wg=1, tma=1, cm=1, ks=2, mw=1, mt=1,
            ra=0, s24=1)


def random_matrix(m, k, density, seed=0, dtype="fp16"):
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((m, k)).astype(np.float32)
    d[rng.random((m, k)) >= density] = 0
    return SparseMatrix.from_dense(d, dtype=dtype)


@pytest.mark.parametrize("m,k,density", [(37, 53, 0.3), (64, 128, 0.6), (5, 7, 1.0),
                                         (20, 40, 0.0)])
def test_split_keeps_the_two_largest_of_each_group(m, k, density):
    mat = random_matrix(m, k, density, seed=m)
    part, res = split24.split(mat)
    assert first_violation(part) is None
    np.testing.assert_array_equal(part.to_dense() + res.to_dense(), mat.to_dense())
    assert not np.any(part.mask() & res.mask())
    # every residual entry is at most the smaller of its group's two kept ones
    dense_p, dense_r = np.abs(part.to_dense()), np.abs(res.to_dense())
    kp = -(-k // 4) * 4
    pad = lambda a: np.pad(a, ((0, 0), (0, kp - k))).reshape(m, kp // 4, 4)
    gp, gr = pad(dense_p), pad(dense_r)
    kept = (pad(part.mask())).sum(axis=2)
    over = gr.max(axis=2) > 0
    assert np.all(kept[over] == 2)
    smallest_kept = np.where(pad(part.mask()), gp, np.inf).min(axis=2)
    assert np.all(gr.max(axis=2)[over] <= smallest_kept[over])
    expect = 0.0 if mat.nnz == 0 else res.nnz / mat.nnz
    assert split24.residual_fraction(mat) == pytest.approx(expect)


@pytest.mark.parametrize("m,k,density,rows", [(300, 520, 0.1, 128), (64, 128, 0.6, 16),
                                              (5, 7, 1.0, 128), (20, 40, 0.0, 128)])
def test_split_for_steps_needs_fewer_columns_a_tile(m, k, density, rows):
    """The residual in steps (tile_rows): a 2:4 part and the residual that
    make W, as many residual nonzeros as the two-largest split, and no
    more distinct columns in any tile of rows (fewer in all)."""
    mat = random_matrix(m, k, density, seed=m + 1)
    part, res = split24.split(mat, rows)
    assert first_violation(part) is None
    np.testing.assert_array_equal(part.to_dense() + res.to_dense(), mat.to_dense())
    assert not np.any(part.mask() & res.mask())
    _, res0 = split24.split(mat)
    assert res.nnz == res0.nnz
    np.testing.assert_array_equal(np.diff(res.indptr), np.diff(res0.indptr))

    def columns(r):
        return [len(set(r.indices[r.indptr[a]:r.indptr[min(a + rows, m)]]))
                for a in range(0, m, rows)]
    assert sum(columns(res)) <= sum(columns(res0))
    if m == 300:
        assert sum(columns(res)) < 0.9 * sum(columns(res0))


def test_split_for_steps_shares_a_column_across_rows():
    """Two rows of one tile, each a group of 3 (columns 0-2 and 1-3) whose
    smallest members differ (0 and 3): one shared column (1) holds the
    residual; tiles of one row each need a column each."""
    w = np.zeros((2, 4), np.float32)
    w[0, :3] = [1, 5, 6]
    w[1, 1:] = [7, 8, 2]
    mat = SparseMatrix.from_dense(w, dtype="fp16")
    assert sorted(split24.split(mat)[1].indices) == [0, 3]
    res = split24.split(mat, 2)[1]
    assert list(res.indices) == [1, 1] and list(np.diff(res.indptr)) == [1, 1]
    assert len(set(split24.split(mat, 1)[1].indices)) == 2


@pytest.mark.parametrize("layout,dtype", [("fm", "fp16"), ("tm", "bf16")])
def test_plan_reads_back_and_carries_bias_and_permutation(layout, dtype):
    mat = random_matrix(100, 200, 0.4, seed=3, dtype=dtype)
    mat.perm = np.random.default_rng(0).permutation(100)
    op = Operation(dtype, layout, Epilogue(bias=True, activation="gelu"))
    p = FAM.plan(mat, op, {}, TILE, bias=np.arange(100.0))
    back = FAM.unpack(p)
    np.testing.assert_array_equal(back.to_dense(), round_to_dtype(mat.to_dense(), dtype))
    np.testing.assert_array_equal(back.perm, mat.perm)
    assert p.res_ptr % 16 == 0 and p.res_rec % 16 == 0 and p.res_rec > p.res_ptr
    k = FAM.generate(mat, op, {}, TILE, bias=np.arange(100.0))
    assert k.name.startswith("sf_csr_") and "s241" in k.name and k.config == TILE
    assert "HAS_RES = true" in k.source and "RES_PTR" in k.source
    with pytest.raises(ValueError, match="bias"):
        FAM.plan(mat, op, {}, TILE)


def test_each_k_split_has_its_own_slice_table():
    """Two tiles padding K alike (bk 128 x ks 2, bk 64 x ks 4) share the
    2:4 packing, not the residual's slice table."""
    mat = random_matrix(200, 264, 0.3, seed=5)
    op = Operation("fp16", "fm")
    a = FAM.plan(mat, op, {}, TILE)
    b = FAM.plan(mat, op, {}, dict(TILE, bk=64, ks=4))
    assert a.kp == b.kp and a.packed != b.packed
    for p in (a, b):
        np.testing.assert_array_equal(FAM.unpack(p).to_dense(), mat.to_dense())
    ptr = np.frombuffer(b.packed, dtype="<i4", count=b.mp * 5, offset=b.res_ptr).reshape(-1, 5)
    _, res = split24.split(mat)
    cols = res.indices
    for m in range(0, 200, 37):
        lo, hi = res.indptr[m], res.indptr[m + 1]
        expect = [lo + int(np.sum(cols[lo:hi] < z * 128)) for z in range(4)] + [hi]
        assert list(ptr[m]) == expect


def test_speedup_limit_counts_the_format_bytes():
    """The 2:4 part's 1 + 1/8 bytes an entry of W and the residual's 8 a
    record: 1.78x at low density whatever it is; the bitmaps' otherwise."""
    from sparseforge.generator.families.csr import speedup_limit, tc
    assert split24.speedup_limit(0.0) == pytest.approx(2 / 1.125)
    # density 0.5: a group leaves 1 record with probability 4/16, 2 with 1/16
    assert split24.speedup_limit(0.5) == pytest.approx(2 / (1.125 + 8 * (4 / 16 + 2 / 16) / 4))
    assert speedup_limit(0.1, TILE) == split24.speedup_limit(0.1)
    assert speedup_limit(0.1, {"mf": 1}) == speedup_limit(0.1) == tc.speedup_limit(0.1)


def test_inspect_reports_the_residual():
    short, long_ = random_matrix(256, 512, 0.1, seed=6), random_matrix(256, 512, 0.3, seed=6)
    for mat, tail in ((short, ""), (long_, " (too long: bitmaps only)")):
        fit, = FAM.analyze(mat)
        frac = split24.residual_fraction(mat)
        assert fit.data["split24_residual"] == frac
        assert fit.detail.endswith(f"split 2:4 residual {100 * frac:.1f}% of the nonzeros{tail}")
    assert "split24_residual" not in FAM.analyze(short.astype("fp32"))[0].data


def test_corrupt_residual_is_refused():
    mat = random_matrix(64, 64, 0.5, seed=1)
    op = Operation("fp16", "fm")
    p = FAM.plan(mat, op, {}, TILE)
    raw = bytearray(p.packed)
    ptr = np.frombuffer(raw, dtype="<i4", count=p.mp + 1, offset=p.res_ptr).copy()
    ptr[1], ptr[2] = ptr[2] + 1, ptr[1]
    raw[p.res_ptr:p.res_ptr + ptr.nbytes] = ptr.tobytes()
    import dataclasses
    with pytest.raises(ValueError, match="corrupt plan"):
        FAM.unpack(dataclasses.replace(p, packed=bytes(raw)))


def test_corrupt_steps_are_refused():
    """s24 3: a list's count past LIST_MAX, step ends that disagree with
    the lists, a tile's first step off by one: each a corrupt plan."""
    import dataclasses
    mat = random_matrix(256, 512, 0.1, seed=24)
    p = FAM.plan(mat, Operation("fp16", "fm"), {}, dict(split24.STEP_TILES[1], s24=3))
    FAM.unpack(p)   # intact
    block = 2 * 2 * 2304 + split24.LIST_BYTES   # a stage: 2 x 64 rows x 2 K steps, its list
    heads = [i * block + block - split24.LIST_BYTES for i in range(p.mp // 128 * p.kp // 64)]
    ends_at = next(h for h in heads if p.packed[h + 1] & 1)
    for offset, value in ((heads[0], split24.LIST_MAX + 1),        # a count past the list
                          (ends_at + 1, 0),                       # a step end dropped
                          (p.rs_ptr + 4, p.packed[p.rs_ptr + 4] + 1)):   # tile 1's first step
        raw = bytearray(p.packed)
        raw[offset] = value
        with pytest.raises(ValueError, match="corrupt plan"):
            FAM.unpack(dataclasses.replace(p, packed=bytes(raw)))


def test_configs_are_the_tma_tiles_on_sm90a_only():
    mat = random_matrix(300, 520, 0.1, seed=2)
    op = Operation("fp16", "tm")
    space = FAM.search_space(mat, op, {}, H100)
    s24 = [c for c in space if c.get("s24")]
    assert s24 and all(c["tma"] == 1 for c in s24)
    for c in s24:
        FAM.check_config(c, mat, op, {}, H100)
    assert not [c for c in FAM.search_space(mat, op, {}, A100) if c.get("s24")]
    with pytest.raises(ConfigError, match="TMA"):
        FAM.check_config(dict(bm=128, bn=128, bk=64, wm=2, wn=1, stages=4, wg=1, s24=1), mat,
                         op, {}, H100)
    with pytest.raises(ConfigError, match="s24"):
        FAM.check_config(dict(TILE, s24=2), mat, op, {}, H100)
    with pytest.raises(ConfigError, match="sm_90a"):
        FAM.check_config(TILE, mat, op, {}, A100)
    with pytest.raises(ConfigError, match="unknown"):
        FAM.check_config(dict(TILE, ck=2), mat, op, {}, H100)
    with pytest.raises(ConfigError, match="decode tiles"):
        FAM.check_config(dict(TILE, bn=128, ks=1, stages=4), mat, op, {}, H100)


def test_hints_where_the_residual_is_short():
    """Decode tiles only, where the residual is short (density 0.05: 0.2%
    of the nonzeros; 0.1: 1%): the split 2:4 hints first, the two formats
    in turn; none where it is longer (density 0.2: 4%), nor off sm_90a; the
    untuned default stays the bitmaps' (any GPU)."""
    op = Operation("fp16", "tm")
    mats = [random_matrix(256, 512, d, seed=4) for d in (0.05, 0.1, 0.2)]
    fracs = [split24.residual_fraction(m) for m in mats]
    assert fracs[0] < fracs[1] <= split24.MAX_RESIDUAL < fracs[2]
    for mat in mats[:2]:
        hints = FAM.hint_configs(mat, op, {}, H100, 16)
        flags = [bool(h.get("s24")) for h in hints]
        assert flags[:4] == [True, False, True, False] and sum(flags) >= 4
        assert all(h["bn"] // h["wn"] <= split24.MAX_WG_N for h in hints if h.get("s24"))
        space = FAM.search_space(mat, op, {}, H100)
        assert all(h in space for h in hints)
        assert not FAM.default_config(mat, op, {}, H100).get("s24")
    assert not any(h.get("s24") for h in FAM.hint_configs(mats[2], op, {}, H100, 16))
    assert not any(c.get("s24") for c in FAM.search_space(mats[2], op, {}, H100))
    assert not any(h.get("s24") for h in FAM.hint_configs(mats[0], op, {}, A100, 16))


def test_small_matrices_first_try_the_tiles_without_split_k():
    """A matrix of at most SMALL_ENTRIES entries gets SMALL_TILES (64 rows,
    32 then 16 columns of N, K not split) as its first split 2:4 hints at
    every N, all in the search space; a larger one starts with the 2:4
    family's own hints."""
    op = Operation("fp16", "tm")
    small = random_matrix(64, 256, 0.05, seed=6)
    large = random_matrix(2048, 2056, 0.05, seed=6)
    assert small.rows * small.cols <= split24.SMALL_ENTRIES < large.rows * large.cols
    want = [dict(t, s24=1) for t in split24.SMALL_TILES]
    space = FAM.search_space(small, op, {}, H100)
    for n in (16, 3136, None):
        got = split24.candidates(small, op, H100, n)
        assert got[:2] == want and all(c in space for c in got)
        assert [c for c in split24.candidates(large, op, H100, n) if c in want] == []


def test_split_k_decode_tiles_are_followed_by_their_4_stage_form():
    """Each split 2:4 tile that splits K in deep stages is followed by the
    same tile in 4 stages (at N = 64 the first two split 2:4 hints), and
    both are in the search space."""
    op = Operation("fp16", "tm")
    mat = random_matrix(2048, 2056, 0.05, seed=7)
    space = FAM.search_space(mat, op, {}, H100)
    got = split24.candidates(mat, op, H100, 64)
    assert got[0]["ks"] > 1 and got[0]["stages"] > 4 and got[1] == dict(got[0], stages=4)
    for i, c in enumerate(got):
        if c.get("ks", 1) > 1 and c["stages"] > 4:
            assert dict(c, stages=4) in got[i + 1:]
    assert all(c in space for c in got)


def test_tall_matrices_at_n64_first_try_the_128_row_tile():
    """At N = 64 a matrix whose 128-row tiles alone fill half the GPU gets
    the 128-row tile without split K first; 4096 rows keep the 64-row tiles
    splitting K first, and N = 16 keeps its order."""
    op = Operation("fp16", "tm")
    tall = random_matrix(8448, 1024, 0.05, seed=8)
    got = split24.candidates(tall, op, H100, 64)
    assert got[0]["bm"] == 128 and got[0].get("ks", 1) == 1 and got[0]["bn"] >= 64
    short = random_matrix(8320, 1024, 0.05, seed=8)   # 65 tiles of 128 rows: not half of 132
    assert split24.candidates(short, op, H100, 64)[0].get("ks", 1) > 1
    assert split24.candidates(tall, op, H100, 16)[0]["bm"] == 64
    assert split24.candidates(tall, op, dict(H100, sm_count=200), 64)[0].get("ks", 1) > 1


@pytest.mark.parametrize("shape,density,dtype", [((300, 520), 0.1, "fp16"),
                                                 ((513, 1000), 0.12, "bf16"),
                                                 ((64, 64), 0.0, "fp16")])
def test_steps_read_back(shape, density, dtype):
    """s24 3: the 2:4 part plus the steps put back at their columns is W
    (values in the dtype, the bias and permutation carried); every K
    tile's list within LIST_MAX, its slots unique in its step, each tile's
    first step counted from the lists, each step 2:4."""
    mat = random_matrix(*shape, density, seed=21, dtype=dtype)
    mat.perm = np.random.default_rng(1).permutation(shape[0])
    op = Operation(dtype, "fm", Epilogue(bias=True))
    cfg = dict(split24.STEP_TILES[0], s24=3)
    FAM.check_config(cfg, mat, op, {}, H100)
    p = FAM.plan(mat, op, {}, cfg, bias=np.arange(shape[0], dtype=np.float64))
    back = FAM.unpack(p)
    want = round_to_dtype(mat.to_dense(), dtype)
    np.testing.assert_array_equal(back.to_dense(), want)
    np.testing.assert_array_equal(back.perm, mat.perm)
    part, res = split24.split(mat, cfg["bm"])
    lists, first, stacked = split24.residual_steps(res, p.mp, p.kp, cfg["bm"], cfg["bk"])
    lists = lists.reshape(p.mp // cfg["bm"], p.kp // cfg["bk"], split24.LIST_BYTES)
    assert lists[:, :, 0].max(initial=0) <= split24.LIST_MAX
    ends = (lists[:, :, 1] & 1).sum(axis=1)
    assert list(first) == list(np.concatenate([[0], np.cumsum(ends)[:-1]]))
    assert stacked.rows == ends.sum() * cfg["bm"]
    assert first_violation(stacked) is None
    for t in range(lists.shape[0]):
        slots = []
        for w in range(lists.shape[1]):
            cnt = lists[t, w, 0]
            slots += list(lists[t, w, 5:5 + 2 * cnt:2])
            if lists[t, w, 1] & 1:
                assert len(slots) == len(set(slots)) and max(slots) < split24.STEP_SLOTS
                slots = []
        assert not slots
    if density == 0:
        assert stacked.rows == 0


def test_steps_refuse_k_tiles_past_their_list(monkeypatch):
    """A K tile whose residual columns overflow its list is refused (the
    tuner then takes other tiles), and the step tiles, once offered, are
    offered only for feature-major prefill."""
    dense = random_matrix(128, 256, 0.3, seed=22)
    cfg = dict(split24.STEP_TILES[1], s24=3)
    with pytest.raises(ConfigError, match="list"):
        FAM.plan(dense, Operation("fp16", "fm"), {}, cfg, None)
    # 30 residual columns of one row: within a list, but 2 a group of 4 slots need 60
    w = np.zeros((128, 64), np.float32)
    w[0, :60] = np.arange(1, 61)
    with pytest.raises(ConfigError, match="do not fit one step"):
        FAM.plan(SparseMatrix.from_dense(w, dtype="fp16"), Operation("fp16", "fm"), {}, cfg,
                 None)
    mat = random_matrix(512, 1024, 0.1, seed=23)
    fm, tm = Operation("fp16", "fm"), Operation("fp16", "tm")
    steps = [dict(t, s24=3) for t in split24.STEP_TILES]
    # offered (split24.OFFER_STEPS) first for feature-major prefill where their
    # tiles fill the GPU (4 x 64 tiles at N = 16384; 4 x 16 at 4096 do not), after the
    # decode tiles with N unknown; with the offer off, never
    big_n = 16384
    monkeypatch.setattr(split24, "OFFER_STEPS", False)
    assert not [c for c in split24.candidates(mat, fm, H100, big_n) if c.get("s24") == 3]
    monkeypatch.setattr(split24, "OFFER_STEPS", True)
    # (a small matrix: after its small tiles)
    small = [dict(t, s24=1) for t in split24.SMALL_TILES]
    assert mat.rows * mat.cols <= split24.SMALL_ENTRIES
    assert split24.candidates(mat, fm, H100, big_n)[:4] == small + steps
    monkeypatch.setattr(split24, "SMALL_ENTRIES", mat.rows * mat.cols - 1)
    assert split24.candidates(mat, fm, H100, big_n)[:2] == steps
    assert split24.candidates(mat, fm, H100)[-2:] == steps
    assert not [c for c in split24.candidates(mat, fm, H100, 4096) if c.get("s24") == 3]
    assert split24.candidates(mat, fm, dict(H100, sm_count=64), 4096)[:2] == steps
    assert not [c for c in split24.candidates(mat, fm, H100, 64) if c.get("s24") == 3]
    assert not [c for c in split24.candidates(mat, tm, H100, big_n) if c.get("s24") == 3]
    with pytest.raises(ConfigError, match="feature-major"):
        FAM.check_config(steps[0], mat, tm, {}, H100)
    with pytest.raises(ConfigError, match="rs"):
        FAM.check_config(dict(steps[0], rs=1), mat, fm, {}, H100)
    with pytest.raises(ConfigError, match="rs"):
        get_family("nm24").check_config(dict(split24.STEP_TILES[0], rs=1), mat, fm, {}, H100)


def test_steps_not_offered_where_a_list_overflows(monkeypatch):
    """A short residual overall, but one K tile of one tile of rows needs
    32 columns (16 full groups of 4, one a row, no two sharing a column):
    more than a list holds, so the tuner is not offered the step tiles
    (it would only see them refused), and a plan says why."""
    w = random_matrix(512, 1024, 0.04, seed=31).to_dense()
    for r in range(16):
        w[r, 4 * r:4 * r + 4] = 1.0 + r
    mat = SparseMatrix.from_dense(w, dtype="fp16")
    assert split24.residual_fraction(mat) <= split24.MAX_RESIDUAL
    monkeypatch.setattr(split24, "OFFER_STEPS", True)
    monkeypatch.setattr(split24, "SMALL_ENTRIES", 0)
    fm = Operation("fp16", "fm")
    cands = split24.candidates(mat, fm, H100, 16384)
    assert cands and not [c for c in cands if c.get("s24") == 3]
    with pytest.raises(ConfigError, match="list"):
        FAM.plan(mat, fm, {}, dict(split24.STEP_TILES[0], s24=3), None)
    # without those rows the step tiles come first
    w[:16, :64] = 0
    mat = SparseMatrix.from_dense(w, dtype="fp16")
    assert split24.candidates(mat, fm, H100, 16384)[:2] == [dict(t, s24=3)
                                                            for t in split24.STEP_TILES]


@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_hints_compile_without_spills(layout, assert_no_spills):
    mat = random_matrix(300, 520, 0.1, seed=13)
    op = Operation("bf16", layout, Epilogue(bias=True, activation="gelu"))
    picks = [h for h in FAM.hint_configs(mat, op, {}, H100) if h.get("s24")]
    picks += FAM.accepted([dict(TILE, **change) for change in GPU_CHANGES], mat, op, {}, H100)
    assert len(picks) >= 10
    assert_no_spills(picks, lambda cfg: FAM.generate(mat, op, {}, cfg, bias=np.zeros(300)),
                     "sm_90a", "csr_s24.cu")


# ---- GPU ------------------------------------------------------------------------------------

GPU_CASES = [
    # (shape, density, dtype, layout, epilogue, tile changes, N values)
    ((37, 56), 0.3, "fp16", "fm", Epilogue(bias=True, activation="gelu"), {}, (1, 5, 16, 17)),
    ((37, 56), 0.3, "bf16", "tm", Epilogue(bias=True, activation="relu"), {}, (1, 16, 33)),
    ((300, 520), 0.5, "fp16", "tm", Epilogue(), dict(ks=4, bk=64), (3, 16, 40)),
    ((300, 520), 0.1, "bf16", "fm", Epilogue(scale=0.5), dict(bn=64, stages=8), (7, 64, 70)),
    ((300, 520), 0.6, "fp16", "fm", Epilogue(bias=True),
     dict(bm=128, bn=64, wm=2, ks=1, stages=5), (1, 64, 65)),
    ((300, 520), 0.2, "bf16", "tm", Epilogue(activation="gelu"),
     dict(bm=64, bn=64, ks=1, cm=2, stages=8), (9, 64)),
    ((513, 1000), 0.3, "fp16", "tm", Epilogue(bias=True, activation="gelu"),
     dict(bm=128, bn=64, bk=64, wm=2, ks=1, stages=6), (5, 64, 300)),
    ((513, 1000), 0.05, "bf16", "fm", Epilogue(bias=True),
     dict(bm=64, bn=128, bk=64, wm=1, wn=2, ks=1, stages=4), (8, 128, 257)),
    ((200, 3000), 0.15, "fp16", "tm", Epilogue(), dict(ks=4, bk=64, cm=1), (16, 20)),
    ((200, 3000), 0.15, "bf16", "fm", Epilogue(activation="relu"),
     dict(bm=128, bn=32, wm=2, ks=1, stages=6), (31, 32, 33)),
    ((64, 256), 0.05, "fp16", "tm", Epilogue(bias=True, activation="gelu"),
     dict(bn=32, ks=1, stages=4), (1, 32, 3136)),          # split24.SMALL_TILES
    ((130, 1152), 0.1, "bf16", "fm", Epilogue(), dict(bn=16, ks=1, stages=4), (7, 16, 784)),
    ((64, 64), 0.0, "fp16", "tm", Epilogue(bias=True), {}, (1, 16)),
    ((128, 128), 1.0, "fp16", "fm", Epilogue(), dict(bn=64, stages=8), (16, 64)),
    # the residual in steps (s24 3, feature-major prefill tiles): odd shapes,
    # K tiles full of residual columns (density 0.12: steps of one K tile,
    # slots skipped for the 2:4 rule), long K (many steps: both halves
    # reused), N not a multiple of 8 (the producer's own loads), no residual
    ((300, 520), 0.1, "fp16", "fm", Epilogue(bias=True, activation="gelu"),
     dict(split24.STEP_TILES[1], s24=3), (1, 256, 300)),
    ((513, 1000), 0.12, "bf16", "fm", Epilogue(bias=True),
     dict(split24.STEP_TILES[0], s24=3), (8, 256, 257)),
    ((256, 4096), 0.1, "fp16", "fm", Epilogue(scale=0.5),
     dict(split24.STEP_TILES[0], s24=3), (256, 512)),
    ((200, 640), 0.02, "bf16", "fm", Epilogue(activation="relu"),
     dict(split24.STEP_TILES[1], s24=3), (5, 256)),
    ((64, 64), 0.0, "fp16", "fm", Epilogue(), dict(split24.STEP_TILES[1], s24=3), (256,)),
    # the shapes whose probes ended without a result (bench/RESULTS.md, 2026-11-28):
    # K = 11008 (about 45 steps a tile, six words of step ends), and many tiles
    ((256, 11008), 0.1, "fp16", "fm", Epilogue(), dict(split24.STEP_TILES[0], s24=3), (256,)),
    ((2816, 4096), 0.1, "bf16", "fm", Epilogue(bias=True), dict(split24.STEP_TILES[0], s24=3),
     (512,)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_gpu_correct(case):
    from sparseforge.tuner.execute import default_context, verify
    if default_context().device_info()["arch"] != "sm_90a":
        pytest.skip("the split 2:4 format runs sparse wgmma: it needs an sm_90a GPU (Hopper)")
    shape, density, dtype, layout, ep, change, ns = GPU_CASES[case]
    mat = random_matrix(*shape, density, seed=200 + case, dtype=dtype)
    op = Operation(dtype, layout, ep)
    cfg = dict(TILE, **change)
    FAM.check_config(cfg, mat, op, {})
    for n in ns:
        res = verify("csr", mat, op, {}, cfg, n, seed=case * 5 + n)
        assert res["ok"], (n, res)


GPU_CHANGES = [case[5] for case in GPU_CASES if case[5]]


# The step tiles on whole prefill problems, each in a process of its own (a hung kernel
# cannot be stopped from inside): these matrices (and 11008 x 4096, 4096 x 11008) hung
# the kernel while the producer's lane 0 waited for a step's slot alone, its warp at the
# branch's reconvergence point (bench/RESULTS.md, 2026-11-28).
_STEP_RUN = """
import sys
import numpy as np
from sparseforge.generator.families.csr import split24
from sparseforge.generator.kernel import Epilogue, Operation
from sparseforge.generator.synth import random_matrix
from sparseforge.generator.families import get_family
from sparseforge.tuner.execute import random_input, run_kernel
m, k, n, tile, seed = map(int, sys.argv[1:])
mat = random_matrix("csr", m, k, 0.1, "fp16", seed=seed)
op = Operation("fp16", "fm", Epilogue())
kern = get_family("csr").generate(mat, op, {}, dict(split24.STEP_TILES[tile], s24=3))
x = random_input(op, k, n, np.random.default_rng(2))
y = run_kernel(kern, op, x, n, m)
rows = np.random.default_rng(3).choice(m, 64, replace=False)
ref = np.stack([mat.values[mat.indptr[r]:mat.indptr[r + 1]].astype(np.float64)
                @ x[mat.indices[mat.indptr[r]:mat.indptr[r + 1]]].astype(np.float64) for r in rows])
print(np.linalg.norm(y[rows] - ref) / np.linalg.norm(ref))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("problem", [(4096, 4096, 4096, 0, 1), (5504, 4096, 4096, 1, 1)])
def test_gpu_steps_finish_on_prefill_problems(problem):
    import subprocess
    import sys
    from sparseforge.tuner.execute import default_context
    if default_context().device_info()["arch"] != "sm_90a":
        pytest.skip("the split 2:4 format runs sparse wgmma: it needs an sm_90a GPU (Hopper)")
    try:
        out = subprocess.run([sys.executable, "-c", _STEP_RUN, *map(str, problem)],
                             capture_output=True, text=True, timeout=60, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{problem}: the kernel did not finish in 60 s")
    assert float(out.stdout.split()[-1]) < 1e-2, out.stdout
