"""The csr family in fp16 and bf16 (tensor cores): the tiled-bitmap format
(pack, read back, the lanes' decode emulated against the mma fragment
layout), the schedule, the search space and its constraints, NVRTC
compiles for sm_80 and sm_90a (no spills; the tensor-core instructions in
the code); on a GPU, correctness over odd shapes, both layouts, both
dtypes, the epilogues and the DLMC subset."""
from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from sparseforge.generator.families import get_family
from sparseforge.generator.families.csr import bitmap, tc
from sparseforge.generator.kernel import ConfigError, Epilogue, Operation
from sparseforge.generator.matrix import SparseMatrix, round_to_dtype

FAM = get_family("csr")
H100 = {"smem_per_block_optin": 232448, "sm_count": 132, "cc_major": 9, "cc_minor": 0,
        "arch": "sm_90a"}
A100 = {"smem_per_block_optin": 166912, "sm_count": 108, "cc_major": 8, "cc_minor": 0,
        "arch": "sm_80"}
DECODE = dict(mf=1, wm=4, wk=2, ksw=2, bn=16, stages=4, ck=1)
PREFILL = dict(mf=2, wm=2, wk=1, ksw=2, bn=128, stages=3, ck=1)
WGCFG = dict(mf=1, wm=4, wk=1, ksw=2, bn=128, stages=4, ck=1, wg=1)
TMACFG = dict(WGCFG, wm=8, ksw=4, bn=256, tma=1)
SACFG = dict(TMACFG, sa=1)
LRCFG = dict(SACFG, lr=1)


def random_matrix(m, k, density, seed=0, dtype="fp16", empty_rows=(), empty_cols=()):
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((m, k)).astype(np.float32)
    d[rng.random((m, k)) >= density] = 0
    d[list(empty_rows)] = 0
    d[:, list(empty_cols)] = 0
    return SparseMatrix.from_dense(d, dtype=dtype)


def same(a: SparseMatrix, b: SparseMatrix, dtype):
    assert a.shape == b.shape and b.dtype == dtype
    np.testing.assert_array_equal(round_to_dtype(a.to_dense(), dtype).view(np.uint32),
                                  b.to_dense().view(np.uint32))


# ---- the format ---------------------------------------------------------------------------

def test_bit_positions_are_the_mma_fragment_layout():
    """bit 8 lane + 2 reg + half is a[reg] half `half` of lane: a0 (g, 2t),
    a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8) by the PTX ISA."""
    frow, fcol = bitmap.fragment_positions()
    bits = np.arange(256).reshape(32, 4, 2)
    r, c = bitmap.slot_position(bits)
    np.testing.assert_array_equal(r, frow)
    np.testing.assert_array_equal(c, fcol)
    assert sorted(zip(r.ravel(), c.ravel())) == [(i, j) for i in range(16) for j in range(16)]
    np.testing.assert_array_equal(bitmap.position_bit(r, c), bits)


SHAPES = [
    ("odd", lambda dt: random_matrix(37, 53, 0.3, seed=1, dtype=dt, empty_rows=(0, 5, 36))),
    ("one_row", lambda dt: random_matrix(1, 7, 0.9, seed=2, dtype=dt)),
    ("one_col", lambda dt: random_matrix(9, 1, 0.5, seed=3, dtype=dt)),
    ("dense", lambda dt: random_matrix(33, 40, 1.01, seed=4, dtype=dt)),
    ("zero", lambda dt: SparseMatrix.from_dense(np.zeros((13, 17), np.float32), dtype=dt)),
    ("sparse_cols", lambda dt: random_matrix(70, 300, 0.2, seed=5, dtype=dt,
                                             empty_cols=range(16, 200))),
    ("tall", lambda dt: random_matrix(300, 24, 0.05, seed=6, dtype=dt)),
]
BLOCKINGS = [(16, 1), (32, 2), (64, 4), (128, 8), (64, 3)]


