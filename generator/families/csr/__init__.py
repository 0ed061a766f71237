"""The `csr` family: unstructured sparse W, any pattern, specialized to one
matrix as SparseRT does.  One family to the user, two kernels by dtype:

  fp32         CSR on CUDA cores (below; templates/include/sf/csr.cuh);
  fp16, bf16   two formats, fp32 accumulation, the tuner measuring both:
               tiled bitmaps decoded into tensor-core fragments (tc.py,
               bitmap.py; templates/include/sf/csr_tc.cuh), and on sm_90a
               a 2:4 part on Sparse Tensor Cores plus a residual CSR
               (split24.py, config key `s24`; sf/nm24_tma.cuh).

fp32.  The plan sorts the rows by their nonzero count, descending (a row
swizzle: the warps of a block, and the blocks launched first, get similar
and large work), and packs the CSR in that slot order.  A configuration
chooses where the index lists live (`tables`):

  "global"  the packed CSR in the device buffer; a warp stages 32 nonzeros
            at a time and broadcasts them by shuffle;
  "const"   __constant__ arrays in the generated source (only when they fit
            in the 64 KB constant bank);
  "imm"     straight-line code with the columns and values as immediates
            (only for small matrices: compile time grows with nnz);

and the shape of the work: `vec` (1, 2, 4, 8: columns of X per thread, as
float / float2 / float4 / two float4 loads; tokens per thread for "tm"),
`rows` (row slots per block), `split` (warps per row, each over a share of its
nonzeros, added in shared memory: parallelism for few, long rows; 1 for
"imm") and `unroll` (nonzeros per step of the table loops; 1 for "imm",
whose code is fully unrolled).

The kernel source lives in templates/include/sf/csr.cuh; templates/csr.cu.j2
adds the constants, the tables and the immediates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import register
from ...family import Family, Fit, Pruned
from ...kernel import (ConfigError, Kernel, Operation, config_name, make_launch, render,
                      smem_limit)
from ...matrix import SparseMatrix, round_to_dtype
from ...prune import top_mask
from ...space import Constraint, Space
from . import split24, tc

MAGIC = 0x53434653          # 'SFCS' little-endian
ALIGN = 16                  # every packed section starts at a multiple of this

TABLES = ("global", "const", "imm")
VECS = (1, 2, 4, 8)
CONST_BYTES = 65536         # the __constant__ bank a module may fill
# Straight-line code compiles in time that grows faster than nnz (NVRTC
# 13.0, sm_90a, one core): 819 nonzeros 1-2 s, 3276: 5-11 s, 7372: 14-32 s
# (vec 1-4), 29491: 240 s.  Hence a small bound.
IMM_MAX_NNZ = 8192
IMM_MAX_ROWS = 4096         # cases of the slot switch
MAX_THREADS = 1024
CONFIG_KEYS = ("tables", "vec", "rows", "split", "unroll")
STAGED_KEY = "rb"           # token-major only, optional (absent: 0)
SMEM_LIMIT = 48 * 1024      # static shared memory of the split reduction

# The search space (see search_space for the restrictions per matrix).
# (rows, split) pairs: 4 or 8 warps a block.  "const" tables are for small
# matrices and take unroll 8 only; "imm" kernels take seconds to compile
# each and vary in vec only (1 or 2: with float4 loads ptxas hoists so many
# of them that the straight-line code spills even at 128 registers).
SPACE = {
    "fm": {"vec": (1, 2, 4, 8), "unroll": (4, 8)},
    "tm": {"vec": (1, 2), "unroll": (4, 8)},
}
# Token-major with X staged: the block copies its BN tokens' rows of X into
# shared memory transposed (K x BN: the feature-major access for every
# nonzero), then runs `rb` groups of `rows` row slots over it (the copy
# shared by rows * rb rows of W).  0: X read from device memory, a token
# per lane (one sector a token per nonzero).
STAGED_RB = (4, 16)
ROWS_SPLIT = ((4, 1), (2, 2), (4, 2), (1, 4), (2, 4), (1, 8))
# Feature-major (global tables) also in blocks of 8 to 32 rows: the block's warps read
# overlapping rows of X, which L1 then serves (H100, DLMC at 90%: 16 rows
# a block 15-17% faster on ResNet-50 bottleneck_2 at N = 6272 and the
# Transformer's ffn conv2 at N = 2048, level to 5% faster elsewhere;
# bench/RESULTS.md, 2026-11-28).
FM_ROWS_SPLIT = ((8, 1), (16, 1), (32, 1), (8, 2), (16, 2), (8, 4))
CONST_UNROLL = (8,)
IMM_ROWS_SPLIT = ((4, 1), (1, 4))
IMM_VEC = (1, 2)

TABLE_SOURCE = "generator/families/csr/__init__.py"

# fp32 hints: the tuned winners of the DLMC subset (H100; feature-major at
# 60d7b4f, bench/RESULTS.md 2026-11-26; token-major at ac96371, 2026-11-24),
# most frequent first.  Feature-major: up to about a thousand columns of N,
# two rows of two warps a block (parallelism along the rows), then blocks
# of 8 rows; above, 16 rows of one warp (probes of 2026-11-28), then four
# rows, float4 loads.  (Global tables: the others are the search's to find
# where they fit.)
FP32_SMALL_MAX_N = 1024
FP32_FM_SMALL_N = ((2, 2, 8, 4), (8, 2, 8, 4), (2, 2, 8, 2), (8, 4, 8, 4), (4, 2, 8, 2),
                   (2, 2, 8, 1))   # rows, split, unroll, vec
FP32_FM_LARGE_N = ((16, 1, 8, 4), (4, 2, 8, 4), (16, 2, 8, 4), (4, 1, 8, 4), (4, 1, 8, 2),
                   (4, 1, 8, 8))
FP32_TM = ((2, 4, 4, 1), (2, 4, 4, 2), (1, 4, 4, 1), (2, 2, 8, 1))
# token-major with X staged (H100, e178a5a: it won 32 of the DLMC subset's
# 36 token-major rows, bench/RESULTS.md 2026-11-26): rows, split, unroll, vec, rb
FP32_TM_STAGED = ((4, 1, 8, 1, 16), (2, 2, 8, 1, 16), (4, 2, 8, 1, 4), (4, 1, 8, 2, 4))

# The constraint table (generator/space.py).  The problem's constants: m,
# k, nnz, const_bytes (the __constant__ tables' size); the device's:
# max_threads.  `tables` is a word: tables_global, tables_const, tables_imm.
TABLE = Space(
    choices={"tables": TABLES, "vec": VECS},
    enums={"tables": TABLES},
    derived={"threads": "32 * rows * split", "smem": "4 * (split - 1) * rows * vec * 32",
             "xs_stride": "32 * vec + (1 if vec == 1 else 2)",
             "xs_bytes": "4 * k * xs_stride if rb > 0 else 0"},
    defaults={"rb": 0},
    constraints=[
        Constraint("m >= 1 and k >= 1", "W has at least one row and one column"),
        Constraint(f"vec in {VECS}", "columns (fm) or tokens (tm) per thread: float, float2, "
                   "float4, two float4"),
        Constraint(f"smem <= {SMEM_LIMIT}", "the split reduction fits static shared memory"),
        Constraint(f"rows >= 1 and split >= 1 and threads <= {MAX_THREADS}",
                   "rows and split are >= 1 with at most 32 warps a block"),
        Constraint("threads <= max_threads", "the block fits the GPU's thread limit",
                   device=True),
        Constraint("vec < 8 or threads <= 512",
                   "8 columns a thread take about 100 registers: at most 512 threads a block "
                   "(with 1024 they spill)"),
        Constraint("unroll == 1", "straight-line code is fully unrolled", when="tables == tables_imm"),
        Constraint(f"vec in {IMM_VEC}", "wider loads spill in straight-line code",
                   when="tables == tables_imm"),
        Constraint("unroll in (1, 2, 4, 8, 16, 32)",
                   "unroll divides the warp's staged chunk of 32 nonzeros",
                   when="tables != tables_imm"),
        Constraint(f"const_bytes <= {CONST_BYTES}", "the tables fit the 64 KB constant bank",
                   when="tables == tables_const"),
        Constraint(f"nnz <= {IMM_MAX_NNZ}", "straight-line code compiles in seconds",
                   when="tables == tables_imm"),
        Constraint(f"m <= {IMM_MAX_ROWS}", "cases of the slot switch",
                   when="tables == tables_imm"),
        Constraint("rb in (0, 1, 2, 4, 8, 16, 32)", "row groups a block over one staged X tile"),
        Constraint("rb == 0 or tm == 1", "X is staged in token-major only"),
        Constraint("rb == 0 or vec in (1, 2)", "a staged X tile of at most 64 tokens"),
        Constraint("xs_bytes <= smem_limit", "the staged X tile fits the GPU's shared memory",
                   device=True),
    ])


def _problem(m: int, k: int, nnz: int, layout: str) -> dict:
    """The fp32 table's constants: shape, nonzeros, the __constant__
    tables' size and the layout."""
    return {"m": m, "k": k, "nnz": nnz, "const_bytes": const_bytes(m, k, nnz),
            "tm": int(layout == "tm")}


