"""The `csr` family's tensor-core path: unstructured W in fp16 or bf16 (the
format is bitmap.py, the device code templates/include/sf/csr_tc.cuh),
its search space as data and its kernels.

A configuration takes one of two compute paths:

    mma.sync   mf wm wk ksw bn stages ck       (sm_80 and newer; ck > 1: sm_90)
    wgmma      the same and wg = 1             (sm_90a; A decoded into registers)
    wgmma+TMA  the same and tma = 1            (sm_90a, wk = 1, token-major with
                                                K % 8 == 0: a producer warp fills the
                                                stages by TMA and bulk copies, mbarriers
                                                in place of the CTA's barrier a stage)
               and sa = 1                      (the same, A decoded into shared memory
                                                and the wgmma reading both operands from
                                                there)
               and lr = 1                      (TMA: W as lane records, bitmap.py: a lane
                                                reads its record, then its nonzero A
                                                registers whole)

mf: 16-row strips per warp; wm: warps along M (wgmma: 4 per warpgroup);
wk: warps (warpgroups) along K inside a CTA; ksw: k-steps (16 columns of
K) per warp and stage; bn: columns of N per CTA; stages: the cp.async
pipeline's depth; ck: CTAs of a cluster splitting each row block's stages
(each pushes its sums of the rows another CTA finishes into that CTA's
shared memory).  A row block is
bm = 16 mf wm rows; a stage is ks = ksw wk k-steps.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...family import accepted_by, by_tile_n
from ...kernel import ConfigError, Kernel, Operation, config_name, make_launch, render, smem_limit
from ...matrix import SparseMatrix
from ...space import Constraint, Space
from . import bitmap

TABLE_SOURCE = "generator/families/csr/tc.py"
KEYS = ("bn", "ck", "ksw", "mf", "stages", "wk", "wm")
WG_KEYS = tuple(sorted(KEYS + ("wg",)))
TMA_KEYS = tuple(sorted(WG_KEYS + ("tma",)))
SA_KEYS = tuple(sorted(TMA_KEYS + ("sa",)))
LR_KEYS = tuple(sorted(TMA_KEYS + ("lr",)))
SA_LR_KEYS = tuple(sorted(SA_KEYS + ("lr",)))
RV_KEYS = tuple(sorted(KEYS + ("rv",)))
FX_KEYS = tuple(sorted(KEYS + ("fx",)))
RV_FX_KEYS = tuple(sorted(RV_KEYS + ("fx",)))

BN_CHOICES = (16, 32, 64, 128, 256)
WG_BN_CHOICES = (16, 32, 64, 128, 256)   # the register-A wgmma wrappers (mma_sm90.cuh)
PREFILL_WG_BN = (64, 128, 256)       # the cp.async wgmma path's (below 64: the TMA decode tiles)
TMA_DECODE_BN = (16, 64)
# the decode tile fed by TMA: one warpgroup of 64 rows, four k-steps a
# stage, a cluster splitting K (bn and ck: the search's)
TMA_DECODE = dict(mf=1, wm=4, wk=1, ksw=4, bn=16, stages=4, ck=4, wg=1, tma=1)
STAGE_CHOICES = (2, 3, 4)
WG_STAGE_CHOICES = (3, 4, 5)
TMA_STAGE_CHOICES = (3, 4, 5, 6, 8)  # the TMA kernels' (decode's small stages: more of them)
CK_CHOICES = (1, 2, 4, 8)            # portable cluster sizes
MAX_ACC = 128

MMA = "not wg"
WG = "wg"
TMA = "tma"
SA = "sa"
LR = "lr"
RV = "rv"
FX = "fx"

DERIVED = {
    "threads": "32 * wm * wk + 32 * tma",
    "bm": "16 * mf * wm",
    "ms": "bm // 16",
    "ks": "ksw * wk",
    "bk": "16 * ks",
    "nf": "bn // 8",
    "acc": "mf * nf * 4",
    "x_row_ch": "bk // 8 if tm else bn // 8",
    "x_bytes": "bk * bn * 2",
    "rec_stage": f"ms * ks * ({bitmap.LANE_REC_BYTES} if lr else {bitmap.REC_BYTES})",
    "val_bytes": "(2 * vmax + 15) // 16 * 16 + 32",
    "stage_raw": "x_bytes + rec_stage + val_bytes + 16",
    "stage_align": "1024 if wg else 128",
    "stage_bytes": "cdiv(stage_raw, stage_align) * stage_align",
    "tabs": "cdiv(smax, ck)",
    "tab_bytes": "cdiv((ks * tabs + tabs + 1) * 4, 16) * 16",
    "c_bytes": "(bn if tm else bm) * ((bm if tm else bn) + 8) * 2",
    "r_bytes": "wk * bm * (bn + 4) * 4 if wk > 1 or ck > 1 else 0",
    "bar_bytes": "16 * stages if tma else 0",
    "pipe_end": "stages * stage_bytes + tab_bytes",
    "a_bytes": "2 * bm * bk * 2 if sa else 0",
    "a_off": "cdiv(pipe_end, 1024) * 1024 if sa else pipe_end",
    # ck > 1: the partial sums the cluster's other CTAs push, and their barrier
    "recv_bytes": "(ck - 1) * (bm // ck) * (bn + 4) * 4 + 16 if ck > 1 else 0",
    "smem": "max(max(a_off + a_bytes, c_bytes), r_bytes) + bar_bytes + recv_bytes"
            " + (1024 if wg else 0)",
}

TABLE = [
    # every path
    Constraint("mf in (1, 2) and wm in (1, 2, 4, 8) and wk in (1, 2, 4)",
               "strips per warp, warps along M and along K"),
    Constraint("ksw in (1, 2, 4)", "k-steps per warp and stage"),
    Constraint(f"bn in {BN_CHOICES}", "BN: whole pairs of n8 fragments"),
    Constraint(f"ck in {CK_CHOICES}", "CTAs of a cluster along K (portable cluster sizes)"),
    Constraint("threads <= 512", "at most 16 warps"),
    Constraint("threads % x_row_ch == 0", "a thread keeps one chunk column of the X tile"),
    Constraint("stage_bytes % 128 == 0", "stages stay 128-byte aligned"),
    # mma.sync
    Constraint(f"stages in {STAGE_CHOICES}", "pipeline depth of the mma.sync path", when=MMA),
    Constraint(f"acc <= {MAX_ACC}", "at most 128 fp32 accumulators per thread", when=MMA),
    Constraint("ksw <= 2 or acc <= 32",
               "four k-steps a stage, unrolled, with more than 32 accumulators spill", when=MMA),
    Constraint("(acc + 72 + 24 * (mf - 1)) * threads <= 65536",
               "the accumulators and ~72 registers of decode and addressing fit the register "
               "file", when=MMA),
    # wgmma
    Constraint("wg == 1", "wg = 1 selects the wgmma path (omit the key for mma.sync)", when=WG),
    Constraint("sm90a", "the wgmma path needs sm_90a", when=WG, device=True),
    Constraint("mf == 1 and wm % 4 == 0", "wgmma: a warpgroup is 4 warps of one strip each",
               when=WG),
    Constraint("ksw % 2 == 0", "wgmma: the A registers alternate between two sets", when=WG),
    Constraint(f"bn in {WG_BN_CHOICES}", "BN of the wgmma path (its register-A wrappers)",
               when=WG),
    Constraint("bn >= 64 or tma", "wgmma with cp.async stages: BN of 64 and up", when=WG),
    Constraint(f"stages in {WG_STAGE_CHOICES} or (tma and stages in {TMA_STAGE_CHOICES})",
               "pipeline depth of the wgmma path (deeper with TMA)", when=WG),
    Constraint("bk <= 64 or not tm", "wgmma, token-major: X rows of at most 128 bytes (swizzle)",
               when=WG),
    Constraint("(bn // 2 + 48) * threads <= 65536",
               "the accumulators and ~48 other registers fit the register file", when=WG),
    # wgmma fed by TMA
    Constraint("tma == 1", "tma = 1 selects the TMA-fed stages (omit the key otherwise)",
               when=TMA),
    Constraint("wg == 1 and wk == 1",
               "TMA: the wgmma path, one warpgroup column along K (a cluster may split K)",
               when=TMA),
    Constraint("bn >= 64 or tm",
               "TMA, feature-major: X's tile in boxes of 64 columns of N", when=TMA),
    Constraint("k8 or not tm",
               "TMA, token-major: X's rows 16-byte aligned (K % 8 == 0) for its tensor map",
               when=TMA),
    # A decoded into shared memory
    Constraint("sa == 1", "sa = 1 selects A decoded into shared memory (omit the key otherwise)",
               when=SA),
    Constraint("tma == 1", "sa: the TMA-fed kernel", when=SA),
    # W as lane records
    Constraint("lr == 1", "lr = 1 selects W as lane records (omit the key otherwise)", when=LR),
    Constraint("sa == 1",
               "lr: with A decoded into shared memory (sa, itself the TMA kernel's; with A "
               "in registers ptxas serializes the wgmma)", when=LR),
    # the bitmaps with register values (the mma.sync kernels only: check_keys;
    # lane records there were at most 3% faster than rv, storing 0.31 bytes
    # more an entry)
    Constraint("rv == 1", "rv = 1 selects the bitmaps with register values (omit the key "
               "otherwise)", when=RV),
    # fixed offsets (the mma.sync kernels alone: check_keys; check refuses
    # a matrix whose schedule is not regular: bitmap.regular)
    Constraint("fx == 1", "fx = 1 selects fixed offsets (omit the key otherwise)", when=FX),
    # the GPU's (Python only)
    Constraint("ck == 1 or sm90", "clusters need sm_90", device=True),
    Constraint("smem <= smem_limit", "the shared memory fits the GPU's per-block limit",
               device=True),
]

SPACE = Space(choices={"bn": BN_CHOICES, "stages": STAGE_CHOICES, "ck": CK_CHOICES},
              constraints=TABLE, derived=DERIVED,
              defaults={"wg": 0, "tma": 0, "sa": 0, "lr": 0, "rv": 0, "fx": 0})


def problem(layout_: str, vmax: int, smax: int, k: int) -> dict:
    """The table's constants the problem fixes: the layout, the largest
    stage's values and the most stages of a row block (the plan's, for the
    (bm, ks) of a configuration; a CTA keeps its share of a block's stage
    table in shared memory), and whether K is a multiple of 8."""
    return {"tm": int(layout_ == "tm"), "vmax": int(vmax), "smax": int(smax),
            "k8": int(k % 8 == 0)}


def windows(config: dict) -> bool:
    """Whether the configuration's stages are whole windows of k-steps
    (bitmap.layout): the TMA kernels load a stage's X as one box."""
    return bool(config.get("tma", 0))


