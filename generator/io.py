"""Reading and writing weight files.

`load(path)` turns a weights file into a list of (name, SparseMatrix):

| extension      | what it holds                                                   |
| -------------- | --------------------------------------------------------------- |
| `.npy`         | one dense 2-D array; pruned entries are exact zeros             |
| `.npz`         | dense arrays (one per key), or one scipy-saved sparse matrix    |
|                | (csr, csc, coo or bsr; parsed here, scipy is not needed)        |
| `.safetensors` | dense tensors (F32, F16, BF16; F64 is read as fp32)              |
| `.mtx`         | Matrix Market: coordinate (real, integer, pattern; general,     |
|                | symmetric, skew-symmetric) or array (dense)                     |
| `.smtx`        | DLMC pattern: no values, they are drawn from a seeded generator |

Dense inputs: the pattern is the nonzeros.  Sparse inputs (scipy npz, mtx
coordinate, smtx): the pattern is what the file stores, explicit zeros
included (a bsr file stores whole blocks).

Every malformed file raises `WeightFileError` (a ValueError) whose message
starts with the file's path and names the problem.

`save(path, matrices)` writes `.npz`, `.safetensors`, `.mtx`, `.smtx` and
`.npy` so that `load` gives back the same matrices (see `save` for what each
format keeps).
"""
from __future__ import annotations

import ast
import json
import math
import re
import struct
import zipfile
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from .matrix import DTYPES, SparseMatrix, round_to_dtype, to_device_bytes

EXTENSIONS = (".npy", ".npz", ".safetensors", ".mtx", ".smtx")

