"""The nm24 family (2:4 sparse W on Sparse Tensor Cores): pattern check,
plan/unpack round trips, the fragment-order shuffles, the search space and
its constraints, rendering, NVRTC compiles for sm_80 and sm_90a; on a GPU,
correctness across configurations, shapes, dtypes, layouts and epilogues."""
from __future__ import annotations


import numpy as np
import pytest

from sparseforge.generator.families import nm24 as nm24_mod
from sparseforge.generator.families.nm24 import pack as nm24_pack
from sparseforge.generator.families import get_family
from sparseforge.generator.kernel import ConfigError, Epilogue, Operation, smem_limit
from sparseforge.generator.matrix import SparseMatrix, round_to_dtype, to_device_bytes

FAM = get_family("nm24")
BASE = dict(bm=128, bn=128, bk=64, wm=2, wn=2, stages=3)
H100 = {"smem_per_block_optin": 232448, "sm_count": 132, "cc_major": 9, "arch": "sm_90a"}
A100 = {"smem_per_block_optin": 166912, "sm_count": 108, "cc_major": 8, "arch": "sm_80"}


def random_24(m, k, seed=0, mode="mixed", zero_rows=(), dtype="fp16"):
    """A random 2:4 matrix.  mode 'mixed': each aligned group of 4 holds 0, 1
    or 2 nonzeros; 'full': exactly 2 (where the group is whole)."""
    rng = np.random.default_rng(seed)
    kq = -(-k // 4) * 4
    w = np.zeros((m, kq), np.float32)
    w[:, :k] = rng.standard_normal((m, k))
    counts = rng.integers(0, 3, size=(m, kq // 4)) if mode == "mixed" else np.full((m, kq // 4), 2)
    rank = np.argsort(np.argsort(rng.random((m, kq // 4, 4)), axis=2), axis=2)
    w.reshape(m, kq // 4, 4)[rank >= counts[:, :, None]] = 0
    w = w[:, :k].copy()
    for r in zero_rows:
        w[r] = 0
    return SparseMatrix.from_dense(w, dtype=dtype)


def same_matrix(a: SparseMatrix, b: SparseMatrix, dtype: str):
    assert a.shape == b.shape and b.dtype == dtype
    np.testing.assert_array_equal(round_to_dtype(a.to_dense(), dtype).view(np.uint32),
                                  b.to_dense().view(np.uint32))
    if a.perm is None:
        assert b.perm is None
    else:
        np.testing.assert_array_equal(a.perm, b.perm)


# ---- pattern ----------------------------------------------------------------------------

def test_fits_and_refusal():
    ok = random_24(20, 37, seed=1)
    assert FAM.fits(ok, {})
    d = ok.to_dense()
    d[7, 8:11] = [1.0, 2.0, 3.0]           # three nonzeros in group 8..11
    bad = SparseMatrix.from_dense(d)
    assert not FAM.fits(bad, {})
    assert nm24_mod.first_violation(bad) == (7, 8)
    with pytest.raises(ValueError, match=r"not 2:4: row 7 .* columns 8\.\.11"):
        FAM.generate(bad, Operation(), {}, BASE)
    # a tail group (K % 4 != 0) is a group too
    t = np.zeros((2, 7), np.float32)
    t[1, 4:7] = 1.0
    assert not FAM.fits(SparseMatrix.from_dense(t), {})
    t[1, 4] = 0
    assert FAM.fits(SparseMatrix.from_dense(t), {})
    assert FAM.fits(SparseMatrix.from_dense(np.zeros((0, 0), np.float32)), {})


# ---- plan / unpack ----------------------------------------------------------------------

SHAPES = [
    ("odd", lambda: random_24(37, 70, seed=1, zero_rows=(0, 5, 36))),
    ("full", lambda: random_24(64, 128, seed=2, mode="full")),
    ("tiny", lambda: random_24(1, 1, seed=3)),
    ("k_tail", lambda: random_24(17, 33, seed=4)),
    ("all_zero", lambda: SparseMatrix.from_dense(np.zeros((13, 17), np.float32))),
    ("tall", lambda: random_24(300, 40, seed=5)),
    ("no_rows", lambda: SparseMatrix.from_dense(np.zeros((0, 9), np.float32))),
]
CONFIGS = [dict(bm=64, bn=64, bk=32, wm=2, wn=2, stages=2), BASE,
           dict(bm=128, bn=256, bk=32, wm=2, wn=4, stages=4)]


@pytest.mark.parametrize("name,make", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_plan_unpack_round_trip(name, make, dtype):
    m = make()
    for c in CONFIGS:
        p = FAM.plan(m, Operation(dtype=dtype), {}, c)
        same_matrix(m, FAM.unpack(p), dtype)
        assert p.mp % c["bm"] == 0 and p.mp >= m.rows
        assert p.kp % c["bk"] == 0 and p.kp >= m.cols
        assert p.values_offset % 16 == 0 and p.meta_offset % 16 == 0
        assert len(p.packed) % 16 == 0
        assert len(p.packed) == p.meta_offset + (p.mp // 16) * (p.kp // 32) * 64
        assert p.grid == (1, p.mp // c["bm"], 1)


def test_round_trip_permutation_and_bias():
    m = random_24(40, 64, seed=6)
    perm = np.random.default_rng(0).permutation(40)
    m = SparseMatrix(m.shape, m.indptr, m.indices, m.values, "fp16", perm=perm)
    bias = np.linspace(-1, 1, 40)
    op = Operation(dtype="fp16", epilogue=Epilogue(bias=True, activation="relu"))
    p = FAM.plan(m, op, {}, BASE, bias=bias)
    same_matrix(m, FAM.unpack(p), "fp16")
    b = np.frombuffer(p.packed, "<f4", count=p.mp, offset=p.bias_offset)
    np.testing.assert_array_equal(b[:40], bias.astype(np.float32))
    assert not b[40:].any()
    with pytest.raises(ValueError, match="bias has 3 entries"):
        FAM.plan(m, op, {}, BASE, bias=np.ones(3))
    with pytest.raises(ValueError, match="none was given"):
        FAM.plan(m, op, {}, BASE)
    with pytest.raises(ValueError, match="epilogue has none"):
        FAM.plan(m, Operation(), {}, BASE, bias=bias)


def test_compress_index_choice():
    """Groups with 2 entries keep them in order; 1 entry pairs with a valid
    neighbour; an empty group is (0, 1); every nibble is an ordered pair."""
    d = np.array([[0, 5, 0, 6, 0, 0, 0, 7, 0, 0, 0, 0, 8, 0, 0, 0]], np.float32)
    vals, nib = nm24_pack.compress_rows(d, d != 0)
    assert vals.tolist() == [[5, 6, 0, 7, 0, 0, 8, 0]]
    pairs = [(int(x) & 3, int(x) >> 2) for x in nib[0]]
    assert pairs == [(1, 3), (2, 3), (0, 1), (0, 1)]
    vals, nib = nm24_pack.compress_rows(np.zeros((1, 4), np.float32), np.zeros((1, 4), bool))
    with pytest.raises(ValueError):
        nm24_pack.compress_rows(np.ones((1, 4), np.float32), np.ones((1, 4), bool))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("wgmma", [False, True])
def test_packing_from_entries_matches_the_dense_rules(dtype, wgmma):
    """pack_matrix compresses the stored entries directly; it equals
    compress_rows over the dense padded matrix (lone entries at every
    position, empty groups, stored zeros, padding rows and columns)."""
    rng = np.random.default_rng(3)
    m, k, mp, kp = 70, 52, 128, 64
    dense = rng.standard_normal((m, k)).astype(np.float32)
    keep = np.zeros((m, k // 4, 4), bool)
    for r in range(m):
        for g in range(k // 4):
            keep[r, g, rng.choice(4, size=rng.integers(0, 3), replace=False)] = True
    dense = np.where(keep.reshape(m, k), dense, np.float32(0))
    mask = keep.reshape(m, k).copy()
    dense[5, :8] = 0.0                       # stored zeros
    mask[5, [1, 6]] = True
    mask[5, [0, 2, 3, 4, 5, 7]] = False
    rows, cols = np.nonzero(mask)
    mat = SparseMatrix((m, k), np.searchsorted(rows, np.arange(m + 1)).astype(np.int64),
                       cols.astype(np.int32), dense[rows, cols], dtype=dtype)
    vals, meta = nm24_pack.pack_matrix(mat, dtype, mp, kp, wgmma=wgmma)
    pd = np.zeros((mp, kp), np.float32)
    pm = np.zeros((mp, kp), bool)
    pd[:m, :k], pm[:m, :k] = dense, mask
    v, nib = nm24_pack.compress_rows(pd, pm)
    shuffle = nm24_pack.pack_values_sm90 if wgmma else nm24_pack.pack_values
    assert vals == to_device_bytes(shuffle(v), dtype)
    assert meta == nm24_pack.pack_meta(nib).astype("<u4").tobytes()
    lone3 = nm24_pack.compress_entries(np.array([0]), np.array([3]), np.array([7.0]), 1, 4)
    assert lone3[0].tolist() == [[0, 7]] and lone3[1].tolist() == [[2 | 3 << 2]]


def test_top2_of_4_is_a_stable_sort_of_the_magnitudes():
    """The comparison network keeps what a stable argsort of -|w| keeps,
    ties (equal magnitudes, zeros) included."""
    rng = np.random.default_rng(0)
    g = rng.integers(0, 3, size=(500, 7, 4)).astype(np.float32)   # many ties
    g = np.concatenate([g, np.abs(rng.standard_normal((500, 7, 4))).astype(np.float32)])
    top = np.argsort(-g, axis=2, kind="stable")[:, :, :2]
    want = np.zeros(g.shape, bool)
    np.put_along_axis(want, top, True, axis=2)
    got = nm24_mod.top2_of_4(g)
    assert got.dtype == bool and np.array_equal(got, want)
    assert (got.sum(axis=2) == 2).all()


def test_fragment_order_matches_mma_sp_layout():
    """Lane L = 4g + t, register r: rows g (r even) / g + 8 (r odd), chunk
    t (r < 2) / t + 4 (r >= 2) of the step; metadata word 2g + h: row g in
    bits 0-15 and row g + 8 in bits 16-31, chunks 4h .. 4h + 3."""
    r, kh = 32, 32                        # two 16-row tiles, two K steps
    vals = np.arange(r * kh, dtype=np.float32).reshape(r, kh)
    flat = nm24_pack.pack_values(vals).reshape(2, 2, 32, 4, 2)   # mt s lane reg half
    for mt in range(2):
        for s in range(2):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for reg in range(4):
                    row = mt * 16 + g + 8 * (reg & 1)
                    chunk = t + 4 * (reg >> 1)
                    for h in range(2):
                        assert flat[mt, s, lane, reg, h] == vals[row, s * 16 + chunk * 2 + h]
    np.testing.assert_array_equal(nm24_pack.unpack_values(nm24_pack.pack_values(vals), r, kh), vals)
    nib = np.random.default_rng(0).integers(0, 16, size=(r, 16)).astype(np.uint8)
    words = nm24_pack.pack_meta(nib).reshape(2, 2, 8, 2)              # mt s g h
    for mt in range(2):
        for s in range(2):
            for g in range(8):
                for h in range(2):
                    w = int(words[mt, s, g, h])
                    for j in range(4):
                        assert (w >> (4 * j)) & 15 == nib[mt * 16 + g, s * 8 + 4 * h + j]
                        assert (w >> (16 + 4 * j)) & 15 == nib[mt * 16 + g + 8, s * 8 + 4 * h + j]
    np.testing.assert_array_equal(nm24_pack.unpack_meta(nm24_pack.pack_meta(nib), r, 16), nib)


# ---- search space --------------------------------------------------------------------

@pytest.mark.parametrize("device", [None, H100, A100, {"smem_per_block_optin": 101376}])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_search_space_valid(device, layout):
    m = random_24(64, 64, seed=7)
    op = Operation(dtype="fp16", layout=layout)
    space = FAM.search_space(m, op, {}, device)
    assert space
    limit = smem_limit(device)
    names = set()
    for c in space:
        FAM.check_config(c, m, op, {}, device)
        assert nm24_mod.smem_bytes(c, layout) <= limit
        if c.get("wg"):
            mw = c.get("mw", 1)
            assert mw * c["bn"] // c["wn"] // 2 <= 128 and c["bm"] == 64 * c["wm"] * mw
        else:
            assert (c["bm"] // c["wm"] // 16) * (c["bn"] // c["wn"] // 8) * 4 <= 128
        names.add(FAM.generate(m, op, {}, c).name)
    assert len(names) == len(space)
    # sparse wgmma where the device is sm_90a (or none is named), never elsewhere
    assert any(c.get("wg") for c in space) == (device is None or device.get("arch") == "sm_90a"
                                               or "arch" not in device)
    if device is H100:
        assert all(c.get("wg") for c in space)        # sm_90a: sparse wgmma alone
        hints = FAM.hint_configs(m, op, {}, device)
        assert hints[0].get("wg") == 1
        # N known: decode's tiles (bn <= 64) first for a few tokens, prefill's for many
        dec, pre = FAM.hint_configs(m, op, {}, device, n=16), FAM.hint_configs(m, op, {}, device, n=4096)
        assert dec[0]["bn"] <= 64 and pre[0]["bn"] > 64
        assert sorted(map(repr, dec)) == sorted(map(repr, pre)) == sorted(map(repr, hints))
        # every hint is a configuration of the space, as the search matches them
        from sparseforge.tuner.strategies import hinted
        assert hinted(space, hints) == hints
    if device is A100:
        assert not any(c.get("wg") for c in FAM.hint_configs(m, op, {}, device))


def test_decode_hints_put_tiles_as_wide_as_n_first():
    """A budgeted search measures its first few hints only: at N = 64 the
    16- and 32-column tiles (which read the weights 4 and 2 times) come
    after every tile at least 64 wide; at N = 16 the 16- and 32-column
    tiles lead."""
    m = random_24(512, 512, seed=17)
    op = Operation(dtype="fp16", layout="tm")
    at64 = [c["bn"] for c in FAM.hint_configs(m, op, {}, H100, n=64)]
    assert at64[0] >= 64 and sorted(at64, key=lambda bn: bn < 64) == at64
    assert any(bn < 64 for bn in at64)           # kept, later
    assert FAM.hint_configs(m, op, {}, H100, n=16)[0]["bn"] == 16
    at16 = [c["bn"] for c in FAM.hint_configs(m, op, {}, H100, n=16)]
    assert set(at16[:4]) <= {16, 32} and 64 in at16
    # feature-major takes the narrow tiles too (one 32- or 64-byte box)
    fm16 = FAM.hint_configs(m, Operation(dtype="fp16", layout="fm"), {}, H100, n=16)
    assert [c["bn"] for c in fm16][:2] == [16, 32]


def test_tiles_per_cta_fills_whole_waves():
    """`mt` a CTA: the fewest tile-times on the GPU's SMs, a tile after the
    first a little cheaper the shorter K is."""
    tile = nm24_mod.PREFILL_MT_TILE
    # 12 x 32 tiles: 3 waves of 132 one a CTA, or 1 of 128 CTAs taking 3
    assert nm24_mod.tiles_per_cta(3072, 768, 4096, tile, 132) == 3
    # 96 tiles: one wave already
    assert nm24_mod.tiles_per_cta(768, 3072, 4096, tile, 132) == 1
    # 43 x 32 tiles, long K: no mt saves a wave's worth
    assert nm24_mod.tiles_per_cta(11008, 4096, 4096, tile, 132) == 1
    # fewer SMs: 12 x 32 tiles on 64 SMs, 6 waves, or one of 64 CTAs taking 6
    assert nm24_mod.tiles_per_cta(3072, 768, 4096, tile, 64) == 6


def test_prefill_hints_take_several_tiles_a_cta_where_it_fills_the_waves():
    m = random_24(3072, 768, seed=9)
    op = Operation(dtype="fp16", layout="tm")
    pre = FAM.hint_configs(m, op, {}, H100, n=4096)
    assert pre[1] == {**nm24_mod.TMA_SPACE.defaults, **nm24_mod.CLUSTER_MT_TILE, "mt": 3}
    assert pre[2] == {**nm24_mod.TMA_SPACE.defaults, **nm24_mod.PREFILL_MT_TILE, "mt": 3}
    assert not any(c.get("mt", 1) > 1 for c in FAM.hint_configs(m, op, {}, H100, n=16))
    from sparseforge.tuner.strategies import hinted
    assert hinted(FAM.search_space(m, op, {}, H100), pre) == pre


@pytest.mark.parametrize("shape,first", [((768, 3072), True), ((3072, 768), False),
                                         ((4096, 4096), False), ((1024, 4096), False)])
def test_prefill_hints_lead_with_the_192_column_tile_where_it_fills_a_wave(shape, first):
    """768 rows x N = 4096: 96 tiles of 128 x 256 on 132 SMs, 132 of 128 x
    192; elsewhere in S1 the wider tile's waves cost no more."""
    m = random_24(*shape, seed=10)
    pre = FAM.hint_configs(m, Operation(dtype="fp16", layout="tm"), {}, H100, n=4096)
    wave = {**nm24_mod.TMA_SPACE.defaults, **nm24_mod.WAVE_TILE}
    assert (pre[0] == wave) == first
    assert nm24_mod.wave_cost(768, 4096, nm24_mod.WAVE_TILE, 132) == 128 * 192
    assert nm24_mod.wave_cost(768, 4096, nm24_mod.CLUSTER_MT_TILE, 132) == 128 * 256


@pytest.mark.parametrize("bad,what", [
    (dict(bm=96), r"bm in \(64, 128\): BM of a CTA tile"),
    (dict(bn=32), r"bn in \(64, 128, 256\): BN of a CTA tile"),
    (dict(bk=128), r"bk in \(32, 64\)"),
    (dict(stages=5), r"stages in \(2, 3, 4\): pipeline depth"),
    (dict(wm=3, wn=1), "a warp's rows are whole m16 tiles"),
    (dict(bm=64, bn=64, wm=1, wn=2), "4 or 8 warps as 2x2, 1x4, 4x1, 2x4 or 4x2"),
    (dict(bm=128, bn=256, wm=1, wn=4), "at most 128 fp32 accumulators"),
    (dict(bm=128, bn=256, wm=2, wn=2), "at most 128 fp32 accumulators"),
    (dict(bm=128, bn=256, bk=64, wm=2, wn=4, stages=4), "smem <= smem_limit: the shared memory"),
])
def test_check_config_refusals(bad, what):
    m = random_24(64, 64, seed=8)
    cfg = dict(BASE, **bad)
    with pytest.raises(ConfigError, match=what):
        FAM.check_config(cfg, m, Operation(), {}, {"smem_per_block_optin": 101376})


WG = dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1)


@pytest.mark.parametrize("bad,layout,what", [
    (dict(wm=1), "fm", "bm == 64 \\* wm: a warpgroup's rows are one 64-row wgmma tile"),
    (dict(bn=192), "fm", r"wg_n in \(64, 128, 256\): a warpgroup's columns"),
    (dict(bn=64, wn=2), "fm", "a warpgroup's columns are one wgmma N of 64, 128 or 256"),
    (dict(bk=32), "tm", "token-major X tile rows are whole 128-byte swizzle atoms"),
    (dict(bm=256, wm=4), "fm", "the accumulators .* fit the registers"),
    (dict(stages=2), "fm", r"stages in \(3, 4, 5, 6\)"),
    (dict(stages=6, bk=128), "fm", "a 256-wide warpgroup tile runs out of registers"),
    (dict(stages=6, bk=128, bn=128), "fm", "smem <= smem_limit"),
])
def test_check_config_refusals_wg(bad, layout, what):
    m = random_24(64, 64, seed=8)
    with pytest.raises(ConfigError, match=what):
        FAM.check_config(dict(WG, **bad), m, Operation(layout=layout), {}, H100)


TMA = dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=2)


@pytest.mark.parametrize("bad,layout,k,what", [
    (dict(cm=3), "fm", 64, r"cm in \(1, 2\)"),
    (dict(bn=64, cm=2), "fm", 64, "feature-major X tiles are shared only by tiles of 128 columns"),
    (dict(), "tm", 60, "token-major X rows .* must be 16-byte aligned"),
    (dict(tma=2), "fm", 64, "wg == 1 and tma == 1"),
    (dict(ks=3, cm=1), "fm", 64, r"ks in \(1, 2, 4\)"),
    (dict(mw=2), "fm", 64, "bm == 64 \\* mw \\* wm"),
    (dict(mw=2, bm=256), "fm", 64, "the accumulators .* fit the registers"),
    (dict(bk=32), "tm", 64, "whole 128-byte swizzle atoms"),
    (dict(mt=5), "fm", 64, r"mt in \(1, 2, 3, 4, 6, 8\)"),
    (dict(mt=2, ks=2, cm=1, bn=64), "tm", 64, "several tiles a CTA only without split K"),
    (dict(mt=2, cm=1, bn=64), "tm", 64, "several tiles a CTA only for prefill"),
    (dict(mt=2, bn=128, stages=3), "fm", 64, "several tiles a CTA only on 256-row tiles"),
    (dict(mt=2, bn=192, stages=5), "fm", 64, "several tiles a CTA only on 256-row tiles"),
    (dict(mw=2, bm=256, bn=192, cm=1), "fm", 64, "the accumulators .* at most 128"),
    (dict(ra=2), "fm", 64, r"ra in \(0, 1\)"),
    (dict(ra=1, cm=1, bn=64), "tm", 64, "CTAs ordered down M only for prefill"),
    (dict(ra=1), "fm", 64, "CTAs ordered down M only on 256-row tiles"),
    (dict(bm=256, bn=128, cm=1, mw=2, mt=2, stages=5), "fm", 64,
     "fits the GPU's per-block limit"),
    (dict(mt=2, stages=6), "fm", 64, "fits the GPU's per-block limit"),
])
def test_check_config_refusals_tma(bad, layout, k, what):
    m = random_24(64, k, seed=8)
    with pytest.raises(ConfigError, match=what):
        FAM.check_config(dict(TMA, **bad), m, Operation(layout=layout), {}, H100)


@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_tma_plan_round_trip(layout):
    """The interleaved runs of values and metadata read back to W; M pads to
    a cluster's rows; the module declares its map of X."""
    m = random_24(150, 200, seed=13, zero_rows=(0, 149), dtype="fp16")
    op = Operation(dtype="fp16", layout=layout, epilogue=Epilogue(bias=True))
    plan = FAM.plan(m, op, {}, TMA, bias=np.arange(150, dtype=np.float32))
    assert plan.mp == 256 and plan.kp == 256 and plan.threads == 288
    assert plan.bias_offset == 256 // 64 * (256 // 32) * nm24_pack.AE_STEP
    same_matrix(FAM.unpack(plan), m, "fp16")
    k = FAM.render(plan, op, TMA)
    assert "__cluster_dims__(1, 2, 1)" in k.source
    assert f"SF_DECLARE_X_MAP({2 if layout == 'tm' else 1}, 200, Cfg::BOX_W, Cfg::BOX_ROWS)" in k.source
    assert k.launch["block"] == (288, 1, 1) and k.launch["grid"] == (1, 2, 1)
    ae = nm24_pack.interleave_ae(b"\1" * 4 * 2 * 2048, b"\2" * 16 * 2 * 64, 256, 64)
    assert nm24_pack.split_ae(ae, 256, 64) == (b"\1" * 4 * 2 * 2048, b"\2" * 16 * 2 * 64)


def test_tiles_per_cta_plan():
    """`mt` tiles along M a CTA: the grid's y counts CTAs (a cluster's CM
    side by side), the last slot taking what is left; the output tile gets
    its own shared memory."""
    m = random_24(1000, 200, seed=15)
    mt_tile = dict(TMA, bm=256, bn=128, cm=1, mw=2, stages=4)         # 4 tiles of 256 rows
    for c, slots in ((dict(mt_tile, mt=3), 2), (dict(mt_tile, mt=2), 2),
                     (dict(mt_tile, stages=3, mt=4), 1), (dict(mt_tile, mt=8), 1)):
        for layout in ("fm", "tm"):
            op = Operation(layout=layout)
            plan = FAM.plan(m, op, {}, c)
            assert plan.grid == (1, slots, 1), (c, plan.grid)
            k = FAM.render(plan, op, c)
            # (rs 0; ys 0: two wgmma tiles a warpgroup store the whole tile)
            assert f", {c['mt']}, 0, 0, 0>;" in k.source and k.launch["grid"] == (1, slots, 1)
            env = nm24_mod.TMA_SPACE.env(c, nm24_mod._layout_problem(layout, 200))
            assert plan.smem_bytes == 2048 + c["stages"] * env["stage_bytes"] + env["c_bytes"]
            same_matrix(FAM.unpack(plan), m, "fp16")


@pytest.mark.parametrize("layout,rows,mt,maps", [
    ("tm", 296, 2, True),     # token-major: Y's rows of M 16-byte aligned
    ("tm", 300, 2, False),    # ... not aligned: the warpgroups copy the slices out
    ("fm", 300, 2, True),     # feature-major: the runtime maps Y where N % 8 == 0
    ("fm", 296, 1, False),    # one tile a CTA: the whole tile through the stages
])
def test_sliced_output_declares_a_map_of_y(layout, rows, mt, maps):
    """The 128 x 256 tile taking several tiles a CTA sends its output
    slices to Y by tensor stores: its module declares a map of Y (64 x 64
    boxes), which the kernel takes after X's."""
    m = random_24(rows, 256, seed=17)
    c = dict(TMA, stages=5, mt=mt)
    op = Operation(layout=layout)
    FAM.check_config(c, m, op, {}, H100)
    k = FAM.generate(m, op, {}, c)
    decl = f"SF_DECLARE_Y_MAP({2 if layout == 'tm' else 1}, {rows}, Cfg::YBOX_W, Cfg::YBOX_ROWS);"
    assert (decl in k.source) == maps
    assert ("TensorMap y_map" in k.source) == maps and (f", {int(maps)}>;" in k.source)


def test_split_k_plan():
    """Split K over a cluster along z: K pads to BK x KS, the grid's z is KS,
    the partial tile fits the shared memory."""
    m = random_24(100, 296, seed=14)
    c = dict(TMA, bm=64, wm=1, bn=64, bk=128, cm=1, ks=4, stages=5)
    plan = FAM.plan(m, Operation(layout="tm"), {}, c)
    assert plan.kp == 512 and plan.grid == (1, 2, 4)
    k = FAM.render(plan, Operation(layout="tm"), c)
    assert "__cluster_dims__(1, 1, 4)" in k.source and k.launch["grid"] == (1, 2, 4)
    same_matrix(FAM.unpack(plan), m, "fp16")


def test_wg_needs_sm90a():
    m = random_24(64, 64, seed=8)
    FAM.check_config(WG, m, Operation(), {}, H100)
    with pytest.raises(ConfigError, match="sm90a == 1: sparse wgmma needs sm_90a"):
        FAM.check_config(WG, m, Operation(), {}, A100)


def test_wgmma_value_order():
    """Per (64-row tile, K step): value (r, c) of the 64 x 16 compressed
    block at 256 (r/8) + 128 (c/8) + 16 (r%8) + 2 (c%8) bytes."""
    r, kh = 128, 48
    vals = np.arange(r * kh, dtype=np.float32).reshape(r, kh)
    flat = nm24_pack.pack_values_sm90(vals)
    ksteps = kh // 16
    for (row, col) in [(0, 0), (1, 0), (0, 1), (8, 0), (0, 8), (63, 15), (64, 16), (127, 47), (70, 33)]:
        t, s, rr, cc = row // 64, col // 16, row % 64, col % 16
        off = (t * ksteps + s) * 1024 + (rr // 8) * 128 + (cc // 8) * 64 + (rr % 8) * 8 + cc % 8
        assert flat[off] == vals[row, col], (row, col)
    np.testing.assert_array_equal(nm24_pack.unpack_values_sm90(flat, r, kh), vals)


@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_wg_plan_round_trip(layout):
    m = random_24(150, 200, seed=12, zero_rows=(0, 149), dtype="bf16")
    op = Operation(dtype="bf16", layout=layout)
    plan = FAM.plan(m, op, {}, WG)
    assert plan.mp == 256 and plan.kp == 256 and plan.threads == 256
    same_matrix(FAM.unpack(plan), m, "bf16")
    k = FAM.render(plan, op, WG)
    assert "wgmma.mma_async.sp.sync.aligned.m64n256k32.f32.bf16.bf16" in k.source
    assert k.launch["block"] == (256, 1, 1) and k.launch["n_tile"] == 256
    assert k.launch["grid"] == (1, 2, 1)
    assert k.launch["shared_bytes"] == nm24_mod.smem_bytes(WG, layout)


def test_check_config_keys_and_ops():
    m = random_24(16, 32, seed=9)
    with pytest.raises(ConfigError, match="lacks stages"):
        FAM.check_config({k: v for k, v in BASE.items() if k != "stages"}, m, Operation(), {})
    with pytest.raises(ConfigError, match="unknown keys"):
        FAM.check_config(dict(BASE, foo=1), m, Operation(), {})
    with pytest.raises(ConfigError, match="dtype"):
        FAM.check_config(BASE, m, Operation(dtype="fp32"), {})


def test_smem_formula_matches_header():
    """The plan's shared-memory size is checked against Config::SMEM_BYTES
    by a static_assert in the rendered source (compile test below)."""
    c = dict(bm=128, bn=256, bk=64, wm=2, wn=4, stages=3)
    assert nm24_mod.smem_bytes(c, "fm") == 3 * (8 * 2 * (512 + 64) + 64 * 256 * 2)
    assert nm24_mod.smem_bytes(dict(c, stages=2, bk=32), "tm") == 256 * (128 + 8) * 2


def test_render_names_and_self_contained():
    m = random_24(45, 77, seed=10)
    op = Operation(dtype="bf16", layout="tm", epilogue=Epilogue(activation="gelu", scale=0.5))
    k = FAM.generate(m, op, {}, BASE)
    assert k.name == "sf_nm24_bf16_tm_s0_5_gelu_bk64_bm128_bn128_stages3_wm2_wn2"
    assert f"\n{k.name}(const unsigned char* __restrict__ packed" in k.source
    assert '#include "sf/' not in k.source
    assert "mma.sp::ordered_metadata" in k.source
    assert "SCALE = 0x1.0000000000000p-1f" in k.source
    assert k.launch["block"] == (128, 1, 1) and k.launch["n_axis"] == 0 and k.launch["n_tile"] == 128
    assert k.launch_config(1000)["grid"] == (8, 1, 1)
    assert k.launch["shared_bytes"] == nm24_mod.smem_bytes(BASE, "tm")


# ---- NVRTC compiles -----------------------------------------------------------------

COMPILE_CASES = [
    ("fp16", "fm", dict(bm=128, bn=128, bk=64, wm=2, wn=2, stages=3), Epilogue()),
    ("bf16", "fm", dict(bm=64, bn=256, bk=32, wm=1, wn=4, stages=4),
     Epilogue(bias=True, activation="gelu", scale=0.5)),
    ("fp16", "tm", dict(bm=128, bn=64, bk=32, wm=4, wn=1, stages=2), Epilogue(activation="relu")),
    ("bf16", "tm", dict(bm=128, bn=256, bk=64, wm=2, wn=4, stages=3), Epilogue(bias=True)),
]


WG_COMPILE_CASES = [
    ("fp16", "fm", dict(TMA), Epilogue()),
    ("bf16", "tm", dict(TMA), Epilogue(bias=True, activation="gelu")),
    ("fp16", "tm", dict(TMA, bn=128, cm=1, stages=6), Epilogue(activation="relu")),
    ("bf16", "fm", dict(TMA, bm=64, wm=1, bn=128, bk=128, cm=1, stages=5), Epilogue(scale=0.5)),
    ("fp16", "tm", dict(TMA, bm=64, wm=1, bn=64, bk=128, cm=1, ks=4, stages=5),
     Epilogue(bias=True, activation="gelu")),
    ("bf16", "fm", dict(TMA, bm=256, bn=128, cm=1, mw=2, stages=6), Epilogue(bias=True, activation="gelu")),
    ("fp16", "tm", dict(TMA, bm=256, bn=128, cm=1, mw=2, stages=4, mt=4),
     Epilogue(bias=True, activation="gelu")),
    ("bf16", "fm", dict(TMA, bm=256, bn=128, cm=1, mw=2, stages=3, mt=2), Epilogue(activation="relu")),
    ("fp16", "tm", dict(TMA, bm=256, bn=128, mw=2, stages=5, ra=1), Epilogue()),
    ("fp16", "fm", dict(TMA, bm=64, wm=1, bn=16, bk=128, stages=12, cm=1, ks=2), Epilogue()),
    ("bf16", "fm", dict(TMA, bm=128, bn=32, bk=128, stages=6, cm=1),
     Epilogue(bias=True, activation="gelu")),
    ("bf16", "tm", dict(TMA, bm=64, wm=1, bn=64, bk=128, stages=8, cm=2),
     Epilogue(bias=True, activation="gelu")),
    ("bf16", "fm", dict(TMA, bm=256, bn=128, cm=1, mw=2, stages=4, mt=2, ra=1), Epilogue(bias=True)),
    # the 128 x 256 tile taking several tiles, its output in slices
    ("fp16", "tm", dict(TMA, stages=5, mt=3), Epilogue(bias=True, activation="gelu")),
    ("bf16", "fm", dict(TMA, stages=5, cm=1, mt=2), Epilogue(bias=True, activation="gelu")),
    # wgmma N = 192 (the 128 x 192 tile)
    ("fp16", "tm", dict(TMA, bn=192, stages=5), Epilogue(bias=True, activation="gelu")),
    ("bf16", "fm", dict(TMA, bn=192, cm=1, stages=6), Epilogue()),
    ("fp16", "fm", dict(WG), Epilogue()),
    ("bf16", "tm", dict(WG, bn=128, stages=5), Epilogue(bias=True, activation="gelu")),
    ("fp16", "fm", dict(WG, bm=64, bn=64, bk=32, wm=1, stages=3), Epilogue(activation="relu")),
    ("bf16", "tm", dict(WG, bk=64, stages=5), Epilogue(scale=0.5)),
    ("fp16", "fm", dict(WG, bm=64, wm=1, wn=2), Epilogue(bias=True)),
]


@pytest.mark.parametrize("case", range(len(WG_COMPILE_CASES)))
def test_wg_templates_compile_without_spills(case, nvrtc):
    """Sparse wgmma kernels compile for sm_90a with no local-memory spills
    and are refused for sm_80 with the reason."""
    import re
    from sparseforge.native import CompileError
    dtype, layout, c, ep = WG_COMPILE_CASES[case]
    odd_k = layout == "tm" and not c.get("tma") and case % 2 == 1   # tm: K % 8 != 0 once
    m = random_24(150, 203 if odd_k else 200, seed=30 + case)
    op = Operation(dtype=dtype, layout=layout, epilogue=ep)
    k = FAM.generate(m, op, {}, c, bias=np.ones(150, np.float32) if ep.bias else None)
    log = nvrtc(k.source, "sm_90a", k.name + ".cu", options=("--ptxas-options=-v",)).log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(s == ("0", "0") for s in spills), log
    assert "warning" not in log.lower(), log
    with pytest.raises(CompileError, match="compile it for sm_90a"):
        nvrtc(k.source, "sm_80", k.name + ".cu")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_templates_compile_with_nvrtc(arch, nvrtc):
    m = random_24(45, 77, seed=21, zero_rows=(2, 44))     # K % 8 != 0: scalar tm path
    m8 = random_24(45, 96, seed=22)                       # K % 8 == 0: cp.async tm path
    bias = np.ones(45, np.float32)
    for i, (dtype, layout, c, ep) in enumerate(COMPILE_CASES):
        mat = m if i % 2 == 0 else m8
        op = Operation(dtype=dtype, layout=layout, epilogue=ep)
        k = FAM.generate(mat, op, {}, c, bias=bias if ep.bias else None)
        cubin = nvrtc(k.source, arch, k.name + ".cu").data
        assert len(cubin) > 0 and k.name.encode() in cubin


# ---- GPU -------------------------------------------------------------------------------

def _verify(matrix, op, config, n, bias=None, seed=0):
    from sparseforge.tuner.execute import verify
    res = verify(FAM, matrix, op, {}, config, n, bias=bias, seed=seed)
    assert res["ok"], (config, n, res)
    return res


GPU_CONFIGS = [
    dict(bm=128, bn=128, bk=64, wm=2, wn=2, stages=3),
    dict(bm=128, bn=256, bk=64, wm=2, wn=4, stages=3),
    dict(bm=128, bn=128, bk=32, wm=2, wn=2, stages=4),
    dict(bm=64, bn=64, bk=32, wm=2, wn=2, stages=2),
    dict(bm=64, bn=256, bk=64, wm=1, wn=4, stages=4),
    dict(bm=128, bn=64, bk=64, wm=4, wn=1, stages=2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_configs(layout, dtype):
    """Odd M, K (K % 8 != 0: scalar token-major path), empty rows; N = 1,
    odd N (scalar feature-major path) and N past one tile."""
    m = random_24(200, 300, seed=1, zero_rows=(0, 7, 199), dtype=dtype)
    op = Operation(dtype=dtype, layout=layout)
    for c in GPU_CONFIGS:
        for n in (1, 77, 264):
            _verify(m, op, c, n)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_aligned_and_special(layout):
    """K % 8 == 0 (cp.async paths), an all-zero matrix, a 3 x 5 matrix."""
    op = Operation(dtype="fp16", layout=layout)
    for m in (random_24(333, 1000, seed=2, mode="full"),
              SparseMatrix.from_dense(np.zeros((40, 64), np.float32), dtype="fp16"),
              random_24(3, 5, seed=3)):
        for c in GPU_CONFIGS[:4]:
            for n in (1, 8, 130):
                _verify(m, op, c, n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_epilogues(layout, dtype):
    m = random_24(200, 300, seed=4, dtype=dtype)
    for ep in (Epilogue(bias=True, activation="relu"), Epilogue(bias=True, activation="gelu", scale=0.5),
               Epilogue(activation="gelu"), Epilogue(scale=-2.0)):
        op = Operation(dtype=dtype, layout=layout, epilogue=ep)
        for c in GPU_CONFIGS[:3]:
            _verify(m, op, c, 13)
            _verify(m, op, c, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_large_n(layout):
    m = random_24(512, 1024, seed=5, mode="full")
    op = Operation(dtype="fp16", layout=layout)
    for c in GPU_CONFIGS[:2]:
        _verify(m, op, c, 4096)


# ---- GPU: the sparse wgmma path (sm_90a) -------------------------------------------------

WG_GPU_CONFIGS = [
    dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1),
    dict(bm=128, bn=128, bk=64, wm=2, wn=1, stages=5, wg=1),
    dict(bm=64, bn=256, bk=128, wm=1, wn=2, stages=3, wg=1),
    dict(bm=64, bn=64, bk=64, wm=1, wn=1, stages=6, wg=1),
]
WG_FM_ONLY = [dict(bm=64, bn=128, bk=32, wm=1, wn=1, stages=3, wg=1)]  # BK = 32: feature-major
TMA_GPU_CONFIGS = [
    dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=2),
    dict(bm=128, bn=128, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1),
    dict(bm=64, bn=256, bk=128, wm=1, wn=2, stages=3, wg=1, tma=1, cm=2),
    dict(bm=64, bn=64, bk=64, wm=1, wn=1, stages=5, wg=1, tma=1, cm=1),
    dict(bm=64, bn=64, bk=128, wm=1, wn=1, stages=5, wg=1, tma=1, cm=1, ks=4),   # split K
    dict(bm=128, bn=64, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=1, ks=2),
    dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1, mw=2),  # 2 tiles a warpgroup
    dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=2, mw=2),
    dict(bm=64, bn=64, bk=64, wm=1, wn=1, stages=12, wg=1, tma=1, cm=1, ks=2),   # deep, split
    dict(bm=128, bn=192, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=2),  # wgmma N = 192
]
# several tiles along M a CTA (`mt`): a slot with fewer tiles at the end of
# M, a cluster pair; the 128 x 256 tile's output slices by tensor stores
# (where Y can be mapped) or copied out by the warpgroups
TMA_MT = [dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=3, wg=1, tma=1, cm=1, mw=2, mt=2),
          dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=1, mw=2, mt=3),
          dict(bm=256, bn=128, bk=64, wm=2, wn=2, stages=4, wg=1, tma=1, cm=1, mw=2, mt=2),
          # the 128 x 256 tile, its output in slices: a cluster pair, and alone
          dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=2, mt=3),
          dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=1, mt=2)]
# consecutive CTAs down M (`ra`): with a cluster pair (the remap keeps a
# cluster's CTAs on one column of N), with several tiles a CTA
TMA_RA = [dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=2, mw=2, ra=1),
          dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=1, mw=2, mt=2, ra=1),
          dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1, mw=2, ra=1)]
# decode's narrow tiles, both layouts (feature-major: one box of 32- or
# 64-byte rows, swizzled to it)
TMA_NARROW = [dict(bm=128, bn=16, bk=64, wm=2, wn=1, stages=12, wg=1, tma=1, cm=1),
              dict(bm=64, bn=16, bk=128, wm=1, wn=1, stages=12, wg=1, tma=1, cm=1, ks=2),
              dict(bm=128, bn=32, bk=128, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1),
              dict(bm=64, bn=32, bk=64, wm=1, wn=1, stages=8, wg=1, tma=1, cm=1, ks=4)]
TMA_TM_ONLY = [
               # decode's X tile shared by a cluster pair (rows split between the two)
               dict(bm=64, bn=64, bk=128, wm=1, wn=1, stages=8, wg=1, tma=1, cm=2),
               dict(bm=128, bn=32, bk=128, wm=2, wn=1, stages=6, wg=1, tma=1, cm=2),
               dict(bm=64, bn=32, bk=128, wm=1, wn=1, stages=8, wg=1, tma=1, cm=1, ks=4)]


@pytest.fixture(scope="module")
def hopper():
    from sparseforge import native
    info = native.Context(0).device_info()
    if info["arch"] != "sm_90a":
        pytest.skip(f"sparse wgmma needs sm_90a; this GPU is {info['arch']}")
    return info


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_wg_odd_shapes(hopper, layout, dtype):
    """M and K not multiples of the tile (K % 8 != 0: the element-load
    token-major path), empty rows; N = 1, odd N (the element-load
    feature-major path), N ending inside a tile and past several."""
    m = random_24(300, 523, seed=41, zero_rows=(0, 64, 299), dtype=dtype)
    op = Operation(dtype=dtype, layout=layout)
    for c in WG_GPU_CONFIGS + (WG_FM_ONLY if layout == "fm" else []):
        for n in (1, 77, 264, 520):
            _verify(m, op, c, n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_wg_epilogues(hopper, layout, dtype):
    m = random_24(256, 512, seed=42, mode="full", dtype=dtype)
    bias = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    for ep in (Epilogue(bias=True, activation="relu"), Epilogue(bias=True, activation="gelu", scale=0.5),
               Epilogue(activation="gelu"), Epilogue(scale=-2.0)):
        op = Operation(dtype=dtype, layout=layout, epilogue=ep)
        for c in WG_GPU_CONFIGS[:2]:
            _verify(m, op, c, 200, bias=bias if ep.bias else None)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_wg_large(hopper, layout):
    m = random_24(1024, 2048, seed=43, mode="full")
    op = Operation(dtype="fp16", layout=layout)
    for c in WG_GPU_CONFIGS[:3]:
        _verify(m, op, c, 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_tma_odd_shapes(hopper, layout, dtype):
    """The warp-specialized TMA path: M not a multiple of a cluster's rows,
    K not of the stage (token-major needs K % 8 == 0), empty rows; N = 1,
    odd N (feature-major: rows of X not 16-byte aligned, loaded without the
    map), N ending inside a tile and past several."""
    m = random_24(300, 520 if layout == "tm" else 523, seed=44, zero_rows=(0, 64, 299),
                  dtype=dtype)
    op = Operation(dtype=dtype, layout=layout)
    for c in (TMA_GPU_CONFIGS + TMA_MT + TMA_RA + TMA_NARROW
              + (TMA_TM_ONLY if layout == "tm" else [])):
        for n in (1, 77, 264, 520):
            _verify(m, op, c, n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_tma_y_stores(hopper, layout, dtype):
    """The output slices sent to Y by tensor stores: M a multiple
    of 8 but not of the tiles (token-major: the map's rows are then
    16-byte aligned; the store clips the box at M and at N), N = 1, odd N
    (feature-major: Y's rows are not 16-byte aligned, no map, the slices
    copied out by the warpgroups), N ending inside a tile and past
    several; token-major with M % 8 != 0 (no map declared)."""
    for rows, n_list in ((296, (1, 77, 264, 520)), (300, (77, 520))):
        m = random_24(rows, 520, seed=48, zero_rows=(0, 64, rows - 1), dtype=dtype)
        op = Operation(dtype=dtype, layout=layout)
        for c in TMA_MT[3:]:   # the 128 x 256 tile's, in slices
            for n in n_list:
                _verify(m, op, c, n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_tma_epilogues(hopper, layout, dtype):
    m = random_24(256, 512, seed=45, mode="full", dtype=dtype)
    bias = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    for ep in (Epilogue(bias=True, activation="relu"), Epilogue(bias=True, activation="gelu", scale=0.5),
               Epilogue(activation="gelu"), Epilogue(scale=-2.0)):
        op = Operation(dtype=dtype, layout=layout, epilogue=ep)
        for c in (TMA_GPU_CONFIGS[:2] + TMA_GPU_CONFIGS[-2:] + TMA_MT + TMA_RA + TMA_NARROW
                  + (TMA_TM_ONLY if layout == "tm" else [])):
            _verify(m, op, c, 200, bias=bias if ep.bias else None)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_tma_large(hopper, layout):
    m = random_24(1024, 2048, seed=46, mode="full")
    op = Operation(dtype="fp16", layout=layout)
    for c in (TMA_GPU_CONFIGS[:3] + [dict(TMA_MT[0], mt=4), dict(TMA_MT[2], mt=3)] + TMA_MT[3:]
              + TMA_RA):
        _verify(m, op, c, 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [
    dict(bm=64, bn=16, bk=128, wm=1, wn=1, stages=12, wg=1, tma=1, cm=1, ks=2),   # decode, split K
    dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=1, mw=2, mt=2),
    dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=2),
    dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=2, mt=2)])
def test_gpu_tma_dependent_launches(hopper, config):
    """The TMA kernels are launched as programmatic dependents of the
    stream's previous work (SF_DECLARE_PDL): three of them back to back
    on one stream, each reading the one before's output (tests/py/chain.py)."""
    from chain import check_dependent_chain
    check_dependent_chain(FAM, random_24(512, 512, seed=47, mode="full"), {}, config,
                          64 if config["bn"] <= 64 else 320)


def test_token_major_decode_shares_x_in_a_cluster_pair():
    """Token-major X tiles of any width are shared by a cluster pair (rows
    split between the two); feature-major ones only from 128 columns."""
    m = random_24(300, 512, seed=16)
    op = Operation(layout="tm")
    c = dict(TMA, bm=64, wm=1, bn=64, bk=128, stages=8, cm=2)
    FAM.check_config(c, m, op, {}, H100)
    k = FAM.generate(m, op, {}, c)
    assert "__cluster_dims__(1, 2, 1)" in k.source and k.launch["grid"] == (1, 6, 1)
    with pytest.raises(ConfigError, match="feature-major X tiles are shared only"):
        FAM.check_config(c, m, Operation(layout="fm"), {}, H100)
    with pytest.raises(ConfigError, match="a cluster shares the X tile or splits K, not both"):
        FAM.check_config(dict(c, ks=2), m, op, {}, H100)


def test_tile_order_plan():
    """`ra` reaches the kernel's configuration; the grid and block do not
    change with it (the kernel remaps its index)."""
    m = random_24(1000, 200, seed=15)
    base = dict(TMA, bm=256, bn=128, cm=1, mw=2, stages=4, mt=2)
    op = Operation(layout="tm")
    for ra in (0, 1):
        c = dict(base, ra=ra)
        plan = FAM.plan(m, op, {}, c)
        k = FAM.render(plan, op, c)
        assert f", 2, {ra}, 0, 0>;" in k.source and plan.threads == 288
        assert k.launch["grid"] == (1, 2, 1) and k.launch["block"] == (288, 1, 1)


def test_configurations_that_pack_alike_share_one_packed_object():
    """The tuner's worker keeps one device copy per packed buffer (keyed by
    its digest, memoized by identity): configurations that differ only in
    what does not change the packing share one bytes object; a different
    bias gets its own."""
    m = random_24(128, 256, seed=3)
    a = FAM.plan(m, Operation(), {}, BASE)
    b = FAM.plan(m, Operation(), {}, dict(BASE, bn=64, stages=4))
    assert a.packed is b.packed
    c = FAM.plan(m, Operation(), {}, dict(BASE, bm=64, wm=1, wn=4))   # pads M alike (128)
    assert c.packed is a.packed
    op = Operation(epilogue=Epilogue(bias=True))
    one = FAM.plan(m, op, {}, BASE, bias=np.ones(128))
    two = FAM.plan(m, op, {}, BASE, bias=np.full(128, 2.0))
    assert one.packed is not two.packed and one.packed != two.packed
    assert FAM.plan(m, op, {}, dict(BASE, bn=64), bias=np.ones(128)).packed is one.packed
    m.drop_cached()
    assert FAM.plan(m, Operation(), {}, BASE).packed == a.packed   # made again, alike