def lanes(config: dict) -> bool:
    """Whether the configuration reads W as lane records (bitmap.py)."""
    return bool(config.get("lr", 0))


def regvals(config: dict) -> bool:
    """Whether the configuration reads the bitmaps with register values
    (bitmap.py)."""
    return bool(config.get("rv", 0))


def fixed(config: dict) -> bool:
    """Whether the configuration computes its offsets (bitmap.pack's
    `fixed`): no block or stage table read before the first copies."""
    return bool(config.get("fx", 0))


def bm_ks(config: dict) -> tuple[int, int]:
    return 16 * int(config["mf"]) * int(config["wm"]), int(config["ksw"]) * int(config["wk"])


def device_constants(device: Optional[dict]) -> Optional[dict]:
    if device is None:
        return None
    arch = str(device.get("arch", ""))
    major = int(device.get("cc_major", 0) or 0)
    found = re.fullmatch(r"(?:sm|compute)_(\d+?)\d[af]?", arch)
    if not major and found:
        major = int(found.group(1))
    return {"smem_limit": smem_limit(device), "sm90a": int(arch == "sm_90a"),
            "sm90": int(major >= 9)}


def check_keys(config: dict) -> None:
    keys = tuple(sorted(config))
    if keys not in (KEYS, WG_KEYS, TMA_KEYS, SA_KEYS, LR_KEYS, SA_LR_KEYS, RV_KEYS, FX_KEYS,
                    RV_FX_KEYS):
        raise ConfigError(f"csr (fp16/bf16) config needs the keys {', '.join(KEYS)} "
                          f"(and wg = 1 for wgmma, with tma = 1 for its TMA-fed stages, "
                          f"with sa = 1 for A decoded into shared memory and lr = 1 for "
                          f"W as lane records; rv = 1 for mma.sync with register values; "
                          f"fx = 1 for mma.sync with fixed offsets), got {', '.join(keys)}")
    for key in keys:
        v = config[key]
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise ConfigError(f"{key} must be an integer, got {v!r}")


