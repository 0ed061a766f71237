"""nm24: 2:4 semi-structured sparse W (in every aligned group of 4 along K,
at most 2 nonzeros) times dense X on Sparse Tensor Cores (fp16 / bf16 in,
fp32 accumulate), on two paths:

- `mma.sp::ordered_metadata` m16n8k32 (sm_80 and later; templates/include/
  sf/nm24.cuh), warps of a CTA tiling BM x BN;
- on sm_90a, Hopper's sparse warpgroup MMA `wgmma.mma_async.sp` m64nNk32
  (config key `wg`; sf/nm24_sm90.cuh): `wm` x `wn` warpgroups, each owning
  a 64 x BN/wn tile, operands in shared memory.

pack.py compresses and shuffles W into the order the kernel consumes it;
the packed buffer holds the values, the metadata and the bias (fp32, MP
entries, original row order).  M is padded to the CTA tile BM and K to the
stage depth BK (both with zeros), so the kernel's weight loads need no
guards.  Matrices with more than two nonzeros in some group are refused
(pruning keeps the 2 largest |w| of every group).  Analysis: the groups
over 2 and the fraction of |W| that 2:4 pruning would drop.  The device
code is templates/include/sf/nm24.cuh.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from .. import register
from ...family import DECODE_MAX_N, Family, Fit, PatternError, Pruned, by_tile_n
from ...kernel import (ConfigError, Kernel, Operation, config_name, make_launch, render,
                       sm_count, smem_limit)
from ...matrix import SparseMatrix, from_device_bytes
from ...space import Constraint, Space
from .pack import (AE_STEP, FRAG_BYTES, KSTEP, META_BYTES, MTILE, first_violation,
                   interleave_ae, pack_matrix, split_ae, unpack_meta, unpack_values,
                   unpack_values_sm90)

BM_CHOICES = (64, 128)
BN_CHOICES = (64, 128, 256)
BK_CHOICES = (32, 64)
STAGE_CHOICES = (2, 3, 4)
WARP_LAYOUTS = ((2, 2), (1, 4), (4, 1), (2, 4), (4, 2))
CONFIG_KEYS = ("bm", "bn", "bk", "wm", "wn", "stages")
TABLE_SOURCE = "generator/families/nm24/__init__.py"

# The search space: choices, derived sizes (nm24.cuh's Config names) and
# the constraint table (generator/space.py).  `tm` is 1 for token-major.
SPACE = Space(
    choices={"bm": BM_CHOICES, "bn": BN_CHOICES, "bk": BK_CHOICES, "stages": STAGE_CHOICES},
    derived={
        "threads": "32 * wm * wn",
        "mi": "bm // wm // 16",
        "ni": "bn // wn // 8",
        "stage_bytes": f"bm // {MTILE} * (bk // {KSTEP}) * {FRAG_BYTES + META_BYTES} + bk * bn * 2",
        "b_cpr": "bk // 8 if tm else bn // 8",
        "c_bytes": "(bn if tm else bm) * ((bm if tm else bn) + 8) * 2",
        "smem": "max(stages * stage_bytes, c_bytes)",
    },
    constraints=[
        Constraint("bm % (16 * wm) == 0", "a warp's rows are whole m16 tiles"),
        Constraint("bn % (8 * wn) == 0", "a warp's columns are whole n8 tiles"),
        Constraint("mi * ni * 4 <= 128", "at most 128 fp32 accumulators per thread"),
        Constraint("b_cpr == 4 or b_cpr % 8 == 0", "B tile rows: 4 or a multiple of 8 chunks"),
        Constraint("stage_bytes % 128 == 0", "stages stay 128-byte aligned"),
        Constraint("threads <= 1024", "at most 1024 threads"),
        # the choices the kernel is tuned over (after the rules above, which
        # they imply, so that a configuration off the choices breaks those first)
        Constraint(f"bm in {BM_CHOICES}", "BM of a CTA tile"),
        Constraint(f"bn in {BN_CHOICES}", "BN of a CTA tile"),
        Constraint(f"bk in {BK_CHOICES}", "BK: one or two mma.sp K steps per stage"),
        Constraint(f"stages in {STAGE_CHOICES}", "pipeline depth"),
        Constraint("wm in (1, 2, 4) and wn in (1, 2, 4) and wm * wn in (4, 8)",
                   "4 or 8 warps as 2x2, 1x4, 4x1, 2x4 or 4x2"),
        Constraint("smem <= smem_limit", "the shared memory fits the GPU's per-block limit",
                   device=True),
    ])


# The sm_90a path (`wg`: 1): wm x wn warpgroups, each a 64 x (bn / wn) tile
# of sparse wgmma.
WG_BM_CHOICES = (64, 128, 256)
WG_BN_CHOICES = (64, 128, 256)
WG_BK_CHOICES = (32, 64, 128)
WG_STAGE_CHOICES = (3, 4, 5, 6)
WG_KEYS = CONFIG_KEYS + ("wg",)
WG_SPACE = Space(
    choices={"bm": WG_BM_CHOICES, "bn": WG_BN_CHOICES, "bk": WG_BK_CHOICES, "wn": (1, 2),
             "stages": WG_STAGE_CHOICES},
    derived={
        "wg_n": "bn // wn",
        "threads": "128 * wm * wn",
        "b_bytes": "bk * bn * 2",
        "a_bytes": "bm * bk",
        "e_bytes": "bm * bk // 8",
        "stage_bytes": "cdiv(b_bytes + a_bytes + e_bytes, 1024) * 1024",
        "c_bytes": "(bn if tm else bm) * ((bm if tm else bn) + 8) * 2",
        "smem": "max(stages * stage_bytes, c_bytes) + 1024",
        # the accumulators and about 72 registers of addresses and epilogue
        "regs": "threads * (wg_n // 2 + 72)",
    },
    constraints=[
        Constraint("wg == 1", "the sparse wgmma path"),
        Constraint("bm == 64 * wm", "a warpgroup's rows are one 64-row wgmma tile"),
        Constraint("wg_n * wn == bn and wg_n in (64, 128, 256)",
                   "a warpgroup's columns are one wgmma N of 64, 128 or 256"),
        Constraint("not tm or bk in (64, 128)",
                   "token-major X tile rows are whole 128-byte swizzle atoms"),
        Constraint("(bk * bn // 8) % threads == 0 and threads % ((bk if tm else bn) // 8) == 0",
                   "the threads cover whole rows of the X tile"),
        Constraint("regs <= 65536", "the accumulators (bn / wn / 2 a thread) and the rest fit "
                   "the registers"),
        Constraint("wg_n < 256 or (bk <= 64 and threads >= 256)",
                   "a 256-wide warpgroup tile runs out of registers unless it copies stages "
                   "of at most 64 columns of K with at least two warpgroups"),
        Constraint(f"bn in {WG_BN_CHOICES}", "BN of a CTA tile"),
        Constraint(f"bk in {WG_BK_CHOICES}", "BK: one to four sparse wgmma K steps per stage"),
        Constraint(f"stages in {WG_STAGE_CHOICES}", "pipeline depth (two stages behind the copies)"),
        Constraint("wm in (1, 2, 4) and wn in (1, 2)", "1, 2 or 4 warpgroups along M, 1 or 2 along N"),
        Constraint("sm90a == 1", "sparse wgmma needs sm_90a", device=True),
        Constraint("smem <= smem_limit", "the shared memory fits the GPU's per-block limit",
                   device=True),
    ])


# The warp-specialized TMA path (`wg`: 1, `tma`: 1): wm x wn consumer
# warpgroups and a producer warp; the X tile shared by clusters of `cm`
# CTAs along M.
TMA_STAGE_CHOICES = (3, 4, 5, 6, 8, 12)
TMA_KEYS = WG_KEYS + ("tma", "cm", "ks", "mw", "mt", "ra", "rs")
TMA_OPTIONAL = ("ks", "mw", "mt", "ra", "rs")   # keys with defaults
# `rs` 1: csr's split 2:4 residual in steps of compacted columns
# (generator/families/csr/split24.py); never a 2:4 matrix's own key, so
# neither among the choices the family searches nor written into its
# configurations: the problem's environment holds rs 0 (_problem), a
# configuration's own rs overrides it
MT_CHOICES = (1, 2, 3, 4, 6, 8)
# below 64: decode's few tokens; 192: 22 column tiles of N = 4096 (132 CTAs
# of 128 x 192 on 768 rows, one full wave)
TMA_BN_CHOICES = (16, 32, 64, 128, 192, 256)
TMA_SPACE = Space(
    choices={"bm": WG_BM_CHOICES, "bn": TMA_BN_CHOICES, "bk": WG_BK_CHOICES, "wn": (1, 2),
             "stages": TMA_STAGE_CHOICES, "cm": (1, 2), "ks": (1, 2, 4), "mw": (1, 2),
             "mt": MT_CHOICES, "ra": (0, 1)},
    defaults={"ks": 1, "mw": 1, "mt": 1, "ra": 0},
    derived={
        "wg_n": "bn // wn",
        "consumers": "128 * wm * wn",
        "threads": "consumers + 32",
        "b_bytes": "bk * bn * 2",
        "ae_bytes": f"bm // 64 * (bk // 32) * {AE_STEP}",
        "acc_regs": "mw * wg_n // 2",
        # (rs) each stage also holds its K tile's list of residual columns
        "stage_bytes": "cdiv(b_bytes + ae_bytes + 64 * rs, 1024) * 1024",
        "c_bytes": "(bn if tm else bm) * ((bm if tm else bn) + 8) * 2",
        # the split's partial tile: [bm][bn + 4] floats, token-major [bn][bm + 4]
        "p_bytes": "((bn * (bm + 4)) if tm else (bm * (bn + 4))) * 4 if ks > 1 else 0",
        # split K: the partial sums the cluster's other CTAs push for this CTA's rows
        "recv_bytes": "(ks - 1) * (bm // ks) * bn * 4 if ks > 1 else 0",
        # (rs) two halves of a step's 32 columns of X and two slots of its weights
        "rs_bytes": f"rs * 2 * (bn * 64 + bm // 64 * {AE_STEP})",
        # with several tiles a CTA, the output tile has a buffer of its own
        # mt > 1, one 64-row wgmma tile a warpgroup: each warpgroup's slice
        # buffer (64 x 64, rows padded by 16 bytes); with two, the whole output tile
        "slice_bytes": "64 * (64 + 8) * 2",
        "out_bytes": "wm * wn * slice_bytes if mw == 1 else c_bytes",
        "smem": "2048 + (stages * stage_bytes + out_bytes if mt > 1 else "
                "max(max(stages * stage_bytes, c_bytes), p_bytes)) + recv_bytes + rs_bytes",
        # the accumulators and about 40 registers of addresses and epilogue
        "regs": "threads * (acc_regs + 40)",
    },
    constraints=[
        Constraint("wg == 1 and tma == 1", "the warp-specialized TMA path"),
        Constraint("mw in (1, 2)", "1 or 2 wgmma tiles of 64 rows per warpgroup"),
        Constraint("ks in (1, 2, 4)", "K split over 1, 2 or 4 CTAs of a cluster"),
        Constraint("bm == 64 * mw * wm", "a warpgroup's rows are mw 64-row wgmma tiles"),
        # (both, a cluster of CM x KS, ran slower than either alone on every
        # token-major S2 problem: bench/RESULTS.md, 2026-11-26)
        Constraint("cm == 1 or ks == 1", "a cluster shares the X tile or splits K, not both"),
        Constraint("rs == 0 or (not tm and ks == 1 and mt == 1 and wn == 1 and mw == 1 and "
                   "bn >= 64)",
                   "the residual in steps: feature-major, no split K, one tile a CTA, one "
                   "64-row wgmma tile a warpgroup, whole 64-column X boxes"),
        Constraint(f"mt in {MT_CHOICES}", "tiles along M a CTA takes in turn"),
        Constraint("mt == 1 or ks == 1", "several tiles a CTA only without split K"),
        Constraint("ra in (0, 1)", "consecutive CTAs along N (0) or down M (1)"),
        Constraint("ra == 0 or bn >= 128", "CTAs ordered down M only for prefill's wide tiles "
                   "(decode has one column of N tiles)"),
        # (it won only on them, and lost 2-10% on the 128 x 256 cluster tile:
        # bench/RESULTS.md, 2026-11-26)
        Constraint("ra == 0 or bm == 256", "CTAs ordered down M only on 256-row tiles"),
        Constraint("mt == 1 or bn >= 128", "several tiles a CTA only for prefill's wide tiles "
                   "(they hide a tile's pipeline fill and output store behind the next)"),
        # every value of mt on every tile would triple the space a search
        # covers (482 to 1532 configurations); mt goes with the tiles the
        # prefill hints take (the 128 x 256 one since its output went to
        # slices: bench/RESULTS.md, 2026-11-28)
        Constraint("mt == 1 or (bm == 256 and cm == 1) or (bm == 128 and bn == 256)",
                   "several tiles a CTA only on 256-row tiles without a cluster and on the "
                   "128 x 256 tile"),
        # where each knob pays: splitting K and deep pipelines for decode's few
        # columns, sharing the X tile for prefill's wide ones
        Constraint("ks == 1 or bn <= 64", "K is split only for tiles of at most 64 columns"),
        Constraint("stages <= 6 or bn <= 64", "pipelines deeper than 6 only for tiles of at "
                   "most 64 columns"),
        Constraint("cm == 1 or tm or bn >= 128", "feature-major X tiles are shared only by tiles "
                   "of 128 columns or more (whole 64-column boxes for each CTA)"),
        Constraint("(mw == 1 and wn == 1) or bn >= 128",
                   "two tiles per warpgroup, or two warpgroups along N, only for 128 columns or more"),
        Constraint("wg_n * wn == bn and wg_n in (16, 32, 64, 128, 192, 256)",
                   "a warpgroup's columns are one wgmma N of 16, 32, 64, 128, 192 or 256"),
        # (feature-major X tiles are whole 64-column swizzle atoms, or one
        # atom of 16 or 32 columns, 32- or 64-byte swizzle: what the rules
        # on wg_n and wn above already leave)
        Constraint("not tm or bk in (64, 128)",
                   "token-major X tile rows are whole 128-byte swizzle atoms"),
        Constraint("not tm or k % 8 == 0",
                   "token-major X rows (K values) must be 16-byte aligned to be mapped"),
        Constraint("cm in (1, 2)", "1 or 2 CTAs of a cluster share the X tile"),
        Constraint("regs <= 65536 and acc_regs <= 128",
                   "the accumulators (mw x bn / wn / 2 a thread, at most 128) and the rest fit "
                   "the registers"),
        Constraint(f"bn in {TMA_BN_CHOICES}", "BN of a CTA tile"),
        Constraint(f"bk in {WG_BK_CHOICES}", "BK: one to four sparse wgmma K steps per stage"),
        Constraint(f"stages in {TMA_STAGE_CHOICES}", "pipeline depth"),
        Constraint("wm in (1, 2, 4) and wn in (1, 2)", "1, 2 or 4 warpgroups along M, 1 or 2 along N"),
        Constraint("sm90a == 1", "sparse wgmma and TMA need sm_90a", device=True),
        Constraint("smem <= smem_limit", "the shared memory fits the GPU's per-block limit",
                   device=True),
    ])


# one table per compute path (mma.sp, sparse wgmma, warp-specialized TMA)
PATH_TABLES = (SPACE, WG_SPACE, TMA_SPACE)


def is_wg(config: dict) -> bool:
    """Whether a configuration takes a sparse wgmma (sm_90a) path."""
    return bool(config.get("wg", 0))


def is_tma(config: dict) -> bool:
    """Whether it is the warp-specialized TMA path."""
    return bool(config.get("tma", 0))


def _space(config: dict) -> Space:
    return TMA_SPACE if is_tma(config) else WG_SPACE if is_wg(config) else SPACE


def _problem(op: Operation, k: int) -> dict:
    return _layout_problem(op.layout, k)


def _layout_problem(layout: str, k: int) -> dict:
    return {"tm": int(layout == "tm"), "k": k, "rs": 0}


def _device_env(device: Optional[dict]) -> dict:
    return {"smem_limit": smem_limit(device),
            "sm90a": int(not device or not device.get("arch") or device["arch"] == "sm_90a")}


def padded_shape(m: int, k: int, config: dict) -> tuple[int, int]:
    """(MP, KP): M and K padded as a configuration packs them (rows to the
    tile, a TMA cluster's tiles; K to the tile times its split)."""
    tma = is_tma(config)
    ks = config.get("ks", 1) if tma else 1
    return (_round_up(m, config["bm"] * (config["cm"] if tma else 1)),
            _round_up(k, config["bk"] * ks))


def _round_up(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


def _tile_slots(mp: int, bm: int, config: dict) -> int:
    """CTAs along M: one a tile, or (TMA, `mt` > 1) one for every `mt`
    tiles, the cluster's `cm` CTAs side by side."""
    if not is_tma(config):
        return mp // bm
    cm, mt = config.get("cm", 1), config.get("mt", 1)
    return cm * -(-(mp // (bm * cm)) // mt)


def _align16(x: int) -> int:
    return -(-x // 16) * 16


def smem_bytes(config: dict, layout: str, k: int = 0) -> int:
    """Dynamic shared memory of a configuration (the table's `smem`)."""
    return _space(config).env(config, _layout_problem(layout, k))["smem"]


# ---- analysis -------------------------------------------------------------------

@dataclass
class Nm24Fit:
    fits: bool
    violating_groups: int      # aligned groups of 4 with more than 2 nonzeros
    dropped_l1: float          # fraction of |W| that 2:4 pruning drops
    dropped_nnz: float         # fraction of the nonzeros it drops
    k_multiple_of_4: bool


def _group_ids(matrix: SparseMatrix) -> np.ndarray:
    """Group id of every nonzero (non-decreasing in CSR order)."""
    return matrix.row_ids() * -(-matrix.cols // 4) + matrix.indices // 4


def fits_nm24(matrix: SparseMatrix) -> bool:
    """True when every row has at most 2 nonzeros in every aligned group of
    4 along K (a partial last group of K % 4 columns included)."""
    return first_violation(matrix) is None


def nm24_fit(matrix: SparseMatrix) -> Nm24Fit:
    gid = _group_ids(matrix)
    nnz = gid.size
    k4 = matrix.cols % 4 == 0
    if nnz == 0:
        return Nm24Fit(True, 0, 0.0, 0.0, k4)
    a = np.abs(matrix.values.astype(np.float64))
    total = a.sum()
    # only groups with more than 2 nonzeros drop anything
    over = np.zeros(nnz, dtype=bool)
    if nnz > 2:
        third = np.flatnonzero(gid[2:] == gid[:-2])   # entry i + 2 shares i's group
        over[np.isin(gid, gid[third + 2])] = True
    sel = np.flatnonzero(over)
    gs, av = gid[sel], a[sel]
    order = np.lexsort((-av, gs))
    gs, av = gs[order], av[order]
    start = np.concatenate([[True], gs[1:] != gs[:-1]]) if gs.size else np.zeros(0, bool)
    run_start = np.maximum.accumulate(np.where(start, np.arange(gs.size), 0)) if gs.size else start
    drop = (np.arange(gs.size) - run_start) >= 2
    violating = int(start.sum())
    return Nm24Fit(violating == 0, violating,
                   float(av[drop].sum() / total) if total > 0 else 0.0,
                   float(drop.sum() / nnz), k4)


# ---- plan -------------------------------------------------------------------------

@dataclass
class Nm24Plan:
    """Everything the template needs for one matrix and configuration."""
    name: str
    dtype: str
    layout: str
    m: int
    k: int
    mp: int                  # M padded to BM
    kp: int                  # K padded to BK
    config: dict
    packed: bytes
    values_offset: int
    meta_offset: int
    bias_offset: int         # 0 when there is no bias
    has_bias: bool
    smem_bytes: int
    threads: int
    grid: tuple[int, int, int]   # for one N tile of BN
    perm: Optional[np.ndarray] = None
    epilogue: dict = field(default_factory=dict)
    # csr's split 2:4 format (csr/split24.py): the residual's sections in
    # `packed` (row offsets, records), 0 when there is none
    res_ptr: int = 0
    res_rec: int = 0
    rs_a: int = 0         # (rs) csr's split 2:4 residual in steps: the steps' weights,
    rs_ptr: int = 0       # each tile's first step, the step ends (the lists are in
    rs_ends: int = 0      # the 2:4 part's blocks at values_offset)


def top2_of_4(g: np.ndarray) -> np.ndarray:
    """The two largest of each group of 4 along the last axis (ties: the
    lower index first, as a stable sort of -g), as a boolean mask: entry i
    is kept when fewer than two entries beat it.  Six comparisons instead
    of a sort (a 11008 x 4096 matrix: 0.1 s against 1.3 s)."""
    beaten = np.zeros(g.shape, dtype=np.uint8)
    for i in range(4):
        for j in range(i + 1, 4):
            i_wins = g[..., i] >= g[..., j]     # i < j: a tie goes to i
            beaten[..., j] += i_wins
            beaten[..., i] += ~i_wins
    return beaten < 2


class Nm24Family(Family):
    name = "nm24"
    syntax = "nm24"
    summary = "2:4 semi-structured: at most 2 nonzeros in every aligned 4 along K"
    dtypes = ("fp16", "bf16")
    layouts = ("fm", "tm")
    auto_rank = 10

    def __init__(self):
        self._spaces: dict = {}   # search_space's, per (dtype, layout, K, device)

    # ---- the pattern --------------------------------------------------------
    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        return fits_nm24(matrix)

    def analyze(self, matrix: SparseMatrix) -> list[Fit]:
        n = nm24_fit(matrix)
        detail = ("every group of 4 has at most 2 nonzeros" if n.fits else
                  f"{n.violating_groups} groups over 2; 2:4 pruning drops "
                  f"{100 * n.dropped_l1:.1f}% of |W| ({100 * n.dropped_nnz:.1f}% of nonzeros)")
        if not n.k_multiple_of_4:
            detail += "; K is not a multiple of 4"
        return [Fit("nm24", "nm24", n.fits, n.dropped_l1, f"{n.dropped_l1:.3f} (|W| dropped)",
                    detail, asdict(n))]

    def detect(self, matrix: SparseMatrix) -> Optional[dict]:
        return {} if matrix.dtype in self.dtypes and fits_nm24(matrix) else None

    def prune(self, w: np.ndarray, params: dict, sparsity: float,
              rng: np.random.Generator) -> Pruned:
        """The 2 largest |w| of every aligned 4 along K (a partial last
        group of K % 4 columns keeps at most 2)."""
        if abs(sparsity - 0.5) > 1e-9:
            raise PatternError(f"nm24 keeps 2 of every 4 weights: sparsity must be 0.5, "
                               f"got {sparsity}")
        m, k = w.shape
        a = np.abs(w)
        mask = np.zeros((m, k), dtype=bool)
        full = k // 4 * 4
        if full:
            mask[:, :full] = top2_of_4(a[:, :full].reshape(m, -1, 4)).reshape(m, full)
        if k > full:
            g = a[:, full:].reshape(m, 1, k - full)
            top = np.argsort(-g, axis=2, kind="stable")[:, :, :2]
            gm = np.zeros(g.shape, dtype=bool)
            np.put_along_axis(gm, top, True, axis=2)
            mask[:, full:] = gm.reshape(m, k - full)
        return Pruned(mask)

    def synth(self, params: dict, m: int, k: int, density: float,
              rng: np.random.Generator) -> tuple[np.ndarray, Optional[np.ndarray]]:
        if k % 4:
            raise PatternError(f"nm24 needs K divisible by 4, got {k}")
        order = np.argsort(rng.random((m, k // 4, 4)), axis=2)
        mask = np.zeros((m, k // 4, 4), dtype=bool)
        np.put_along_axis(mask, order[:, :, :2], True, axis=2)
        return mask.reshape(m, k), None

    def densities(self, params: dict, asked: list) -> list:
        return [0.5]

    def dtype_for(self, dtype: str) -> str:
        return dtype if dtype in self.dtypes else "fp16"

    # ---- configurations -------------------------------------------------------
    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation,
                     params: dict, device: Optional[dict] = None) -> None:
        keys = (tuple(k_ for k_ in TMA_KEYS if k_ not in TMA_OPTIONAL) if "tma" in config
                else WG_KEYS if "wg" in config else CONFIG_KEYS)
        missing = [k for k in keys if k not in config]
        if missing:
            raise ConfigError(f"nm24 config lacks {', '.join(missing)} (needs {', '.join(keys)})")
        extra = sorted(set(config) - set(TMA_KEYS))
        if extra:
            raise ConfigError(f"nm24 config has unknown keys {', '.join(extra)}")
        for k_ in keys:
            if not isinstance(config[k_], (int, np.integer)) or isinstance(config[k_], bool):
                raise ConfigError(f"{k_}: must be an integer, got {config[k_]!r}")
        if config.get("rs", 0) not in (0, 1) or (config.get("rs") and not params.get("rs")):
            raise ConfigError("rs: 1 only for csr's split 2:4 residual (s24 3), else 0")
        self.check_op(op)
        _space(config).check(config, _problem(op, matrix.cols), _device_env(device))

    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        """mma.sp configurations elsewhere, the sparse wgmma ones (cp.async
        and TMA) on sm_90a, every one with no device named.  On sm_90a
        mma.sp is left out: sparse wgmma won every S1 and S2 problem on an
        H100 (bench/RESULTS.md, 6ca2191), and a quarter fewer candidates
        shortens the first search of a shape."""
        # check_config reads the matrix only for K and the operation only for
        # its dtype and layout: one filtering of the ~65,000 candidates
        # serves every layer of a shape (about a second each)
        hopper = bool(device and device.get("arch") == "sm_90a")
        key = (op.dtype, op.layout, matrix.cols, hopper,
               tuple(sorted(_device_env(device).items())))
        if key not in self._spaces:
            self._spaces[key] = self._filtered_space(matrix, op, params, device, hopper)
        return [dict(c) for c in self._spaces[key]]

    def _filtered_space(self, matrix, op, params, device, hopper: bool) -> list[dict]:
        candidates = [] if hopper else [dict(c, wm=wm, wn=wn, stages=stages)
                                        for c in SPACE.enumerate(("bm", "bn", "bk"))
                                        for wm, wn in WARP_LAYOUTS for stages in STAGE_CHOICES]
        candidates += [dict(c, wm=c["bm"] // 64, wg=1) for c in WG_SPACE.enumerate()]
        candidates += [dict(c, wm=c["bm"] // 64 // c["mw"], wg=1, tma=1)
                       for c in TMA_SPACE.enumerate() if c["bm"] >= 64 * c["mw"]]
        return self.accepted(candidates, matrix, op, params, device)

    def hint_configs(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None, n: Optional[int] = None) -> list[dict]:
        """Large tiles of sparse wgmma first on sm_90a (two warpgroups along
        M, the widest N the problem fills), decode's tiles first for a few
        tokens (by_regime); mma.sp's default elsewhere."""
        # (measured on an H100 and an H200, bench/nm24.py and bench/RESULTS.md:
        # the first four win prefill, the next five decode; a budgeted
        # search measures only its first few hints before it follows the
        # best, so the order counts)
        wg = [dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=2),
              dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1, mw=2),
              # the second with CTAs ordered down M: it won where X outgrows
              # L2 (1024 x 4096 x 8192: -8%) and lost little elsewhere
              # (bench/RESULTS.md, 2026-11-26)
              dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1, mw=2, ra=1),
              dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=1),
              # decode: 16 columns (token-major), K split over a pair
              dict(bm=64, bn=16, bk=128, wm=1, wn=1, stages=12, wg=1, tma=1, cm=1, ks=2),
              # N = 64: 8 stages of 128 columns beat 12 of 64 on every S2 row
              # (4096 x 11008 x 64 fm: 1.54x of cuBLAS against 1.19x; H200)
              dict(bm=64, bn=64, bk=128, wm=1, wn=1, stages=8, wg=1, tma=1, cm=1, ks=2),
              dict(bm=128, bn=64, bk=128, wm=2, wn=1, stages=5, wg=1, tma=1, cm=1),
              # 11008 x 4096 x 16, token-major: 1.64x of cuBLAS, where the
              # 16-column tiles reach 1.1x
              dict(bm=128, bn=32, bk=128, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1),
              # 11008 x 4096 x 16, feature-major: 1.52x of cuBLAS (H200), where
              # the 32-column tile reaches 1.33x
              dict(bm=128, bn=16, bk=128, wm=2, wn=1, stages=6, wg=1, tma=1, cm=1),
              # token-major, N = 64: the X tile shared by a cluster pair
              # (4096 x 4096 x 64: -11% against splitting K)
              dict(bm=64, bn=64, bk=128, wm=1, wn=1, stages=8, wg=1, tma=1, cm=2),
              dict(bm=64, bn=16, bk=64, wm=1, wn=1, stages=12, wg=1, tma=1, cm=1, ks=4),
              dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=2, mw=2),
              dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=4, wg=1),
              dict(bm=64, bn=64, bk=128, wm=1, wn=1, stages=5, wg=1),
              dict(WAVE_TILE)]
        wg = by_tile_n(wg, n)   # N known: its regime's tiles first, the rest in turn
        if n is not None and n <= DECODE_MAX_N:
            # decode: the tiles at least N wide first (at N = 64 a 16-column
            # tile reads the weights four times: 2-3x slower), and of those
            # the ones at most twice N (at N = 16 a 64-column tile is 10-50%
            # slower than the 16-column ones), else in turn
            wg = sorted(wg, key=lambda c: (c["bn"] < n, c["bn"] > 2 * n))
        if n is not None and n > DECODE_MAX_N:
            # prefill: the 256 x 128 tile taking `mt` tiles a CTA, the number
            # that fills the GPU's waves best, second
            mt = tiles_per_cta(*matrix.shape, n, PREFILL_MT_TILE,
                               sm_count(device))
            if mt > 1:
                wg.insert(1, dict(PREFILL_MT_TILE, mt=mt))
            # and before it the 128 x 256 cluster pair taking `mt` tiles (5
            # stages beside its slices: -2 to -5% on 3072 x 768, 4096 x 4096
            # and 1024 x 4096 x 8192; bench/RESULTS.md, 2026-11-28)
            mt = tiles_per_cta(*matrix.shape, n, CLUSTER_MT_TILE, sm_count(device))
            if mt > 1:
                wg.insert(1, dict(CLUSTER_MT_TILE, mt=mt))
            # first of all, where its tiles fill the waves better than the
            # 128 x 256 ones: the 128 x 192 cluster pair (768 x 3072 x 4096:
            # 132 tiles, one full wave, against 96 of 128 x 256; -8% in both
            # layouts, bench/RESULTS.md, 2026-11-28)
            if (wave_cost(matrix.shape[0], n, WAVE_TILE, sm_count(device))
                    < wave_cost(matrix.shape[0], n, CLUSTER_MT_TILE, sm_count(device))):
                wg.sort(key=lambda c: c != WAVE_TILE)
        hopper = bool(device and device.get("arch") == "sm_90a")
        out = []
        for cfg in wg + ([] if hopper else [dict(BASE_CONFIG)]):   # as the space has them
            if is_tma(cfg):   # the space's form: every key of the path, defaults included
                cfg = {**TMA_SPACE.defaults, **cfg}
            try:
                self.check_config(cfg, matrix, op, params, device)
            except ConfigError:
                continue
            out.append(cfg)
        return out or super().hint_configs(matrix, op, params, device, n)

    # ---- plan / unpack / render -------------------------------------------------
    def plan(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
             bias: Optional[np.ndarray] = None) -> Nm24Plan:
        self.check_config(config, matrix, op, params)
        bad = matrix.cached(("nm24.valid",), lambda: first_violation(matrix))
        if bad is not None:
            row, col = bad
            raise ValueError(f"matrix is not 2:4: row {row} has more than 2 nonzeros in "
                             f"columns {col}..{col + 3} (prune it to 2:4 first)")
        m, k = matrix.shape
        tma = is_tma(config)
        ks = config.get("ks", 1) if tma else 1
        mp, kp = padded_shape(m, k, config)
        wg = is_wg(config)
        # the same for every configuration that pads alike: packed once
        values, meta = matrix.cached(("nm24.pack", op.dtype, mp, kp, wg),
                                     lambda: pack_matrix(matrix, op.dtype, mp, kp, wgmma=wg))
        if tma:   # one run of weights and metadata per 64-row tile and K step
            values, meta = matrix.cached(("nm24.ae", op.dtype, mp, kp),
                                         lambda: (interleave_ae(values, meta, mp, kp), b""))

        ep = op.epilogue
        bias_bytes = b""
        if ep.bias:
            if bias is None:
                raise ValueError("the epilogue has a bias but none was given")
            b = np.asarray(bias, dtype=np.float64).ravel()
            if b.shape != (m,):
                raise ValueError(f"bias has {b.size} entries, expected M = {m}")
            if not np.all(np.isfinite(b)):
                raise ValueError("bias contains NaN or infinity")
            padded = np.zeros(mp, dtype=np.float32)
            padded[:m] = b
            bias_bytes = padded.astype("<f4").tobytes()
        elif bias is not None:
            raise ValueError("a bias was given but the epilogue has none")

        values_offset = 0
        meta_offset = _align16(values_offset + len(values))   # (TMA: no section of its own)
        bias_offset = _align16(meta_offset + len(meta)) if ep.bias else 0
        total = _align16((bias_offset + len(bias_bytes)) if ep.bias else meta_offset + len(meta))

        def assemble() -> bytes:
            buf = bytearray(total)
            buf[values_offset:values_offset + len(values)] = values
            buf[meta_offset:meta_offset + len(meta)] = meta
            if ep.bias:
                buf[bias_offset:bias_offset + len(bias_bytes)] = bias_bytes
            return bytes(buf)
        # one bytes object per packing (and bias): the configurations that
        # share it share it in memory too, and the tuner's worker keeps one
        # device copy of it (tuner/worker.py)
        packed = matrix.cached(("nm24.packed", op.dtype, mp, kp, wg, tma,
                                hashlib.blake2b(bias_bytes, digest_size=16).digest()), assemble)

        cfg = {key: int(config[key]) for key in (TMA_KEYS if tma else WG_KEYS if wg else CONFIG_KEYS)
               if key in config}
        return Nm24Plan(
            name=config_name(self.tag(params), cfg, op), dtype=op.dtype, layout=op.layout,
            m=m, k=k, mp=mp, kp=kp, config=cfg, packed=packed,
            values_offset=values_offset, meta_offset=meta_offset, bias_offset=bias_offset,
            has_bias=ep.bias, smem_bytes=smem_bytes(cfg, op.layout, k),
            threads=_space(cfg).env(cfg, _problem(op, k))["threads"],
            grid=(1, _tile_slots(mp, config["bm"], config), ks),
            perm=None if matrix.perm is None else matrix.perm.copy(),
            epilogue=dict(activation=ep.activation, scale=float(ep.scale)))

    # ---- the benchmark peer ---------------------------------------------------------
    peer = "cuSPARSELt"

    def time_peer(self, ctx, matrix: SparseMatrix, params: dict, op: Operation, n: int,
                  timing: dict) -> dict:
        """cuSPARSELt's 2:4 matmul on the matrix's shape and layout, after
        its own configuration search (sizes multiples of 16)."""
        m, k = matrix.shape
        return ctx.time_sparselt(op.dtype, m, k, n, layout=op.layout, **timing)

    def unpack(self, plan: Nm24Plan) -> SparseMatrix:
        """W back from the packed bytes (values rounded to the dtype; the
        permutation, if any, carried along).  Stored zeros are not kept."""
        mp, kp = plan.mp, plan.kp
        nv = mp * kp // 2
        raw = plan.packed[plan.values_offset:plan.values_offset + nv * 2]
        nw = (mp // MTILE) * (kp // KSTEP) * 16
        if is_tma(plan.config):
            raw, meta = split_ae(plan.packed[plan.values_offset:plan.values_offset +
                                             mp // 64 * (kp // KSTEP) * AE_STEP], mp, kp)
            words = np.frombuffer(meta, dtype="<u4", count=nw)
        else:
            words = np.frombuffer(plan.packed, dtype="<u4", count=nw, offset=plan.meta_offset)
        unshuffle = unpack_values_sm90 if is_wg(plan.config) else unpack_values
        values = unshuffle(from_device_bytes(raw, plan.dtype, nv), mp, kp // 2)
        nib = unpack_meta(words.astype(np.uint32), mp, kp // 4)
        idx0 = (nib & 3).astype(np.int64)
        idx1 = (nib >> 2).astype(np.int64)
        if np.any(idx0 >= idx1):
            raise ValueError("corrupt plan: metadata indices not strictly increasing")
        dense = np.zeros((mp, kp), dtype=np.float32)
        rows = np.arange(mp)[:, None]
        base = 4 * np.arange(kp // 4)[None, :]
        dense[rows, base + idx0] = values[:, 0::2]
        dense[rows, base + idx1] = values[:, 1::2]
        if np.any(dense[plan.m:, :]) or np.any(dense[:, plan.k:]):
            raise ValueError("corrupt plan: nonzeros in the padding")
        return SparseMatrix.from_dense(dense[:plan.m, :plan.k], dtype=plan.dtype, perm=plan.perm)

    def render(self, plan: Nm24Plan, op: Operation, config: dict) -> Kernel:
        c = plan.config
        scale = np.float32(plan.epilogue.get("scale", 1.0))
        checks = _space(c).static_asserts(c, _layout_problem(plan.layout, plan.k),
                                          TABLE_SOURCE)
        template = ("nm24_tma.cu.j2" if is_tma(c) else "nm24_sm90.cu.j2" if is_wg(c)
                    else "nm24.cu.j2")
        source = render(template, name=plan.name, cm=c.get("cm", 1), ks=c.get("ks", 1),
                        mw=c.get("mw", 1), mt=c.get("mt", 1), ra=c.get("ra", 0),
                        dtype=plan.dtype, layout=plan.layout,
                        m=plan.m, k=plan.k, mp=plan.mp, kp=plan.kp,
                        bm=c["bm"], bn=c["bn"], bk=c["bk"], wm=c["wm"], wn=c["wn"],
                        stages=c["stages"], threads=plan.threads, smem_bytes=plan.smem_bytes,
                        values_offset=plan.values_offset, meta_offset=plan.meta_offset,
                        bias_offset=plan.bias_offset, has_bias=plan.has_bias,
                        act=op.act_code, scale=_float_literal(scale), constraints=checks,
                        res_ptr=plan.res_ptr, res_rec=plan.res_rec, rs=c.get("rs", 0),
                        # the output in slices (several tiles a CTA, one 64-row wgmma
                        # tile a warpgroup) goes to Y by tensor stores where the runtime
                        # can map Y (token-major: rows of M 16-byte aligned)
                        ys=int(c.get("mt", 1) > 1 and c.get("mw", 1) == 1
                               and (plan.layout == "fm" or plan.m % 8 == 0)),
                        rs_a=plan.rs_a, rs_ptr=plan.rs_ptr,
                        rs_ends=plan.rs_ends)
        launch = make_launch(grid=plan.grid, block=(plan.threads,), n_axis=0,
                             n_tile=plan.config["bn"], shared_bytes=plan.smem_bytes)
        return Kernel(name=plan.name, source=source, packed=plan.packed, launch=launch,
                      config=dict(plan.config))


# The prefill tile that takes several tiles along M a CTA (`mt`): two
# warpgroups of two 64-row wgmma tiles, 4 stages (the output tile's own
# buffer leaves no room for more).
PREFILL_MT_TILE = dict(bm=256, bn=128, bk=64, wm=2, wn=1, stages=4, wg=1, tma=1, cm=1, mw=2)
# the same for the 128 x 256 tile of a cluster pair
CLUSTER_MT_TILE = dict(bm=128, bn=256, bk=64, wm=2, wn=1, stages=5, wg=1, tma=1, cm=2)


# the 128 x 192 tile (wgmma N = 192) for problems whose 128 x 256 tiles
# leave much of the last wave idle (wave_cost)
WAVE_TILE = dict(bm=128, bn=192, bk=64, wm=2, wn=1, stages=6, wg=1, tma=1, cm=2)


def wave_cost(m: int, n: int, config: dict, sms: int) -> int:
    """The waves of one CTA a tile (`sms` CTAs at a time) times the tile's
    area: what the problem takes if every wave, the last one too, costs as
    much as a full one (the units: one output element's work)."""
    tiles = -(-m // config["bm"]) * -(-n // config["bn"])
    return -(-tiles // sms) * config["bm"] * config["bn"]


def tiles_per_cta(m: int, k: int, n: int, config: dict, sms: int) -> int:
    """The `mt` (of MT_CHOICES) that runs a problem's tiles in the fewest
    tile-times: a CTA an SM (one wave of `sms` CTAs at a time) taking mt
    tiles in turn, each tile after the first cheaper by the share of its
    pipeline fill and store that the next tile's loads hide.  That share
    is taken as 1.6 / (K tiles), at most 15%: an estimate, which the
    tuner's S1 suites on an H200 bore out (bench/RESULTS.md, 2026-11-28:
    on each of the six shapes every winner took the `mt` this gives for
    the 128 x 256 tile, 3, 1, 8, 2, 1 and 4; the tuner still measures the
    hint beside the others)."""
    rows = -(-m // config["bm"])
    cols = -(-n // config["bn"])
    gain = min(0.15, 1.6 / -(-k // config["bk"]))

    def cost(mt: int) -> float:
        waves = -(-cols * -(-rows // mt) // sms)
        return waves * mt * (1.0 - gain * (1.0 - 1.0 / mt))
    return min(MT_CHOICES, key=lambda mt: (cost(mt), mt))


# mma.sp's default (the first configuration a budgeted search measures
# where sparse wgmma is not available)
BASE_CONFIG = dict(bm=128, bn=128, bk=64, wm=2, wn=2, stages=3)


def _float_literal(v: np.float32) -> str:
    """An exact C++ float literal."""
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"epilogue scale must be finite, got {f}")
    return f"{f.hex()}f" if f != 0.0 else "0.0f"


register(Nm24Family())
