"""The row-group gather GEMM families `bsr` and `shflbw`: plan/unpack round
trips, a NumPy run of each packed plan, configuration constraints, NVRTC
compilation for sm_80 and sm_90a (CPU), and correctness on the GPU (marked
gpu)."""
import re

import numpy as np
import pytest

from sparseforge.generator.families import get_family
from sparseforge.generator.kernel import ConfigError, Epilogue, Operation, reference
from sparseforge.generator.matrix import SparseMatrix, round_to_dtype
from sparseforge.generator.families import rowgroup
from sparseforge.generator.families.rowgroup import plan as plan_mod

FP16 = Operation("fp16", "fm")


# ---- matrices ------------------------------------------------------------------------

def make_bsr(m, k, br, bc, density, rng, dtype="fp16", empty_block_rows=()):
    nbr, nbc = -(-m // br), -(-k // bc)
    blocks = rng.random((nbr, nbc)) < density
    for b in empty_block_rows:
        blocks[b] = False
    mask = np.kron(blocks, np.ones((br, bc), dtype=bool))[:m, :k]
    vals = rng.standard_normal((m, k)).astype(np.float32) + 3.0  # never 0 after rounding
    return SparseMatrix.from_dense(np.where(mask, vals, 0.0), dtype=dtype)


def make_shflbw(m, k, v, density, rng, dtype="fp16", with_perm=True, empty_groups=()):
    """An exact Shfl-BW matrix: group g of the permuted rows shares one
    support; rows shuffled by a random permutation."""
    permuted = np.zeros((m, k), dtype=np.float32)
    for g in range(-(-m // v)):
        if g in empty_groups:
            continue
        sup = rng.random(k) < density
        rows = slice(g * v, min(m, (g + 1) * v))
        vals = rng.standard_normal((rows.stop - rows.start, k)).astype(np.float32) + 3.0
        permuted[rows] = np.where(sup[None, :], vals, 0.0)
    perm = rng.permutation(m)
    dense = np.zeros_like(permuted)
    dense[perm] = permuted
    return SparseMatrix.from_dense(dense, dtype=dtype, perm=perm if with_perm else None)


def make_random(m, k, density, rng, dtype="fp16"):
    mask = rng.random((m, k)) < density
    vals = rng.standard_normal((m, k)).astype(np.float32) + 3.0
    return SparseMatrix.from_dense(np.where(mask, vals, 0.0), dtype=dtype)


def emulate(plan, x):
    """Y from the packed plan, the way the kernel computes it (pads and
    all), in float64; x is K x N."""
    if plan.xr:
        return emulate_shared(plan, x)
    m, k = plan.shape
    bm, bk, raw = plan.bm, plan.bk, plan.packed
    total = plan.total_chunks
    w = plan_mod.chunk_weights(plan).astype(np.float64)   # (a swizzled plan's rows put back)
    idx = np.frombuffer(raw, np.int32, total * bk, plan.offsets["indices"]).reshape(total, bk)
    slots = np.frombuffer(raw, np.int32, plan.num_slots * 4, plan.offsets["slots"]).reshape(-1, 4)
    rows = np.frombuffer(raw, np.int32, m, plan.offsets["rows"]) if plan.permuted else None
    assert np.all((idx >= 0) & (idx < max(k, 1))), "an index (pads too) points outside X"
    y = np.full((m, x.shape[1]), np.nan)
    for f, nch, r0, nr in slots:
        if nch:
            tile = w[f:f + nch].transpose(1, 0, 2).reshape(bm, nch * bk)
            acc = tile @ x[idx[f:f + nch].ravel()]
        else:
            acc = np.zeros((bm, x.shape[1]))
        orig = rows[r0:r0 + nr] if rows is not None else np.arange(r0, r0 + nr)
        y[orig] = acc[:nr]
    return y


def emulate_shared(plan, x):
    """Y from a shared-gather plan the way its kernel computes it: per
    chunk, the union rows into slots (empty slots hold NaN, which a read
    would spread), then each group's entries read their slots."""
    m, k = plan.shape
    bm, bk, xr, xu, raw = plan.bm, plan.bk, plan.xr, plan.xu, plan.packed
    total, tr = plan.total_chunks, plan.xr * plan.bm
    from sparseforge.generator.matrix import from_device_bytes
    w = from_device_bytes(raw[plan.offsets["weights"]:], plan.dtype, total * tr * bk)
    w = w.reshape(total, xr, bm, bk).astype(np.float64)
    idx = np.frombuffer(raw, np.int32, total * xu, plan.offsets["indices"]).reshape(total, xu)
    loc = np.frombuffer(raw, np.uint8, total * xr * bk, plan.offsets["local"]).reshape(total, xr, bk)
    slots = np.frombuffer(raw, np.int32, plan.num_slots * 4, plan.offsets["slots"]).reshape(-1, 4)
    rows = np.frombuffer(raw, np.int32, plan.num_slots * tr, plan.offsets["rows"])
    assert np.all((idx >= -1) & (idx < max(k, 1)))
    y = np.full((m, x.shape[1]), np.nan)
    for f, nch, r0, nr in slots:
        acc = np.zeros((xr, bm, x.shape[1]))
        for c in range(f, f + nch):
            tile = np.full((xu, x.shape[1]), np.nan)
            tile[idx[c] >= 0] = x[idx[c][idx[c] >= 0]]
            for j in range(xr):
                acc[j] += w[c, j] @ tile[loc[c, j]]
        orig = rows[r0:r0 + nr]
        y[orig[orig >= 0]] = acc.reshape(tr, -1)[orig >= 0]
    return y


def assert_round_trip(fam, mat, plan):
    back = fam.unpack(plan)
    want = mat.astype(plan.dtype)
    assert back.shape == want.shape and back.dtype == want.dtype
    np.testing.assert_array_equal(back.indptr, want.indptr)
    np.testing.assert_array_equal(back.indices, want.indices)
    np.testing.assert_array_equal(back.values, want.values)
    return back


CFG = {"bk": 32, "bn": 64, "stages": 3, "wm": 1, "wn": 2}


# ---- plan / unpack -------------------------------------------------------------------

@pytest.mark.parametrize("br,bc", [(32, 32), (64, 64), (16, 8), (8, 8), (24, 40), (1, 16)])
@pytest.mark.parametrize("bk", [16, 64])
def test_bsr_round_trip_and_emulation(rng, br, bc, bk):
    m, k = 203, 317
    mat = make_bsr(m, k, br, bc, 0.3, rng, empty_block_rows=(0, 2))
    fam = get_family("bsr")
    params = {"br": br, "bc": bc}
    assert fam.fits(mat, params)
    cfg = dict(CFG, bk=bk, wm=1)
    plan = fam.plan(mat, FP16, params, cfg)
    assert plan.bm % 16 == 0 and plan.bm >= plan.group_rows
    assert_round_trip(fam, mat, plan)
    assert plan.perm is None and not plan.permuted
    x = round_to_dtype(rng.standard_normal((k, 5)), "fp16").astype(np.float64)
    np.testing.assert_allclose(emulate(plan, x), reference(mat, x, FP16), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("shape,bc,runs", [((96, 512), 32, True), ((96, 512), 8, True),
                                           ((96, 512), 12, False), ((96, 100), 32, False)])
def test_bsr_runs_of_eight_for_token_major(rng, shape, bc, runs):
    """Token-major gathers 16-byte runs only when every run of 8 indices
    (pads included) is 8 consecutive aligned columns and K % 8 == 0."""
    mat = make_bsr(*shape, 32, bc, 0.3, rng)
    fam = get_family("bsr")
    op = Operation("fp16", "tm")
    for bk in (16, 64):
        plan = fam.plan(mat, op, {"br": 32, "bc": bc}, dict(CFG, bk=bk))
        assert plan.runs8 == runs
        assert_round_trip(fam, mat, plan)
    k = fam.generate(mat, op, {"br": 32, "bc": bc}, CFG)
    assert ("RUNS8 = true" in k.source) == runs and "Config<__half, 32, 64, 32, 1, 2, 3, true, false, 32, 0, 0>" in k.source


def test_bsr_not_exact_stores_explicit_zeros(rng):
    mat = make_random(100, 90, 0.05, rng)
    fam = get_family("bsr")
    params = {"br": 16, "bc": 16}
    assert not fam.fits(mat, params)
    plan = fam.plan(mat, FP16, params, CFG)
    assert plan.stored_entries > mat.nnz
    assert_round_trip(fam, mat, plan)


@pytest.mark.parametrize("v", [16, 32, 64, 24])
@pytest.mark.parametrize("with_perm", [True, False])
def test_shflbw_round_trip_and_emulation(rng, v, with_perm):
    m, k = 150, 130
    mat = make_shflbw(m, k, v, 0.3, rng, with_perm=with_perm, empty_groups=(1,))
    fam = get_family("shflbw")
    params = {"v": v}
    assert fam.fits(mat, params)
    plan = fam.plan(mat, FP16, params, dict(CFG, wm=1))
    assert plan.permuted and plan.stored_entries == mat.nnz
    back = assert_round_trip(fam, mat, plan)
    if with_perm:
        np.testing.assert_array_equal(back.perm, mat.perm)
    else:
        assert back.perm is not None
    # every group of the plan's permutation shares one support
    pd = mat.to_dense()[plan.perm] != 0
    for g in range(-(-m // v)):
        blk = pd[g * v:(g + 1) * v]
        assert np.all(blk == blk[0])
    x = round_to_dtype(rng.standard_normal((k, 3)), "fp16").astype(np.float64)
    np.testing.assert_allclose(emulate(plan, x), reference(mat, x, FP16), rtol=1e-9, atol=1e-9)


XS_CFG = {"bk": 16, "bn": 64, "stages": 3, "wm": 4, "wn": 2, "xr": 4, "xu": 32}


@pytest.mark.parametrize("family,params,kind,shape", [
    ("shflbw", {"v": 32}, "shflbw", (300, 257)),      # a short last set, K odd
    ("shflbw", {"v": 16}, "random", (130, 90)),       # not exact: union supports
    ("bsr", {"br": 32, "bc": 32}, "bsr", (203, 317)),  # clipped last block column
    ("bsr", {"br": 16, "bc": 8}, "bsr", (150, 200)),   # runs of 8
    ("bsr", {"br": 64, "bc": 40}, "bsr", (260, 300)),  # runs of 40: aligned units of bk
    ("bsr", {"br": 8, "bc": 12}, "bsr", (100, 120)),   # runs not of 8: single columns
])
@pytest.mark.parametrize("xr,bk,xu", [(4, 16, 32), (8, 32, 128), (16, 16, 256), (4, 32, 32)])
def test_shared_gather_round_trip_and_emulation(rng, family, params, kind, shape, xr, bk, xu):
    mat = _gpu_matrix(kind, shape, params, "fp16", rng)
    fam = get_family(family)
    cfg = dict(XS_CFG, bk=bk, xr=xr, xu=xu, wm=xr, wn=1)
    plan = plan_mod.build_shared_plan(mat, FP16, fam.grouping(mat, params), bk, xr, xu,
                                      family=family, tag=fam.tag(params))
    assert plan.xr == xr and plan.xu == xu
    assert_round_trip(fam, mat, plan)
    x = round_to_dtype(rng.standard_normal((shape[1], 3)), "fp16").astype(np.float64)
    np.testing.assert_allclose(emulate(plan, x), reference(mat, x, FP16), rtol=1e-9, atol=1e-9)
    try:
        fam.check_config(cfg, mat, FP16, params)
    except ConfigError as e:  # 16 groups of 64 rows: too many registers for a kernel
        assert "register file" in str(e) and plan.bm * xr >= 1024, e
        return
    k = fam.generate(mat, FP16, params, cfg)
    assert k.launch["grid"] == (plan.num_slots, 1, 1) and k.launch["n_axis"] == 1 and plan.num_slots == -(-len(
        fam.grouping(mat, params).supports) // xr)
    assert k.launch["shared_bytes"] == rowgroup.smem_bytes(plan.bm, cfg)


def _octet_residues(plan):
    total = plan.total_chunks
    loc = np.frombuffer(plan.packed, np.uint8, total * plan.xr * plan.bk,
                        plan.offsets["local"]).reshape(total, plan.xr, plan.bk // 8, 8)
    return np.array([[[len(set((o % 8).tolist())) for o in g] for g in c] for c in loc])


def test_shared_gather_saves_traffic_and_avoids_bank_conflicts():
    """At d = 0.25, eight groups of 32 share most of their columns: the
    union loaded is under half the per-group gathers; bsr blocks give
    conflict-free octets (8 distinct slot residues), single columns nearly
    always do."""
    from sparseforge.generator.synth import random_matrix
    for pattern, params, fam in [("shflbw:32", {"v": 32}, "shflbw"), ("bsr:32x32", {"br": 32, "bc": 32}, "bsr")]:
        mat = random_matrix(pattern, 1024, 1024, 0.25, "fp16", seed=0)
        F = get_family(fam)
        plan = F.plan(mat, FP16, params, dict(XS_CFG, bk=32, xr=8, wm=8, wn=1, xu=192, bn=64))
        gathered = sum(s.size for s in F.grouping(mat, params).supports)
        assert plan.meta["union_rows"] < 0.5 * gathered, (pattern, plan.meta, gathered)
        # MMA padding: the chunks hold at most 15% more entries than the groups have
        assert plan.total_chunks * plan.bk * plan.xr <= 1.15 * gathered
        res = _octet_residues(plan)
        if fam == "bsr":
            assert np.all(res == 8)
        else:
            assert np.mean(res == 8) > 0.85 and res.min() >= 6, (np.mean(res == 8), res.min())


@pytest.mark.parametrize("change,constraint", [
    ({"wm": 2}, "wm == xr: one warp row per group"),
    ({"xr": 3, "wm": 3}, r"xr in \(4, 8, 16\): groups per CTA"),
    ({"xu": 24}, "rows of X per chunk: a multiple of 16"),
    ({"xu": 80}, "rows of X per chunk: a multiple of 16"),
    ({"bk": 64, "xu": 64}, r"bk in \(16, 32\): BK of the shared gather"),
    ({"bn": 32, "wn": 1}, r"bn in \(64, 128, 256\): BN of the shared gather"),
    ({"bn": 256, "wn": 1}, "acc <= 128: at most 128 fp32 accumulators"),
])
def test_invalid_shared_gather_configs_name_their_constraint(rng, change, constraint):
    mat = make_shflbw(256, 128, 32, 0.3, rng)
    with pytest.raises(ConfigError, match=constraint):
        get_family("shflbw").check_config(dict(XS_CFG, **change), mat, FP16, {"v": 32})
    # token-major takes the shared gather too
    get_family("bsr").check_config(XS_CFG, make_bsr(128, 64, 32, 32, 0.5, rng),
                                   Operation("fp16", "tm"), {"br": 32, "bc": 32})


def test_shflbw_non_fitting_matrix_runs_with_union_supports(rng):
    mat = make_random(70, 50, 0.1, rng, dtype="bf16")
    fam = get_family("shflbw")
    op = Operation("bf16", "fm")
    assert not fam.fits(mat, {"v": 16})
    plan = fam.plan(mat, op, {"v": 16}, dict(CFG, wm=1))
    assert plan.stored_entries > mat.nnz
    assert_round_trip(fam, mat, plan)
    x = round_to_dtype(rng.standard_normal((50, 4)), "bf16").astype(np.float64)
    np.testing.assert_allclose(emulate(plan, x), reference(mat, x, op), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family,params", [("bsr", {"br": 32, "bc": 32}), ("shflbw", {"v": 32})])
def test_all_zero_and_empty_shapes(family, params):
    fam = get_family(family)
    for shape in [(40, 33), (1, 1), (0, 8), (8, 0)]:
        mat = SparseMatrix.from_dense(np.zeros(shape, np.float32), dtype="fp16")
        plan = fam.plan(mat, FP16, params, dict(CFG, wm=1))
        assert plan.total_chunks == 0
        assert plan.num_slots == -(-shape[0] // plan.group_rows)
        assert fam.unpack(plan).nnz == 0
        k = fam.render(plan, FP16, dict(CFG, wm=1))
        assert k.launch["grid"] == (max(1, plan.num_slots), 1, 1)


def test_schedule_longest_first_and_sections_aligned(rng):
    mat = make_shflbw(256, 200, 32, 0.4, rng)
    fam = get_family("shflbw")
    plan = fam.plan(mat, Operation("fp16", "fm", Epilogue(bias=True)), {"v": 32},
                    dict(CFG, wm=2), bias=np.arange(256, dtype=np.float32))
    assert all(off % 16 == 0 for off in plan.offsets.values())
    assert np.all(np.diff(plan.group_k) <= 0)
    slots = plan.slots
    # chunks are laid out in slot order, contiguously
    np.testing.assert_array_equal(slots[1:, 0], np.cumsum(slots[:, 1])[:-1])
    np.testing.assert_array_equal(slots[:, 1], -(-plan.group_k // plan.bk))
    # the bias is stored by position (the rows section's order): bias[perm]
    bias = np.frombuffer(plan.packed, np.float32, 256, plan.offsets["bias"])
    rows = np.frombuffer(plan.packed, np.int32, 256, plan.offsets["rows"])
    assert plan.permuted and not np.array_equal(rows, np.arange(256))
    np.testing.assert_array_equal(bias, rows.astype(np.float32))


def test_bias_is_required_and_checked(rng):
    mat = make_bsr(64, 64, 32, 32, 0.5, rng)
    fam = get_family("bsr")
    op = Operation("fp16", "fm", Epilogue(bias=True, activation="relu"))
    with pytest.raises(ValueError, match="bias"):
        fam.plan(mat, op, {"br": 32, "bc": 32}, CFG)
    with pytest.raises(ValueError, match="bias has 3 entries"):
        fam.plan(mat, op, {"br": 32, "bc": 32}, CFG, bias=np.ones(3))


def test_params_are_validated():
    mat = SparseMatrix.from_dense(np.eye(32, dtype=np.float32), dtype="fp16")
    with pytest.raises(ValueError, match="br and bc"):
        get_family("bsr").plan(mat, FP16, {"br": 32}, CFG)
    with pytest.raises(ValueError, match="v="):
        get_family("shflbw").plan(mat, FP16, {"v": 0}, CFG)
    assert get_family("bsr").tag({"br": 64, "bc": 64}) == "bsr64x64"
    assert get_family("shflbw").tag({"v": 64}) == "shflbw64"


# ---- configurations -----------------------------------------------------------------

@pytest.mark.parametrize("family,params", [("bsr", {"br": 64, "bc": 64}), ("bsr", {"br": 16, "bc": 16}),
                                           ("shflbw", {"v": 128}), ("shflbw", {"v": 32})])
def test_search_space_is_valid(rng, family, params):
    fam = get_family(family)
    mat = make_random(256, 128, 0.2, rng)
    dev = {"smem_per_block_optin": 101376, "cc_major": 8, "cc_minor": 6}
    for device in (None, dev):
        space = fam.search_space(mat, FP16, params, device)
        assert space
        names = set()
        for cfg in space:
            fam.check_config(cfg, mat, FP16, params, device)
            assert rowgroup.smem_bytes(fam.tile_rows(mat, params), cfg) <= rowgroup.smem_limit(device)
            names.add(str(sorted(cfg.items())))
        assert len(names) == len(space)
    assert len(fam.search_space(mat, FP16, params, dev)) <= len(fam.search_space(mat, FP16, params))
    assert fam.default_config(mat, FP16, params) in fam.search_space(mat, FP16, params)


HOPPER = {"arch": "sm_90a", "cc_major": 9, "cc_minor": 0, "smem_per_block_optin": 232448}
AMPERE = {"arch": "sm_80", "cc_major": 8, "cc_minor": 0, "smem_per_block_optin": 166912}
WG_CFG = {"bk": 32, "bn": 256, "stages": 4, "wm": 4, "wn": 2, "wg": 1}


@pytest.mark.parametrize("family,params,bm", [("shflbw", {"v": 64}, 64), ("bsr", {"br": 64, "bc": 64}, 64),
                                              ("shflbw", {"v": 128}, 128), ("shflbw", {"v": 32}, 32),
                                              ("bsr", {"br": 16, "bc": 16}, 16)])
def test_hopper_space_is_wgmma_where_groups_fill_warpgroups(rng, family, params, bm):
    fam = get_family(family)
    mat = make_random(256, 128, 0.2, rng)
    space = fam.search_space(mat, FP16, params, HOPPER)
    wg = [c for c in space if c.get("wg")]
    assert wg and all(c["wm"] == max(64, bm) // 16 for c in wg)
    for cfg in space:
        fam.check_config(cfg, mat, FP16, params, HOPPER)
    # whole warpgroups of rows: wgmma, then mma.sync's decode tiles (few columns of N, split
    # K among them) alone; padded tiles: all of mma.sync and the shared gather join
    xs = [c for c in space if c.get("xr")]
    mma = [c for c in space if not c.get("wg")]
    assert space[:len(wg)] == wg
    assert (max(c["bn"] for c in mma) <= 32 and any(c.get("ks") for c in mma)) == \
        (bm % 64 == 0) == (not xs)
    assert bm % 64 == 0 or {4, 8} <= {c["xr"] for c in xs}
    ampere_xr = {c["xr"] for c in fam.search_space(mat, FP16, params, AMPERE) if c.get("xr")}
    assert 4 in ampere_xr and (bm > 32 or 8 in ampere_xr)
    assert {c["bn"] for c in wg} >= {64, 256} | ({512} if bm <= 64 else set())
    assert {c["stages"] for c in wg} == {3, 4, 5, 6}
    # nothing wgmma off sm_90a, nor token-major
    assert not [c for c in fam.search_space(mat, FP16, params, AMPERE) if c.get("wg")]
    assert not [c for c in fam.search_space(mat, FP16, params) if c.get("wg")]
    # the hints (a budgeted search's first trials) are valid, in the space, the default first:
    # wgmma where groups fill warpgroups, else mma.sync first, the shared gather among them
    hints = fam.hint_configs(mat, FP16, params, HOPPER)
    assert hints and all(h in space for h in hints) and hints[0] == fam.default_config(mat, FP16, params, HOPPER)
    assert bool(hints[0].get("wg")) == (bm % 64 == 0)
    assert bm % 64 == 0 or (set(hints[0]) == {"bk", "bn", "stages", "wm", "wn"} and
                            any(h.get("xr") == 8 for h in hints))
    assert "wg" not in fam.default_config(mat, FP16, params, AMPERE)
    assert all(h in fam.search_space(mat, FP16, params, AMPERE) for h in fam.hint_configs(mat, FP16, params, AMPERE))
    # token-major on sm_90a: wgmma (no streamed tiles) beside mma.sync and its split K
    tm = Operation("fp16", "tm")
    tm_space = fam.search_space(mat, tm, params, HOPPER)
    tm_wg = [c for c in tm_space if c.get("wg")]
    assert tm_wg and [c for c in tm_wg if "tn" in c]
    assert [c for c in tm_space if c.get("ks")] and [c for c in tm_space if set(c) == set(CFG)]
    tm_hints = fam.hint_configs(mat, tm, params, HOPPER)
    assert all(h in tm_space for h in tm_hints) and any(h.get("wg") for h in tm_hints[:2])
    assert not [c for c in fam.search_space(mat, tm, params, AMPERE) if c.get("wg")]


@pytest.mark.parametrize("change,constraint", [
    ({"wm": 2}, "wm == tile // 16: 4 warps per 64 rows of the wgmma tile"),
    ({"stages": 2}, "pipeline depth of the wgmma path"),
    ({"stages": 7}, "pipeline depth of the wgmma path"),
    ({"bn": 1024, "wn": 4}, r"bn in \(64, 128, 256, 512\): BN of the wgmma path"),
    ({"bn": 64, "wn": 2}, "each warpgroup's N is one of the wgmma wrappers'"),
    ({"wg": 2}, "wg == 1: wg = 1 selects the wgmma path"),
    ({"bk": 64, "bn": 512, "wn": 2, "stages": 4}, "smem <= smem_limit: the shared memory fits"),
    ({"tn": 3}, r"tn in \(1, 2, 4\): tiles of N per CTA"),
    ({"tn": 1}, "tn: omit the key for one tile"),
    ({"tn": 2, "bk": 16}, "streamed tiles: half the output tile fits one stage"),
])
def test_invalid_wgmma_configs_name_their_constraint(rng, change, constraint):
    mat = make_shflbw(128, 64, 64, 0.5, rng)
    fam = get_family("shflbw")
    with pytest.raises(ConfigError, match=constraint):
        fam.check_config(dict(WG_CFG, **change), mat, FP16, {"v": 64}, HOPPER)
    fam.check_config(WG_CFG, mat, FP16, {"v": 64}, HOPPER)
    with pytest.raises(ConfigError, match="register file"):   # 4 warpgroups x 128 accumulators
        fam.check_config(dict(WG_CFG, bn=512, wm=8), make_shflbw(128, 64, 128, 0.5, rng), FP16,
                         {"v": 128}, HOPPER)
    with pytest.raises(ConfigError, match="needs sm_90a"):
        fam.check_config(WG_CFG, mat, FP16, {"v": 64}, AMPERE)
    # token-major: the wgmma path, streamed tiles too
    bsr, tm = get_family("bsr"), Operation("fp16", "tm")
    for cfg in (WG_CFG, dict(WG_CFG, bn=128, wn=1, tn=2)):
        bsr.check_config(cfg, make_bsr(64, 64, 64, 16, 0.5, rng), tm, {"br": 64, "bc": 16}, HOPPER)
    with pytest.raises(ConfigError, match="keys"):   # streamed tiles are the wgmma path's
        fam.check_config(dict(CFG, tn=2), mat, FP16, {"v": 64}, HOPPER)


TMA_CFG = dict(WG_CFG, bk=64, bn=128, wn=1, tma=1)
TM16 = Operation("fp16", "tm")


@pytest.mark.parametrize("family,params,shape,change,constraint", [
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {}, None),
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"layout": "fm"}, "tm == 1: the TMA path is token-major"),
    ("bsr", {"br": 64, "bc": 32}, (128, 256), {}, "xrun >= bk and xrun % bk == 0"),
    ("bsr", {"br": 64, "bc": 64}, (128, 200), {}, "xrun >= bk"),       # K not a multiple of bc
    ("bsr", {"br": 64, "bc": 16}, (128, 200), {"bk": 16}, "xrun >= bk"),  # K not a multiple of bc either
    ("shflbw", {"v": 64}, (128, 256), {}, "xrun >= bk"),               # columns one at a time
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"bn": 512, "wn": 2, "stages": 3},
     "a TMA box of X has at most 256 tokens"),
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"tma": 2}, "tma == 1: tma = 1 selects"),
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"tn": 2}, None),         # streamed tiles
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"ks": 2}, "keys"),       # no split K
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"pc": 264}, None),       # persistent CTAs
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"pc": 0}, "pc: omit the key"),
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"pc": -3}, "pc >= 1"),
    ("bsr", {"br": 128, "bc": 64}, (128, 256), {"pc": 132, "wm": 8, "bn": 256, "stages": 3},
     "the accumulators and the items' state fit"),       # ptxas spills it (168 registers)
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"pc": 132, "tma": None}, "keys"),
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"pc": 132, "tn": 2}, "keys"),
    ("bsr", {"br": 64, "bc": 64}, (128, 256), {"wg": None}, "keys"),    # wgmma's alone
])
def test_tma_configs_name_their_constraint(rng, family, params, shape, change, constraint):
    """The TMA-fed path takes token-major chunks that are one run of X's
    columns (bsr blocks a multiple of BK wide, K a multiple of them and of
    8), boxes of at most 256 tokens, one tile of N a CTA."""
    fam = get_family(family)
    mat = (make_bsr(*shape, params["br"], params["bc"], 0.5, rng) if family == "bsr"
           else make_shflbw(*shape, params["v"], 0.5, rng))
    change = dict(change)
    op = Operation("fp16", change.pop("layout", "tm"))
    cfg = {k: v for k, v in dict(TMA_CFG, **change).items() if v is not None}
    if constraint is None:
        fam.check_config(cfg, mat, op, params, HOPPER)
        space_ = fam.search_space(mat, op, params, HOPPER)
        if "pc" in cfg:   # the space's: the device's SMs (an H100's 132 by default) x CTAs an SM holds
            blocks = rowgroup.min_blocks(64, dict(cfg, pc=1), "tm")
            assert dict(cfg, pc=132 * blocks) in space_
            assert dict(cfg, pc=114 * blocks) in fam.search_space(mat, op, params,
                                                                  dict(HOPPER, sm_count=114))
        else:
            assert cfg in space_
        return
    with pytest.raises(ConfigError, match=constraint):
        fam.check_config(cfg, mat, op, params, HOPPER)