def check(config: dict, matrix: SparseMatrix, op: Operation,
          device: Optional[dict] = None) -> None:
    check_keys(config)
    bm, ks = bm_ks(config)
    # the structural rules first (bm and ks index the plan)
    SPACE.check(config, problem(op.layout, 0, 0, matrix.cols))
    if bm < 16 or ks < 1:
        raise ConfigError(f"bm = {bm} and ks = {ks}: at least one strip and one k-step")
    lay = bitmap.cached_layout(matrix, bm, ks, windows(config))
    # the register variants store whole registers (their stages' 16-bit values)
    per_stage = 2 * lay.stage_regs if lanes(config) or regvals(config) else lay.stage_values
    vmax = int(per_stage.max(initial=0))
    if fixed(config):
        if not bitmap.regular(lay):
            raise ConfigError("fx: fixed offsets need every row block to hold every k-step "
                              f"(a regular schedule); this matrix's {bm}-row blocks skip some")
        vmax = bitmap.fixed_stride(per_stage)
    SPACE.check(config, problem(op.layout, vmax, lay.smax, matrix.cols),
                device_constants(device))


# ---- the search space ---------------------------------------------------------------------
# (mf, wm) pairs: rows of a row block 64 or 128 (16, 32 for matrices of few rows)
MMA_SHAPES = ((1, 4), (2, 2), (2, 4), (1, 8))
SMALL_SHAPES = ((1, 1), (1, 2))
DECODE_BN = (16, 64)
RV_DENSITY = 0.2   # at or below: the hints put the register-values tiles first
PREFILL_BN = (64, 128)


