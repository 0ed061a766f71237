"""The row-group kernel's search space as data: the choices of each compute
path, the quantities derived from a configuration, and the one table of
constraints that filters the space and becomes every kernel's
static_asserts (generator/space.py).

A configuration takes one of three compute paths, told apart by its keys:

    mma.sync       bk bn stages wm wn            (sm_80 and newer), and
                   optionally ks (split K over a cluster of ks CTAs: sm_90a)
    wgmma          the same and wg = 1, tn       (sm_90a; tn absent = 1)
    TMA-fed wgmma  the wgmma keys and tma = 1    (sm_90a, token-major, each chunk one
                                                  run of X's columns: bsr blocks), and
                   optionally tn or pc           (pc: persistent CTAs, the grid)
    shared gather  the same and xr, xu           (mma.sync, both layouts)

The problem's constants: `bm` (a group's rows padded to 16), `tm` (1:
token-major) and `xrun` (a group's columns come in aligned runs of this
many that X's tensor map can read whole; 0: none); the device's: `smem_limit` and `sm90a` (1 when the kernels
are built for sm_90a).
"""
from __future__ import annotations

from ...space import Constraint, Space

BK_CHOICES = (16, 32, 64)
STAGE_CHOICES = (2, 3, 4)
BN_CHOICES = (16, 32, 64, 128, 256)
WG_N_CHOICES = (64, 128, 256)        # N of one warpgroup's wgmma (the wrappers in mma_sm90.cuh)
WG_BN_CHOICES = (64, 128, 256, 512)
WG_STAGE_CHOICES = (3, 4, 5, 6)
TN_CHOICES = (2, 4)                  # streamed tiles (absent: 1)
XR_CHOICES = (4, 8, 16)              # shared gather: groups per CTA
XS_BK_CHOICES = (16, 32)
KS_CHOICES = (2, 4)                  # split K: CTAs of a cluster (absent: 1)
KS_MAX_BN = 32                       # split K serves decode: few columns of N per CTA
XS_BN_CHOICES = (64, 128, 256)       # a tile row of at least 8 chunks keeps the swizzle by row
MAX_UNION = 256                      # shared gather: slots fit a uint8
MAX_ACC_REGS = 128

CONFIG_KEYS = ("bk", "bn", "stages", "wm", "wn")
WG_KEYS = tuple(sorted(CONFIG_KEYS + ("wg",)))
WG_TN_KEYS = tuple(sorted(WG_KEYS + ("tn",)))
TMA_KEYS = tuple(sorted(WG_KEYS + ("tma",)))
TMA_TN_KEYS = tuple(sorted(WG_TN_KEYS + ("tma",)))
TMA_PC_KEYS = tuple(sorted(TMA_KEYS + ("pc",)))
KS_KEYS = tuple(sorted(CONFIG_KEYS + ("ks",)))
XS_KEYS = tuple(sorted(CONFIG_KEYS + ("xr", "xu")))
KEY_SETS = (CONFIG_KEYS, KS_KEYS, WG_KEYS, WG_TN_KEYS, TMA_KEYS, TMA_TN_KEYS, TMA_PC_KEYS, XS_KEYS)
MAX_PC = 4096                        # persistent CTAs (the grid of such a kernel)
TMA_MAX_BN = 256                     # rows of one TMA box of X (tokens)

MMA = "not wg and not xr"
WG = "wg"
XS = "xr > 0"