@pytest.mark.parametrize("br,bc,bk", [(64, 64, 64), (64, 64, 32), (32, 32, 16), (128, 64, 64),
                                      (64, 128, 32)])
def test_tma_plan_swizzles_chunks_and_round_trips(rng, br, bc, bk):
    """A TMA plan packs each chunk's rows in the shared tile's swizzled
    order (16-byte chunk ch of row r at ch XOR the row's swizzle phase) and
    is otherwise the cp.async plan: same indices, slots, same matrix back,
    same product."""
    m, k = 200, 512
    mat = make_bsr(m, k, br, bc, 0.3, rng, empty_block_rows=(1,))
    fam, params = get_family("bsr"), {"br": br, "bc": bc}
    wm = rowgroup.wg_tile_rows(fam.tile_rows(mat, params)) // 16
    base = dict(WG_CFG, bk=bk, bn=128, wm=wm, wn=1)
    plain = fam.plan(mat, TM16, params, base)
    tma = fam.plan(mat, TM16, params, dict(base, tma=1))
    assert tma.swizzled and not plain.swizzled and tma.packed is not plain.packed
    assert plain.offsets == tma.offsets      # the sections after the weights: byte for byte
    assert plain.packed[plain.offsets["indices"]:] == tma.packed[tma.offsets["indices"]:]
    raw = lambda p: np.frombuffer(p.packed, np.uint16, p.total_chunks * p.bm * bk,
                                  p.offsets["weights"]).reshape(p.total_chunks, p.bm, bk // 8, 8)
    w0, w1 = raw(plain), raw(tma)
    phase = {8: lambda r: r % 8, 4: lambda r: (r // 2) % 4, 2: lambda r: (r // 4) % 2}[bk // 8]
    for r in range(plain.bm):
        for ch in range(bk // 8):
            np.testing.assert_array_equal(w1[:, r, ch ^ phase(r)], w0[:, r, ch])
    assert_round_trip(fam, mat, tma)
    x = round_to_dtype(rng.standard_normal((k, 3)), "fp16").astype(np.float64)
    np.testing.assert_allclose(emulate(tma, x), reference(mat, x, FP16), rtol=1e-9, atol=1e-9)
    k_ = fam.generate(mat, TM16, params, dict(base, tma=1))
    assert k_.launch["block"][0] == 32 * wm + 32          # the consumers and a producer warp
    assert "SF_DECLARE_X_MAP(2, 512, %d, 128)" % bk in k_.source


def test_streamed_tiles_kernel(rng):
    """tn: one CTA per tn tiles of N (the grid's N axis counts bn * tn
    columns a block), the same shared memory as one tile."""
    mat = make_shflbw(128, 64, 64, 0.5, rng)
    fam = get_family("shflbw")
    cfg = dict(WG_CFG, bn=128, wn=1, tn=4)
    fam.check_config(cfg, mat, FP16, {"v": 64}, HOPPER)
    k = fam.generate(mat, FP16, {"v": 64}, cfg)
    one = fam.generate(mat, FP16, {"v": 64}, dict(WG_CFG, bn=128, wn=1))
    assert k.name == one.name.replace("_stages4_wg1", "_stages4_tn4_wg1") != one.name
    assert k.launch["n_tile"] == 512 and one.launch["n_tile"] == 128
    assert k.launch_config(1000)["grid"] == (2, 2, 1) and one.launch_config(1000)["grid"] == (2, 8, 1)
    assert k.launch["shared_bytes"] == one.launch["shared_bytes"]
    assert "Config<__half, 64, 128, 32, 4, 1, 4, false, true, 64, 0, 0, 4>" in k.source
    space = fam.search_space(mat, FP16, {"v": 64}, HOPPER)
    assert {c.get("tn", 1) for c in space} == {1, 2, 4}
    assert not [c for c in fam.search_space(mat, FP16, {"v": 64}, AMPERE) if "tn" in c]


@pytest.mark.parametrize("chunks", [[3] * 12, [20, 16, 14, 12, 10, 9, 8, 7, 6, 5, 4, 3, 0], [8, 1, 1, 0],
                                    [0, 0], [], [5], [2, 9, 30, 1]])
@pytest.mark.parametrize("tn", [1, 2, 4])
def test_tile_spans(chunks, tn):
    """Even groups stream tn tiles per CTA; a longer group takes fewer
    (powers of two dividing tn), never more per CTA than tn x the mean group
    or the longest group once, and never more than a shorter group."""
    c = np.array(chunks, dtype=np.int64)
    span = plan_mod.tile_spans(c, tn)
    assert span.shape == c.shape and np.all(tn % span == 0) and np.all(span & (span - 1) == 0)
    if c.size == 0:
        return
    assert np.all(span * c <= max(tn * c.mean(), c.max()))
    o = np.argsort(c, kind="stable")
    assert np.all(np.diff(span[o]) <= 0)
    if np.all(c == c[0]):
        assert np.all(span == tn)
    # halving is only where needed: doubling any span would break the bound
    assert np.all((span == tn) | (2 * span * c > max(tn * c.mean(), c.max())))


def test_streamed_tile_spans_plan(rng):
    """tn with uneven groups: a group of span < tn has tn / span slots, at
    tiles 0, span, 2 span, ... of its CTA's block of N; the slots run most
    work first, and the plan packs each chunk once."""
    mat = _gpu_matrix("skew", (330, 500), {"br": 64, "bc": 32}, "fp16", rng)
    fam = get_family("bsr")
    params = {"br": 64, "bc": 32}
    cfg = dict(WG_CFG, bn=128, wn=1, tn=4)
    plan = fam.plan(mat, FP16, params, cfg)
    one = fam.plan(mat, FP16, params, dict(WG_CFG, bn=128, wn=1))
    chunks = -(-np.array([sp.size for sp in fam.grouping(mat, params).supports]) // plan.bk)
    span = plan_mod.tile_spans(chunks, 4)
    assert span.min() < 4 == span.max()
    code = plan.slots[:, 3] >> 16
    got_span, got_tile = 4 >> (code & 15), code >> 4
    group = plan.slots[:, 2] // 64
    for g in range(len(chunks)):
        mine = group == g
        assert np.all(got_span[mine] == span[g])
        np.testing.assert_array_equal(np.sort(got_tile[mine]), np.arange(0, 4, span[g]))
    work = got_span * plan.slots[:, 1]
    assert np.all(np.diff(work) <= 0)
    assert plan.num_slots == (4 // span).sum() and plan.total_chunks == one.total_chunks
    np.testing.assert_array_equal(plan.first_spans, got_tile == 0)
    np.testing.assert_array_equal(fam.unpack(plan).to_dense(), mat.to_dense())
    k = fam.render(plan, FP16, cfg)
    assert k.launch["grid"] == (plan.num_slots, 1, 1) and k.launch["n_tile"] == 512
    # the tail's cost classes: runs of equal span x chunks, in the kernel
    ends = plan_mod.cost_classes(plan, 4)
    assert ends[-1] == plan.num_slots and np.all(np.diff([0] + ends) > 0)
    for c0, c1 in zip([0] + ends[:-1], ends):
        assert len(set(work[c0:c1])) == 1
    assert "constexpr int ends[CLASSES] = {" + ", ".join(map(str, ends)) + "};" in k.source


def test_cost_classes_merge_the_shortest_past_the_limit(rng):
    """bsr groups of 0 to 40 chunks: more distinct costs than classes, so
    the first classes are runs of one cost and the last takes the rest."""
    dense = np.zeros((64 * 40, 64 * 40), np.float32)
    for g in range(40):
        dense[64 * g:64 * (g + 1), :64 * g] = 1.0
    mat = SparseMatrix.from_dense(dense)
    fam = get_family("bsr")
    plan = fam.plan(mat, FP16, {"br": 64, "bc": 64}, dict(WG_CFG, bk=64, bn=128, wn=1))
    ends = plan_mod.cost_classes(plan)
    assert len(ends) == plan_mod.MAX_COST_CLASSES and ends[-1] == plan.num_slots == 40
    assert ends[:-1] == list(range(1, plan_mod.MAX_COST_CLASSES))
    assert plan_mod.cost_classes(fam.plan(SparseMatrix.from_dense(np.zeros((64, 64), np.float32)),
                                          FP16, {"br": 64, "bc": 64}, dict(WG_CFG, bn=128, wn=1))) \
        in ([0], [1])


@pytest.mark.parametrize("change,constraint", [
    ({"wm": 4}, r"bm % \(16 \* wm\) == 0: BM is a multiple of 16 x WM"),
    ({"bn": 48}, "BN of the mma.sync path"),
    ({"bk": 128}, "BK of the mma.sync path"),
    ({"stages": 5}, "pipeline depth of the mma.sync paths"),
    ({"wn": 8}, r"bn % \(16 \* wn\) == 0: BN is a multiple of 16 x WN"),
    ({"wm": 1, "wn": 1, "bn": 256}, "at most 128 fp32 accumulators"),
    ({"wm": 4, "wn": 4}, "at most 8 warps"),
    ({"wm": 1, "wn": 1, "bn": 64, "bk": 64}, "at most 8 16-byte loads per thread"),
])
def test_invalid_configs_name_their_constraint(rng, change, constraint):
    mat = make_shflbw(64, 64, 32, 0.5, rng)
    fam = get_family("shflbw")
    cfg = dict(CFG, **change)
    with pytest.raises(ConfigError, match=constraint):
        fam.check_config(cfg, mat, FP16, {"v": 32})


@pytest.mark.parametrize("change,constraint", [
    ({"ks": 3}, r"K split over 2 or 4 CTAs of a cluster"),
    ({"ks": 1}, "ks: omit the key for one CTA per group"),
    ({"bn": 64}, r"ks == 1 or bn <= 32: split K serves decode"),
    ({"wg": 1}, "keys"),          # split K is the mma.sync path's
    ({"xr": 4, "xu": 64}, "keys"),
])
def test_invalid_split_k_configs_name_their_constraint(rng, change, constraint):
    mat = make_shflbw(128, 256, 64, 0.5, rng)
    fam = get_family("shflbw")
    tm = Operation("fp16", "tm")
    fam.check_config(KS_CFG, mat, tm, {"v": 64}, HOPPER)
    with pytest.raises(ConfigError, match=constraint):
        fam.check_config(dict(KS_CFG, **change), mat, tm, {"v": 64}, HOPPER)
    with pytest.raises(ConfigError, match="split K runs on clusters: sm_90a"):
        fam.check_config(KS_CFG, mat, tm, {"v": 64}, AMPERE)


def test_split_k_kernel_grid_and_shared_memory(rng):
    """A cluster of ks CTAs along z per (group, tile of N); rank 0's
    receive buffer for the other ranks' partial tiles (ks - 1 of BM x BN
    fp32) and its barrier come on top of the pipeline."""
    mat = make_shflbw(128, 256, 64, 0.5, rng)
    fam = get_family("shflbw")
    tm = Operation("fp16", "tm")
    for cfg in (KS_CFG, dict(KS_CFG, bn=32, bk=16, stages=2, ks=4)):
        k = fam.generate(mat, tm, {"v": 64}, cfg)
        assert k.launch["grid"] == (2, 1, cfg["ks"]) and k.launch["n_axis"] == 1
        assert f"__cluster_dims__(1, 1, {cfg['ks']})" in k.source
        assert k.launch["shared_bytes"] >= (cfg["ks"] - 1) * 64 * cfg["bn"] * 4 + 16 + 64 * 8
    # bk 16, 2 stages, bn 32: the pipeline (2 x (64 x 16 + 16 x 32) halves), the
    # row map, 3 partial tiles and the barrier
    assert rowgroup.smem_bytes(64, dict(KS_CFG, bn=32, bk=16, stages=2, ks=4), "tm") == \
        2 * (64 * 16 + 16 * 32) * 2 + 64 * 8 + 3 * 64 * 32 * 4 + 16
    plain = fam.generate(mat, tm, {"v": 64}, {k_: v for k_, v in KS_CFG.items() if k_ != "ks"})
    assert plain.launch["grid"] == (2, 1, 1) and "__cluster_dims__" not in plain.source
    # in the token-major space on sm_90a, not elsewhere
    assert KS_CFG in fam.search_space(mat, tm, {"v": 64}, HOPPER)
    assert not [c for c in fam.search_space(mat, tm, {"v": 64}, AMPERE) if c.get("ks")]
    # the token-major hints lead with split K on sm_90a alone, taking turns with the prefill tiles
    hints = fam.hint_configs(mat, tm, {"v": 64}, HOPPER)
    assert hints[0] == KS_CFG and hints[2].get("ks") == 4 and "ks" not in hints[1]
    for device in (AMPERE, None):
        assert not [c for c in fam.hint_configs(mat, tm, {"v": 64}, device) if c.get("ks")]
    # N known: decode's tiles first for a few tokens, prefill's (wgmma) first for many
    dec = fam.hint_configs(mat, tm, {"v": 64}, HOPPER, n=16)
    pre = fam.hint_configs(mat, tm, {"v": 64}, HOPPER, n=4096)
    assert dec[0] == KS_CFG and all(c["bn"] <= 32 for c in dec[:6])
    assert pre[0].get("wg") and all(c["bn"] >= 128 for c in pre[:len(pre) - 6])
    assert sorted(map(repr, dec)) == sorted(map(repr, pre)) == sorted(map(repr, hints))
    assert fam.hint_configs(mat, tm, {"v": 64}, HOPPER, n=128) == hints   # between: in turn
    # feature-major on sm_90a (whole warpgroups): the split-K decode tiles first at 16
    # tokens, in the space; wgmma's first for many tokens or N unknown (the default)
    fm_space = fam.search_space(mat, FP16, {"v": 64}, HOPPER)
    fm_dec = fam.hint_configs(mat, FP16, {"v": 64}, HOPPER, n=16)
    assert fm_dec[0] == dict(KS_CFG, wm=2, ks=4) and all(h in fm_space for h in fm_dec)
    for n in (None, 4096):
        assert fam.hint_configs(mat, FP16, {"v": 64}, HOPPER, n=n)[0].get("wg")


def test_by_regime_orders_hints_by_n():
    from sparseforge.generator.family import DECODE_MAX_N, PREFILL_MIN_N, by_regime
    d, p = ["d1", "d2", "d3"], ["p1"]
    assert by_regime(d, p, 1) == by_regime(d, p, DECODE_MAX_N) == ["d1", "d2", "d3", "p1"]
    assert by_regime(d, p, PREFILL_MIN_N) == ["p1", "d1", "d2", "d3"]
    assert by_regime(d, p, None) == by_regime(d, p, DECODE_MAX_N + 1) == ["d1", "p1", "d2", "d3"]
    assert by_regime([], p, 16) == p and by_regime(d, [], 4096) == d
    from sparseforge.generator.family import by_tile_n
    hints = [{"bn": 256}, {"bn": 16}, {"bn": 64}, {"bn": 128}]
    assert by_tile_n(hints, None) == hints
    assert by_tile_n(hints, 16) == [{"bn": 16}, {"bn": 64}, {"bn": 256}, {"bn": 128}]
    assert by_tile_n(hints, 4096) == [{"bn": 256}, {"bn": 128}, {"bn": 16}, {"bn": 64}]


def test_config_shared_memory_dtype_layout_and_keys(rng):
    mat = make_shflbw(128, 64, 128, 0.5, rng)
    fam = get_family("shflbw")
    big = {"bk": 64, "bn": 256, "stages": 4, "wm": 4, "wn": 2}
    fam.check_config(big, mat, FP16, {"v": 128})                 # fits in 227 KB
    with pytest.raises(ConfigError, match="shared memory"):
        fam.check_config(big, mat, FP16, {"v": 128}, {"smem_per_block_optin": 100000})
    with pytest.raises(ConfigError, match="shared memory"):
        fam.check_config(big, mat, FP16, {"v": 128}, {"cc_major": 8, "cc_minor": 0})
    with pytest.raises(ConfigError, match="dtype"):
        fam.check_config(CFG, mat, Operation("fp32", "fm"), {"v": 128})
    fam.check_config(CFG, mat, Operation("fp16", "tm"), {"v": 128})   # token-major too
    with pytest.raises(ConfigError, match="keys"):
        fam.check_config({"bn": 64}, mat, FP16, {"v": 128})


def test_wgmma_kernel_shape_and_shared_memory(rng):
    mat = make_bsr(96, 64, 32, 32, 0.5, rng)
    fam = get_family("bsr")
    cfg = dict(WG_CFG, bn=128, wn=1)
    k = fam.generate(mat, FP16, {"br": 32, "bc": 32}, cfg)
    assert k.name == "sf_bsr32x32_fp16_fm_plain_bk32_bn128_stages4_wg1_wm4_wn1"
    assert k.launch["block"] == (128, 1, 1) and k.config == cfg and k.launch["n_tile"] == 128
    # a 64-row tile over 32-row groups, 1 KB for alignment
    assert k.launch["shared_bytes"] == rowgroup.smem_bytes(32, cfg) == 4 * (64 * 32 * 2 + 32 * 128 * 2) + 64 * 8 + 1024
    assert "Config<__half, 64, 128, 32, 4, 1, 4, false, true, 32, 0, 0>" in k.source
    assert "compile it for sm_90a" in k.source


def test_kernel_name_is_the_configuration(rng):
    mat = make_bsr(96, 64, 32, 32, 0.5, rng)
    fam = get_family("bsr")
    op = Operation("bf16", "fm", Epilogue(bias=True, activation="gelu"))
    k = fam.generate(mat, op, {"br": 32, "bc": 32}, CFG, bias=np.ones(96, np.float32))
    assert k.name == "sf_bsr32x32_bf16_fm_bias_gelu_bk32_bn64_stages3_wm1_wn2"
    assert k.launch["block"] == (64, 1, 1) and k.launch["n_axis"] == 1 and k.launch["n_tile"] == 64
    assert k.launch["grid"] == (3, 1, 1) and k.launch_config(130)["grid"] == (3, 3, 1)  # groups fastest
    assert k.launch_config(65535 * 64)["grid"][1] == 65535
    with pytest.raises(ValueError, match="65536 blocks along grid axis 1"):
        k.launch_config(65535 * 64 + 1)
    assert k.launch["shared_bytes"] == rowgroup.smem_bytes(32, CFG)
    assert f"{k.name}(" in k.source and '#include "sf/' not in k.source


# ---- NVRTC compilation (no GPU needed) -------------------------------------------------

COMPILE_CASES = [
    ("bsr", {"br": 64, "bc": 64}, "fp16", Epilogue(), {"bk": 32, "bn": 128, "stages": 3, "wm": 2, "wn": 2}),
    ("bsr", {"br": 32, "bc": 32}, "bf16", Epilogue(bias=True, activation="gelu", scale=0.5),
     {"bk": 64, "bn": 256, "stages": 4, "wm": 2, "wn": 4}),
    ("bsr", {"br": 8, "bc": 8}, "fp16", Epilogue(activation="relu"), {"bk": 16, "bn": 16, "stages": 2, "wm": 1, "wn": 1}),
    ("shflbw", {"v": 64}, "fp16", Epilogue(bias=True, activation="relu"), {"bk": 32, "bn": 128, "stages": 4, "wm": 2, "wn": 2}),
    ("shflbw", {"v": 128}, "bf16", Epilogue(), {"bk": 64, "bn": 64, "stages": 3, "wm": 4, "wn": 2}),
    ("shflbw", {"v": 32}, "fp16", Epilogue(bias=True), {"bk": 16, "bn": 32, "stages": 2, "wm": 1, "wn": 2}),
    ("bsr-tm", {"br": 32, "bc": 32}, "fp16", Epilogue(bias=True, activation="relu"),
     {"bk": 32, "bn": 128, "stages": 4, "wm": 1, "wn": 4}),
    ("bsr-tm", {"br": 64, "bc": 16}, "bf16", Epilogue(activation="gelu"),
     {"bk": 64, "bn": 64, "stages": 3, "wm": 2, "wn": 2}),
    ("shflbw-tm", {"v": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     {"bk": 32, "bn": 128, "stages": 4, "wm": 2, "wn": 2}),
    ("shflbw-tm", {"v": 32}, "bf16", Epilogue(),
     {"bk": 32, "bn": 256, "stages": 4, "wm": 1, "wn": 4}),
    ("shflbw-tm", {"v": 128}, "fp16", Epilogue(bias=True),
     {"bk": 64, "bn": 128, "stages": 4, "wm": 4, "wn": 2}),
]


WG_COMPILE_CASES = [
    ("shflbw", {"v": 64}, "fp16", Epilogue(bias=True, activation="gelu"), WG_CFG),
    ("bsr", {"br": 64, "bc": 64}, "bf16", Epilogue(), dict(WG_CFG, bk=64, bn=128, wn=1, stages=3)),
    ("shflbw", {"v": 128}, "fp16", Epilogue(activation="relu"), dict(WG_CFG, bk=16, bn=256, wm=8, wn=2)),
    ("bsr", {"br": 32, "bc": 32}, "bf16", Epilogue(bias=True), dict(WG_CFG, bn=64, wn=1)),
    # streamed tiles of N
    ("shflbw", {"v": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=256, wn=1, stages=5, tn=2)),
    ("bsr", {"br": 64, "bc": 64}, "bf16", Epilogue(activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1, stages=3, tn=4)),
    ("shflbw", {"v": 128}, "fp16", Epilogue(bias=True), dict(WG_CFG, bk=64, bn=128, wm=8, wn=1, tn=2)),
]
COMPILE_CASES += [(f, p, d, e, c) for f, p, d, e, c in WG_COMPILE_CASES]
XS_COMPILE_CASES = [
    ("shflbw", {"v": 32}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(XS_CFG, bk=32, bn=128, xr=8, wm=8, wn=1, xu=192)),
    ("bsr", {"br": 32, "bc": 32}, "bf16", Epilogue(), dict(XS_CFG, bn=256, wn=4, stages=4)),
    ("shflbw", {"v": 16}, "fp16", Epilogue(activation="relu"), dict(XS_CFG, bn=128, wn=1, xr=16, wm=16, xu=128)),
    ("shflbw", {"v": 64}, "bf16", Epilogue(), dict(XS_CFG, bn=64, wn=1)),
    ("bsr", {"br": 16, "bc": 16}, "fp16", Epilogue(bias=True), dict(XS_CFG, bn=64, wn=1, stages=2)),
]
COMPILE_CASES += XS_COMPILE_CASES
# the shared gather, token-major: the union tile filled by element loads
XS_TM_COMPILE_CASES = [
    ("shflbw-tm", {"v": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(XS_CFG, bk=32, bn=128, xr=4, wm=4, wn=2, xu=96)),
    ("shflbw-tm", {"v": 16}, "bf16", Epilogue(), dict(XS_CFG, bn=64, wn=1, xr=16, wm=16, xu=128)),
    ("bsr-tm", {"br": 32, "bc": 32}, "fp16", Epilogue(bias=True),
     dict(XS_CFG, bk=32, bn=128, wn=2, xr=4, wm=4, xu=128, stages=3)),
    ("shflbw-tm", {"v": 64}, "fp16", Epilogue(), dict(XS_CFG, bk=32, bn=64, xr=4, wm=4, wn=1, xu=64)),
]
COMPILE_CASES += XS_TM_COMPILE_CASES
# split K over clusters (sm_90a): decode tiles, both layouts, epilogues
KS_CFG = {"bk": 64, "bn": 16, "stages": 4, "wm": 4, "wn": 1, "ks": 2}
KS_COMPILE_CASES = [
    ("shflbw-tm", {"v": 64}, "fp16", Epilogue(), KS_CFG),
    ("shflbw-tm", {"v": 64}, "bf16", Epilogue(bias=True, activation="gelu"),
     dict(KS_CFG, bn=32, stages=3, wm=2, wn=2, ks=4)),
    ("bsr", {"br": 32, "bc": 32}, "fp16", Epilogue(bias=True, activation="relu"),
     dict(KS_CFG, bk=32, bn=32, wm=2, wn=2, ks=4)),
]
COMPILE_CASES += KS_COMPILE_CASES
# wgmma, token-major (sm_90a): B is the K-major BN x BK tile, 16-byte runs or element gathers
WG_TM_COMPILE_CASES = [
    ("bsr-tm", {"br": 64, "bc": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1)),
    ("bsr-tm", {"br": 32, "bc": 32}, "bf16", Epilogue(), dict(WG_CFG, bn=256, wn=2, stages=5)),
    ("shflbw-tm", {"v": 64}, "fp16", Epilogue(bias=True), dict(WG_CFG, bk=16, bn=128, wn=1)),
    ("shflbw-tm", {"v": 128}, "bf16", Epilogue(activation="relu"), dict(WG_CFG, bn=128, wm=8, wn=1)),
    # streamed tiles of N
    ("bsr-tm", {"br": 64, "bc": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, tn=4)),
    ("shflbw-tm", {"v": 64}, "bf16", Epilogue(), dict(WG_CFG, bn=256, wn=2, stages=5, tn=2)),
]
COMPILE_CASES += WG_TM_COMPILE_CASES
# TMA-fed wgmma, token-major (sm_90a): bsr blocks a multiple of BK wide, one box of X a chunk
TMA_COMPILE_CASES = [
    ("bsr-tm", {"br": 64, "bc": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1, stages=4, tma=1)),
    ("bsr-tm", {"br": 64, "bc": 64}, "bf16", Epilogue(), dict(WG_CFG, bk=32, bn=256, wn=2, stages=5,
                                                            tma=1)),
    ("bsr-tm", {"br": 32, "bc": 32}, "fp16", Epilogue(activation="relu"),
     dict(WG_CFG, bk=16, bn=64, wn=1, stages=6, tma=1)),
    ("bsr-tm", {"br": 128, "bc": 64}, "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=256, wm=8, wn=1, stages=3, tma=1)),
    ("bsr-tm", {"br": 64, "bc": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1, stages=4, tma=1, tn=4)),
    ("bsr-tm", {"br": 64, "bc": 64}, "bf16", Epilogue(), dict(WG_CFG, bk=32, bn=256, wn=2, stages=4,
                                                            tma=1, tn=2)),
    # persistent CTAs
    ("bsr-tm", {"br": 64, "bc": 64}, "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=32, bn=128, wn=1, stages=6, tma=1, pc=264)),
    ("bsr-tm", {"br": 32, "bc": 32}, "fp16", Epilogue(activation="relu"),
     dict(WG_CFG, bk=16, bn=64, wn=1, stages=4, tma=1, pc=132)),
    ("bsr-tm", {"br": 128, "bc": 64}, "bf16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=128, wm=8, wn=1, stages=3, tma=1, pc=132)),
]
COMPILE_CASES += TMA_COMPILE_CASES


@pytest.mark.parametrize("case", range(len(COMPILE_CASES)))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_template_compiles(arch, case, nvrtc):
    family, params, dtype, ep, cfg = COMPILE_CASES[case]
    family, layout = (family.split("-") + ["fm"])[:2]
    rng = np.random.default_rng(case)
    mat = (make_bsr(150, 256, params["br"], params["bc"], 0.3, rng, dtype)
           if layout == "tm" and family == "bsr" else make_random(150, 97, 0.2, rng, dtype=dtype))
    fam = get_family(family)
    op = Operation(dtype, layout, ep)
    bias = rng.standard_normal(150).astype(np.float32) if ep.bias else None
    k = fam.generate(mat, op, params, cfg, bias=bias)
    if cfg.get("wg") and arch != "sm_90a":
        from sparseforge.native import CompileError
        with pytest.raises(CompileError, match="compile it for sm_90a"):
            nvrtc(k.source, arch, "rowgroup.cu")
        return
    if cfg.get("ks") and arch != "sm_90a":
        from sparseforge.native import CompileError
        with pytest.raises(CompileError, match="__cluster_dims__"):
            nvrtc(k.source, arch, "rowgroup.cu")
        return
    log = nvrtc(k.source, arch, "rowgroup.cu", options=("--ptxas-options=-v",)).log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills, log
    assert all(s == ("0", "0") for s in spills), log
    assert "warning" not in log.lower(), log


# ---- GPU ---------------------------------------------------------------------------------

GPU_CASES = [
    # (family, params, matrix maker, shape (M, K), dtype, epilogue, config, N values)
    # odd patterns the parser accepts: blocks of 3 x 5 (a group is 6 block-rows,
    # 18 rows in a 32-row tile) and groups of V = 3 (a 16-row tile, 13 rows padding)
    ("bsr", {"br": 3, "bc": 5}, "bsr", (99, 100), "fp16", Epilogue(bias=True, activation="gelu"),
     {"bk": 16, "bn": 64, "stages": 3, "wm": 1, "wn": 2}, (1, 70)),
    ("bsr-tm", {"br": 3, "bc": 5}, "bsr", (99, 100), "bf16", Epilogue(),
     {"bk": 16, "bn": 32, "stages": 2, "wm": 1, "wn": 1}, (3, 40)),
    ("shflbw", {"v": 3}, "shflbw", (61, 48), "fp16", Epilogue(bias=True),
     {"bk": 16, "bn": 32, "stages": 2, "wm": 1, "wn": 1}, (1, 45)),
    ("bsr", {"br": 64, "bc": 64}, "bsr", (300, 260), "fp16", Epilogue(),
     {"bk": 32, "bn": 128, "stages": 3, "wm": 2, "wn": 2}, (1, 77, 256)),
    ("bsr", {"br": 32, "bc": 32}, "bsr", (200, 333), "bf16", Epilogue(bias=True, activation="gelu", scale=0.5),
     {"bk": 64, "bn": 64, "stages": 4, "wm": 1, "wn": 2}, (8, 130)),
    ("bsr", {"br": 16, "bc": 8}, "bsr", (77, 91), "fp16", Epilogue(bias=True, activation="relu"),
     {"bk": 16, "bn": 32, "stages": 2, "wm": 1, "wn": 1}, (1, 33, 64)),
    ("shflbw", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="relu"),
     {"bk": 32, "bn": 128, "stages": 4, "wm": 2, "wn": 2}, (1, 100, 4096)),
    ("shflbw", {"v": 32}, "shflbw", (100, 500), "bf16", Epilogue(),
     {"bk": 16, "bn": 256, "stages": 3, "wm": 2, "wn": 4}, (5, 264)),
    ("shflbw", {"v": 128}, "random", (260, 150), "fp16", Epilogue(bias=True),
     {"bk": 64, "bn": 64, "stages": 2, "wm": 4, "wn": 2}, (16, 63)),
    ("shflbw", {"v": 16}, "zero", (50, 40), "fp16", Epilogue(bias=True, activation="gelu"),
     {"bk": 32, "bn": 16, "stages": 3, "wm": 1, "wn": 1}, (1, 24)),
    # token-major bsr: 16-byte runs (bc % 8 == 0, K % 8 == 0), M % 8 == 0 stores
    ("bsr-tm", {"br": 32, "bc": 32}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="relu"),
     {"bk": 32, "bn": 128, "stages": 4, "wm": 1, "wn": 4}, (1, 77, 1024)),
    # token-major shflbw: element gathers held in registers across a stage,
    # permuted element stores; groups cut at the edges, N past a tile
    ("shflbw-tm", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="gelu"),
     {"bk": 32, "bn": 128, "stages": 4, "wm": 2, "wn": 2}, (1, 100, 1024)),
    ("shflbw-tm", {"v": 32}, "shflbw", (100, 500), "bf16", Epilogue(),
     {"bk": 16, "bn": 64, "stages": 2, "wm": 1, "wn": 2}, (5, 264)),
    ("shflbw-tm", {"v": 16}, "zero", (50, 40), "fp16", Epilogue(bias=True),
     {"bk": 32, "bn": 32, "stages": 3, "wm": 1, "wn": 1}, (1, 24)),
    ("shflbw-tm", {"v": 128}, "random", (260, 150), "fp16", Epilogue(bias=True, activation="relu"),
     {"bk": 64, "bn": 128, "stages": 4, "wm": 4, "wn": 2}, (16, 63, 300)),
    # token-major shared gather: union tiles with empty slots, short last
    # sets, odd N and M, permuted and plain rows
    ("shflbw-tm", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(XS_CFG, bk=32, bn=128, xr=4, wm=4, wn=2, xu=96), (1, 100, 1024)),
    ("shflbw-tm", {"v": 16}, "shflbw", (200, 300), "bf16", Epilogue(),
     dict(XS_CFG, bn=64, wn=1, xr=16, wm=16, xu=128), (5, 77)),
    ("bsr-tm", {"br": 32, "bc": 32}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="relu"),
     dict(XS_CFG, bk=32, bn=128, wn=2, xr=4, wm=4, xu=128, stages=3), (3, 300)),
    ("shflbw-tm", {"v": 64}, "random", (260, 150), "fp16", Epilogue(bias=True),
     dict(XS_CFG, bk=32, bn=64, xr=4, wm=4, wn=1, xu=64), (16, 63)),
    # token-major, element gathers (K % 8 != 0) and element stores (M % 8 != 0)
    ("bsr-tm", {"br": 16, "bc": 8}, "bsr", (77, 91), "bf16", Epilogue(bias=True, activation="gelu"),
     {"bk": 16, "bn": 32, "stages": 2, "wm": 1, "wn": 1}, (1, 33)),
    ("bsr-tm", {"br": 64, "bc": 16}, "bsr", (200, 160), "fp16", Epilogue(),
     {"bk": 64, "bn": 64, "stages": 3, "wm": 2, "wn": 2}, (5, 130)),
    ("bsr-tm", {"br": 32, "bc": 32}, "zero", (64, 64), "fp16", Epilogue(bias=True),
     {"bk": 32, "bn": 64, "stages": 2, "wm": 1, "wn": 2}, (3,)),
    # wgmma (sm_90a): odd N (element gathers and stores), padded tiles, 2 warpgroups along M
    ("shflbw", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG), (1, 100, 512)),
    ("bsr", {"br": 64, "bc": 64}, "bsr", (300, 260), "bf16", Epilogue(),
     dict(WG_CFG, bk=64, bn=512, stages=3), (77, 1024)),
    ("shflbw", {"v": 32}, "shflbw", (100, 500), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=16, bn=64, wn=1, stages=3), (5, 264)),
    ("shflbw", {"v": 128}, "random", (260, 150), "bf16", Epilogue(activation="relu"),
     dict(WG_CFG, bn=128, wm=8, wn=1), (16, 63)),
    ("bsr", {"br": 16, "bc": 8}, "zero", (50, 40), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bn=64, wn=1), (1, 24)),
    ("bsr", {"br": 64, "bc": 32}, "bsr", (260, 700), "fp16", Epilogue(activation="gelu"),
     dict(WG_CFG, bk=16, bn=128, wn=1, stages=6), (40, 300)),
    ("shflbw", {"v": 64}, "shflbw", (200, 600), "bf16", Epilogue(bias=True),
     dict(WG_CFG, bn=256, wn=2, stages=5), (256,)),
    # streamed tiles: N cut short inside a CTA's tiles, odd N, groups of one
    # chunk (fewer than the copies in flight), empty groups, 2 warpgroups along M
    ("shflbw", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, stages=4, tn=2), (1, 100, 300, 512, 1000)),
    ("bsr", {"br": 64, "bc": 32}, "bsr", (260, 700), "bf16", Epilogue(activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, stages=6, tn=4), (40, 300, 1024)),
    ("bsr", {"br": 64, "bc": 16}, "bsr", (200, 40), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=64, wn=1, stages=5, tn=4), (63, 256, 777)),
    ("bsr", {"br": 16, "bc": 8}, "zero", (50, 40), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=64, wn=1, tn=2), (1, 200)),
    ("shflbw", {"v": 128}, "random", (260, 150), "bf16", Epilogue(activation="relu"),
     dict(WG_CFG, bk=64, bn=128, wm=8, wn=1, stages=3, tn=2), (16, 63, 600)),
    # streamed tiles, a long group among short ones: its CTAs take 1 or 2
    # tiles, the others 4; N ending before a span's first tile, inside one
    ("bsr", {"br": 64, "bc": 32}, "skew", (330, 500), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, stages=4, tn=4), (1, 100, 300, 1000)),
    ("bsr", {"br": 64, "bc": 32}, "skew", (330, 500), "bf16", Epilogue(),
     dict(WG_CFG, bn=64, wn=1, stages=5, tn=2), (65, 4000)),
    # a scale: the bias is added in the epilogue, not started in the accumulators
    ("bsr", {"br": 64, "bc": 32}, "bsr", (260, 700), "fp16",
     Epilogue(bias=True, activation="gelu", scale=0.5), dict(WG_CFG, bn=128, wn=1, tn=2), (40, 300)),
    # more CTAs than fill the GPU once, so the last columns run longest slot
    # first and the ones before group-fast (tail_first)
    ("bsr", {"br": 64, "bc": 32}, "skew", (4096, 256), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bn=128, wn=1, stages=4), (2000, 2500)),
    ("bsr", {"br": 64, "bc": 32}, "skew", (4096, 256), "bf16", Epilogue(),
     dict(WG_CFG, bn=64, wn=1, stages=4, tn=2), (1800, 4100)),
    ("bsr", {"br": 32, "bc": 32}, "bsr", (4096, 128), "fp16", Epilogue(activation="gelu"),
     {"bk": 32, "bn": 64, "stages": 3, "wm": 1, "wn": 2}, (1000, 1999)),
    # shared gather: odd N, short last sets, empty groups, every stage count
    ("shflbw", {"v": 32}, "shflbw", (300, 257), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(XS_CFG, bk=32, bn=128, xr=8, wm=8, wn=1, xu=192), (1, 100, 512)),
    ("bsr", {"br": 32, "bc": 32}, "bsr", (203, 317), "bf16", Epilogue(),
     dict(XS_CFG, bn=256, wn=4, stages=4), (77, 1024)),
    ("shflbw", {"v": 16}, "random", (260, 150), "fp16", Epilogue(activation="relu"),
     dict(XS_CFG, bn=128, wn=1, xr=16, wm=16, xu=128), (16, 63)),
    ("shflbw", {"v": 64}, "shflbw", (330, 270), "bf16", Epilogue(bias=True),
     dict(XS_CFG, bn=64, wn=1), (1, 100, 4096)),
    ("bsr", {"br": 16, "bc": 8}, "bsr", (150, 200), "fp16", Epilogue(bias=True),
     dict(XS_CFG, bn=64, wn=1, stages=2), (1, 24, 300)),
    ("bsr", {"br": 64, "bc": 64}, "zero", (64, 64), "fp16", Epilogue(bias=True),
     dict(XS_CFG, bn=64, wn=1), (3,)),
    # split K over clusters (sm_90a): token-major and feature-major, odd N,
    # groups of fewer chunks than CTAs (K = 100: two chunks of 64 over 4),
    # empty groups, epilogues after the sum, odd group rows (24: rows past
    # a group's end)
    ("shflbw-tm", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="gelu"),
     KS_CFG, (1, 16, 37)),
    ("shflbw-tm", {"v": 64}, "shflbw", (300, 1000), "bf16", Epilogue(),
     dict(KS_CFG, bn=32, stages=3, wm=2, wn=2, ks=4), (5, 64, 100)),
    ("shflbw-tm", {"v": 64}, "shflbw", (200, 100), "fp16", Epilogue(bias=True),
     dict(KS_CFG, ks=4), (16, 33)),
    ("bsr-tm", {"br": 32, "bc": 32}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="relu"),
     dict(KS_CFG, bk=32, bn=32, wm=2, wn=2, ks=4), (1, 77)),
    ("shflbw", {"v": 24}, "shflbw", (150, 700), "bf16", Epilogue(bias=True, activation="gelu", scale=0.5),
     dict(KS_CFG, bk=32, bn=16, stages=3, wm=2, wn=1), (3, 16, 40)),
    ("bsr", {"br": 64, "bc": 64}, "zero", (64, 64), "fp16", Epilogue(bias=True),
     dict(KS_CFG, ks=4), (16,)),
    # wgmma, token-major (sm_90a): 16-byte runs of X and of Y (bsr, K and M
    # % 8 == 0), element gathers (K % 8 != 0, shflbw), permuted element
    # stores, padded tiles (32-row groups), 2 warpgroups along M or N, odd N,
    # empty groups, every BK, more CTAs than fill the GPU once
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1), (1, 77, 1024)),
    ("bsr-tm", {"br": 32, "bc": 32}, "bsr", (200, 512), "bf16", Epilogue(),
     dict(WG_CFG, bn=256, wn=2, stages=5), (5, 300)),
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (300, 260), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=16, bn=64, wn=1, stages=3), (16, 130)),
    ("shflbw-tm", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True, activation="relu"),
     dict(WG_CFG, bn=128, wn=1), (1, 100, 1024)),
    ("shflbw-tm", {"v": 128}, "random", (260, 150), "bf16", Epilogue(activation="gelu", scale=0.5),
     dict(WG_CFG, bn=128, wm=8, wn=1, stages=3), (16, 63)),
    ("bsr-tm", {"br": 16, "bc": 8}, "zero", (50, 40), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bn=64, wn=1), (1, 24)),
    ("bsr-tm", {"br": 64, "bc": 32}, "skew", (4096, 256), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bn=128, wn=1, stages=4), (2000,)),
    # ... streamed tiles: N cut short inside a CTA's tiles, spans of a long
    # group among short ones, element gathers (shflbw), groups of one chunk
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, tn=4), (1, 77, 300, 1024)),
    ("bsr-tm", {"br": 64, "bc": 32}, "skew", (330, 512), "bf16", Epilogue(),
     dict(WG_CFG, bn=64, wn=1, stages=5, tn=4), (65, 700)),
    ("shflbw-tm", {"v": 64}, "shflbw", (330, 270), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bn=256, wn=2, stages=5, tn=2), (1, 100, 1000)),
    ("bsr-tm", {"br": 16, "bc": 8}, "zero", (50, 40), "fp16", Epilogue(bias=True, activation="relu"),
     dict(WG_CFG, bn=64, wn=1, tn=2), (1, 200)),
    # TMA-fed wgmma, token-major (sm_90a): odd N (boxes past N), groups cut
    # at M (element stores), 32-row groups (zero A rows), 2 warpgroups
    # along M or N, every BK, empty groups, a group of 72 chunks (the
    # producer's columns reloaded past 32), more CTAs than fill the GPU once
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1, stages=4, tma=1), (1, 77, 1024)),
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (300, 512), "bf16", Epilogue(),
     dict(WG_CFG, bn=256, wn=2, stages=5, tma=1), (5, 300)),
    ("bsr-tm", {"br": 32, "bc": 32}, "bsr", (200, 320), "fp16", Epilogue(activation="relu", scale=0.5),
     dict(WG_CFG, bk=16, bn=64, wn=1, stages=6, tma=1), (16, 130)),
    ("bsr-tm", {"br": 128, "bc": 64}, "bsr", (256, 640), "bf16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=256, wm=8, wn=1, stages=3, tma=1), (40, 600)),
    ("bsr-tm", {"br": 64, "bc": 32}, "skew", (256, 2304), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, stages=3, tma=1), (33, 257)),
    ("bsr-tm", {"br": 64, "bc": 64}, "skew", (4096, 256), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=128, wn=1, stages=4, tma=1), (2000,)),
    ("bsr-tm", {"br": 64, "bc": 64}, "zero", (64, 64), "fp16", Epilogue(bias=True, activation="relu"),
     dict(WG_CFG, bk=64, bn=64, wn=1, stages=3, tma=1), (1, 70)),
    # ... streamed tiles: N cut short inside a CTA's tiles, spans of a long
    # group among short ones, groups of fewer chunks than stages, empty groups
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bk=64, bn=128, wn=1, stages=4, tma=1, tn=4), (1, 77, 300, 1024)),
    ("bsr-tm", {"br": 64, "bc": 32}, "skew", (330, 512), "bf16", Epilogue(),
     dict(WG_CFG, bn=64, wn=1, stages=5, tma=1, tn=4), (65, 700)),
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (300, 512), "fp16", Epilogue(activation="relu"),
     dict(WG_CFG, bn=256, wn=2, stages=4, tma=1, tn=2), (5, 300, 1000)),
    ("bsr-tm", {"br": 64, "bc": 64}, "zero", (64, 64), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=64, wn=1, stages=3, tma=1, tn=2), (1, 200)),
    # ... persistent CTAs: more CTAs than items, a few CTAs of many items
    # (rounds in both directions), a group of 72 chunks, odd M and N, 32-row
    # groups, 2 warpgroups along M, empty groups
    ("bsr-tm", {"br": 64, "bc": 64}, "bsr", (256, 512), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, stages=6, tma=1, pc=264), (1, 77, 1024, 4000)),
    ("bsr-tm", {"br": 64, "bc": 32}, "skew", (330, 512), "bf16", Epilogue(),
     dict(WG_CFG, bn=64, wn=1, stages=5, tma=1, pc=7), (65, 700)),
    ("bsr-tm", {"br": 64, "bc": 32}, "skew", (256, 2304), "fp16", Epilogue(bias=True, activation="gelu"),
     dict(WG_CFG, bn=128, wn=1, stages=3, tma=1, pc=5), (33, 257)),
    ("bsr-tm", {"br": 32, "bc": 32}, "bsr", (200, 320), "fp16", Epilogue(activation="relu", scale=0.5),
     dict(WG_CFG, bk=16, bn=64, wn=1, stages=6, tma=1, pc=3), (16, 130)),
    ("bsr-tm", {"br": 128, "bc": 64}, "bsr", (256, 640), "bf16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=128, wm=8, wn=1, stages=3, tma=1, pc=132), (40, 600)),
    ("bsr-tm", {"br": 64, "bc": 64}, "zero", (64, 64), "fp16", Epilogue(bias=True),
     dict(WG_CFG, bk=64, bn=64, wn=1, stages=3, tma=1, pc=2), (1, 200)),
]