def search_space(matrix: SparseMatrix, op: Operation, device: Optional[dict]) -> list[dict]:
    """The configurations the tuner searches (about 190 on sm_80, 470 on
    sm_90a, a quarter of them with fixed offsets where the schedule is
    regular): decode-shaped ones (BN 16 or 64, 4 stages, warps and clusters
    splitting K for parallelism) and prefill-shaped ones (BN 64-256; wgmma
    on sm_90a).  N is not known here: the space covers both; the hints put
    each regime's likely best first."""
    consts = device_constants(device) or {"sm90a": 1, "sm90": 1}
    ck_choices = CK_CHOICES[:3] if consts.get("sm90") else (1,)
    # blocks of 16 and 32 rows: for few rows, and without clusters (sm_80)
    # the parallelism of decode; on sm_90 blocks of 32 rows for decode
    # (more CTAs: 4096 x 4096 at density 0.1, N = 16, token-major ran in
    # 0.0146 ms with 32-row blocks against 0.0158 ms with 64, H100)
    small = SMALL_SHAPES if matrix.rows <= 512 or not consts.get("sm90") else ((1, 2),)
    cands = []
    for mf, wm in MMA_SHAPES + small:
        for wk in (1, 2, 4):
            for ksw in (1, 2, 4):
                for bn in DECODE_BN:
                    for ck in ck_choices:
                        base = dict(mf=mf, wm=wm, wk=wk, ksw=ksw, bn=bn, stages=4, ck=ck)
                        cands.append(base)
                        if ksw == 4 and bn == 16:
                            # the bitmaps with register values: fewer
                            # instructions a tile, 2 d (1 - d) bytes more an
                            # entry (they win at low density, N = 16)
                            cands.append(dict(base, rv=1))
                        if ksw == 4:
                            # fixed offsets (matrices whose every row block
                            # holds every k-step): the first copies wait on
                            # no table
                            cands.append(dict(base, fx=1))
                            if bn == 16:
                                cands.append(dict(base, rv=1, fx=1))
    for mf, wm in MMA_SHAPES + (SMALL_SHAPES if matrix.rows <= 512 else ()):
        for ksw in (1, 2, 4):
            for bn in PREFILL_BN + (256,) * (mf == 1):
                for stages in (3, 4):
                    cands.append(dict(mf=mf, wm=wm, wk=1, ksw=ksw, bn=bn, stages=stages, ck=1))
    if consts.get("sm90a"):
        for wm in (4, 8):
            for ksw in (2, 4):
                for bn in PREFILL_WG_BN:
                    for stages in (3, 4):
                        cands.append(dict(mf=1, wm=wm, wk=1, ksw=ksw, bn=bn, stages=stages,
                                          ck=1, wg=1))
            for wk in (1, 2):
                for ck in (2, 4):
                    cands.append(dict(mf=1, wm=wm, wk=wk, ksw=2, bn=64, stages=4, ck=ck, wg=1))
        # the same prefill tiles fed by TMA (token-major: K % 8 == 0)
        for ksw in (2, 4):
            for bn in (128, 256):
                for stages in (3, 4):
                    # (sa with the bitmaps: 12-17% slower than either, not offered)
                    for extra in ({}, {"sa": 1, "lr": 1}):
                        cands.append(dict(mf=1, wm=8, wk=1, ksw=ksw, bn=bn, stages=stages,
                                          ck=1, wg=1, tma=1, **extra))
        # decode tiles fed by TMA: a few tokens (wgmma n16 and n64), a cluster
        # splitting K for parallelism, deeper pipelines of small stages
        # (64-row blocks: 128 in clusters of 2, 4 and 8 were 25-90% slower
        # on every shape probed at N = 64; 64 rows with bn 16 or 32, several
        # CTAs along N = 64, were slower too: bench/RESULTS.md, 2026-11-26)
        for bn in TMA_DECODE_BN:
            for ck in CK_CHOICES:
                for stages in (4, 6):
                    cands.append(dict(TMA_DECODE, bn=bn, stages=stages, ck=ck))
                if ck > 1:
                    cands.append(dict(TMA_DECODE, bn=bn, ck=ck, sa=1, lr=1))
    return _valid(cands, matrix, op, device)