def speedup_limit(density: float, config: Optional[dict] = None) -> float:
    """What a memory-bound fp16/bf16 decode can gain over dense at most, in
    the format of `config` (the bitmaps' unless it is a split 2:4 one), for
    a random pattern at `density`."""
    if config and split24.is_split24(config):
        return split24.speedup_limit(density)
    return tc.speedup_limit(density)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class CsrPlan:
    """What a csr kernel is built from: the schedule (slot order), the CSR
    in slot order, the packed buffer holding it, and the byte offsets of its
    sections."""
    shape: tuple[int, int]
    dtype: str                   # of the matrix's values (kernels read fp32)
    order: np.ndarray            # int32 [M]: slot -> original row
    ptr: np.ndarray              # int32 [M+1]: nonzero offsets in slot order
    col: np.ndarray              # int32 [nnz]
    val: np.ndarray              # float32 [nnz], rounded to `dtype`
    bias: Optional[np.ndarray]   # float32 [M], original order, or None
    offsets: dict                # section name -> byte offset in packed
    packed: bytes
    perm: Optional[np.ndarray] = None
    name: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def nnz(self) -> int:
        return int(self.col.size)


def schedule(matrix: SparseMatrix) -> np.ndarray:
    """Row order: nonzero count descending; ties keep the original order."""
    return np.argsort(-matrix.row_nnz(), kind="stable").astype(np.int32)