def _gpu_matrix(kind, shape, params, dtype, rng):
    m, k = shape
    if kind == "bsr":
        return make_bsr(m, k, params["br"], params["bc"], 0.3, rng, dtype, empty_block_rows=(1,))
    if kind == "shflbw":
        return make_shflbw(m, k, params["v"], 0.25, rng, dtype, empty_groups=(0,))
    if kind == "random":
        return make_random(m, k, 0.1, rng, dtype)
    if kind == "skew":  # bsr: the first block-row dense, the rest sparse, one empty
        dense = make_bsr(m, k, params["br"], params["bc"], 0.1, rng, dtype,
                         empty_block_rows=(1,)).to_dense()
        dense[:params["br"]] = rng.standard_normal((params["br"], k))
        return SparseMatrix.from_dense(dense.astype(np.float32), dtype=dtype)
    return SparseMatrix.from_dense(np.zeros(shape, np.float32), dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_gpu_correct(case):
    from sparseforge.tuner.execute import default_context, verify
    family, params, kind, shape, dtype, ep, cfg, ns = GPU_CASES[case]
    if (cfg.get("wg") or cfg.get("ks")) and default_context().device_info()["arch"] != "sm_90a":
        pytest.skip("the wgmma path and split K need an sm_90a GPU (Hopper)")
    family, layout = (family.split("-") + ["fm"])[:2]
    rng = np.random.default_rng(100 + case)
    mat = _gpu_matrix(kind, shape, params, dtype, rng)
    op = Operation(dtype, layout, ep)
    for n in ns:
        res = verify(family, mat, op, params, cfg, n, seed=case * 7 + n)
        assert res["ok"], (n, res)


@pytest.mark.gpu
@pytest.mark.parametrize("family, params, layout, cfg, n", [
    ("shflbw", {"v": 64}, "tm", KS_CFG, 16),                         # decode, split K
    ("shflbw", {"v": 64}, "tm", dict(WG_CFG, bn=128, wn=1), 300),    # wgmma, element gather
    ("bsr", {"br": 64, "bc": 64}, "fm", dict(WG_CFG, bn=128, wn=1), 256),
    ("bsr", {"br": 64, "bc": 64}, "tm", dict(WG_CFG, bk=64, bn=128, wn=1, tma=1), 300),
    ("bsr", {"br": 64, "bc": 64}, "tm", dict(WG_CFG, bn=128, wn=1, stages=6, tma=1, pc=132), 300)])
def test_gpu_dependent_launches(family, params, layout, cfg, n):
    """On sm_90 the row-group kernels are launched as programmatic
    dependents of the stream's previous work (SF_DECLARE_PDL): three back
    to back on one stream, each reading the one before's output
    (tests/py/chain.py)."""
    from chain import check_dependent_chain
    from sparseforge.tuner.execute import default_context
    if default_context().device_info()["arch"] != "sm_90a":
        pytest.skip("programmatic dependent launch needs sm_90 (Hopper)")
    rng = np.random.default_rng(48)
    mat = (make_shflbw(512, 512, 64, 0.25, rng) if family == "shflbw"
           else make_bsr(512, 512, 64, 64, 0.3, rng))
    check_dependent_chain(get_family(family), mat, params, cfg, n, layout)


@pytest.mark.gpu
def test_gpu_small_every_bk_and_stage_count():
    """The 'small' set (for compute-sanitizer): one matrix per family, a
    sweep of pipeline shapes, odd N."""
    from sparseforge.tuner.execute import verify
    rng = np.random.default_rng(7)
    for family, params, mat in [
        ("bsr", {"br": 32, "bc": 16}, make_bsr(70, 150, 32, 16, 0.4, rng)),
        ("shflbw", {"v": 32}, make_shflbw(70, 150, 32, 0.3, rng)),
    ]:
        for bk in (16, 32, 64):
            for st in (2, 3, 4):
                cfg = {"bk": bk, "bn": 64, "stages": st, "wm": 2, "wn": 2}
                for n in (40, 67):
                    res = verify(family, mat, FP16, params, cfg, n, seed=bk + st + n)
                    assert res["ok"], (family, cfg, n, res)


def test_configurations_that_pack_alike_share_one_plan(rng):
    """The packing depends on BK (and streamed tiles, the shared gather's
    keys, the bias) alone: other configurations share one plan and its
    packed bytes object (the tuner's worker keeps one device copy of it)."""
    mat = make_bsr(128, 192, 32, 32, 0.5, rng)
    fam, params = get_family("bsr"), {"br": 32, "bc": 32}
    a = fam.plan(mat, FP16, params, CFG)
    assert fam.plan(mat, FP16, params, dict(CFG, bn=128, stages=4)).packed is a.packed
    assert fam.plan(mat, FP16, params, dict(CFG, bk=64)).packed is not a.packed
    op = Operation("fp16", "fm", Epilogue(bias=True))
    one = fam.plan(mat, op, params, CFG, bias=np.ones(128))
    two = fam.plan(mat, op, params, CFG, bias=np.full(128, 2.0))
    assert one.packed != two.packed
    assert fam.plan(mat, op, params, dict(CFG, bn=128), bias=np.ones(128)).packed is one.packed