def _valid(cands: list[dict], matrix: SparseMatrix, op: Operation,
           device: Optional[dict]) -> list[dict]:
    """The candidates that pass the table, each once, in order."""
    return accepted_by(lambda c: check(c, matrix, op, device), cands)


def hint_configs(matrix: SparseMatrix, op: Operation, device: Optional[dict],
                 n: Optional[int] = None) -> list[dict]:
    """Measured first: one per regime (N known: its regime's first,
    by_tile_n).  Decode (N <= 64): on Hopper rows in
    blocks of 32 (N = 16) or 64, K split over 4 or 2 warps of four k-steps
    and a cluster of 2 (enough CTAs to fill the GPU with 4096-row
    matrices; elsewhere blocks of 32 rows and 4 warps along K), and on
    sm_90a the TMA-fed decode tiles (64-row blocks, K split over clusters
    of 2 to 8; at N = 64 first); prefill: wgmma 128 x 256 with four
    k-steps a stage (Hopper) or mma.sync 64 x 128."""
    consts = device_constants(device) or {"sm90a": 1, "sm90": 1}
    if consts.get("sm90"):
        # four k-steps a warp and stage: a stage's fixed work (its barrier,
        # its copies) is shared by more tiles (H100, 4096 x 4096,
        # N = 16, density 0.1: 0.0123 ms against 0.0146 with two; N = 64:
        # 0.0234 against 0.0343; 11008 x 4096, N = 16, density 0.3: 16-row
        # pairs of strips, 0.0271 ms)
        mma16 = dict(mf=1, wm=2, wk=4, ksw=4, bn=16, stages=4, ck=2)
        mma16_pairs = dict(mf=2, wm=2, wk=2, ksw=4, bn=16, stages=4, ck=2)
        mma64 = dict(mf=1, wm=4, wk=2, ksw=4, bn=64, stages=4, ck=2)
        if consts.get("sm90a"):
            # the decode tiles fed by TMA, K split over a cluster (H100,
            # bench/RESULTS.md 2026-11-26): at N = 16 clusters of 4 on
            # 11008 x 4096 (0.0225 ms against 0.0268 at density 0.1) and of 8
            # on 4096 x 11008 (0.0293 against 0.0313 at 0.5), of 2 at 0.5
            # on 11008 rows (0.0285 against 0.0353); at N = 64 first, lane
            # records in pairs (4096 x 4096 at 0.1: 0.0209 against 0.0221;
            # 11008 x 4096: 0.0371 against 0.0531), the bitmaps in pairs
            # (11008 x 4096 at 0.5: 0.0400 against 0.0602) and clusters of 8
            # and 4 (4096 x 11008: 0.0348 against 0.0445 at 0.1, 0.0445
            # against 0.0522 at 0.5)
            dec16 = [mma16, dict(TMA_DECODE, bn=16, ck=4), dict(TMA_DECODE, bn=16, ck=8),
                     mma16_pairs, dict(TMA_DECODE, bn=16, ck=2)]
            if matrix.density <= RV_DENSITY:
                # at low density the bitmaps with register values first (H100,
                # N = 16, density 0.1: 4096 x 4096 0.0109 ms against 0.0118;
                # 11008 x 4096, pairs of strips, 0.0194 against 0.0234;
                # 4096 x 11008 0.0207 against 0.0239; level to 5% ahead at
                # 0.2, 2-12% behind at 0.3; where the TMA tiles won none),
                # pairs of strips with four warps along K first (the tuner's
                # winners on 4096 x 4096 and 4096 x 11008 at 0.1 with fixed
                # offsets: 0.0084 ms against 0.0087-0.0089 for mma16)
                dec16 = [dict(mma16_pairs, wk=4, rv=1), dict(mma16, rv=1),
                         dict(mma16_pairs, rv=1), mma16] + dec16[1:]
            dec64 = [dict(TMA_DECODE, bn=64, ck=2, sa=1, lr=1), dict(TMA_DECODE, bn=64, ck=2),
                     dict(TMA_DECODE, bn=64, ck=8), dict(TMA_DECODE, bn=64, ck=4), mma64]
        else:
            dec16, dec64 = [mma16, mma16_pairs], [mma64]
            if matrix.density <= RV_DENSITY:
                dec16 = [dict(mma16, rv=1), dict(mma16_pairs, rv=1)] + dec16
        # N known: its tile's width first; unknown: in turn
        if n is None:
            hints = [c for pair in itertools.zip_longest(dec16, dec64) for c in pair if c]
        else:
            hints = dec64 + dec16 if 16 < n <= 64 else dec16 + dec64
    else:  # no clusters: smaller blocks, more warps along K
        hints = [dict(mf=1, wm=2, wk=4, ksw=1, bn=16, stages=4, ck=1),
                 dict(mf=1, wm=2, wk=4, ksw=1, bn=64, stages=4, ck=1)]
    if consts.get("sm90a"):
        # prefill: wgmma 128 x 256, four k-steps a stage (H100, 4096 x 4096 x
        # 4096 token-major at density 0.3: 0.335 ms against 0.397 with two
        # in one run; bench/RESULTS.md, 2026-11-26), with the stages fed
        # by TMA (token-major where K % 8 == 0: 0.222 ms against
        # 0.292 with cp.async, 4 stages against 3: 0.233; feature-major
        # 0.211 against 0.366), first with W as lane records decoded into
        # shared memory (0.208 ms against 0.218 at density 0.3, 0.192
        # against 0.212 at 0.1; feature-major level: 0.213 against 0.211)
        hints += [dict(mf=1, wm=8, wk=1, ksw=4, bn=256, stages=4, ck=1, wg=1, tma=1, sa=1,
                       lr=1),
                  dict(mf=1, wm=8, wk=1, ksw=4, bn=256, stages=4, ck=1, wg=1, tma=1),
                  dict(mf=1, wm=8, wk=1, ksw=4, bn=256, stages=4, ck=1, wg=1),
                  dict(mf=1, wm=4, wk=1, ksw=2, bn=64, stages=4, ck=4, wg=1)]
    hints.append(dict(mf=2, wm=2, wk=1, ksw=2, bn=128, stages=3, ck=1))
    return _valid(_fixed_where_regular(by_tile_n(hints, n), matrix, op, device),
                  matrix, op, device)


