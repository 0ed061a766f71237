"""The canonical sparse matrix: shape, pattern (CSR), values, dtype and an
optional row permutation.  Every reader produces one, every family's
planner consumes one.

Values are kept as float32 whatever the dtype (fp16 and bf16 values are
exactly representable in float32); `dtype` says what precision the weights
have and what the kernels will read.

Row permutation: `perm[i]` is the original row placed at position i of the
permuted matrix, so `permuted = W[perm]`.  It does not change W: it records
an ordering (found by pruning to shflbw, or recovered by analysis) under
which groups of consecutive rows share their column support.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

DTYPES = ("fp32", "fp16", "bf16")


def round_to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 array holding `values` rounded to `dtype` (round to nearest
    even, as a cast does)."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "fp32":
        return v.copy()
    if dtype == "fp16":
        return v.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = v.view(np.uint32).astype(np.uint64)
        rounding = ((bits >> 16) & 1) + 0x7FFF
        out = ((bits + rounding) >> 16 << 16).astype(np.uint32)
        nan = np.isnan(v)
        out[nan] = 0x7FC00000
        return out.view(np.float32)
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")


def to_device_bytes(values: np.ndarray, dtype: str) -> bytes:
    """The bytes a kernel reads for `values` stored as `dtype`."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "fp32":
        return v.tobytes()
    if dtype == "fp16":
        return v.astype(np.float16).tobytes()
    if dtype == "bf16":
        return (round_to_dtype(v, "bf16").view(np.uint32) >> 16).astype(np.uint16).tobytes()
    raise ValueError(f"unknown dtype {dtype!r}")


def from_device_bytes(data: bytes, dtype: str, count: int) -> np.ndarray:
    """Inverse of to_device_bytes: float32 values."""
    if dtype == "fp32":
        return np.frombuffer(data, dtype=np.float32, count=count).copy()
    if dtype == "fp16":
        return np.frombuffer(data, dtype=np.float16, count=count).astype(np.float32)
    if dtype == "bf16":
        u = np.frombuffer(data, dtype=np.uint16, count=count).astype(np.uint32) << 16
        return u.view(np.float32)
    raise ValueError(f"unknown dtype {dtype!r}")


_CACHED_LOCK = threading.Lock()
_MISSING = object()