def const_bytes(m: int, k: int, nnz: int) -> int:
    """Bytes of the __constant__ tables for an m x k matrix with nnz
    nonzeros (columns as 16-bit when k fits)."""
    idx = 2 if k <= 65536 else 4
    return 4 * m + 4 * (m + 1) + idx * max(nnz, 1) + 4 * max(nnz, 1)


def pack(matrix: SparseMatrix, bias: Optional[np.ndarray] = None) -> CsrPlan:
    """The schedule and the packed buffer for `matrix` (with `bias`, fp32 of
    M in original row order, when given)."""
    m, k = matrix.shape
    if m < 1 or k < 1:
        raise ValueError(f"csr needs at least one row and one column, got {m} x {k}")
    if matrix.nnz >= 2 ** 31:
        raise ValueError(f"csr indexes nonzeros with int32; {matrix.nnz} is too many")
    order = schedule(matrix)
    counts = matrix.row_nnz()[order]
    ptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    # gather each row's nonzeros in slot order
    starts = matrix.indptr[:-1][order]
    idx = (np.repeat(starts - ptr[:-1], counts) + np.arange(matrix.nnz)).astype(np.int64)
    col = matrix.indices[idx].astype(np.int32)
    val = round_to_dtype(matrix.values, matrix.dtype)[idx].astype(np.float32)
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
        if bias.shape != (m,):
            raise ValueError(f"bias has {bias.size} entries, expected M = {m}")
        if not np.all(np.isfinite(bias)):
            raise ValueError("bias contains NaN or infinity")

    sections = [("header", np.array([MAGIC, m, k, matrix.nnz], dtype=np.uint32).tobytes()),
                ("order", order.astype(np.int32).tobytes()),
                ("ptr", ptr.astype(np.int32).tobytes()),
                ("col", col.tobytes()),
                ("val", val.tobytes())]
    if bias is not None:
        sections.append(("bias", bias.tobytes()))
    offsets, out, pos = {}, bytearray(), 0
    for name, data in sections:
        offsets[name] = pos
        out += data + b"\0" * (_align(len(data)) - len(data))
        pos = len(out)
    offsets.setdefault("bias", 0)
    return CsrPlan((m, k), matrix.dtype, order, ptr.astype(np.int32), col, val,
                   None if bias is None else bias.copy(), offsets, bytes(out),
                   None if matrix.perm is None else matrix.perm.copy(), matrix.name)