def _fixed_where_regular(hints: list[dict], matrix: SparseMatrix, op: Operation,
                         device: Optional[dict]) -> list[dict]:
    """Each mma.sync decode hint with fixed offsets instead, where the
    matrix's schedule is regular (every row block holds every k-step): on
    every pair measured the fixed tile was the faster, by 4-24% (H100, N =
    16, densities 0.1 and 0.5, 4096 x 512 to 11008 x 4096; bench/RESULTS.md,
    2026-11-27); elsewhere the hint as it was."""
    out = []
    for h in hints:
        if h.get("ksw") == 4 and not h.get("wg") and not h.get("tma"):
            try:
                check(dict(h, fx=1), matrix, op, device)
                h = dict(h, fx=1)
            except ConfigError:
                pass
        out.append(h)
    return out


# ---- plan and render ------------------------------------------------------------------------

@dataclass
class TcPlan:
    """What a tensor-core csr kernel is built from."""
    name: str
    dtype: str
    layout: str
    shape: tuple[int, int]
    nnz: int
    config: dict
    packed: bytes
    offsets: dict
    num_blocks: int
    total_stages: int
    vmax: int
    smax: int
    has_bias: bool
    fixed_stride: int = 0   # fx: the values a stage (bitmap.pack)
    perm: Optional[np.ndarray] = None
    matrix_name: str = ""
    epilogue: dict = field(default_factory=dict)