@dataclass
class SparseMatrix:
    shape: tuple[int, int]
    indptr: np.ndarray   # int64, M + 1
    indices: np.ndarray  # int32, nnz, sorted within each row
    values: np.ndarray   # float32, nnz
    dtype: str = "fp32"
    perm: Optional[np.ndarray] = None  # int64, M, or None
    values_synthetic: bool = False     # True when values were drawn (DLMC)
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        m, k = int(self.shape[0]), int(self.shape[1])
        self.shape = (m, k)
        self.indptr = np.ascontiguousarray(self.indptr, dtype=np.int64)
        idx = np.asarray(self.indices)
        if idx.size and idx.dtype.kind in "iu" and idx.dtype.itemsize >= 4 and idx.dtype != np.int32:
            # checked before the cast to int32, which would wrap 2**32 + 5 to 5
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= k:
                raise ValueError(f"column index out of range [0, {k})")
            if hi > np.iinfo(np.int32).max:
                raise ValueError(f"column index {hi} does not fit the int32 column indices")
        self.indices = np.ascontiguousarray(idx, dtype=np.int32)
        self.values = np.ascontiguousarray(self.values, dtype=np.float32)
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {DTYPES}")
        if m < 0 or k < 0:
            raise ValueError(f"negative shape {self.shape}")
        if self.indptr.shape != (m + 1,):
            raise ValueError(f"indptr has {self.indptr.size} entries, expected rows + 1 = {m + 1}")
        nnz = self.indices.size
        if self.indptr[0] != 0 or self.indptr[-1] != nnz:
            raise ValueError(f"indptr must run from 0 to nnz={nnz}, got {self.indptr[0]}..{self.indptr[-1]}")
        if np.any(np.diff(self.indptr) < 0):
            raise ValueError("indptr (row offsets) is not non-decreasing")
        if self.values.size != nnz:
            raise ValueError(f"{self.values.size} values for {nnz} indices")
        if nnz and (self.indices.min() < 0 or self.indices.max() >= k):
            raise ValueError(f"column index out of range [0, {k})")
        if nnz and not np.all(np.isfinite(self.values)):
            raise ValueError("weights contain NaN or infinity")
        if self.perm is not None:
            p = np.ascontiguousarray(self.perm, dtype=np.int64)
            if p.shape != (m,) or not np.array_equal(np.sort(p), np.arange(m)):
                raise ValueError("perm is not a permutation of the rows")
            self.perm = p
        # sorted, duplicate-free columns within each row
        if nnz:
            d = np.diff(self.indices)   # (int32 differences of columns in [0, k): no overflow)
            row_start = np.zeros(nnz, dtype=bool)
            starts = self.indptr[:-1][np.diff(self.indptr) > 0]
            row_start[starts] = True
            if np.any((d <= 0) & ~row_start[1:]):
                raise ValueError("column indices are not strictly increasing within a row")

    # ---- construction ---------------------------------------------------
    @classmethod
    def from_dense(cls, dense: np.ndarray, dtype: str = "fp32", **kw) -> "SparseMatrix":
        """Nonzeros of a 2-D array (pruned entries are exact zeros)."""
        a = np.asarray(dense)
        if a.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {a.shape}")
        a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            raise ValueError("weights contain NaN or infinity")
        return cls.from_mask(a, a != 0, dtype, **kw)

    @classmethod
    def from_mask(cls, dense: np.ndarray, mask: np.ndarray, dtype: str,
                  **kw) -> "SparseMatrix":
        """The entries of a 2-D array under a boolean mask of its shape
        (explicit zeros under it kept), rounded to `dtype`."""
        a = np.asarray(dense)
        indptr = np.zeros(a.shape[0] + 1, dtype=np.int64)
        np.cumsum(mask.sum(axis=1), out=indptr[1:])
        flat = np.flatnonzero(mask)   # row-major: rows in order, columns sorted
        cols = (flat % a.shape[1] if a.shape[1] else flat).astype(np.int32)
        return cls(a.shape, indptr, cols, round_to_dtype(a.reshape(-1)[flat], dtype),
                   dtype=dtype, **kw)

    # ---- views ----------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def density(self) -> float:
        total = self.shape[0] * self.shape[1]
        return self.nnz / total if total else 0.0

    def row_nnz(self) -> np.ndarray:
        return np.diff(self.indptr)

    def row_ids(self) -> np.ndarray:
        """Row index of each stored nonzero."""
        return np.repeat(np.arange(self.rows, dtype=np.int64), self.row_nnz())

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.float32)
        out[self.row_ids(), self.indices] = self.values
        return out

    def mask(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=bool)
        out[self.row_ids(), self.indices] = True
        return out

    def with_values(self, values: np.ndarray) -> "SparseMatrix":
        return SparseMatrix(self.shape, self.indptr, self.indices, values, self.dtype,
                            self.perm, self.values_synthetic, self.name, dict(self.meta))

    def astype(self, dtype: str) -> "SparseMatrix":
        """The same matrix with its values rounded to `dtype`."""
        m = self.with_values(round_to_dtype(self.values, dtype))
        m.dtype = dtype
        return m

    def cached(self, key, make):
        """`make()`, computed once per matrix object and `key`: data derived
        from the matrix that many kernels share (a family's packing that
        does not depend on every configuration key).  Safe from several
        threads (one computes, the others wait).  The matrix must not be
        changed in place afterwards."""
        with _CACHED_LOCK:
            memo = self.__dict__.setdefault("_cached", {})
            entry = memo.get(key)
            if entry is None:
                entry = memo[key] = [threading.Lock(), _MISSING]
        with entry[0]:
            if entry[1] is _MISSING:
                entry[1] = make()
            return entry[1]

    def drop_cached(self) -> None:
        """Forgets what `cached` computed (a tuner done with the matrix: the
        packings of a large layer hold hundreds of MB)."""
        with _CACHED_LOCK:
            self.__dict__.pop("_cached", None)

    def fingerprint(self) -> str:
        """SHA-256 of shape, dtype, pattern, permutation and values."""
        h = hashlib.sha256()
        h.update(f"sparseforge-matrix-v1 {self.shape[0]} {self.shape[1]} {self.dtype}\n".encode())
        h.update(self.indptr.tobytes())
        h.update(self.indices.tobytes())
        h.update(self.perm.tobytes() if self.perm is not None else b"noperm")
        h.update(to_device_bytes(self.values, self.dtype))
        return h.hexdigest()

    def __repr__(self) -> str:
        p = ", permuted" if self.perm is not None else ""
        return (f"SparseMatrix({self.shape[0]}x{self.shape[1]}, nnz={self.nnz}, "
                f"density={self.density:.4f}, {self.dtype}{p})")