# safetensors dtype -> (numpy dtype, item size)
_ST_DTYPES = {
    "F64": (np.dtype("<f8"), 8), "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2), "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8), "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2), "I8": (np.dtype("i1"), 1),
    "U64": (np.dtype("<u8"), 8), "U32": (np.dtype("<u4"), 4),
    "U16": (np.dtype("<u2"), 2), "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
    "F8_E4M3": (np.dtype("u1"), 1), "F8_E5M2": (np.dtype("u1"), 1),
}
_ST_MATRIX_DTYPES = {"F64": "fp32", "F32": "fp32", "F16": "fp16", "BF16": "bf16"}
_ST_INT_DTYPES = {"I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}
_ST_MAX_HEADER = 100 * 1024 * 1024


class WeightFileError(ValueError):
    """A weights file that cannot be read: the message names the file and
    the problem."""


def synthetic_note(seed: int) -> str:
    return f"values drawn from a seeded normal generator (seed={seed})"


def synthetic_values(nnz: int, seed: int) -> np.ndarray:
    """The values given to a pattern-only file: standard normal draws
    (float64, then rounded to float32) from np.random.default_rng(seed)."""
    return np.random.default_rng(seed).standard_normal(nnz).astype(np.float32)


# =========================================================================
# load
# =========================================================================
def load(path, name: Optional[str] = None, dtype: Optional[str] = None,
         seed: int = 0) -> list[tuple[str, SparseMatrix]]:
    """Read a weights file.

    name:  for files holding several tensors (.npz, .safetensors), the one
           to load (default: every 2-D floating-point tensor); for
           single-matrix files, the name to give the matrix (default: the
           file's stem).
    dtype: "fp32", "fp16" or "bf16" to override the precision detected
           from the file (values are rounded to it).
    seed:  seed of the values drawn for pattern-only files (.smtx, pattern
           .mtx).
    """
    p = Path(path)
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    ext = p.suffix.lower()
    if ext not in EXTENSIONS:
        raise WeightFileError(f"{p}: unknown extension {p.suffix!r}; expected one of "
                              f"{', '.join(EXTENSIONS)}")
    if not p.is_file():
        raise WeightFileError(f"{p}: no such file")
    reader = {".npy": _load_npy, ".npz": _load_npz, ".safetensors": _load_safetensors,
              ".mtx": _load_mtx, ".smtx": _load_smtx}[ext]
    out = reader(p, name, seed)
    result = []
    for nm, m in out:
        if dtype is not None and dtype != m.dtype:
            m = m.astype(dtype)
        m.name = nm
        m.meta.setdefault("source", str(p))
        result.append((nm, m))
    return result


def load_one(path, name: Optional[str] = None, dtype: Optional[str] = None,
             seed: int = 0) -> SparseMatrix:
    """The single matrix of a file (error if it holds several and `name`
    does not pick one)."""
    mats = load(path, name=name, dtype=dtype, seed=seed)
    if len(mats) != 1:
        raise WeightFileError(f"{path}: holds {len(mats)} matrices "
                              f"({', '.join(n for n, _ in mats[:8])}); pick one by name")
    return mats[0][1]


def _fail(p, msg: str):
    raise WeightFileError(f"{p}: {msg}")


def _read_bytes(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        _fail(p, f"cannot read: {e.strerror or e}")


def _read_text(p: Path) -> str:
    data = _read_bytes(p)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(p, f"not a text file (byte {e.start} is not UTF-8)")


def _check_finite(p, what: str, values: np.ndarray, position=None):
    """ValueError naming the first NaN/inf. `position(i)` describes flat
    index i of `values`."""
    bad = ~np.isfinite(values)
    if np.any(bad):
        i = int(np.flatnonzero(bad.ravel())[0])
        v = values.ravel()[i]
        where = position(i) if position else f"entry {i}"
        _fail(p, f"{what} contains {int(bad.sum())} NaN/inf value(s) (first: {v} at {where})")


def _float_dtype_name(p, what: str, dt: np.dtype) -> str:
    """fp32/fp16 for a numpy float dtype; error for anything else."""
    if dt.kind == "f" and dt.itemsize == 4:
        return "fp32"
    if dt.kind == "f" and dt.itemsize == 2:
        return "fp16"
    if dt.kind == "f" and dt.itemsize == 8:
        return "fp32"
    if dt.kind == "V" and dt.itemsize == 2 and dt.fields is None:
        _fail(p, f"{what} has dtype {dt.str} (2-byte raw void): .npy/.npz cannot hold "
                 "bfloat16 (numpy has no bf16 type); save bf16 weights as .safetensors "
                 "or convert them to float32")
    _fail(p, f"{what} has unsupported dtype {dt} (expected float32, float16 or float64)")


def _dense_to_matrix(p, what: str, arr: np.ndarray, dtype: Optional[str] = None) -> SparseMatrix:
    if arr.ndim != 2:
        _fail(p, f"{what} is not 2-D (shape {tuple(arr.shape)})")
    detected = _float_dtype_name(p, what, arr.dtype) if dtype is None else dtype
    with np.errstate(over="ignore"):  # beyond float32 range: inf, reported below
        a = arr.astype(np.float32)
    k = a.shape[1]
    _check_finite(p, what, a, lambda i: f"row {i // k}, col {i % k}")
    m = SparseMatrix.from_dense(a, dtype=detected)
    if arr.dtype.kind == "f" and arr.dtype.itemsize == 8:
        m.meta["note"] = "float64 weights rounded to float32"
    return m


# ---- .npy ----------------------------------------------------------------
def _parse_npy(p, what: str, buf: bytes) -> np.ndarray:
    """A .npy image (file or npz member) to an array, with precise errors."""
    magic = b"\x93NUMPY"
    if len(buf) < 10:
        if magic.startswith(buf[:6]):
            _fail(p, f"{what}: truncated: {len(buf)} bytes, shorter than a .npy header")
        _fail(p, f"{what}: not a .npy file (bad magic)")
    if buf[:6] != magic:
        _fail(p, f"{what}: not a .npy file (bad magic)")
    major = buf[6]
    if major == 1:
        hlen = struct.unpack_from("<H", buf, 8)[0]
        start = 10
    elif major in (2, 3):
        if len(buf) < 12:
            _fail(p, f"{what}: truncated: {len(buf)} bytes, shorter than a .npy header")
        hlen = struct.unpack_from("<I", buf, 8)[0]
        start = 12
    else:
        _fail(p, f"{what}: unsupported .npy format version {major}.{buf[7]}")
    if start + hlen > len(buf):
        _fail(p, f"{what}: truncated: header of {hlen} bytes, only {len(buf) - start} present")
    try:
        header = ast.literal_eval(buf[start:start + hlen].decode("utf-8" if major == 3 else "latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        _fail(p, f"{what}: bad .npy header ({type(e).__name__}: {e})")
    if not isinstance(header, dict) or not {"descr", "fortran_order", "shape"} <= set(header):
        _fail(p, f"{what}: bad .npy header: expected a dict with descr, fortran_order, shape")
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(s, int) and s >= 0 for s in shape):
        _fail(p, f"{what}: bad .npy header: shape {shape!r}")
    try:
        dt = np.dtype(header["descr"] if isinstance(header["descr"], str)
                      else [tuple(f) for f in header["descr"]])
    except (TypeError, ValueError) as e:
        _fail(p, f"{what}: unsupported dtype {header['descr']!r} ({e})")
    if dt.hasobject:
        _fail(p, f"{what}: unsupported dtype {dt} (object arrays are not read)")
    count = math.prod(shape)
    nbytes = count * dt.itemsize
    data_start = start + hlen
    avail = len(buf) - data_start
    if avail < nbytes:
        _fail(p, f"{what}: truncated: shape {shape} of {dt} needs {nbytes} bytes of data, "
                 f"{avail} present")
    arr = np.frombuffer(buf, dtype=dt, count=count, offset=data_start)
    return arr.reshape(shape, order="F" if header["fortran_order"] else "C")


def _load_npy(p: Path, name, seed):
    arr = _parse_npy(p, "array", _read_bytes(p))
    return [(name or p.stem, _dense_to_matrix(p, "array", arr))]


# ---- .npz ----------------------------------------------------------------
# scipy.sparse's archive formats (file formats, not kernel families)
SCIPY_CSR, SCIPY_CSC, SCIPY_COO, SCIPY_BSR = "csr", "csc", "coo", "bsr"
_SCIPY_FORMATS = (SCIPY_CSR, SCIPY_CSC, SCIPY_COO, SCIPY_BSR)


def _read_npz(p: Path) -> dict[str, np.ndarray]:
    try:
        with zipfile.ZipFile(p) as z:
            out = {}
            for info in z.infolist():
                if info.is_dir():
                    continue
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                try:
                    data = z.read(info)
                except Exception as e:  # BadZipFile, EOFError, zlib.error, ...
                    _fail(p, f"member {info.filename!r} cannot be read, truncated or corrupt "
                             f"({type(e).__name__}: {e})")
                out[key] = _parse_npy(p, f"array {key!r}", data)
            return out
    except WeightFileError:
        raise
    except zipfile.BadZipFile as e:
        _fail(p, f"not a valid .npz (zip) archive, truncated or corrupt ({e})")
    except Exception as e:  # zipfile raises many kinds on a corrupt archive
        _fail(p, f"corrupt .npz archive ({type(e).__name__}: {e})")


def _scalar_str(v: np.ndarray) -> str:
    x = v.item() if v.size == 1 else v
    if isinstance(x, bytes):
        return x.decode("ascii", "replace")
    return str(x)


def _load_npz(p: Path, name, seed):
    arrays = _read_npz(p)
    if "format" in arrays and "shape" in arrays and "data" in arrays:
        nm = name or (_scalar_str(arrays["sparseforge_name"]) if "sparseforge_name" in arrays
                      else p.stem)
        m = _scipy_to_matrix(p, arrays)
        if "perm" in arrays:
            m.perm = _check_perm(p, "array 'perm'", arrays["perm"], m.rows)
        return [(nm, m)]
    dense_keys = [k for k in arrays
                  if not (k.endswith(".perm") and k[:-5] in arrays)
                  and not (k.endswith(".dtype") and k[:-6] in arrays)]
    if name is not None:
        if name not in arrays:
            _fail(p, f"no array named {name!r} (arrays: {_list_names(dense_keys)})")
        keys = [name]
    else:
        keys = [k for k in dense_keys if arrays[k].ndim == 2 and arrays[k].dtype.kind in "fV"]
        if not keys:
            _fail(p, "no 2-D floating-point array in the archive "
                     f"(arrays: {_list_names(arrays)})")
    out = []
    for k in keys:
        dtype = None
        if k + ".dtype" in arrays:
            dtype = _scalar_str(arrays[k + ".dtype"])
            if dtype not in DTYPES:
                _fail(p, f"array {k + '.dtype'!r} names unknown dtype {dtype!r}")
        m = _dense_to_matrix(p, f"array {k!r}", arrays[k])
        if dtype is not None:
            m = m.astype(dtype)
        if k + ".perm" in arrays:
            m.perm = _check_perm(p, f"array {k + '.perm'!r}", arrays[k + ".perm"], m.rows)
        out.append((k, m))
    return out


def _list_names(names: Iterable[str], limit: int = 12) -> str:
    names = list(names)
    s = ", ".join(repr(n) for n in names[:limit])
    return s + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"


def _check_perm(p, what: str, perm: np.ndarray, m: int) -> np.ndarray:
    if perm.dtype.kind not in "iu":
        _fail(p, f"{what} has dtype {perm.dtype}, expected integers")
    perm = perm.astype(np.int64).ravel()
    if perm.size != m or not np.array_equal(np.sort(perm), np.arange(m)):
        _fail(p, f"{what} is not a permutation of the {m} rows")
    return perm


def _int_array(p, arrays, key: str, fmt: str) -> np.ndarray:
    if key not in arrays:
        _fail(p, f"scipy {fmt} archive lacks the {key!r} array")
    a = arrays[key]
    if a.dtype.kind not in "iu":
        _fail(p, f"array {key!r} has dtype {a.dtype}, expected integers")
    return a.astype(np.int64).ravel()


def _check_indptr(p, key: str, indptr: np.ndarray, n: int, nnz: int, what: str):
    if indptr.size != n + 1:
        _fail(p, f"{key!r} has {indptr.size} entries, expected {what} + 1 = {n + 1}")
    if indptr[0] != 0:
        _fail(p, f"{key!r} does not start at 0 (starts at {indptr[0]})")
    d = np.diff(indptr)
    if np.any(d < 0):
        i = int(np.flatnonzero(d < 0)[0])
        _fail(p, f"{key!r} is out of order: entry {i + 1} ({indptr[i + 1]}) < entry {i} ({indptr[i]})")
    if indptr[-1] != nnz:
        _fail(p, f"{key!r} ends at {indptr[-1]}, not at the number of stored entries {nnz}")


def _scipy_to_matrix(p, arrays) -> SparseMatrix:
    fmt = _scalar_str(arrays["format"])
    if fmt not in _SCIPY_FORMATS:
        _fail(p, f"unsupported sparse format {fmt!r} (expected one of {', '.join(_SCIPY_FORMATS)})")
    shape = arrays["shape"].ravel()
    if shape.size != 2 or shape.dtype.kind not in "iu" or np.any(shape < 0):
        _fail(p, f"sparse matrix is not 2-D (shape {shape.tolist()})")
    m, k = int(shape[0]), int(shape[1])
    data = arrays["data"]
    dtype = _float_dtype_name(p, "array 'data'", data.dtype)
    if "sparseforge_dtype" in arrays:
        dtype = _scalar_str(arrays["sparseforge_dtype"])
        if dtype not in DTYPES:
            _fail(p, f"'sparseforge_dtype' names unknown dtype {dtype!r}")
    data = data.astype(np.float32)
    if fmt == SCIPY_BSR:
        if data.ndim != 3:
            _fail(p, f"bsr 'data' must be (blocks, br, bc), got shape {tuple(data.shape)}")
        nb, br, bc = data.shape
        if br == 0 or bc == 0 or m % br or k % bc:
            _fail(p, f"bsr block {br}x{bc} does not divide the shape {m}x{k}")
        indptr = _int_array(p, arrays, "indptr", fmt)
        bcols = _int_array(p, arrays, "indices", fmt)
        _check_indptr(p, "indptr", indptr, m // br, nb, "block rows")
        if bcols.size != nb:
            _fail(p, f"'indices' has {bcols.size} entries for {nb} blocks")
        if nb and (bcols.min() < 0 or bcols.max() >= k // bc):
            _fail(p, f"block column index out of range [0, {k // bc})")
        brow = np.repeat(np.arange(m // br), np.diff(indptr))
        _check_finite(p, "array 'data'", data)
        # every element of every block: (block, i, j)
        rows = (brow[:, None, None] * br + np.arange(br)[None, :, None]) + np.zeros((1, 1, bc), np.int64)
        cols = (bcols[:, None, None] * bc + np.arange(bc)[None, None, :]) + np.zeros((1, br, 1), np.int64)
        rows, cols, vals = rows.ravel(), cols.ravel(), data.ravel()
    else:
        data = data.ravel()
        _check_finite(p, "array 'data'", data)
        nnz = data.size
        if fmt == SCIPY_COO:
            if "row" in arrays and "col" in arrays:
                rows = _int_array(p, arrays, "row", fmt)
                cols = _int_array(p, arrays, "col", fmt)
            elif "coords" in arrays and arrays["coords"].ndim == 2 and arrays["coords"].shape[0] == 2:
                rows = arrays["coords"][0].astype(np.int64)
                cols = arrays["coords"][1].astype(np.int64)
            else:
                _fail(p, "scipy coo archive lacks the 'row' and 'col' arrays")
            for key, a in (("row", rows), ("col", cols)):
                if a.size != nnz:
                    _fail(p, f"{key!r} has {a.size} entries, 'data' has {nnz}")
        else:
            indptr = _int_array(p, arrays, "indptr", fmt)
            idx = _int_array(p, arrays, "indices", fmt)
            if idx.size != nnz:
                _fail(p, f"'indices' has {idx.size} entries, 'data' has {nnz}")
            n_major = m if fmt == SCIPY_CSR else k
            _check_indptr(p, "indptr", indptr, n_major, nnz,
                          "rows" if fmt == SCIPY_CSR else "columns")
            major = np.repeat(np.arange(n_major), np.diff(indptr))
            rows, cols = (major, idx) if fmt == SCIPY_CSR else (idx, major)
        vals = data
    return _coo_to_matrix(p, (m, k), rows, cols, vals, dtype, one_based=False)


def _coo_to_matrix(p, shape, rows, cols, vals, dtype, one_based: bool,
                   perm=None, **kw) -> SparseMatrix:
    """Entries (any order) to a SparseMatrix; rejects out-of-range and
    duplicate entries."""
    m, k = shape
    base = 1 if one_based else 0
    for what, a, n in (("row", rows, m), ("column", cols, k)):
        if a.size:
            bad = (a < base) | (a >= n + base)
            if np.any(bad):
                i = int(np.flatnonzero(bad)[0])
                _fail(p, f"{what} index {a[i]} of entry {i} out of range "
                         f"[{base}, {n + base})" + (" (1-based)" if one_based else ""))
    r = rows.astype(np.int64) - base
    c = cols.astype(np.int64) - base
    order = np.lexsort((c, r))
    r, c = r[order], c[order]
    v = round_to_dtype(np.asarray(vals, np.float32)[order], dtype)
    if r.size > 1:
        dup = (r[1:] == r[:-1]) & (c[1:] == c[:-1])
        if np.any(dup):
            i = int(np.flatnonzero(dup)[0])
            _fail(p, f"duplicate entry at row {r[i] + base}, column {c[i] + base}"
                     + (" (1-based)" if one_based else ""))
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=m), out=indptr[1:])
    try:
        return SparseMatrix((m, k), indptr, c, v, dtype=dtype, perm=perm, **kw)
    except ValueError as e:
        _fail(p, str(e))


# ---- .safetensors --------------------------------------------------------
def read_safetensors_header(path) -> tuple[dict, dict, int]:
    """(tensors, metadata, data_start): the validated header of a
    .safetensors file. tensors: name -> {dtype, shape, data_offsets}."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            _fail(p, f"truncated: {len(head)} bytes, a .safetensors file starts with an "
                     "8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > _ST_MAX_HEADER:
            _fail(p, f"header length {n} is implausible (over {_ST_MAX_HEADER} bytes); "
                     "not a .safetensors file?")
        if 8 + n > size:
            _fail(p, f"truncated: header length {n} exceeds the {size - 8} bytes after it")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        _fail(p, f"bad header JSON: {e}")
    if not isinstance(header, dict):
        _fail(p, f"bad header JSON: expected an object, got {type(header).__name__}")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict):
        _fail(p, "bad header: __metadata__ is not an object")
    data_start = 8 + n
    data_size = size - data_start
    for tname, info in header.items():
        what = f"tensor {tname!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            _fail(p, f"bad header: {what} lacks dtype, shape or data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in _ST_DTYPES:
            _fail(p, f"{what} has unsupported dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                  and s >= 0 for s in shape):
            _fail(p, f"bad header: {what} has shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
                or offs[0] < 0 or offs[1] < offs[0]):
            _fail(p, f"bad header: {what} has data_offsets {offs!r}")
        need = math.prod(shape) * _ST_DTYPES[dt][1]
        if offs[1] - offs[0] != need:
            _fail(p, f"{what}: data_offsets {offs} span {offs[1] - offs[0]} bytes, shape "
                     f"{shape} of {dt} needs {need}")
        if offs[1] > data_size:
            _fail(p, f"{what}: data_offsets {offs} lie outside the file (its data section "
                     f"has {data_size} bytes: truncated file or wrong header)")
    return header, meta, data_start


def _st_tensor(p, f, info, data_start) -> np.ndarray:
    np_dt, _ = _ST_DTYPES[info["dtype"]]
    b, e = info["data_offsets"]
    f.seek(data_start + b)
    raw = f.read(e - b)
    if len(raw) != e - b:
        _fail(p, f"truncated: tensor data ends at byte {data_start + b + len(raw)}")
    return np.frombuffer(raw, dtype=np_dt).reshape(info["shape"])


def _load_safetensors(p: Path, name, seed):
    header, meta, data_start = read_safetensors_header(p)
    if name is not None:
        if name not in header:
            _fail(p, f"no tensor named {name!r} (tensors: {_list_names(header)})")
        names = [name]
    else:
        names = []
        for tname, info in header.items():
            if tname.endswith(".perm") and tname[:-5] in header:
                continue
            if len(info["shape"]) != 2 or info["dtype"] in _ST_INT_DTYPES:
                continue
            names.append(tname)
        if not names:
            _fail(p, f"no 2-D floating-point tensor in the file (tensors: {_list_names(header)})")
    out = []
    with open(p, "rb") as f:
        for tname in names:
            info = header[tname]
            what = f"tensor {tname!r}"
            if len(info["shape"]) != 2:
                _fail(p, f"{what} is not 2-D (shape {info['shape']})")
            if info["dtype"] not in _ST_MATRIX_DTYPES:
                _fail(p, f"{what} has unsupported dtype {info['dtype']} for weights "
                         "(expected F32, F16 or BF16)")
            raw = _st_tensor(p, f, info, data_start)
            dtype = _ST_MATRIX_DTYPES[info["dtype"]]
            if info["dtype"] == "BF16":
                arr = (raw.astype(np.uint32) << 16).view(np.float32)
            else:
                arr = raw
            m = _dense_to_matrix(p, what, arr, dtype=dtype)
            if info["dtype"] == "F64":
                m.meta["note"] = "float64 weights rounded to float32"
            pname = tname + ".perm"
            if pname in header:
                pinfo = header[pname]
                if pinfo["dtype"] not in _ST_INT_DTYPES:
                    _fail(p, f"tensor {pname!r} has dtype {pinfo['dtype']}, expected integers")
                m.perm = _check_perm(p, f"tensor {pname!r}", _st_tensor(p, f, pinfo, data_start), m.rows)
            if meta:
                m.meta["safetensors_metadata"] = dict(meta)
            out.append((tname, m))
    return out


# ---- .mtx ----------------------------------------------------------------
def _parse_numbers(p, what: str, tokens: Sequence[str], kind) -> np.ndarray:
    try:
        return np.array(tokens, dtype=kind)
    except (ValueError, OverflowError):
        conv = int if kind is np.int64 else float
        for i, t in enumerate(tokens):
            try:
                conv(t)
            except (ValueError, OverflowError):
                _fail(p, f"{what}: token {i} ({t!r}) is not {'an integer' if conv is int else 'a number'}")
        raise


def _load_mtx(p: Path, name, seed):
    text = _read_text(p)
    lines = text.split("\n")
    if not lines or not lines[0].lower().startswith("%%matrixmarket"):
        _fail(p, "missing the '%%MatrixMarket' header line")
    banner = lines[0].split()
    if len(banner) != 5:
        _fail(p, f"bad header line {lines[0].strip()!r}: expected "
                 "'%%MatrixMarket matrix <format> <field> <symmetry>'")
    obj, fmt, field_, sym = (b.lower() for b in banner[1:])
    if obj != "matrix":
        _fail(p, f"unsupported object {obj!r} (expected 'matrix')")
    if fmt not in ("coordinate", "array"):
        _fail(p, f"unsupported format {fmt!r} (expected coordinate or array)")
    if field_ not in ("real", "double", "integer", "pattern"):
        _fail(p, f"unsupported field {field_!r} (expected real, integer or pattern)")
    if sym not in ("general", "symmetric", "skew-symmetric"):
        _fail(p, f"unsupported symmetry {sym!r} (expected general, symmetric or skew-symmetric)")
    if fmt == "array" and field_ == "pattern":
        _fail(p, "array format cannot have the pattern field")
    dtype, perm = "fp32", None
    i = 1
    while i < len(lines) and (lines[i].startswith("%") or not lines[i].strip()):
        line = lines[i]
        if line.startswith("%sparseforge-dtype"):
            dtype = line.split()[1] if len(line.split()) > 1 else ""
            if dtype not in DTYPES:
                _fail(p, f"line {i + 1}: unknown dtype {dtype!r}")
        elif line.startswith("%sparseforge-perm"):
            perm = _parse_numbers(p, f"line {i + 1}", line.split()[1:], np.int64)
        i += 1
    if i >= len(lines):
        _fail(p, "truncated: no size line after the header")
    size_tokens = lines[i].split()
    want = 3 if fmt == "coordinate" else 2
    if len(size_tokens) != want:
        _fail(p, f"line {i + 1}: size line {lines[i].strip()!r} must have {want} numbers")
    sizes = _parse_numbers(p, f"line {i + 1} (size line)", size_tokens, np.int64)
    if np.any(sizes < 0):
        _fail(p, f"line {i + 1}: negative size in {lines[i].strip()!r}")
    m, k = int(sizes[0]), int(sizes[1])
    body = " ".join(lines[i + 1:]).split()
    if sym != "general" and m != k:
        _fail(p, f"{sym} matrix must be square, size line says {m}x{k}")
    if perm is not None:
        perm = _check_perm(p, "%sparseforge-perm", perm, m)
    if fmt == "array":
        if sym == "general":
            count = m * k
        else:
            count = m * (m + 1) // 2 if sym == "symmetric" else m * (m - 1) // 2
        if len(body) < count:
            _fail(p, f"truncated: array of {m}x{k} ({sym}) needs {count} values, found {len(body)}")
        if len(body) > count:
            _fail(p, f"{len(body)} values after the size line, the {m}x{k} ({sym}) array has {count}")
        with np.errstate(over="ignore"):
            vals = _parse_numbers(p, "values", body, np.float64).astype(np.float32)
        _check_finite(p, "values", vals)
        dense = np.zeros((m, k), np.float32)
        if sym == "general":
            dense[:, :] = vals.reshape(k, m).T
        else:
            lo = 0 if sym == "symmetric" else 1
            cc, rr = np.triu_indices(m, lo)  # column-major lower triangle
            dense[rr, cc] = vals
            dense[cc, rr] = vals if sym == "symmetric" else -vals
        mat = SparseMatrix.from_dense(dense, dtype=dtype, perm=perm)
        return [(name or p.stem, mat)]
    nnz = int(sizes[2])
    per = 2 if field_ == "pattern" else 3
    if len(body) < nnz * per:
        _fail(p, f"truncated: the size line promises {nnz} entries ({nnz * per} numbers), "
                 f"found {len(body)} numbers")
    if len(body) > nnz * per:
        _fail(p, f"wrong count: {len(body)} numbers after the size line, {nnz} entries of "
                 f"{per} need {nnz * per}")
    rows = _parse_numbers(p, "row indices", body[0::per], np.int64)
    cols = _parse_numbers(p, "column indices", body[1::per], np.int64)
    synthetic = field_ == "pattern"
    if synthetic:
        vals = None
    else:
        with np.errstate(over="ignore"):
            vals = _parse_numbers(p, "values", body[2::per], np.float64).astype(np.float32)
        _check_finite(p, "values", vals, lambda j: f"entry {j} (row {rows[j]}, col {cols[j]})")
    if sym != "general":
        for what, a in (("row", rows), ("column", cols)):
            bad = (a < 1) | (a > m)
            if np.any(bad):
                j = int(np.flatnonzero(bad)[0])
                _fail(p, f"{what} index {a[j]} of entry {j} out of range [1, {m + 1}) (1-based)")
        if np.any(cols > rows):
            j = int(np.flatnonzero(cols > rows)[0])
            _fail(p, f"{sym} file has entry {j} above the diagonal (row {rows[j]}, col {cols[j]}); "
                     "only the lower triangle may be stored")
        off = rows != cols
        if sym == "skew-symmetric" and not np.all(off):
            _fail(p, "skew-symmetric file stores a diagonal entry")
        rows, cols = np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]])
        if vals is not None:
            vals = np.concatenate([vals, vals[off] if sym == "symmetric" else -vals[off]])
    kw = {}
    if synthetic:
        vals = np.zeros(rows.size, np.float32)  # filled below, in CSR order
        kw = dict(values_synthetic=True, meta={"note": synthetic_note(seed)})
    mat = _coo_to_matrix(p, (m, k), rows, cols, vals, dtype, one_based=True, perm=perm, **kw)
    if synthetic:
        mat = mat.with_values(synthetic_values(mat.nnz, seed))
    return [(name or p.stem, mat)]


# ---- .smtx ---------------------------------------------------------------
def _load_smtx(p: Path, name, seed):
    text = _read_text(p)
    lines = text.strip("\n").split("\n") if text.strip() else []
    if len(lines) < 1:
        _fail(p, "empty file: expected 3 lines (sizes, row offsets, column indices)")
    head = [t for t in re.split(r"[,\s]+", lines[0].strip()) if t]
    if len(head) != 3:
        _fail(p, f"line 1 {lines[0].strip()!r} must be 'rows, cols, nnz'")
    m, k, nnz = (int(v) for v in _parse_numbers(p, "line 1", head, np.int64))
    if m < 0 or k < 0 or nnz < 0:
        _fail(p, f"line 1: negative size in {lines[0].strip()!r}")
    if len(lines) < 2 or (nnz > 0 and len(lines) < 3):
        _fail(p, f"truncated: {len(lines)} line(s), expected 3 (sizes, row offsets, column indices)")
    if len(lines) > 3 and any(l.strip() for l in lines[3:]):
        _fail(p, f"{len(lines)} lines, expected 3")
    offs = _parse_numbers(p, "line 2 (row offsets)", lines[1].split(), np.int64)
    idx = _parse_numbers(p, "line 3 (column indices)", lines[2].split() if len(lines) > 2 else [],
                         np.int64)
    if offs.size != m + 1:
        _fail(p, f"wrong count: line 2 has {offs.size} row offsets, expected rows + 1 = {m + 1}")
    if idx.size != nnz:
        _fail(p, f"wrong count: line 1 says nnz = {nnz}, line 3 has {idx.size} column indices")
    if offs[0] != 0:
        _fail(p, f"row offsets do not start at 0 (line 2 starts with {offs[0]})")
    d = np.diff(offs)
    if np.any(d < 0):
        r = int(np.flatnonzero(d < 0)[0])
        _fail(p, f"row offsets out of order: offset {r + 1} ({offs[r + 1]}) < offset {r} ({offs[r]})")
    if offs[-1] != nnz:
        _fail(p, f"row offsets end at {offs[-1]}, not at nnz = {nnz}")
    if nnz:
        bad = (idx < 0) | (idx >= k)
        if np.any(bad):
            j = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(offs, j, side="right") - 1)
            _fail(p, f"column index {idx[j]} (entry {j}, row {row}) out of range [0, {k})")
        dd = np.diff(idx)
        row_start = np.zeros(nnz, bool)
        row_start[offs[:-1][d > 0]] = True
        bad = (dd <= 0) & ~row_start[1:]
        if np.any(bad):
            j = int(np.flatnonzero(bad)[0]) + 1
            row = int(np.searchsorted(offs, j, side="right") - 1)
            _fail(p, f"column indices of row {row} are not strictly increasing "
                     f"({idx[j - 1]} then {idx[j]})")
    mat = SparseMatrix((m, k), offs, idx, synthetic_values(nnz, seed), dtype="fp32",
                       values_synthetic=True, meta={"note": synthetic_note(seed)})
    return [(name or p.stem, mat)]


# =========================================================================
# save
# =========================================================================
def save(path, matrices, npz_layout: str = "auto") -> None:
    """Write matrices so that `load` reads them back equal.

    matrices: a list of (name, SparseMatrix), or one SparseMatrix.
    - .safetensors: each matrix as a dense tensor (F32, F16 or BF16 after
      its dtype), its permutation as an I64 tensor "<name>.perm".
    - .npz: npz_layout "csr" (the default for one matrix) writes the
      scipy CSR keys (format, shape, data, indices, indptr) plus `perm`,
      `sparseforge_dtype` and `sparseforge_name`; "dense" (the default for
      several) one dense array per name plus "<name>.perm" and, for bf16
      (which npy cannot hold), float32 values with "<name>.dtype".
    - .mtx: coordinate real general, values with 9 significant digits
      (exact for float32); dtype and perm in %sparseforge- comment lines.
    - .npy: one dense fp32/fp16 matrix with no permutation.
    - .smtx: the pattern only (the format holds no values and no
      permutation: values come back drawn from the seed).
    Dense layouts keep the nonzeros: explicit zeros in the pattern are lost.
    """
    p = Path(path)
    if isinstance(matrices, SparseMatrix):
        matrices = [(matrices.name or p.stem, matrices)]
    matrices = list(matrices)
    if not matrices:
        raise ValueError(f"{p}: nothing to save")
    names = [n for n, _ in matrices]
    if len(set(names)) != len(names):
        raise ValueError(f"{p}: duplicate matrix names {names}")
    ext = p.suffix.lower()
    if ext == ".safetensors":
        _save_safetensors(p, matrices)
    elif ext == ".npz":
        if npz_layout == "auto":
            npz_layout = SCIPY_CSR if len(matrices) == 1 else "dense"
        _save_npz(p, matrices, npz_layout)
    elif ext in (".mtx", ".smtx", ".npy"):
        if len(matrices) != 1:
            raise ValueError(f"{p}: {ext} holds one matrix, got {len(matrices)}")
        {".mtx": _save_mtx, ".smtx": _save_smtx, ".npy": _save_npy}[ext](p, matrices[0][1])
    else:
        raise ValueError(f"{p}: cannot save to extension {p.suffix!r}; expected one of "
                         f"{', '.join(EXTENSIONS)}")


def _dense_np(m: SparseMatrix) -> np.ndarray:
    d = m.to_dense()
    return d.astype(np.float16) if m.dtype == "fp16" else round_to_dtype(d, m.dtype)


def _save_npy(p: Path, m: SparseMatrix):
    if m.dtype == "bf16":
        raise ValueError(f"{p}: .npy cannot hold bf16 (numpy has no bf16 type); use .safetensors")
    if m.perm is not None:
        raise ValueError(f"{p}: .npy cannot hold a row permutation; use .safetensors or .npz")
    with open(p, "wb") as f:
        np.save(f, _dense_np(m))


def _save_npz(p: Path, matrices, layout: str):
    arrays: dict[str, np.ndarray] = {}
    if layout == SCIPY_CSR:
        if len(matrices) != 1:
            raise ValueError(f"{p}: the csr npz layout holds one matrix, got {len(matrices)}")
        nm, m = matrices[0]
        arrays = {
            "format": np.array(SCIPY_CSR.encode()), "shape": np.array(m.shape, dtype=np.int64),
            "data": m.values.astype(np.float16) if m.dtype == "fp16" else round_to_dtype(m.values, m.dtype),
            "indices": m.indices.astype(np.int32), "indptr": m.indptr.astype(np.int64),
            "sparseforge_dtype": np.array(m.dtype.encode()),
            "sparseforge_name": np.array(nm.encode()),
        }
        if m.perm is not None:
            arrays["perm"] = m.perm.astype(np.int64)
    elif layout == "dense":
        for nm, m in matrices:
            arrays[nm] = _dense_np(m)
            if m.dtype == "bf16":
                arrays[nm + ".dtype"] = np.array(b"bf16")
            if m.perm is not None:
                arrays[nm + ".perm"] = m.perm.astype(np.int64)
    else:
        raise ValueError(f"unknown npz layout {layout!r}; expected 'csr' or 'dense'")
    with open(p, "wb") as f:
        np.savez(f, **arrays)


_ST_OF_DTYPE = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def _save_safetensors(p: Path, matrices):
    header: dict = {"__metadata__": {"format": "sparseforge"}}
    blobs: list[bytes] = []
    off = 0

    def add(tname, dt, shape, blob):
        nonlocal off
        header[tname] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)

    for nm, m in matrices:
        if nm + ".perm" in dict(matrices):
            raise ValueError(f"{p}: matrix name {nm + '.perm'!r} clashes with the permutation of {nm!r}")
        add(nm, _ST_OF_DTYPE[m.dtype], m.shape, to_device_bytes(m.to_dense(), m.dtype))
        if m.perm is not None:
            add(nm + ".perm", "I64", (m.rows,), m.perm.astype("<i8").tobytes())
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def _save_mtx(p: Path, m: SparseMatrix):
    rows = m.row_ids() + 1
    cols = m.indices.astype(np.int64) + 1
    with open(p, "w") as f:
        f.write("%%MatrixMarket matrix coordinate real general\n")
        f.write(f"%sparseforge-dtype {m.dtype}\n")
        if m.perm is not None:
            f.write("%sparseforge-perm " + " ".join(map(str, m.perm.tolist())) + "\n")
        f.write(f"{m.rows} {m.cols} {m.nnz}\n")
        vals = [f"{v:.9g}" for v in m.values.tolist()]
        f.write("".join(f"{r} {c} {v}\n" for r, c, v in zip(rows.tolist(), cols.tolist(), vals)))


def _save_smtx(p: Path, m: SparseMatrix):
    if m.perm is not None:
        raise ValueError(f"{p}: .smtx cannot hold a row permutation; use .safetensors, .npz or .mtx")
    with open(p, "w") as f:
        f.write(f"{m.rows}, {m.cols}, {m.nnz}\n")
        f.write(" ".join(map(str, m.indptr.tolist())) + "\n")
        f.write(" ".join(map(str, m.indices.tolist())) + "\n")