def plan(matrix: SparseMatrix, op: Operation, tag: str, config: dict,
         bias: Optional[np.ndarray]) -> TcPlan:
    check(config, matrix, op)
    bm, ks = bm_ks(config)
    if bias is not None:
        bias = np.asarray(bias, dtype=np.float64).reshape(-1)
        if bias.shape != (matrix.rows,):
            raise ValueError(f"bias has {bias.size} entries, expected M = {matrix.rows}")
        if not np.all(np.isfinite(bias)):
            raise ValueError("bias contains NaN or infinity")
    if op.epilogue.bias and bias is None:
        raise ValueError("the epilogue adds a bias but none was given")
    if not op.epilogue.bias and bias is not None:
        raise ValueError("a bias was given but the epilogue adds none")
    win, lr, rv, fx = windows(config), lanes(config), regvals(config), fixed(config)
    key = ("csr.bitmap.pack", op.dtype, bm, ks, win, lr, rv, fx)
    if bias is None:
        p = matrix.cached(key, lambda: bitmap.pack(matrix, op.dtype, bm, ks, windows=win,
                                                   lanes=lr, regvals=rv, fixed=fx))
    else:
        p = bitmap.pack(matrix, op.dtype, bm, ks, bias, windows=win, lanes=lr, regvals=rv,
                        fixed=fx)
    cfg = {key_: int(config[key_]) for key_ in config}
    return TcPlan(config_name(tag, cfg, op), op.dtype, op.layout, matrix.shape, matrix.nnz, cfg,
                  p.data, p.offsets, p.num_blocks, p.total_stages, p.vmax, p.smax,
                  bias is not None, p.fixed_stride,
                  None if matrix.perm is None else matrix.perm.copy(), matrix.name,
                  dict(activation=op.epilogue.activation, scale=float(op.epilogue.scale)))


