"""nm24: 2:4 semi-structured sparse W (in every aligned group of 4 along K,
at most 2 nonzeros) times dense X on Sparse Tensor Cores, through
`mma.sp::ordered_metadata` m16n8k32 (fp16 / bf16 in, fp32 accumulate).

The plan compresses W (M x K) into values (MP x KP/2) and 2-bit indices and
shuffles both, at pack time, into the order the kernel consumes them
(templates/include/sf/nm24.cuh describes it):

    values  per 16-row tile `mt` and 32-wide K step `s`: 512 bytes; lane L's
            16 bytes are its four A registers (rows g, g+8; chunks t, t+4
            with g = L // 4, t = L % 4).
    meta    per (mt, s): 16 words; word 2g + h holds rows g (bits 0-15) and
            g + 8 (bits 16-31), chunks 4h .. 4h+3 of the step, one nibble
            idx0 | idx1 << 2 (idx0 < idx1) per chunk.
    bias    fp32, MP entries (original row order).

M is padded to the CTA tile BM and K to the stage depth BK (both with
zeros), so the kernel's weight loads need no guards.  A group with fewer
than two nonzeros stores zeros at a valid index pair.  Matrices with more
than two nonzeros in some group are refused (pruning is generator/prune.py's
job).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..kernel import (ConfigError, Family, Kernel, Operation, config_name, register, smem_limit,
                      render)
from ..matrix import SparseMatrix, from_device_bytes, to_device_bytes

KSTEP = 32          # dense K of one mma.sp m16n8k32
MTILE = 16          # rows of one mma.sp
FRAG_BYTES = 512    # compressed A of one (16-row tile, K step)
META_BYTES = 64     # metadata of one (16-row tile, K step)

BM_CHOICES = (64, 128)
BN_CHOICES = (64, 128, 256)
BK_CHOICES = (32, 64)
STAGE_CHOICES = (2, 3, 4)
WARP_LAYOUTS = ((2, 2), (1, 4), (4, 1), (2, 4), (4, 2))
MAX_ACCUMULATORS = 128      # fp32 accumulators per thread (registers)
CONFIG_KEYS = ("bm", "bn", "bk", "wm", "wn", "stages")
ROW_CHUNK = 1024            # rows packed at a time (bounds host memory)

_ACT = {"none": 0, "relu": 1, "gelu": 2}

# Axis orders of the shuffles (see pack_values / pack_meta).
_VALUE_AXES = (0, 3, 2, 5, 4, 1, 6)
_META_AXES = (0, 3, 2, 4, 1, 5)


# ---- pattern --------------------------------------------------------------------

def _group_keys(matrix: SparseMatrix) -> np.ndarray:
    """One key per stored entry: row * groups_per_row + column // 4
    (non-decreasing, since columns are sorted within rows)."""
    groups = max(1, -(-matrix.cols // 4))
    return matrix.row_ids() * groups + matrix.indices.astype(np.int64) // 4


def first_violation(matrix: SparseMatrix) -> Optional[tuple[int, int]]:
    """(row, first column of the group) of the first aligned group of 4
    with more than 2 stored entries, or None when the matrix is 2:4."""
    keys = _group_keys(matrix)
    if keys.size < 3:
        return None
    bad = np.flatnonzero(keys[2:] == keys[:-2])
    if bad.size == 0:
        return None
    i = int(bad[0])
    return int(matrix.row_ids()[i]), int(matrix.indices[i]) // 4 * 4


def smem_bytes(config: dict, layout: str) -> int:
    """Dynamic shared memory of a configuration (as nm24.cuh's Config)."""
    bm, bn, bk, stages = config["bm"], config["bn"], config["bk"], config["stages"]
    ksteps = bk // KSTEP
    stage = (bm // MTILE) * ksteps * (FRAG_BYTES + META_BYTES) + bk * bn * 2
    rows, cols = (bn, bm) if layout == "tm" else (bm, bn)
    return max(stages * stage, rows * (cols + 8) * 2)


def _round_up(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


def _align16(x: int) -> int:
    return -(-x // 16) * 16


# ---- packing ----------------------------------------------------------------------

def compress_rows(dense: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2:4 compression of padded rows (R x KP, KP % 4 == 0).  Returns values
    (R x KP/2: for group j, entries 2j and 2j+1) and nibbles (R x KP/4,
    idx0 | idx1 << 2 with idx0 < idx1).  `mask` marks stored entries; a group
    with one entry at p pairs it with p+1 (or 2 when p = 3), an empty group
    uses (0, 1)."""
    r, kp = dense.shape
    g = dense.reshape(r, kp // 4, 4)
    m = mask.reshape(r, kp // 4, 4)
    cnt = m.sum(axis=2)
    if np.any(cnt > 2):
        raise ValueError("more than 2 nonzeros in an aligned group of 4")
    first = np.argmax(m, axis=2)
    last = 3 - np.argmax(m[:, :, ::-1], axis=2)
    idx0 = np.where(cnt == 2, first, np.where(cnt == 1, np.minimum(first, 2), 0))
    idx1 = np.where(cnt == 2, last, np.where(cnt == 1, np.where(first < 3, first + 1, 3), 1))
    v0 = np.take_along_axis(g, idx0[:, :, None], axis=2)[:, :, 0]
    v1 = np.take_along_axis(g, idx1[:, :, None], axis=2)[:, :, 0]
    values = np.stack([v0, v1], axis=2).reshape(r, kp // 2)
    nibbles = (idx0 | (idx1 << 2)).astype(np.uint8)
    return values, nibbles


def pack_values(values: np.ndarray) -> np.ndarray:
    """Compressed values (R x KP/2, R % 16 == 0) in fragment order:
    [tile][step][lane][register][half]."""
    r, kh = values.shape
    v = values.reshape(r // 16, 2, 8, kh // 16, 2, 4, 2)  # mt rlo g s rhi t h
    return np.ascontiguousarray(v.transpose(_VALUE_AXES)).ravel()


def unpack_values(flat: np.ndarray, r: int, kh: int) -> np.ndarray:
    v = flat.reshape(r // 16, kh // 16, 8, 4, 2, 2, 2)
    return np.ascontiguousarray(v.transpose(np.argsort(_VALUE_AXES))).reshape(r, kh)


def pack_meta(nibbles: np.ndarray) -> np.ndarray:
    """Nibbles (R x KP/4) as metadata words: [tile][step][g][h] (uint32)."""
    r, kq = nibbles.shape
    n = nibbles.reshape(r // 16, 2, 8, kq // 8, 2, 4).astype(np.uint32)  # mt rh g s h j
    n = n.transpose(_META_AXES)                                         # mt s g h rh j
    shifts = (16 * np.arange(2)[:, None] + 4 * np.arange(4)[None, :]).astype(np.uint32)
    return np.ascontiguousarray((n << shifts).sum(axis=(-2, -1), dtype=np.uint32)).ravel()


def unpack_meta(words: np.ndarray, r: int, kq: int) -> np.ndarray:
    w = words.reshape(r // 16, kq // 8, 8, 2)
    shifts = (16 * np.arange(2)[:, None] + 4 * np.arange(4)[None, :]).astype(np.uint32)
    n = (w[..., None, None] >> shifts) & 0xF                            # mt s g h rh j
    n = n.transpose(np.argsort(_META_AXES))                             # mt rh g s h j
    return np.ascontiguousarray(n).reshape(r, kq).astype(np.uint8)


def pack_matrix(matrix: SparseMatrix, dtype: str, mp: int, kp: int) -> tuple[bytes, bytes]:
    """(values bytes, metadata bytes) of `matrix` padded to mp x kp."""
    m, k = matrix.shape
    ks = kp // KSTEP
    vals_out = np.empty(mp * kp // 2, dtype=np.float32)
    meta_out = np.empty((mp // MTILE) * ks * 16, dtype=np.uint32)
    rows_of = matrix.row_ids()
    for r0 in range(0, mp, ROW_CHUNK):
        r1 = min(mp, r0 + ROW_CHUNK)
        dense = np.zeros((r1 - r0, kp), dtype=np.float32)
        mask = np.zeros((r1 - r0, kp), dtype=bool)
        if r0 < m:
            lo, hi = matrix.indptr[r0], matrix.indptr[min(r1, m)]
            rr = rows_of[lo:hi] - r0
            cc = matrix.indices[lo:hi]
            dense[rr, cc] = matrix.values[lo:hi]
            mask[rr, cc] = True
        values, nibbles = compress_rows(dense, mask)
        vals_out[r0 * kp // 2:r1 * kp // 2] = pack_values(values)
        meta_out[r0 // MTILE * ks * 16:r1 // MTILE * ks * 16] = pack_meta(nibbles)
    return to_device_bytes(vals_out, dtype), meta_out.astype("<u4").tobytes()


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


class Nm24Family(Family):
    name = "nm24"
    dtypes = ("fp16", "bf16")
    layouts = ("fm", "tm")

    def tag(self, params: dict) -> str:
        return "nm24"

    def fits(self, matrix: SparseMatrix, params: dict) -> bool:
        return first_violation(matrix) is None

    # ---- configurations ---------------------------------------------------
    def check_config(self, config: dict, matrix: SparseMatrix, op: Operation,
                     params: dict, device: Optional[dict] = None) -> None:
        missing = [k for k in CONFIG_KEYS if k not in config]
        if missing:
            raise ConfigError(f"nm24 config lacks {', '.join(missing)} (needs {', '.join(CONFIG_KEYS)})")
        extra = sorted(set(config) - set(CONFIG_KEYS))
        if extra:
            raise ConfigError(f"nm24 config has unknown keys {', '.join(extra)}")
        bm, bn, bk = config["bm"], config["bn"], config["bk"]
        wm, wn, stages = config["wm"], config["wn"], config["stages"]
        if op.dtype not in self.dtypes:
            raise ConfigError(f"dtype: nm24 supports {', '.join(self.dtypes)}, not {op.dtype}")
        if op.layout not in self.layouts:
            raise ConfigError(f"layout: nm24 supports {', '.join(self.layouts)}, not {op.layout}")
        if bm not in BM_CHOICES:
            raise ConfigError(f"bm: {bm} not in {BM_CHOICES}")
        if bn not in BN_CHOICES:
            raise ConfigError(f"bn: {bn} not in {BN_CHOICES}")
        if bk not in BK_CHOICES:
            raise ConfigError(f"bk: {bk} not in {BK_CHOICES}")
        if stages not in STAGE_CHOICES:
            raise ConfigError(f"stages: {stages} not in {STAGE_CHOICES}")
        if (wm, wn) not in WARP_LAYOUTS:
            raise ConfigError(f"warp layout: {wm}x{wn} not in {WARP_LAYOUTS}")
        if bm % (16 * wm):
            raise ConfigError(f"warp tile M: bm/wm = {bm}/{wm} is not a multiple of 16")
        if bn % (8 * wn):
            raise ConfigError(f"warp tile N: bn/wn = {bn}/{wn} is not a multiple of 8")
        acc = (bm // wm // 16) * (bn // wn // 8) * 4
        if acc > MAX_ACCUMULATORS:
            raise ConfigError(f"accumulators: warp tile {bm // wm}x{bn // wn} needs {acc} fp32 "
                              f"registers per thread (> {MAX_ACCUMULATORS})")
        limit = smem_limit(device)
        need = smem_bytes(config, op.layout)
        if need > limit:
            raise ConfigError(f"shared memory: {need} bytes > smem_per_block_optin {limit}")

    def search_space(self, matrix: SparseMatrix, op: Operation, params: dict,
                     device: Optional[dict] = None) -> list[dict]:
        out = []
        for bm in BM_CHOICES:
            for bn in BN_CHOICES:
                for bk in BK_CHOICES:
                    for wm, wn in WARP_LAYOUTS:
                        for stages in STAGE_CHOICES:
                            cfg = dict(bm=bm, bn=bn, bk=bk, wm=wm, wn=wn, stages=stages)
                            try:
                                self.check_config(cfg, matrix, op, params, device)
                            except ConfigError:
                                continue
                            out.append(cfg)
        return out

    # ---- plan / unpack / generate -------------------------------------------
    def plan(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
             bias: Optional[np.ndarray] = None) -> Nm24Plan:
        self.check_config(config, matrix, op, params)
        bad = first_violation(matrix)
        if bad is not None:
            row, col = bad
            raise ValueError(f"matrix is not 2:4: row {row} has more than 2 nonzeros in "
                             f"columns {col}..{col + 3} (prune it to 2:4 first)")
        m, k = matrix.shape
        bm, bk = config["bm"], config["bk"]
        mp, kp = _round_up(m, bm), _round_up(k, bk)
        values, meta = pack_matrix(matrix, op.dtype, mp, kp)

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
        meta_offset = _align16(values_offset + len(values))
        bias_offset = _align16(meta_offset + len(meta)) if ep.bias else 0
        total = _align16((bias_offset + len(bias_bytes)) if ep.bias else meta_offset + len(meta))
        buf = bytearray(total)
        buf[values_offset:values_offset + len(values)] = values
        buf[meta_offset:meta_offset + len(meta)] = meta
        if ep.bias:
            buf[bias_offset:bias_offset + len(bias_bytes)] = bias_bytes

        cfg = {key: int(config[key]) for key in CONFIG_KEYS}
        return Nm24Plan(
            name=config_name(self.tag(params), cfg, op), dtype=op.dtype, layout=op.layout,
            m=m, k=k, mp=mp, kp=kp, config=cfg, packed=bytes(buf),
            values_offset=values_offset, meta_offset=meta_offset, bias_offset=bias_offset,
            has_bias=ep.bias, smem_bytes=smem_bytes(cfg, op.layout),
            threads=cfg["wm"] * cfg["wn"] * 32, grid=(1, mp // bm, 1),
            perm=None if matrix.perm is None else matrix.perm.copy(),
            epilogue=dict(activation=ep.activation, scale=float(ep.scale)))

    def unpack(self, plan: Nm24Plan) -> SparseMatrix:
        """W back from the packed bytes (values rounded to the dtype; the
        permutation, if any, carried along).  Stored zeros are not kept."""
        mp, kp = plan.mp, plan.kp
        nv = mp * kp // 2
        raw = plan.packed[plan.values_offset:plan.values_offset + nv * 2]
        values = unpack_values(from_device_bytes(raw, plan.dtype, nv), mp, kp // 2)
        nw = (mp // MTILE) * (kp // KSTEP) * 16
        words = np.frombuffer(plan.packed, dtype="<u4", count=nw, offset=plan.meta_offset)
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

    def render(self, plan: Nm24Plan) -> str:
        c = plan.config
        scale = np.float32(plan.epilogue.get("scale", 1.0))
        return render("nm24.cu.j2", name=plan.name, dtype=plan.dtype, layout=plan.layout,
                      m=plan.m, k=plan.k, mp=plan.mp, kp=plan.kp,
                      bm=c["bm"], bn=c["bn"], bk=c["bk"], wm=c["wm"], wn=c["wn"],
                      stages=c["stages"], threads=plan.threads, smem_bytes=plan.smem_bytes,
                      values_offset=plan.values_offset, meta_offset=plan.meta_offset,
                      bias_offset=plan.bias_offset, has_bias=plan.has_bias,
                      act=_ACT[plan.epilogue.get("activation", "none")],
                      scale=_float_literal(scale))

    def generate(self, matrix: SparseMatrix, op: Operation, params: dict, config: dict,
                 bias: Optional[np.ndarray] = None) -> Kernel:
        plan = self.plan(matrix, op, params, config, bias)
        return Kernel(name=plan.name, source=self.render(plan), packed=plan.packed,
                      block=(plan.threads, 1, 1), grid=plan.grid, n_axis=0,
                      n_tile=plan.config["bn"], shared_bytes=plan.smem_bytes,
                      zero_output=False, options=(), config=dict(plan.config))


def _float_literal(v: np.float32) -> str:
    """An exact C++ float literal."""
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"epilogue scale must be finite, got {f}")
    return f"{f.hex()}f" if f != 0.0 else "0.0f"


register(Nm24Family())