@pytest.mark.parametrize("name,make", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_pack_read_back_and_emulated_product(name, make, dtype):
    mat = make(dtype)
    rng = np.random.default_rng(0)
    x = round_to_dtype(rng.standard_normal((mat.cols, 5)).astype(np.float32), dtype)
    ref = round_to_dtype(mat.to_dense(), dtype).astype(np.float64) @ x
    variants = ({}, {"lanes": True}, {"regvals": True})
    for (bm, ks), windows, var in itertools.product(BLOCKINGS, (False, True), variants):
        p = bitmap.pack(mat, dtype, bm, ks, windows=windows, **var)
        back, bias = bitmap.unpack(p.data)
        same(mat, back, dtype)
        assert bias is None
        assert all(v % 16 == 0 for v in p.offsets.values()) and len(p.data) % 16 == 0
        if mat.rows * mat.cols <= 4000:
            np.testing.assert_allclose(bitmap.emulate_product(p.data, x), ref, atol=1e-9)


def test_layout_counts_keys_as_numpy_unique_sorts_them():
    """The layout and the register keys find their distinct keys by
    marking a range (bitmap._unique_inverse), not by sorting: the same
    keys and inverse as np.unique, in both of its paths (a range far
    larger than the keys falls back to the sort), and the tile bits as
    position_bit's."""
    rng = np.random.default_rng(4)
    for size, n in ((1000, 5000), (10**7, 100), (50, 0), (1, 3)):
        key = rng.integers(0, size, n)
        u, inv = bitmap._unique_inverse(key, size)
        u0, inv0 = np.unique(key, return_inverse=True)
        np.testing.assert_array_equal(u, u0)
        np.testing.assert_array_equal(inv, inv0.reshape(-1))
    r, c = np.divmod(np.arange(256), 16)
    np.testing.assert_array_equal(bitmap._TILE_BIT, bitmap.position_bit(r, c))
    np.testing.assert_array_equal(bitmap.slot_position(bitmap._TILE_BIT), (r, c))


def test_layout_sizes_from_tile_counts_match_the_packed_stages():
    """A layout's sizes come from each 16 x 16 tile's counts
    (bitmap.tile_counts), the packed buffer from the nonzeros themselves:
    each stage's values (the bitmaps) and 16-bit register halves (the
    register variants) agree, on matrices with empty rows and columns,
    odd shapes and whole windows; every nonzero finds its entry."""
    for seed, (m, k, d) in enumerate(((37, 71, 0.3), (130, 200, 0.05), (64, 48, 0.9),
                                      (200, 33, 0.5))):
        mat = random_matrix(m, k, d, seed=seed, empty_rows=range(16, min(m, 40)),
                            empty_cols=range(32, 48) if k > 48 else ())
        for bm, ks, win in ((16, 1, False), (32, 3, False), (64, 4, True), (128, 2, True)):
            lay = bitmap.cached_layout(mat, bm, ks, win)
            plain = bitmap.sections(bitmap.pack(mat, "fp16", bm, ks, windows=win).data)
            regs = bitmap.sections(bitmap.pack(mat, "fp16", bm, ks, windows=win,
                                               regvals=True).data)
            np.testing.assert_array_equal(np.diff(plain.voff.astype(np.int64)), lay.stage_values)
            np.testing.assert_array_equal(np.diff(regs.voff.astype(np.int64)),
                                          2 * lay.stage_regs)
            ent = bitmap.nz_entry(mat, lay)
            assert ent.min() >= 0
            rows = np.repeat(np.arange(m), np.diff(mat.indptr))
            np.testing.assert_array_equal(lay.entry_block[ent], rows // bm)
            np.testing.assert_array_equal(lay.entry_kstep[ent], mat.indices // 16)


def test_fixed_offsets_pack_a_regular_schedule_at_one_stride():
    """Fixed offsets (bitmap.pack's `fixed`, config fx): every row block
    holds every k-step, so a kernel computes each block's stages, their
    k-steps and their values' offsets; each stage's values start at a
    multiple of one stride (the largest stage's, rounded to 8).  The
    buffer reads back to the matrix and the emulated product is W X; a
    matrix with a row block missing a k-step is refused, by the packer
    and by the configuration's check, and the space then offers no fx."""
    mat = random_matrix(100, 200, 0.3, seed=5)
    rng = np.random.default_rng(1)
    x = round_to_dtype(rng.standard_normal((200, 3)).astype(np.float32), "fp16")
    ref = round_to_dtype(mat.to_dense(), "fp16").astype(np.float64) @ x
    kt = -(-200 // 16)
    for var in ({}, {"regvals": True}):
        for bm, ks in ((32, 2), (64, 4), (16, 3)):
            p = bitmap.pack(mat, "fp16", bm, ks, fixed=True, **var)
            s = bitmap.sections(p.data)
            assert s.fixed_stride == p.fixed_stride == p.vmax and p.vmax % 8 == 0
            np.testing.assert_array_equal(s.voff, np.arange(s.voff.size) * p.vmax)
            # the kernel's arithmetic: blocks in row order, equal stages, k-steps in order
            nb, st = s.blocks.shape[0], int(s.blocks[0, 1])
            np.testing.assert_array_equal(
                s.blocks[:, :3], np.stack([np.arange(nb) * st, np.full(nb, st),
                                           np.arange(nb) * bm], axis=1))
            np.testing.assert_array_equal(s.kid.reshape(nb, st * ks),
                                          np.minimum(np.arange(st * ks), kt - 1)[None].repeat(nb, 0))
            same(mat, bitmap.unpack(p.data)[0], "fp16")
            np.testing.assert_allclose(bitmap.emulate_product(p.data, x), ref, atol=1e-9)
            plain = bitmap.pack(mat, "fp16", bm, ks, **var)
            assert p.vmax >= plain.vmax and len(p.data) >= len(plain.data)
    holed = random_matrix(100, 200, 0.3, seed=5, empty_cols=range(16, 32))
    with pytest.raises(ValueError, match="regular"):
        bitmap.pack(holed, "fp16", 32, 2, fixed=True)
    op = Operation("fp16", "tm")
    fx = dict(DECODE, wm=2, wk=4, ksw=4, fx=1)
    FAM.check_config(fx, mat, op, {}, H100)
    with pytest.raises(ConfigError, match="regular"):
        FAM.check_config(fx, holed, op, {}, H100)
    with pytest.raises(ConfigError, match="mma.sync"):
        FAM.check_config(dict(WGCFG, fx=1), mat, op, {}, H100)
    assert [c for c in FAM.search_space(mat, op, {}, H100) if c.get("fx")]
    assert not [c for c in FAM.search_space(holed, op, {}, H100) if c.get("fx")]
    # the hints: the mma.sync decode tiles fixed where the schedule is
    # regular, as they were where it is not
    for m, want in ((mat, 1), (holed, None)):
        hints = tc.hint_configs(m, op, H100, n=16)
        mma = [h for h in hints if h["ksw"] == 4 and not h.get("wg") and not h.get("tma")]
        assert mma and all(h.get("fx") == want for h in mma)
        assert [h for h in hints if h.get("wg") or h.get("tma")]
        assert not [h for h in hints if h.get("fx") and (h.get("wg") or h.get("tma"))]


def test_register_values_keep_the_bitmaps_and_count_registers():
    """The register-values variant: the bitmap records, p and base counted
    in registers (base in 16-bit values), the nonzero registers whole as
    the lane records store them; the emulated decode (a lane's word, its
    registers below it, a 4-byte load a register) builds every fragment."""
    mat = random_matrix(64, 80, 0.2, seed=4)
    p = bitmap.pack(mat, "fp16", 32, 2, regvals=True)
    lr = bitmap.pack(mat, "fp16", 32, 2, lanes=True)
    bm_ = bitmap.pack(mat, "fp16", 32, 2)
    s, sl, sb = bitmap.sections(p.data), bitmap.sections(lr.data), bitmap.sections(bm_.data)
    assert s.regvals and not s.lanes and np.all(s.voff % 2 == 0)
    np.testing.assert_array_equal(s.rec["w"], sb.rec["w"])          # the same bitmaps
    np.testing.assert_array_equal(s.values, sl.values)              # the lane records' values
    np.testing.assert_array_equal(s.voff, sl.voff)
    frow, fcol = bitmap.fragment_positions()
    dense = round_to_dtype(mat.to_dense(), "fp16")
    for stage in range(s.voff.size - 1):
        for j in range(2):
            for strip in range(2):
                want = bitmap.emulate_decode(bm_.data, stage, j, strip)
                np.testing.assert_array_equal(bitmap.emulate_decode(p.data, stage, j, strip), want)
                t = (stage * 2 + j) * 2 + strip
                assert s.rec[t]["count"] == np.any(_set_slots(sb.rec[t]), axis=2).sum()
    assert dense.any()
    # 48 bytes a tile, about 4 a nonzero register: between the bitmaps and the lane records
    assert len(bm_.data) < len(p.data) < len(lr.data)
    with pytest.raises(ValueError, match="one at a time"):
        bitmap.pack(mat, "fp16", 32, 2, lanes=True, regvals=True)
    raw = bytearray(p.data)
    off = p.offsets["rec"] + bitmap.RECORD.fields["count"][1]
    raw[off] ^= 1
    with pytest.raises(ValueError, match="count differs"):
        bitmap.unpack(bytes(raw))


def _set_slots(rec) -> np.ndarray:
    """[32 lanes, 4 registers, 2 halves]: which slots a bitmap record sets."""
    bits = np.unpackbits(np.asarray(rec["w"], dtype="<u4").view(np.uint8), bitorder="little")
    return bits.reshape(32, 4, 2).astype(bool)


def test_hints_put_register_values_first_at_low_density():
    """Hopper, density 0.2 and below: the bitmap format's N = 16 hints open
    with the mma.sync tiles reading register values (faster there, H100,
    bench/RESULTS.md 2026-11-26), the bitmaps' twin kept behind them; above,
    no register values.  The family's hints interleave them with the split
    2:4 tiles; the untuned default is the first."""
    op = Operation("fp16", "tm")
    low, high = random_matrix(600, 512, 0.1, seed=3), random_matrix(600, 512, 0.3, seed=3)
    first = tc.hint_configs(low, op, H100, n=16)
    assert first[0].get("rv") == 1 and first[0]["bn"] == 16 and not first[0].get("wg")
    assert first[0].get("fx") == 1   # a random pattern's schedule is regular
    # (then the single strips' tile, whose bitmaps' twin follows)
    assert first[1].get("rv") == 1 and first[1]["mf"] == 1
    assert {k: v for k, v in first[1].items() if k != "rv"} in first[2:]
    assert not any(c.get("rv") for c in tc.hint_configs(high, op, H100, n=16))
    assert any(c.get("rv") for c in FAM.hint_configs(low, op, {}, H100, n=16)[:4])
    assert FAM.default_config(low, op, {}, H100).get("rv") == 1
    assert FAM.default_config(high, op, {}, H100).get("rv") is None


def test_lane_records_name_each_lanes_registers():
    """The lane-record variant: a lane's record holds its slot mask and the
    offset of its first register; its nonzero registers follow whole, a
    zero in the empty half; stages start on an even value (4-byte loads)."""
    mat = random_matrix(64, 64, 0.3, seed=9)
    p = bitmap.pack(mat, "fp16", 32, 2, windows=True, lanes=True)
    s = bitmap.sections(p.data)
    assert s.lanes and s.rec.shape[1] == 32 and np.all(s.voff % 2 == 0)
    dense = round_to_dtype(mat.to_dense(), "fp16")
    frow, fcol = bitmap.fragment_positions()
    for stage in range(s.voff.size - 1):
        for j in range(2):
            for strip in range(2):
                got = bitmap.emulate_decode(p.data, stage, j, strip)
                blk = s.blocks[[b for b in range(s.blocks.shape[0])
                                if s.blocks[b, 0] <= stage < s.blocks[b, 0] + s.blocks[b, 1]][0]]
                r0, k0 = int(blk[2]) + 16 * strip, 16 * int(s.kid[stage * 2 + j])
                tile = np.zeros((16, 16))
                rr, cc = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
                ok = (r0 + rr < 64) & (k0 + cc < 64)
                tile[ok] = dense[(r0 + rr)[ok], (k0 + cc)[ok]]
                np.testing.assert_array_equal(got, tile[frow, fcol])
                rec = s.rec[(stage * 2 + j) * 2 + strip].astype(np.int64)
                mask = rec >> bitmap.LANE_OFFSET_BITS
                np.testing.assert_array_equal(
                    mask, [sum(1 << i for i in range(8) if tile[frow[l].reshape(-1)[i],
                                                               fcol[l].reshape(-1)[i]] != 0)
                           for l in range(32)])
    # about 4 bytes a nonzero register and 128 a tile, against 2 a nonzero and 48 a tile
    q = bitmap.pack(mat, "fp16", 32, 2, windows=True)
    assert len(q.data) < len(p.data) < 4 * len(q.data)


def test_schedule_stages_and_padding():
    """Blocks with more nonempty k-steps first; a block keeps only its
    nonempty k-steps; the padding entries of a last stage are empty and
    name a k-step of the block; each stage's values are contiguous."""
    d = np.zeros((200, 500), np.float32)
    rng = np.random.default_rng(3)
    d[0:64, :] = rng.standard_normal((64, 500)) * (rng.random((64, 500)) < 0.3)
    d[64:128, 32:40] = 1.0                 # one k-step
    d[192:200, 100:260] = rng.standard_normal((8, 160))
    mat = SparseMatrix.from_dense(d, dtype="fp16")
    p = bitmap.pack(mat, "fp16", 64, 4)
    s = bitmap.sections(p.data)
    first, count, row = s.blocks[:, 0], s.blocks[:, 1], s.blocks[:, 2]
    assert list(row) == [0, 192, 64, 128]      # 8 stages, 3 (10 k-steps), 1, 0
    assert list(count) == [8, 3, 1, 0]
    assert list(first) == [0, 8, 11, 12]
    assert s.kid[11 * 4] == 2 and set(s.kid[11 * 4 + 1:12 * 4]) == {2}
    assert list(s.kid[8 * 4:11 * 4][:10]) == list(range(6, 16))
    ms = 4
    pad = s.rec.reshape(-1, 4, ms)[11, 1:]
    assert not pad["w"].any() and not pad["count"].any()
    assert s.voff[-1] == mat.nnz and np.all(np.diff(s.voff.astype(np.int64)) >= 0)
    assert p.vmax == int(np.diff(s.voff.astype(np.int64)).max())


def test_windowed_stages_are_whole_windows_of_consecutive_k_steps():
    """windows: a block's stages are the windows of 4 consecutive k-steps
    (from a multiple of 4) holding a nonzero, empty k-steps and those past
    K as empty tiles, so that one box of X serves a stage (the TMA path)."""
    d = np.zeros((200, 500), np.float32)
    rng = np.random.default_rng(3)
    d[0:64, :] = rng.standard_normal((64, 500)) * (rng.random((64, 500)) < 0.3)
    d[64:128, 32:40] = 1.0                 # k-step 2: window 0
    d[192:200, 100:260] = rng.standard_normal((8, 160))   # k-steps 6-16: windows 1-4
    mat = SparseMatrix.from_dense(d, dtype="fp16")
    p = bitmap.pack(mat, "fp16", 64, 4, windows=True)
    s = bitmap.sections(p.data)
    assert list(s.blocks[:, 2]) == [0, 192, 64, 128]
    assert list(s.blocks[:, 1]) == [8, 4, 1, 0]     # (compact: 8, 3, 1, 0)
    kid = s.kid.reshape(-1, 4)
    assert np.all(kid % 4 == np.arange(4)) and np.all(np.diff(kid, axis=1) == 1)
    assert list(kid[:8, 0]) == list(range(0, 32, 4))     # the last window reaches past K = 500
    assert list(kid[8:12, 0]) == [4, 8, 12, 16] and list(kid[12]) == [0, 1, 2, 3]
    pad = s.rec.reshape(-1, 4, 4)[12]                    # block 64-127: only k-step 2 holds
    assert [bool(t["w"].any()) for t in pad[:, 0]] == [False, False, True, False]
    back, _ = bitmap.unpack(p.data)
    same(mat, back, "fp16")
    assert p.offsets != bitmap.pack(mat, "fp16", 64, 4).offsets


def test_lane_decode_emulation_reads_each_lanes_slots():
    """decode_tile's arithmetic (word, prefix byte, popcount of the bits
    below, then slot order) puts every entry of the tile in its fragment
    register, on a tile with every lane's count different."""
    d = np.zeros((16, 16), np.float32)
    r, c = bitmap.fragment_positions()
    for lane in range(32):
        for slot in range(lane % 9):     # lane L has L % 9 nonzeros
            d[r[lane, slot // 2, slot % 2], c[lane, slot // 2, slot % 2]] = lane + slot / 10
    mat = SparseMatrix.from_dense(d, dtype="fp16")
    p = bitmap.pack(mat, "fp16", 16, 1)
    frag = bitmap.emulate_decode(p.data, 0, 0, 0)
    np.testing.assert_array_equal(frag, round_to_dtype(d, "fp16")[r, c])


def test_bias_plan_and_errors():
    mat = random_matrix(40, 64, 0.3, seed=7)
    op = Operation("fp16", "fm", Epilogue(bias=True, activation="relu"))
    bias = np.linspace(-1, 1, 40)
    p = FAM.plan(mat, op, {}, DECODE, bias=bias)
    assert isinstance(p, tc.TcPlan)
    s = bitmap.sections(p.packed)
    np.testing.assert_array_equal(s.bias, bias.astype(np.float32))
    same(mat, FAM.unpack(p), "fp16")
    with pytest.raises(ValueError, match="bias has 3 entries"):
        FAM.plan(mat, op, {}, DECODE, bias=np.ones(3))
    with pytest.raises(ValueError, match="none was given"):
        FAM.plan(mat, op, {}, DECODE)
    with pytest.raises(ValueError, match="adds none"):
        FAM.plan(mat, Operation("fp16"), {}, DECODE, bias=bias)


def test_permutation_and_name_carried():
    mat = random_matrix(30, 20, 0.4, seed=8, dtype="bf16")
    mat.perm = np.random.default_rng(0).permutation(30)
    mat.name = "w"
    back = FAM.unpack(FAM.plan(mat, Operation("bf16", "tm"), {}, DECODE))
    same(mat, back, "bf16")
    np.testing.assert_array_equal(back.perm, mat.perm)
    assert back.name == "w"


def test_format_bytes_and_speedup_limits():
    """48 bytes a tile and 2 a nonzero: the ceilings of a memory-bound
    decode against dense fp16 weights."""
    mat = random_matrix(512, 512, 0.3, seed=9)
    p = bitmap.pack(mat, "fp16", 64, 4)
    s = bitmap.sections(p.data)
    assert s.rec.size == (512 // 16) * (512 // 16)
    assert tc.speedup_limit(0.5) == pytest.approx(1.68, abs=0.01)
    assert tc.speedup_limit(0.3) == pytest.approx(2.54, abs=0.01)
    assert tc.speedup_limit(0.1) == pytest.approx(5.16, abs=0.01)


# ---- the family: dtype, space, constraints ---------------------------------------------------

def test_one_family_for_every_dtype():
    assert FAM.dtypes == ("fp32", "fp16", "bf16")
    assert FAM.dtype_for("fp16") == "fp16" and FAM.dtype_for("bf16") == "bf16"
    assert FAM.dtype_for("fp32") == "fp32"
    mat = random_matrix(64, 64, 0.3)
    assert FAM.detect(mat) == {} and FAM.fits(mat, {})
    assert "tables" in FAM.search_space(mat, Operation("fp32"), {})[0]
    assert "bn" in FAM.search_space(mat, Operation("fp16"), {})[0]
    with pytest.raises(ConfigError, match="csr takes no pattern parameters"):
        FAM.search_space(mat, Operation("fp16"), {"v": 1})


@pytest.mark.parametrize("device,wg", [(H100, True), (A100, False)])
def test_search_space(device, wg):
    mat = random_matrix(1000, 700, 0.3, seed=10)
    for layout in ("fm", "tm"):
        op = Operation("bf16", layout)
        space = FAM.search_space(mat, op, {}, device)
        assert 60 <= len(space) <= 480
        assert len({tuple(sorted(c.items())) for c in space}) == len(space)
        assert any(c.get("wg") for c in space) == wg
        assert any(c["ck"] > 1 for c in space) == wg
        assert {c["bn"] for c in space} >= {16, 64, 128}
        assert all(not c.get("wg") and c["bn"] == 16 for c in space if c.get("rv"))
        assert any(c.get("rv") for c in space)
        for c in space:
            FAM.check_config(c, mat, op, {}, device)
        hints = FAM.hint_configs(mat, op, {}, device)
        assert hints and all(h in space for h in hints)
        assert {h["bn"] for h in hints} >= {16, 64}
        # N known: the decode tiles first for a few tokens, the prefill tiles for many
        dec, pre = FAM.hint_configs(mat, op, {}, device, n=16), FAM.hint_configs(mat, op, {}, device, n=4096)
        assert dec[0]["bn"] <= 64 and pre[0]["bn"] > 64 and sorted(map(repr, dec)) == sorted(map(repr, pre))


@pytest.mark.parametrize("change,rule", [
    (dict(bn=24), "bn in"),
    (dict(mf=3), "mf in (1, 2)"),
    (dict(wm=8, wk=4), "threads <= 512"),
    (dict(ksw=3), "ksw in (1, 2, 4)"),
    (dict(ck=3), "ck in"),
    (dict(mf=2, bn=256), "acc <= 128"),
    (dict(stages=5), "stages in (2, 3, 4)"),
    (dict(wg=1), "ksw % 2 == 0"),     # with ksw 1 below
])
def test_invalid_configs_name_their_constraint(change, rule):
    mat = random_matrix(64, 64, 0.3)
    cfg = dict(DECODE, ksw=1) if change.get("wg") else dict(DECODE)
    cfg.update(change)
    with pytest.raises(ConfigError, match=re.escape(rule)):
        FAM.check_config(cfg, mat, Operation("fp16"), {})


@pytest.mark.parametrize("layout,k,change,rule", [
    ("tm", 64, dict(wm=4, wk=2, ksw=2), "wg == 1 and wk == 1"),
    ("fm", 64, dict(bn=16), "bn >= 64 or tm"),   # feature-major boxes of 64 columns of N
    ("tm", 64, dict(stages=7), "stages in (3, 4, 5) or (tma and stages in"),
    ("tm", 100, {}, "k8 or not tm"),         # X's rows not 16-byte aligned: no tensor map
    ("tm", 64, dict(tma=2), "tma == 1"),
    ("tm", 64, dict(sa=2), "sa == 1"),
    ("tm", 64, dict(sa=1, tma=0), "tma == 1"),
    ("tm", 64, dict(lr=1), "sa == 1"),       # lane records without sa
    ("tm", 64, dict(sa=1, lr=2), "lr == 1"),
])
def test_invalid_tma_configs_name_their_constraint(layout, k, change, rule):
    mat = random_matrix(64, k, 0.3)
    with pytest.raises(ConfigError, match=re.escape(rule)):
        FAM.check_config(dict(TMACFG, **change), mat, Operation("fp16", layout), {})
    with pytest.raises(ConfigError, match="needs the keys"):
        FAM.check_config(dict(DECODE, tma=1), mat, Operation("fp16", layout), {})
    with pytest.raises(ConfigError, match="needs the keys"):
        FAM.check_config(dict(WGCFG, sa=1), mat, Operation("fp16", layout), {})


def test_tma_kernel_declares_its_map_and_producer_warp():
    mat = random_matrix(300, 704, 0.3)
    op = Operation("fp16", "tm")
    k = FAM.generate(mat, op, {}, TMACFG)
    assert k.launch["block"] == (288, 1, 1)          # 8 consumer warps and the producer
    assert "SF_DECLARE_X_MAP(2, 704, 64, 256)" in k.source   # boxes of a stage: 64 columns
    assert "__grid_constant__ sf::sm90::TensorMap x_map" in k.source
    env = tc.SPACE.env(TMACFG, tc.problem("tm", 0, 0, 704))
    assert env["bar_bytes"] == 16 * TMACFG["stages"]
    plain = FAM.generate(mat, op, {}, {k_: v for k_, v in TMACFG.items() if k_ != "tma"})
    assert k.launch["shared_bytes"] == plain.launch["shared_bytes"] + env["bar_bytes"]
    assert "SF_DECLARE_X_MAP(2," not in plain.source
    # feature-major: boxes of 64 columns of N by the stage's 64 rows, any K
    fm = FAM.generate(random_matrix(300, 700, 0.3), Operation("fp16", "fm"), {}, TMACFG)
    assert "SF_DECLARE_X_MAP(1, 700, 64, 64)" in fm.source
    # a decode tile: 16 tokens a box, K split over a cluster of 4 (a CTA a
    # rank), the fp32 partials in the shared memory the stages leave
    cfg = dict(tc.TMA_DECODE, bn=16, ck=4)
    dec = FAM.generate(mat, op, {}, cfg)
    assert "SF_DECLARE_X_MAP(2, 704, 64, 16)" in dec.source
    assert "__cluster_dims__(4, 1, 1)" in dec.source and "__cluster_dims__" not in k.source
    assert dec.launch["grid"] == (5 * 4, 1, 1) and dec.launch["block"] == (160, 1, 1)
    p = FAM.plan(mat, op, {}, cfg)
    denv = tc.SPACE.env(cfg, tc.problem("tm", p.vmax, p.smax, 704))
    assert denv["r_bytes"] == 64 * (16 + 4) * 4 and dec.launch["shared_bytes"] == denv["smem"]


def test_device_rules():
    mat = random_matrix(64, 64, 0.3)
    op = Operation("fp16")
    with pytest.raises(ConfigError, match="clusters need sm_90"):
        FAM.check_config(dict(DECODE, ck=2), mat, op, {}, A100)
    with pytest.raises(ConfigError, match="the wgmma path needs sm_90a"):
        FAM.check_config(WGCFG, mat, op, {}, A100)
    FAM.check_config(WGCFG, mat, op, {}, H100)
    with pytest.raises(ConfigError, match="needs the keys"):
        FAM.check_config(dict(DECODE, vec=1), mat, op, {})


def test_kernel_launch_record_and_name():
    mat = random_matrix(300, 200, 0.3, seed=11)
    op = Operation("fp16", "tm", Epilogue(bias=True))
    cfg = dict(DECODE, ck=4)
    p = FAM.plan(mat, op, {}, cfg, bias=np.ones(300))
    k = FAM.render(p, op, cfg)
    assert k.launch["grid"] == (5 * 4, 1, 1)    # 300 rows in blocks of 64, 4 CTAs a cluster
    assert k.launch["n_axis"] == 1 and k.launch["n_tile"] == 16
    assert k.launch["block"] == (256, 1, 1) and not k.launch["zero_output"]
    assert k.name.startswith("sf_csr_fp16_tm_bias_") and "ck4" in k.name
    assert "__cluster_dims__(4, 1, 1)" in k.source
    assert k.launch["shared_bytes"] == tc.SPACE.env(cfg, tc.problem("tm", p.vmax, p.smax, mat.cols))["smem"]


def test_the_command_line_tunes_16_bit_weights_on_tensor_cores(tmp_path):
    """prune --pattern csr keeps the dtype; generate and tune (no GPU:
    compile only) take the tensor-core kernels for fp16 weights and the
    CUDA-core ones for fp32."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    from sparseforge.generator import io
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1",
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "sparseforge", *map(str, args)], cwd=root,
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    dense = np.random.default_rng(0).standard_normal((96, 80)).astype(np.float16)
    np.save(tmp_path / "w.npy", dense)
    run("prune", tmp_path / "w.npy", "--pattern", "csr", "--sparsity", "0.7",
        "-o", tmp_path / "p.npz")
    (_, pruned), = io.load(str(tmp_path / "p.npz"))
    assert pruned.dtype == "fp16" and pruned.density == pytest.approx(0.3, abs=0.01)
    run("generate", tmp_path / "p.npz", "--pattern", "csr", "--arch", "sm_90a",
        "-o", tmp_path / "gen")
    meta = json.loads(next((tmp_path / "gen").glob("*.json")).read_text())
    assert meta["op"].startswith("csr.fp16.") and "ksw" in meta["config"]
    out = run("tune", tmp_path / "p.npz", "--db", tmp_path / "t.db", "--n", "16",
              "--budget", "2")
    assert "nothing was measured (no GPU)" in out
    run("generate", tmp_path / "p.npz", "--pattern", "csr", "--dtype", "fp32",
        "--arch", "sm_80", "-o", tmp_path / "gen32")
    meta = json.loads(next((tmp_path / "gen32").glob("*.json")).read_text())
    assert meta["op"].startswith("csr.fp32.") and "tables" in meta["config"]


# ---- compiling ------------------------------------------------------------------------------

def _cuobjdump():
    """CUOBJDUMP, else the toolkit's on PATH, else the copy PyTorch's
    triton carries (the test extra installs it), else None."""
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        import importlib.util
        spec = importlib.util.find_spec("triton")
        if spec and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                cand = os.path.join(loc, "backends", "nvidia", "bin", "cuobjdump")
                if os.access(cand, os.X_OK):
                    return cand
    return tool


def _sass(tool, data: bytes, tmp_path) -> str:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(data)
    return subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout


COMPILE_CASES = [
    ("fp16", "fm", Epilogue(bias=True, activation="gelu"), DECODE),
    ("bf16", "tm", Epilogue(activation="relu"), dict(DECODE, wk=4, ksw=1, bn=64)),
    ("fp16", "tm", Epilogue(bias=True), dict(DECODE, mf=2, wm=2, ck=4)),
    ("bf16", "fm", Epilogue(scale=0.5), PREFILL),
    ("fp16", "tm", Epilogue(bias=True, activation="gelu"), dict(PREFILL, mf=1, wm=8, bn=256)),
    ("fp16", "fm", Epilogue(bias=True, activation="gelu"), dict(WGCFG, wm=8, bn=256)),
    ("bf16", "tm", Epilogue(), dict(WGCFG, ksw=4)),
    ("fp16", "fm", Epilogue(activation="relu"), dict(WGCFG, bn=64, wk=2, ck=4)),
    ("fp16", "tm", Epilogue(bias=True, activation="gelu"), TMACFG),
    ("bf16", "tm", Epilogue(), dict(TMACFG, wm=4, ksw=2, bn=128, stages=3)),
    ("fp16", "fm", Epilogue(bias=True, activation="gelu"), TMACFG),
    ("fp16", "tm", Epilogue(bias=True, activation="gelu"), SACFG),
    ("bf16", "fm", Epilogue(), dict(SACFG, wm=4, ksw=2, bn=128, stages=3)),
    ("fp16", "tm", Epilogue(bias=True, activation="gelu"), LRCFG),
    ("bf16", "fm", Epilogue(activation="relu"), dict(LRCFG, wm=4, ksw=2, bn=128, stages=3)),
    # decode tiles fed by TMA, K split over a cluster
    ("fp16", "tm", Epilogue(bias=True, activation="gelu"), dict(TMACFG, wm=4, bn=16, ck=2)),
    ("bf16", "tm", Epilogue(), dict(LRCFG, wm=4, bn=64, ck=4, stages=6)),
    ("fp16", "fm", Epilogue(activation="relu"), dict(TMACFG, wm=4, bn=64, ck=2, stages=8)),
    # mma.sync, the bitmaps with register values
    ("bf16", "tm", Epilogue(bias=True, activation="gelu"), dict(DECODE, rv=1)),
    ("fp16", "fm", Epilogue(scale=0.5), dict(PREFILL, rv=1)),
    ("fp16", "tm", Epilogue(), dict(DECODE, mf=2, wm=2, wk=2, ksw=4, ck=2, rv=1)),
    # fixed offsets
    ("fp16", "tm", Epilogue(bias=True, activation="gelu"),
     dict(DECODE, wm=2, wk=4, ksw=4, ck=2, rv=1, fx=1)),
    ("bf16", "fm", Epilogue(scale=0.5), dict(DECODE, ksw=4, bn=64, fx=1)),
]


@pytest.mark.parametrize("case", range(len(COMPILE_CASES)))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_template_compiles(arch, case, nvrtc, tmp_path):
    dtype, layout, ep, cfg = COMPILE_CASES[case]
    mat = random_matrix(150, 96 if cfg.get("tma") else 97, 0.3, seed=case, dtype=dtype)
    op = Operation(dtype, layout, ep)
    bias = np.linspace(-1, 1, 150) if ep.bias else None
    k = FAM.generate(mat, op, {}, cfg, bias=bias)
    needs90 = cfg.get("wg") or cfg["ck"] > 1
    if needs90 and arch != "sm_90a":
        from sparseforge.native import CompileError
        with pytest.raises(CompileError):
            nvrtc(k.source, arch, "csr_tc.cu")
        return
    b = nvrtc(k.source, arch, "csr_tc.cu", options=("--ptxas-options=-v",))
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", b.log)
    assert spills and all(s == ("0", "0") for s in spills), b.log
    assert "warning" not in b.log.lower(), b.log
    tool = _cuobjdump()
    if tool:
        sass = _sass(tool, b.data, tmp_path)
        assert ("HGMMA" if cfg.get("wg") else "HMMA") in sass
        assert not re.search(r"\b(LDL|STL)\b", sass)


def test_wgmma_epilogues_read_the_accumulators_after_the_last_wait(nvrtc, tmp_path):
    """An epilogue's scale reads the wgmma accumulators only once no wgmma
    is in flight (after WARPGROUP.DEPBAR.LE gsb0, 0x0): without the
    accumulators' fence after the last wait_group, ptxas scheduled the
    scale's FMULs above it and the output missed the last k-steps."""
    tool = _cuobjdump()
    if not tool:
        pytest.skip("no cuobjdump (CUOBJDUMP, the toolkit's on PATH, or triton's)")
    mat = random_matrix(150, 96, 0.3)
    for layout, cfg in (("fm", WGCFG), ("tm", WGCFG), ("tm", TMACFG), ("fm", dict(TMACFG, wm=4, bn=64))):
        k = FAM.generate(mat, Operation("fp16", layout, Epilogue(scale=0.0863)), {}, cfg)
        in_flight, scaled = False, 0
        for line in _sass(tool, nvrtc(k.source, "sm_90a", "csr_tc.cu").data, tmp_path).splitlines():
            if "HGMMA" in line:
                in_flight = True
            elif "DEPBAR.LE gsb0, 0x0" in line:
                in_flight = False
            elif re.search(r"FMUL .*0\.0863", line):
                scaled += 1
                assert not in_flight, (layout, cfg, line)
        assert scaled >= 32, (layout, cfg, scaled)  # (not vacuous: the scale is there)


@pytest.mark.parametrize("arch,layout", [("sm_90a", "fm"), ("sm_90a", "tm"), ("sm_80", "fm"),
                                         ("sm_80", "tm")])
def test_a_spread_of_the_space_compiles_without_spills(arch, layout, assert_no_spills):
    """Every 12th configuration of the space (the whole of it compiles so
    too: 608 kernels, checked when the table changes)."""
    mat = random_matrix(1000, 700, 0.3, seed=13)
    op = Operation("fp16", layout, Epilogue(bias=True, activation="gelu"))
    space = FAM.search_space(mat, op, {}, H100 if arch == "sm_90a" else A100)
    assert_no_spills(space[::12], lambda cfg: FAM.generate(mat, op, {}, cfg, bias=np.zeros(1000)),
                     arch, "csr_tc.cu")


def test_launch_bounds_keep_two_wgmma_ctas_of_128_columns():
    """8-warp wgmma tiles of at most 128 columns ask for 2 CTAs an SM (128
    registers a thread): asked for 1, ptxas took 136 for bn 128 and the
    kernel ran 19% slower (bench/RESULTS.md, 2026-11-26).  Wider tiles and
    other warp counts keep the general estimate."""
    wg = dict(mf=1, wm=8, wk=1, ksw=4, bn=128, stages=4, ck=1, wg=1)
    assert tc.min_blocks(wg) == 2
    assert tc.min_blocks(dict(wg, bn=64)) == 2
    assert tc.min_blocks(dict(wg, bn=256)) == 1
    # 4-warp tiles: the estimate alone (asked for 4 CTAs, a bf16 one spilled)
    assert tc.min_blocks(dict(wg, wm=4, bn=128)) < 4


# ---- GPU ------------------------------------------------------------------------------------

GPU_CASES = [
    # (shape, density, dtype, layout, epilogue, config, N values)
    ((37, 53), 0.3, "fp16", "fm", Epilogue(bias=True, activation="gelu"), DECODE, (1, 5, 16, 17)),
    ((37, 53), 0.3, "bf16", "tm", Epilogue(bias=True, activation="relu"), DECODE, (1, 16, 33)),
    ((300, 200), 0.5, "fp16", "tm", Epilogue(), dict(DECODE, wk=4, ksw=1, bn=64), (3, 64, 100)),
    ((300, 200), 0.1, "bf16", "fm", Epilogue(scale=0.5), dict(DECODE, mf=2, wm=2), (7, 64)),
    ((129, 1000), 0.3, "fp16", "fm", Epilogue(bias=True), PREFILL, (1, 130, 300)),
    ((129, 1000), 0.3, "bf16", "tm", Epilogue(activation="gelu"),
     dict(PREFILL, mf=1, wm=8, bn=256, ksw=2), (5, 256, 513)),
    ((64, 64), 0.0, "fp16", "fm", Epilogue(bias=True, activation="gelu"), DECODE, (1, 16)),
    ((513, 250), 0.05, "fp16", "tm", Epilogue(bias=True), dict(PREFILL, ksw=1), (16, 200)),
    # Hopper: clusters along K, wgmma
    ((300, 700), 0.3, "fp16", "fm", Epilogue(bias=True, activation="gelu"),
     dict(DECODE, ck=4), (1, 16, 40)),
    ((300, 700), 0.1, "bf16", "tm", Epilogue(), dict(DECODE, wk=1, ck=2, bn=64), (9, 64)),
    ((300, 700), 0.3, "fp16", "fm", Epilogue(bias=True, activation="relu"), WGCFG, (1, 100, 300)),
    ((300, 700), 0.3, "bf16", "tm", Epilogue(bias=True, activation="gelu"),
     dict(WGCFG, wm=8, bn=256), (3, 256, 600)),
    ((1000, 300), 0.5, "fp16", "tm", Epilogue(), dict(WGCFG, ksw=4, bn=64), (64, 65)),
    ((300, 700), 0.1, "fp16", "fm", Epilogue(activation="gelu"), dict(WGCFG, bn=64, wk=2, ck=4),
     (16, 64, 70)),
    # the decode hints' four k-steps a warp and stage
    ((300, 700), 0.1, "fp16", "tm", Epilogue(bias=True), dict(DECODE, wm=2, wk=4, ksw=4, ck=2),
     (1, 16, 40)),
    ((300, 700), 0.5, "bf16", "tm", Epilogue(activation="gelu"),
     dict(DECODE, mf=2, wm=2, wk=2, ksw=4, ck=2), (16, 17)),
    ((1000, 300), 0.3, "fp16", "fm", Epilogue(), dict(DECODE, wk=2, ksw=4, bn=64, ck=2), (64, 65)),
    # wgmma fed by TMA (token-major): odd M, K past the last whole k-step, N
    # past the tile, a row block with no stage, stages fewer than the ring
    ((300, 704), 0.3, "fp16", "tm", Epilogue(bias=True, activation="gelu"), TMACFG,
     (1, 256, 600)),
    ((129, 1000), 0.3, "bf16", "tm", Epilogue(activation="relu"),
     dict(TMACFG, bn=128, stages=3), (5, 130, 257)),
    ((1000, 304), 0.5, "fp16", "tm", Epilogue(scale=0.5), dict(TMACFG, wm=4, ksw=2, bn=64),
     (64, 65)),
    ((256, 72), 0.1, "bf16", "tm", Epilogue(bias=True), dict(TMACFG, stages=4), (16, 300)),
    # feature-major: boxes of 64 columns; N % 8 != 0 (no tensor map: the
    # producer warp copies X element by element); K % 8 != 0 is fine
    ((300, 700), 0.3, "fp16", "fm", Epilogue(bias=True, activation="gelu"), TMACFG,
     (256, 600, 5, 257)),
    ((129, 1000), 0.1, "bf16", "fm", Epilogue(activation="relu"),
     dict(TMACFG, wm=4, ksw=2, bn=128, stages=3), (130, 64, 77)),
    # A decoded into shared memory (sa), from the bitmaps and from lane
    # records (lr): both layouts, both dtypes, 32- and 64-column stages,
    # densities 0.1 to 0.5, the epilogues
    *[case for base, (d1, d2) in ((SACFG, (0.3, 0.5)), (LRCFG, (0.5, 0.1))) for case in (
        ((300, 704), 0.3, "fp16", "tm", Epilogue(bias=True, activation="gelu"), base,
         (1, 256, 600)),
        ((129, 1000), d1, "bf16", "tm", Epilogue(activation="relu"),
         dict(base, bn=128, ksw=2, stages=3), (5, 130, 257)),
        ((1000, 304), d2, "fp16", "tm", Epilogue(scale=0.5), dict(base, wm=4, ksw=2, bn=64),
         (64, 65)),
        ((300, 700), 0.3, "fp16", "fm", Epilogue(bias=True, activation="gelu"), base,
         (256, 600, 5, 257)),
        ((129, 1000), 0.1, "bf16", "fm", Epilogue(activation="relu"),
         dict(base, wm=4, ksw=2, bn=128, stages=3), (130, 64, 77)))],
    # decode tiles fed by TMA: wgmma n16 to n64, K split over clusters of
    # 2 and 4 (each CTA's partials pushed to the CTA finishing their rows), blocks with
    # no stage (300 rows: the first two 64-row blocks), CTAs of a cluster
    # with no stage of their own (K of one window), deeper pipelines
    ((300, 704), 0.3, "fp16", "tm", Epilogue(bias=True, activation="gelu"),
     dict(TMACFG, wm=4, bn=16, ck=2), (1, 16, 40)),
    ((1000, 1000), 0.1, "bf16", "tm", Epilogue(activation="relu"),
     dict(TMACFG, wm=4, bn=64, ck=4, stages=6), (9, 64, 70)),
    ((1000, 304), 0.3, "bf16", "tm", Epilogue(bias=True), dict(TMACFG, bn=32, ck=4, stages=8),
     (16, 33)),
    ((200, 64), 0.5, "fp16", "tm", Epilogue(scale=0.5), dict(TMACFG, wm=4, bn=16, ck=4),
     (16, 3)),
    ((129, 1000), 0.5, "fp16", "tm", Epilogue(activation="gelu"), dict(LRCFG, wm=4, bn=64, ck=2),
     (64, 65)),
    ((1000, 1000), 0.1, "bf16", "tm", Epilogue(bias=True), dict(LRCFG, wm=4, bn=16, ck=4),
     (16, 5)),
    ((300, 700), 0.3, "fp16", "fm", Epilogue(bias=True, activation="gelu"),
     dict(TMACFG, wm=4, bn=64, ck=2), (64, 5, 77)),
    # mma.sync, the bitmaps with register values (rv)
    ((37, 53), 0.3, "bf16", "tm", Epilogue(bias=True, activation="gelu"), dict(DECODE, rv=1),
     (1, 5, 16, 17)),
    ((300, 200), 0.5, "fp16", "fm", Epilogue(scale=0.5), dict(DECODE, wk=4, ksw=1, bn=64, rv=1),
     (3, 64, 100)),
    ((129, 1000), 0.3, "bf16", "fm", Epilogue(bias=True, activation="relu"),
     dict(PREFILL, rv=1), (1, 130, 300)),
    ((64, 64), 0.0, "fp16", "tm", Epilogue(bias=True), dict(DECODE, rv=1), (1, 16)),
    ((300, 700), 0.1, "fp16", "tm", Epilogue(bias=True), dict(DECODE, wm=2, wk=4, ksw=4, ck=2,
                                                              rv=1), (1, 16, 40)),
    ((300, 700), 0.05, "bf16", "tm", Epilogue(activation="gelu"),
     dict(DECODE, mf=2, wm=2, wk=2, ksw=4, ck=4, rv=1), (16, 17)),
    ((513, 250), 0.1, "fp16", "tm", Epilogue(), dict(DECODE, wk=4, ksw=4, bn=64, ck=2, rv=1),
     (64, 65)),
    # fixed offsets (fx: blocks, k-steps and value offsets computed): odd M
    # and K, a last stage padded past K, clusters of 1, 2 and 4, both layouts
    ((300, 700), 0.1, "fp16", "tm", Epilogue(bias=True),
     dict(DECODE, wm=2, wk=4, ksw=4, ck=2, rv=1, fx=1), (1, 16, 40)),
    ((300, 700), 0.3, "bf16", "fm", Epilogue(activation="gelu"),
     dict(DECODE, wm=2, wk=4, ksw=4, fx=1), (16, 17)),
    ((1000, 300), 0.5, "fp16", "tm", Epilogue(scale=0.5),
     dict(DECODE, mf=2, wm=2, wk=2, ksw=4, ck=4, rv=1, fx=1), (16, 5)),
    ((513, 250), 0.3, "fp16", "tm", Epilogue(), dict(DECODE, wk=4, ksw=4, bn=64, ck=2, fx=1),
     (64, 65)),
    # an epilogue scale on the wgmma paths (its reads of the accumulators
    # wait for the last wgmma: sm90::fence_accumulators)
    ((512, 512), 0.3, "fp16", "fm", Epilogue(scale=0.0863), WGCFG, (72,)),
    ((300, 704), 0.3, "bf16", "tm", Epilogue(bias=True, scale=0.25), TMACFG, (256, 40)),
    ((300, 704), 0.3, "fp16", "tm", Epilogue(scale=0.5), dict(TMACFG, wm=4, bn=16), (16,)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_gpu_correct(case):
    from sparseforge.tuner.execute import default_context, verify
    shape, density, dtype, layout, ep, cfg, ns = GPU_CASES[case]
    if (cfg.get("wg") or cfg["ck"] > 1) and default_context().device_info()["arch"] != "sm_90a":
        pytest.skip("wgmma and clusters need an sm_90a GPU (Hopper)")
    empty = range(128) if cfg.get("tma") and shape[0] == 300 else ()   # a block of no stage
    mat = random_matrix(*shape, density, seed=100 + case, dtype=dtype, empty_rows=empty)
    op = Operation(dtype, layout, ep)
    for n in ns:
        res = verify("csr", mat, op, {}, cfg, n, seed=case * 7 + n)
        assert res["ok"], (n, res)


def test_tma_kernels_declare_programmatic_dependent_launch():
    """The TMA kernels are programmatic dependents (sm_90a); the cp.async
    ones are not (measured: no steady gain, up to 16% lost on some shapes)."""
    mat = random_matrix(150, 96, 0.3)
    for cfg, pdl in ((DECODE, False), (WGCFG, False), (TMACFG, True),
                     (dict(TMACFG, wm=4, bn=16, ck=4), True), (LRCFG, True)):
        src = FAM.generate(mat, Operation("fp16", "tm"), {}, cfg).source
        assert ("SF_DECLARE_PDL();" in src) == pdl, cfg


PDL_CASES = [
    ("tm", dict(TMACFG, wm=4, bn=16, ck=4), 16),              # decode tile, a cluster
    ("tm", dict(LRCFG, wm=4, bn=64, ck=2), 40),               # lane records, a pair
    ("fm", TMACFG, 256),                                      # prefill tile
    ("fm", dict(TMACFG, wm=4, bn=64), 60),                    # fm, N % 8 != 0: no tensor map
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(PDL_CASES)))
def test_gpu_dependent_launches(case):
    """On sm_90a the TMA kernels are launched as programmatic dependents of
    the stream's previous work: three back to back on one stream, each
    reading the one before's output (tests/py/chain.py); the first 64 rows
    empty, so that a row block with no stage writes its zeros only after
    the wait."""
    from chain import check_dependent_chain
    from sparseforge.tuner.execute import default_context
    if default_context().device_info()["arch"] != "sm_90a":
        pytest.skip("programmatic dependent launch needs sm_90 (Hopper)")
    layout, cfg, n = PDL_CASES[case]
    mat = random_matrix(512, 512, 0.3, seed=60 + case, empty_rows=range(64))
    check_dependent_chain(FAM, mat, {}, cfg, n, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fm", "tm"])
def test_gpu_small_every_config(layout):
    """Every configuration of the space on one odd matrix (for
    compute-sanitizer too): N = 16 and an odd N."""
    from sparseforge.tuner.execute import default_context, verify
    dev = default_context().device_info()
    mat = random_matrix(70, 150, 0.3, seed=12)
    op = Operation("fp16", layout, Epilogue(bias=True, activation="gelu"))
    space = FAM.search_space(mat, op, {}, dev)
    for cfg in space[::max(1, len(space) // 40)]:
        for n in (16, 67):
            res = verify("csr", mat, op, {}, cfg, n, seed=n)
            assert res["ok"], (cfg, n, res)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_gpu_dlmc_subset(dlmc_files, dtype):
    """The DLMC patterns (values drawn from a seeded generator) with the
    family's first two hints, N = 16 and 256, the layouts taking turns."""
    from sparseforge.generator.io import load
    from sparseforge.tuner.execute import default_context, verify
    dev = default_context().device_info()
    assert dlmc_files
    for i, path in enumerate(dlmc_files):
        (_, mat), = load(str(path), seed=0)
        mat = mat.astype(dtype)
        layout = ("fm", "tm")[i % 2]
        op = Operation(dtype, layout, Epilogue(bias=True, activation="relu"))
        for cfg in FAM.hint_configs(mat, op, {}, dev)[:2]:
            for n in (16, 256):
                res = verify("csr", mat, op, {}, cfg, n, seed=n)
                assert res["ok"], (path.name, layout, cfg, n, res)