# name -> expression, in order.  `tile` is the CTA tile's rows (the header's
# Config::BM), `am` a packed chunk's rows, the rest mirror Config's names.
DERIVED = {
    "tile": "max(64, cdiv(bm, 64) * 64) if wg else bm * max(1, xr)",
    "am": "bm * max(1, xr)",
    # TMA: a producer warp besides the consumers
    "threads": "32 * wm * wn + (32 if tma else 0)",
    "b_rows": "xu if xr else bk",
    "mf": "tile // wm // 16",
    "nf": "bn // wn // 8",
    "acc": "mf * nf * 4",
    "a_iters": "cdiv(am * bk // 8, threads)",
    "b_iters": "cdiv(b_rows * bn // 8, threads)",
    "stage_bytes": "tile * bk * 2 + b_rows * bn * 2 + (xr * bk if xr else 0)",
    "c_ld": "tile + 8 if tm else bn + 8",
    "c_rows": "bn if tm else tile",
    "c_half_bytes": "c_rows // 2 * c_ld * 2",
    # split K: rank 0's receive buffer for the other CTAs' fp32 partial
    # tiles, and its barrier
    "recv_bytes": "(ks - 1) * tile * bn * 4 + 16 if ks > 1 else 0",
    # the pipeline and the output tile (TMA streaming tiles or persistent
    # CTAs: side by side; otherwise the tile takes the drained stages), the
    # row map and biases (persistent: two), TMA's two mbarriers a stage,
    # split K's receive buffer, the 1 KB the kernel may skip to align the
    # swizzled tiles
    "smem": "(stages * stage_bytes + c_rows * c_ld * 2 if tma and (tn > 1 or pc > 0) else"
            " max(stages * stage_bytes, c_rows * c_ld * 2))"
            " + tile * 8 * (2 if pc > 0 else 1)"
            " + (16 * stages if tma else 0) + recv_bytes + (1024 if wg else 0)",
}