def unpack_packed(packed: bytes, dtype: str = "fp32") -> tuple[SparseMatrix, Optional[np.ndarray]]:
    """The matrix (original row order) and bias a packed buffer holds."""
    head = np.frombuffer(packed, dtype=np.uint32, count=4)
    if head[0] != MAGIC:
        raise ValueError("not a csr packed buffer (bad magic)")
    m, k, nnz = (int(v) for v in head[1:])
    pos = ALIGN

    def take(dt, count):
        nonlocal pos
        a = np.frombuffer(packed, dtype=dt, count=count, offset=pos).copy()
        pos += _align(a.nbytes)
        return a

    order = take(np.int32, m).astype(np.int64)
    ptr = take(np.int32, m + 1).astype(np.int64)
    col = take(np.int32, nnz)
    val = take(np.float32, nnz)
    bias = take(np.float32, m) if pos + 4 * m <= len(packed) else None
    counts = np.diff(ptr)
    row_nnz = np.zeros(m, dtype=np.int64)
    row_nnz[order] = counts
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(row_nnz, out=indptr[1:])
    # slot s's nonzeros go to indptr[order[s]]...
    dest = (np.repeat(indptr[order] - ptr[:-1], counts) + np.arange(nnz)).astype(np.int64)
    indices = np.empty(nnz, dtype=np.int32)
    values = np.empty(nnz, dtype=np.float32)
    indices[dest] = col
    values[dest] = val
    return SparseMatrix((m, k), indptr, indices, values, dtype=dtype), bias


def _float_literal(v: float) -> str:
    """A C float literal that reads back as exactly the float32 `v`."""
    s = str(np.float32(v))
    if not any(ch in s for ch in ".e"):
        s += ".0"
    return s + "f"


def _join(items, per_line: int = 16) -> str:
    items = list(items)
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "\n    " + ",\n    ".join(lines) + "\n" if lines else "0"