def min_blocks(config: dict) -> int:
    """CTAs per SM the register allocation must allow (__launch_bounds__):
    as many as leave each thread room for its accumulators, the decode and
    the addressing (an estimate; the full-space compile test holds it to
    no spills).  A quarter of the SM's warps share each 16K-register
    partition, so b CTAs of w warps leave 512 / ceil(b w / 4) registers a
    thread."""
    warps = config["wm"] * config["wk"] + config.get("tma", 0)   # tma: the producer warp
    acc = config["mf"] * config["bn"] // 2
    # the X loader's copies a thread issues per stage (each keeps a k-step
    # and an address)
    xiters = -(-(2 * config["ksw"] * config["wk"] * config["bn"]) // (32 * warps))
    need = min(255, acc + 72 + 24 * (config["mf"] - 1) + 8 * (config["ksw"] - 1) + 3 * xiters)
    best = 1
    for b in range(1, 9):
        if b * warps > 64 or (512 // -(-b * warps // 4)) // 8 * 8 < need:
            break
        best = b
    if config.get("wg") and warps == 8 and config["bn"] <= 128:
        # wgmma, 8 warps, at most 64 accumulators: 2 CTAs an SM (128
        # registers a thread; asked for 1, ptxas took 136 for bn 128 once the
        # X descriptors stepped, and it ran 19% slower at 4096 x 4096 x 4096;
        # none of these spills, fp16 or bf16, with or without bias + GELU)
        best = max(best, 2)
    return best


def render_kernel(p: TcPlan, op: Operation, float_literal) -> Kernel:
    c = p.config
    m, k = p.shape
    wg = int(c.get("wg", 0))
    tma = int(c.get("tma", 0))
    sa = int(c.get("sa", 0))
    lr = int(c.get("lr", 0))
    rv = int(c.get("rv", 0))
    prob = problem(p.layout, p.vmax, p.smax, k)
    checks = SPACE.static_asserts(c, prob, TABLE_SOURCE)
    env = SPACE.env(c, prob)
    threads = env["threads"]
    source = render("csr_tc.cu.j2", name=p.name, dtype=p.dtype, layout=p.layout, m=m, k=k,
                    nnz=p.nnz, mf=c["mf"], wm=c["wm"], wk=c["wk"], ksw=c["ksw"], bn=c["bn"],
                    stages=c["stages"], ck=c["ck"], wg=wg, tma=tma, sa=sa, lr=lr, rv=rv,
                    vmax=p.vmax, tabs=env["tabs"],
                    bm=env["bm"], bk=env["bk"], fixed_stride=p.fixed_stride,
                    block_stages=p.smax, kt=max(1, -(-k // bitmap.TILE)),
                    num_blocks=p.num_blocks, off=p.offsets, has_bias=p.has_bias,
                    act=op.act_code, scale=float_literal(np.float32(op.epilogue.scale)),
                    threads=threads, min_blocks=min_blocks(c), constraints=checks)
    launch = make_launch(grid=(max(1, p.num_blocks) * c["ck"],), block=(threads,), n_axis=1,
                         n_tile=c["bn"], shared_bytes=env["smem"])
    return Kernel(name=p.name, source=source, packed=p.packed, launch=launch, config=dict(c))


def unpack(p: TcPlan) -> SparseMatrix:
    mat, _ = bitmap.unpack(p.packed)
    mat.perm = None if p.perm is None else p.perm.copy()
    mat.name = p.matrix_name
    return mat


def bytes_per_entry(density: float) -> float:
    """Bytes the format stores per entry of W at `density` (random
    pattern, every tile nonempty): 48 per 256 entries and 2 per nonzero."""
    return bitmap.REC_BYTES / 256 + 2 * density


def speedup_limit(density: float) -> float:
    """Dense fp16 weight bytes over the format's: what a memory-bound
    decode can gain at most."""
    return 2.0 / bytes_per_entry(density) if density < 1 else math.nan