TABLE = [
    # every path
    Constraint("bm >= 16 and bm % 16 == 0", "a group's tile rows are a multiple of 16"),
    Constraint("wm >= 1 and wn >= 1", "at least one warp along M and N"),
    Constraint("threads <= 512", "at most 16 warps"),
    Constraint("am <= tile", "a packed chunk has at most the tile's rows"),
    # mma.sync
    Constraint(f"bn in {BN_CHOICES}", "BN of the mma.sync path", when=MMA),
    Constraint(f"bk in {BK_CHOICES}", "BK of the mma.sync path", when=MMA),
    Constraint("wm * wn <= 8", "at most 8 warps on the mma.sync path", when=MMA),
    Constraint("bm % (16 * wm) == 0", "BM is a multiple of 16 x WM", when=MMA),
    Constraint(f"stages in {STAGE_CHOICES}", "pipeline depth of the mma.sync paths",
               when="not wg"),
    Constraint("bn % (16 * wn) == 0", "BN is a multiple of 16 x WN (warps take n16 steps)",
               when="not wg"),
    Constraint(f"acc <= {MAX_ACC_REGS}", "at most 128 fp32 accumulators per thread",
               when="not wg"),
    Constraint("a_iters <= 8 and b_iters <= 8",
               "at most 8 16-byte loads per thread per stage and operand", when=MMA),
    # split K
    Constraint(f"ks == 1 or ks in {KS_CHOICES}", "K split over 2 or 4 CTAs of a cluster "
               "(omit the key for 1)"),
    Constraint("ks == 1 or sm90a", "split K runs on clusters: sm_90a", device=True),
    Constraint(f"ks == 1 or bn <= {KS_MAX_BN}",
               f"split K serves decode: at most {KS_MAX_BN} columns of N per CTA"),
    # wgmma
    Constraint("wg == 1", "wg = 1 selects the wgmma path (omit the key for mma.sync)",
               when="wg"),
    Constraint("sm90a", "the wgmma path needs sm_90a", when=WG, device=True),
    Constraint("wm == tile // 16", "4 warps per 64 rows of the wgmma tile", when=WG),
    Constraint(f"bk in {BK_CHOICES}", "BK of the wgmma path", when=WG),
    Constraint(f"stages in {WG_STAGE_CHOICES}", "pipeline depth of the wgmma path", when=WG),
    Constraint(f"bn in {WG_BN_CHOICES}", "BN of the wgmma path", when=WG),
    Constraint(f"bn % wn == 0 and bn // wn in {WG_N_CHOICES}",
               "each warpgroup's N is one of the wgmma wrappers'", when=WG),
    Constraint(f"tn in {(1,) + TN_CHOICES}", "tiles of N per CTA (streamed)", when=WG),
    Constraint("tn == 1 or tma or c_half_bytes <= stage_bytes",
               "streamed tiles: half the output tile fits one stage (take a larger bk)",
               when=WG),
    Constraint("bn // wn // 2 + 40 <= min(255, 65536 // threads // 8 * 8)",
               "the accumulators and ~40 addressing registers fit the register file",
               when=WG),
    Constraint("a_iters <= 16 and b_iters <= 16",
               "at most 16 16-byte loads per thread per stage and operand", when="wg or xr"),
    # TMA-fed wgmma
    Constraint("tma == 1", "tma = 1 selects the TMA-fed wgmma path (omit the key for cp.async)",
               when="tma"),
    Constraint("wg == 1", "the TMA path feeds wgmma", when="tma"),
    Constraint("tm == 1", "the TMA path is token-major", when="tma"),
    Constraint("xrun >= bk and xrun % bk == 0",
               "the TMA path reads each chunk as one box of X: its BK columns are one run "
               "(bsr blocks of a multiple of BK columns, K a multiple of them and of 8)",
               when="tma"),
    Constraint(f"bn <= {TMA_MAX_BN}", f"a TMA box of X has at most {TMA_MAX_BN} tokens",
               when="tma"),
    Constraint(f"pc >= 1 and pc <= {MAX_PC}", f"persistent CTAs: 1 to {MAX_PC} (omit the key "
               "for one item a CTA)", when="pc != 0"),
    Constraint("tma == 1", "persistent CTAs run the TMA path", when="pc != 0"),
    Constraint("bn // wn // 2 + 48 <= min(255, 16384 // (cdiv(threads // 32, 4) * 32) // 8 * 8)",
               "persistent CTAs: the accumulators and the items' state fit the registers of "
               "an SM's scheduler (its warps' share)", when="pc != 0"),
    # shared gather
    Constraint(f"xr in {XR_CHOICES}", "groups per CTA of the shared gather", when=XS),
    Constraint(f"bk in {XS_BK_CHOICES}", "BK of the shared gather", when=XS),
    Constraint(f"xu % 16 == 0 and bk <= xu and xu <= min(xr * bk, {MAX_UNION})",
               "rows of X per chunk: a multiple of 16 in [bk, min(xr * bk, 256)]", when=XS),
    Constraint(f"bn in {XS_BN_CHOICES}", "BN of the shared gather", when=XS),
    Constraint("wm == xr", "one warp row per group", when=XS),
    Constraint("(mf * nf * 4 + mf * 4 + nf * 2 + 24) * threads <= 65536",
               "accumulators, fragments and addressing fit the register file", when=XS),
    # the GPU's (checked last, in Python only)
    Constraint("smem <= smem_limit", "the shared memory fits the GPU's per-block limit",
               device=True),
]

DEFAULTS = {"wg": 0, "tn": 1, "xr": 0, "xu": 0, "ks": 1, "tma": 0, "pc": 0}

MMA_SPACE = Space(choices={"bn": BN_CHOICES, "bk": BK_CHOICES, "wm": (1, 2, 4, 8),
                           "wn": (1, 2, 4, 8), "stages": STAGE_CHOICES},
                  constraints=TABLE, derived=DERIVED, defaults=DEFAULTS)
WG_SPACE = Space(choices={"n": WG_N_CHOICES, "wn": (1, 2, 4), "bk": BK_CHOICES,
                          "stages": WG_STAGE_CHOICES},
                 constraints=TABLE, derived=DERIVED, defaults=DEFAULTS)
XS_SPACE = Space(choices={"xr": XR_CHOICES, "bk": XS_BK_CHOICES, "bn": XS_BN_CHOICES,
                          "wn": (1, 2, 4), "stages": STAGE_CHOICES},
                 constraints=TABLE, derived=DERIVED, defaults=DEFAULTS)
# one table serves all three: the generated static_asserts come from it
SPACE = MMA_SPACE