class CsrFamily(Family):
    name = "csr"
    dtypes = ("fp32", "fp16", "bf16")
    layouts = ("fm", "tm")
    syntax = "csr"
    summary = "unstructured: any pattern (fp32 on CUDA cores; fp16/bf16 on tensor cores)"
    auto_rank = 90       # every matrix is a CSR: asked last

    def dtype_for(self, dtype: str) -> str:
        """Each dtype in its own kernels: 16-bit weights on tensor cores."""
        return dtype if dtype in self.dtypes else "fp32"

    # ---- the pattern -------------------------------------------------------
    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        return matrix.rows >= 1 and matrix.cols >= 1   # any pattern is a CSR

    def analyze(self, matrix: SparseMatrix) -> list[Fit]:
        from ...analysis import stats
        cv = stats(matrix.row_nnz())[3]
        detail, data = f"row imbalance (cv) {cv:.3f}", {"fits": True, "cost": 0.0, "imbalance": cv}
        if matrix.dtype != "fp32":   # the split 2:4 format's residual (Hopper)
            frac = split24.residual_fraction(matrix)
            detail += (f", split 2:4 residual {100 * frac:.1f}% of the nonzeros"
                       f"{'' if frac <= split24.MAX_RESIDUAL else ' (too long: bitmaps only)'}")
            data["split24_residual"] = frac
        return [Fit("csr", "csr", True, 0.0, "0.000", detail, data)]

    def detect(self, matrix: SparseMatrix) -> Optional[dict]:
        return {}

    def prune(self, w: np.ndarray, params: dict, sparsity: float,
              rng: np.random.Generator) -> Pruned:
        """The largest |w| (exact zeros of the input are never kept, so a
        matrix already sparser than asked stays as it is)."""
        a = np.abs(w)
        keep = min(int(round((1.0 - sparsity) * w.size)), int(np.count_nonzero(a)))
        return Pruned(top_mask(a, keep, rng))

    def synth(self, params: dict, m: int, k: int, density: float,
              rng: np.random.Generator) -> tuple[np.ndarray, Optional[np.ndarray]]:
        return rng.random((m, k)) < density, None

    # ---- configurations --------------------------------------------------
    @staticmethod
    def tables_allowed(matrix: SparseMatrix) -> list[str]:
        out = ["global"]
        if const_bytes(matrix.rows, matrix.cols, matrix.nnz) <= CONST_BYTES:
            out.append("const")
        if matrix.nnz <= IMM_MAX_NNZ and matrix.rows <= IMM_MAX_ROWS:
            out.append("imm")
        return out

    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        self.check_op(op)
        if op.dtype != "fp32":
            self._check_params(params)
            return tc.search_space(matrix, op, device) + split24.candidates(matrix, op, device)
        space = SPACE[op.layout]
        candidates = []
        for tables in self.tables_allowed(matrix):
            shapes = IMM_ROWS_SPLIT if tables == "imm" else ROWS_SPLIT
            if op.layout == "fm" and tables == "global":
                # (blocks of many rows where the matrix has at least 8 of them)
                shapes += tuple(rs for rs in FM_ROWS_SPLIT if 8 * rs[0] <= matrix.rows)
            unrolls = {"imm": (1,), "const": CONST_UNROLL}.get(tables, space["unroll"])
            for vec in (IMM_VEC if tables == "imm" else space["vec"]):
                for rows, split in shapes:
                    for unroll in unrolls:
                        cfg = {"tables": tables, "vec": vec, "rows": rows, "split": split,
                               "unroll": unroll}
                        candidates.append(cfg)
                        if op.layout == "tm" and tables == "global":
                            candidates += [dict(cfg, rb=rb) for rb in STAGED_RB]
        return self.accepted(candidates, matrix, op, params, device)

    def hint_configs(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None, n: Optional[int] = None) -> list[dict]:
        if op.dtype != "fp32":
            return self._tc_hints(matrix, op, device, n)
        return self._fp32_hints(matrix, op, params, device, n)

    def _fp32_hints(self, matrix: SparseMatrix, op: Operation, params: dict,
                    device: Optional[dict], n: Optional[int]) -> list[dict]:
        """The fp32 winners (FP32_*), valid here: feature-major, the
        small-N shapes first up to FP32_SMALL_MAX_N columns, the large-N
        ones first above, in turn when N is unknown."""
        def cfgs(shapes):
            return [{"tables": "global", "vec": v, "rows": r, "split": sp, "unroll": u}
                    for r, sp, u, v in shapes]
        if op.layout == "tm":
            prefs = [{"tables": "global", "vec": v, "rows": r, "split": sp, "unroll": u, "rb": rb}
                     for r, sp, u, v, rb in FP32_TM_STAGED] + cfgs(FP32_TM)
        else:
            small, large = cfgs(FP32_FM_SMALL_N), cfgs(FP32_FM_LARGE_N)
            if n is None:
                prefs = [c for pair in zip(small, large) for c in pair]
            else:
                prefs = small + large if n <= FP32_SMALL_MAX_N else large + small
        return self.accepted(prefs, matrix, op, params, device)   # (shapes of the space)

    @staticmethod
    def _tc_hints(matrix: SparseMatrix, op: Operation, device: Optional[dict],
                  n: Optional[int] = None) -> list[dict]:
        """The split 2:4 format's hints and the bitmap format's in turn,
        the split 2:4 first where it is offered (a short residual: faster
        on most decode rows measured, split24.MAX_RESIDUAL)."""
        bitmaps = tc.hint_configs(matrix, op, device, n)
        s24 = split24.candidates(matrix, op, device, n)
        out = []
        for i in range(max(len(s24), len(bitmaps))):
            out += s24[i:i + 1] + bitmaps[i:i + 1]
        return out

    def default_config(self, matrix: SparseMatrix, op: Operation, params: dict,
                       device: Optional[dict] = None) -> dict:
        """Untuned: fp32, its first hint (N unknown); fp16/bf16, the
        bitmap format's first hint (the decode-shaped kernel, on any GPU);
        the first of the space where no hint is valid."""
        hints = (tc.hint_configs(matrix, op, device) if op.dtype != "fp32"
                 else self._fp32_hints(matrix, op, {}, device, None))
        if hints:
            return hints[0]
        return super().default_config(matrix, op, params, device)

    @staticmethod
    def _check_params(params: dict) -> None:
        if params:
            raise ConfigError(f"csr takes no pattern parameters (got {params!r})")

    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> None:
        self.check_op(op)
        self._check_params(params)
        if op.dtype != "fp32":
            if split24.is_split24(config):
                split24.check(config, matrix, op, device)
            else:
                tc.check(config, matrix, op, device)
            return
        missing = [k for k in CONFIG_KEYS if k not in config]
        extra = [k for k in config if k not in CONFIG_KEYS + (STAGED_KEY,)]
        if missing or extra:
            raise ConfigError(f"csr config needs exactly the keys {CONFIG_KEYS} (and "
                              f"optionally {STAGED_KEY!r}); missing {missing}, unknown {extra}")
        for key in ("vec", "rows", "split", "unroll") + ((STAGED_KEY,) if STAGED_KEY in config
                                                           else ()):
            if not isinstance(config[key], (int, np.integer)) or isinstance(config[key], bool):
                raise ConfigError(f"{key} must be an integer, got {config[key]!r}")
        limit = MAX_THREADS
        if device and device.get("max_threads_per_block"):
            limit = int(device["max_threads_per_block"])
        TABLE.check(config, _problem(*matrix.shape, matrix.nnz, op.layout),
                    {"max_threads": limit, "smem_limit": smem_limit(device)})

    def token_major_as_fast(self, dtype: str) -> bool:
        """fp16 and bf16: the tensor-core kernels stage X's tile as either
        layout holds it (bench/RESULTS.md, 2026-11-26: BERT at 70%, the
        route tried for all 72 layers, whose token-major kernels lost to
        cuBLAS, and taken by none).  fp32 reads X across token rows: no."""
        return dtype != "fp32"

    # ---- the benchmark peer ---------------------------------------------------
    peer = "cuSPARSE CSR"

    def time_peer(self, ctx, matrix: SparseMatrix, params: dict, op: Operation, n: int,
                  timing: dict) -> dict:
        """cuSPARSE's CSR SpMM on the matrix's pattern in op's dtype and
        layout (its fastest CSR algorithm)."""
        self._check_params(params)
        m, k = matrix.shape
        return ctx.time_csr(op.dtype, m, k, n, matrix.indptr, matrix.indices,
                            layout=op.layout, **timing)

    # ---- plan, unpack, generate ----------------------------------------------
    def plan(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
             bias: Optional[np.ndarray] = None):
        if op.dtype != "fp32":
            self.check_op(op)
            self._check_params(params)
            if split24.is_split24(config):
                return split24.plan(matrix, op, self.tag({}), config, bias)
            return tc.plan(matrix, op, self.tag({}), config, bias)
        self.check_config(config, matrix, op, params)
        if op.epilogue.bias and bias is None:
            raise ValueError("the epilogue adds a bias but none was given")
        if not op.epilogue.bias and bias is not None:
            raise ValueError("a bias was given but the epilogue adds none")
        return pack(matrix, bias)

    def unpack(self, plan) -> SparseMatrix:
        """The matrix the plan's packed buffer holds (original row order,
        values as the kernel reads them, the permutation carried along)."""
        if isinstance(plan, tc.TcPlan):
            return tc.unpack(plan)
        if isinstance(plan, split24.Nm24Plan):
            return split24.unpack(plan)
        mat, _ = unpack_packed(plan.packed, plan.dtype)
        mat.perm = None if plan.perm is None else plan.perm.copy()
        mat.name = plan.name
        return mat

    def render(self, p, op: Operation, config: dict) -> Kernel:
        if isinstance(p, tc.TcPlan):
            return tc.render_kernel(p, op, _float_literal)
        if isinstance(p, split24.Nm24Plan):
            return split24.render_kernel(p, op)
        m, k = p.shape
        tables, vec, rows, split, unroll = (int(config[k_]) if k_ != "tables" else config[k_]
                                            for k_ in CONFIG_KEYS)
        rb = int(config.get(STAGED_KEY, 0))
        name = config_name(self.tag({}), config, op)
        ep = op.epilogue
        problem = _problem(*p.shape, p.nnz, op.layout)
        values = dict(name=name, M=m, K=k, nnz=p.nnz, layout=op.layout, tables=tables,
                      vec=vec, rows=rows, split=split, unroll=unroll, rb=rb,
                      epilogue_tag=ep.tag, has_bias=ep.bias, act=op.act_code,
                      scale=_float_literal(ep.scale), off=p.offsets,
                      constraints=TABLE.static_asserts(config, problem, TABLE_SOURCE))
        if tables == "const":
            values.update(self._const_tables(p))
        elif tables == "imm":
            values["imm_cases"] = self._imm_cases(p, split)
        source = render("csr.cu.j2", **values)
        launch = make_launch(grid=(-(-m // (rows * max(rb, 1))),), block=(32 * rows * split,),
                             n_axis=1, n_tile=32 * vec,
                             shared_bytes=TABLE.env(config, problem)["xs_bytes"])
        return Kernel(name=name, source=source, packed=p.packed, launch=launch,
                      config=dict(config))

    @staticmethod
    def _const_tables(p: CsrPlan) -> dict:
        m, k = p.shape
        col = p.col if p.nnz else np.zeros(1, dtype=np.int32)
        val = p.val if p.nnz else np.zeros(1, dtype=np.float32)
        return dict(c_order=_join(map(str, p.order.tolist())),
                    c_ptr=_join(map(str, p.ptr.tolist())),
                    c_col_type="unsigned short" if k <= 65536 else "int",
                    c_col=_join(map(str, col.tolist()), 32),
                    c_val=_join(map(_float_literal, val.tolist()), 8))

    @staticmethod
    def _imm_cases(p: CsrPlan, split: int = 1, per_line: int = 4) -> list[dict]:
        """One case per piece (slot * split + part): share `part` of the
        slot's nonzeros, as the header's share<SPLIT> cuts them."""
        cases = []
        cols = p.col.tolist()
        vals = [_float_literal(v) for v in p.val.tolist()]
        for s in range(p.rows):
            row = int(p.order[s])
            start, end = int(p.ptr[s]), int(p.ptr[s + 1])
            for part in range(split):
                lo = start + (end - start) * part // split
                hi = start + (end - start) * (part + 1) // split
                terms = [f"a({cols[j]}, {vals[j]});" for j in range(lo, hi)]
                lines = [" ".join(terms[i:i + per_line]) for i in range(0, len(terms), per_line)]
                cases.append(dict(piece=s * split + part, row=row, nnz=hi - lo, lines=lines,
                                  bias=_float_literal(p.bias[row]) if p.bias is not None else ""))
        return cases


FAMILY = register(CsrFamily())
