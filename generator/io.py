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

`name` selects, it never renames: in a .npz or .safetensors, the tensor to
load; a file that holds one matrix (.npy, .mtx, .smtx, a scipy .npz) takes
only that matrix's own name (the file's stem, or the name a scipy .npz
records) and refuses any other.

Every malformed file raises `WeightFileError` (a ValueError) whose message
starts with the file's path and names the problem; no numpy, zipfile,
struct, json, decoding, overflow or memory error gets through.  Hostile
files (a few bytes declaring a huge matrix) are refused before memory is
committed:

| check         | what is refused                                                  |
| ------------- | ---------------------------------------------------------------- |
| file size     | a shape or nnz that the file cannot hold: .npy data or a          |
|               | safetensors byte range past the end, an .mtx with fewer than 2    |
|               | characters per number, an .smtx without exactly rows + 1 offsets  |
|               | and nnz indices, an npz member whose array disagrees with the     |
|               | sizes the zip directory records (or that deflate cannot reach)    |
| element limit | rows * cols (dense-equivalent, which also bounds nnz) of one      |
|               | matrix over `MAX_ELEMENTS` (2**34); the environment variable      |
|               | SPARSEFORGE_MAX_ELEMENTS or `load(..., max_elements=N)` sets it   |
| index width   | more than MAX_DIM = 2**31 - 1 rows or columns (32-bit indices)    |
| empty         | no rows or no columns: nothing to tune                            |
| values        | NaN/inf, and finite values that overflow the dtype they are       |
|               | rounded to (fp16 holds up to 65504)                               |

Sparse readers check every index against the declared shape, and row
offsets (first 0, non-decreasing, last nnz), before using them.

`save(path, matrices)` writes `.npz`, `.safetensors`, `.mtx`, `.smtx` and
`.npy` so that `load` gives back the same matrices (see `save` for what each
format keeps).
"""
from __future__ import annotations

import ast
import errno
import json
import math
import os
import re
import stat
import struct
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional, Sequence

import numpy as np

from .matrix import DTYPES, SparseMatrix, round_to_dtype, to_device_bytes

EXTENSIONS = (".npy", ".npz", ".safetensors", ".mtx", ".smtx")

# Limits on what one file may declare (see the module docstring).
MAX_ELEMENTS = 2 ** 34          # rows * cols of one matrix
MAX_ELEMENTS_ENV = "SPARSEFORGE_MAX_ELEMENTS"
MAX_DIM = 2 ** 31 - 1           # rows or columns: indices are 32-bit
_NPY_MAX_HEADER = 1 << 20       # numpy itself writes headers of a few hundred bytes
_NPY_MAX_DIMS = 32
_NPY_MAX_EXTENT = 2 ** 62       # one dimension of an .npy/npz array
_SMALL_MEMBER = 4096            # bytes of an npz scalar (format, shape, name, dtype)
_DEFLATE_MAX_RATIO = 1032       # deflate expands at most ~1032:1
# largest finite value of each dtype
_DTYPE_MAX = {"fp32": float(np.finfo(np.float32).max), "fp16": float(np.finfo(np.float16).max),
              "bf16": float(np.array(0x7F7F0000, np.uint32).view(np.float32))}

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


def element_limit(max_elements: Optional[int] = None) -> tuple[int, str]:
    """(limit, what set it): the largest rows * cols of one matrix that
    `load` reads.  The `max_elements` argument, else the environment
    variable SPARSEFORGE_MAX_ELEMENTS, else MAX_ELEMENTS."""
    if max_elements is not None:
        if (isinstance(max_elements, bool) or not isinstance(max_elements, (int, np.integer))
                or max_elements < 1):
            raise ValueError(f"max_elements must be a positive integer, got {max_elements!r}")
        return int(max_elements), "the max_elements argument"
    raw = os.environ.get(MAX_ELEMENTS_ENV, "").strip()
    if not raw:
        return MAX_ELEMENTS, "the default, MAX_ELEMENTS"
    try:
        value = int(raw)
    except ValueError:
        try:  # 1e12
            f = float(raw)
            value = int(f) if f.is_integer() else 0
        except (ValueError, OverflowError):
            value = 0
    if value < 1:
        raise ValueError(f"{MAX_ELEMENTS_ENV}={raw!r} is not a positive integer")
    return value, f"{MAX_ELEMENTS_ENV}={raw}"


# =========================================================================
# load
# =========================================================================
def load(path, name: Optional[str] = None, dtype: Optional[str] = None,
         seed: int = 0, max_elements: Optional[int] = None) -> list[tuple[str, SparseMatrix]]:
    """Read a weights file.

    name:  the tensor to load from a .npz or .safetensors (default: every
           2-D floating-point tensor).  A file holding one matrix (.npy,
           .mtx, .smtx, a scipy .npz) accepts only that matrix's own name
           (its stem, or the name a scipy .npz records); another name is
           an error saying what the file holds.
    dtype: "fp32", "fp16" or "bf16" to override the precision detected
           from the file (values are rounded to it; values that overflow
           it are an error).
    seed:  seed of the values drawn for pattern-only files (.smtx, pattern
           .mtx).
    max_elements: the largest rows * cols of one matrix (default: the
           environment variable SPARSEFORGE_MAX_ELEMENTS, else
           MAX_ELEMENTS = 2**34).
    """
    return list(iterate(path, name=name, dtype=dtype, seed=seed, max_elements=max_elements))


def iterate(path, name: Optional[str] = None, dtype: Optional[str] = None,
            seed: int = 0, max_elements: Optional[int] = None
            ) -> Iterator[tuple[str, SparseMatrix]]:
    """load()'s matrices one at a time: a .safetensors or .npz file's
    tensors are each read when asked for, so that a model's layers need not
    be held in memory at once (the other formats hold one matrix).  The
    same checks and errors as load(), each raised when the matrix it
    concerns is reached."""
    p = Path(path)
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    limit = element_limit(max_elements)
    ext = p.suffix.lower()
    _check_input(p, ext)
    reader = {".npy": _load_npy, ".npz": _load_npz, ".safetensors": _load_safetensors,
              ".mtx": _load_mtx, ".smtx": _load_smtx}[ext]
    for nm, m in _read(p, reader, name, seed, limit):
        if dtype is not None and dtype != m.dtype:
            _check_values(p, f"matrix {nm!r}", m.values, dtype)
            m = m.astype(dtype)
        m.name = nm
        m.meta.setdefault("source", str(p))
        yield nm, m


def _read(p: Path, reader, name, seed, limit) -> Iterator[tuple[str, SparseMatrix]]:
    """The reader's matrices, whatever goes wrong while reading them said
    as the file's fault (WeightFileError)."""
    try:
        yield from reader(p, name, seed, limit)
    except WeightFileError:
        raise
    except MemoryError as e:
        raise WeightFileError(
            f"{p}: not enough memory to read it (MemoryError{': ' + str(e) if str(e) else ''}); "
            f"the element limit ({limit[0]}, set by {limit[1]}) is more than this machine "
            f"holds: lower it with {MAX_ELEMENTS_ENV}=N or load(..., max_elements=N)") from e
    except OSError as e:
        raise WeightFileError(f"{p}: {_os_problem(e)}") from e
    except Exception as e:  # a malformed input that no check foresaw: still the file's fault
        raise WeightFileError(f"{p}: cannot be read (unexpected {type(e).__name__}: "
                              f"{_clip(str(e), 200)})") from e


def load_one(path, name: Optional[str] = None, dtype: Optional[str] = None,
             seed: int = 0, max_elements: Optional[int] = None) -> SparseMatrix:
    """The single matrix of a file (error if it holds several and `name`
    does not pick one)."""
    mats = load(path, name=name, dtype=dtype, seed=seed, max_elements=max_elements)
    if len(mats) != 1:
        raise WeightFileError(f"{path}: holds {len(mats)} matrices "
                              f"({', '.join(n for n, _ in mats[:8])}); pick one by name")
    return mats[0][1]


def _fail(p, msg: str):
    raise WeightFileError(f"{p}: {msg}")


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[:n] + f"... ({len(s)} characters)"


def _os_problem(e: OSError, p=None) -> str:
    """What an OSError on the weights file means, in words."""
    if e.errno == errno.ELOOP:
        return "is a symbolic link loop: the path cannot be resolved"
    if e.errno == errno.ENOENT and p is not None and os.path.islink(p):
        return f"is a broken symbolic link (to {os.readlink(p)!r}, which does not exist)"
    if e.errno == errno.ENOENT:
        return "no such file"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied: cannot read it"
    if e.errno == errno.EISDIR:
        return "is a directory, not a weights file"
    if e.errno == errno.ENOTDIR:
        return "no such file (a component of the path is not a directory)"
    return f"cannot read it: {e.strerror or e}"


def _check_input(p: Path, ext: str) -> None:
    """A readable regular file with a known extension (a directory is named
    as such whatever its extension)."""
    try:
        st, problem = os.stat(p), None
    except OSError as e:
        st, problem = None, _os_problem(e, p)
    except ValueError as e:  # an embedded NUL byte
        st, problem = None, f"not a usable path ({e})"
    if st is not None and stat.S_ISDIR(st.st_mode):
        _fail(p, "is a directory, not a weights file")
    if ext not in EXTENSIONS:
        _fail(p, f"unknown extension {p.suffix!r}; expected one of {', '.join(EXTENSIONS)}")
    if problem:
        _fail(p, problem)
    if not stat.S_ISREG(st.st_mode):
        _fail(p, "is not a regular file (a device, pipe or socket)")


def _open(p: Path):
    try:
        return open(p, "rb")
    except OSError as e:
        _fail(p, _os_problem(e, p))


def _file_size(f) -> int:
    return os.fstat(f.fileno()).st_size


def _read_text(p: Path) -> str:
    with _open(p) as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(p, f"not a text file (byte {e.start} is not UTF-8)")


def _own_name(p: Path, name: Optional[str], own: str, holds: str = "one matrix",
              where: str = "a .npz or .safetensors") -> str:
    """The name of a file that holds one matrix; `name` must be it."""
    if name is not None and name != own:
        _fail(p, f"{p.name} holds {holds}, named {_clip(own)!r}; --name selects a tensor of "
                 f"{where} (got {_clip(str(name))!r})")
    return own


def _check_shape(p, what: str, m: int, k: int, limit: tuple[int, str]) -> None:
    """Refuses, before anything of the matrix's size is allocated, a matrix
    with no rows or columns, beyond 32-bit indices or over the element
    limit."""
    if m == 0 or k == 0:
        none = "rows or columns" if m == k == 0 else "rows" if m == 0 else "columns"
        _fail(p, f"{what} is {m} x {k} and has no {none}: nothing to tune")
    if max(m, k) > MAX_DIM:
        _fail(p, f"{what} is {m} x {k}: more than {MAX_DIM} {'rows' if m > MAX_DIM else 'columns'} "
                 "(row and column indices are 32-bit)")
    lim, source = limit
    if m * k > lim:
        _fail(p, f"{what} is {m} x {k} = {m * k} elements (dense-equivalent), over the limit of "
                 f"{lim} elements per matrix (set by {source}); raise it with "
                 f"{MAX_ELEMENTS_ENV}=N or load(..., max_elements=N)")


def _check_values(p, what: str, values: np.ndarray, dtype: str, position=None):
    """Refuses NaN/inf, then finite values that overflow `dtype` once rounded
    to it (float64 beyond fp32, fp32 beyond fp16 or bf16).  `position(i)`
    describes flat index i of `values`."""
    bad = ~np.isfinite(values)
    if np.any(bad):
        i = int(np.flatnonzero(bad.ravel())[0])
        v = values.ravel()[i]
        where = position(i) if position else f"entry {i}"
        _fail(p, f"{what} contains {int(bad.sum())} NaN/inf value(s) (first: {v} at {where})")
    if values.size:
        big = float(np.max(np.abs(values)))
        with np.errstate(over="ignore"):
            rounded = round_to_dtype(np.array([big]).astype(np.float32), dtype)
        if not np.isfinite(rounded[0]):
            prefix = "" if what == "values" else f"{what}: "
            _fail(p, f"{prefix}values overflow {dtype} (largest |w| = {big:g}; {dtype} holds up "
                     f"to {_DTYPE_MAX[dtype]:g})")


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


def _dense_check(p, what: str, hdr: "_NpyHeader", limit, dtype: Optional[str] = None) -> str:
    """The dtype of a dense .npy/.npz array, checked (2-D, float, shape)
    from its header, before its data is read."""
    if len(hdr.shape) != 2:
        _fail(p, f"{what} is not 2-D (shape {_clip(repr(hdr.shape), 80)})")
    detected = _float_dtype_name(p, what, hdr.dtype)
    _check_shape(p, what, hdr.shape[0], hdr.shape[1], limit)
    return dtype or detected


def _dense_to_matrix(p, what: str, arr: np.ndarray, dtype: str) -> SparseMatrix:
    k = arr.shape[1]
    _check_values(p, what, arr, dtype, lambda i: f"row {i // k}, col {i % k}")
    m = SparseMatrix.from_dense(arr.astype(np.float32), dtype=dtype)
    if arr.dtype.kind == "f" and arr.dtype.itemsize == 8:
        m.meta["note"] = "float64 weights rounded to float32"
    return m


def _perm_count(p, what: str, count: int, m: int):
    """Before a permutation is read: one entry per row."""
    if count != m:
        _fail(p, f"{what} is not a permutation of the {m} rows")


def _check_perm(p, what: str, perm: np.ndarray, m: int) -> np.ndarray:
    if perm.dtype.kind not in "iu":
        _fail(p, f"{what} has dtype {perm.dtype}, expected integers")
    perm = perm.astype(np.int64).ravel()
    if perm.size != m or not np.array_equal(np.sort(perm), np.arange(m)):
        _fail(p, f"{what} is not a permutation of the {m} rows")
    return perm


# ---- .npy ----------------------------------------------------------------
class _NpyHeader(NamedTuple):
    dtype: np.dtype
    shape: tuple
    fortran: bool
    data_start: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


def _npy_header(p, what: str, read, size: int) -> _NpyHeader:
    """The validated header of a .npy image (a file or an npz member) of
    `size` bytes, `read(n)` giving its next n bytes.  The data it declares
    must fit in `size`: nothing is read or allocated for a shape that the
    bytes cannot hold."""
    magic = b"\x93NUMPY"
    pre = read(min(size, 10))
    if len(pre) < 10:
        if magic.startswith(pre[:6]):
            _fail(p, f"{what}: truncated: {len(pre)} bytes, shorter than a .npy header")
        _fail(p, f"{what}: not a .npy file (bad magic)")
    if pre[:6] != magic:
        _fail(p, f"{what}: not a .npy file (bad magic)")
    major = pre[6]
    if major == 1:
        hlen, start = struct.unpack_from("<H", pre, 8)[0], 10
    elif major in (2, 3):
        more = read(2)
        if len(more) < 2:
            _fail(p, f"{what}: truncated: {10 + len(more)} bytes, shorter than a .npy header")
        hlen, start = struct.unpack("<I", pre[8:] + more)[0], 12
    else:
        _fail(p, f"{what}: unsupported .npy format version {major}.{pre[7]}")
    if start + hlen > size:
        _fail(p, f"{what}: truncated: header of {hlen} bytes, only {size - start} present")
    if hlen > _NPY_MAX_HEADER:
        _fail(p, f"{what}: bad .npy header: {hlen} bytes is implausible (over {_NPY_MAX_HEADER})")
    raw = read(hlen)
    if len(raw) < hlen:
        _fail(p, f"{what}: truncated: header of {hlen} bytes, only {len(raw)} present")
    try:
        with warnings.catch_warnings():  # invalid escapes etc. of a hostile header
            warnings.simplefilter("ignore")
            header = ast.literal_eval(raw.decode("utf-8" if major == 3 else "latin1"))
    except (ValueError, TypeError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        _fail(p, f"{what}: bad .npy header ({type(e).__name__}: {_clip(str(e), 80)})")
    if not isinstance(header, dict) or not {"descr", "fortran_order", "shape"} <= set(header):
        _fail(p, f"{what}: bad .npy header: expected a dict with descr, fortran_order, shape")
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(type(s) is int for s in shape):
        _fail(p, f"{what}: bad .npy header: shape {_clip(repr(shape), 80)}")
    if any(s < 0 for s in shape):
        _fail(p, f"{what}: bad .npy header: negative shape {_clip(repr(shape), 80)}")
    if len(shape) > _NPY_MAX_DIMS or any(s > _NPY_MAX_EXTENT for s in shape):
        _fail(p, f"{what}: bad .npy header: shape {_clip(repr(shape), 80)} is too large")
    descr = header["descr"]
    try:
        with warnings.catch_warnings():  # deprecated aliases
            warnings.simplefilter("ignore")
            dt = np.dtype(descr if isinstance(descr, str) else [tuple(f) for f in descr])
    except Exception as e:  # np.dtype of an arbitrary literal: TypeError, ValueError, ...
        _fail(p, f"{what}: unsupported dtype {_clip(repr(descr), 80)} ({type(e).__name__})")
    if dt.hasobject:
        _fail(p, f"{what}: unsupported dtype {dt} (object arrays are not read)")
    if dt.itemsize == 0 or dt.subdtype is not None:
        _fail(p, f"{what}: unsupported dtype {dt}")
    hdr = _NpyHeader(dt, shape, bool(header["fortran_order"]), start + hlen)
    avail = size - hdr.data_start
    if avail < hdr.nbytes:
        _fail(p, f"{what}: truncated: shape {_clip(repr(shape), 80)} of {dt} needs {hdr.nbytes} "
                 f"bytes of data, {avail} present")
    return hdr


def _npy_array(p, what: str, raw: bytes, hdr: _NpyHeader) -> np.ndarray:
    if len(raw) < hdr.nbytes:
        _fail(p, f"{what}: truncated: shape {hdr.shape} of {hdr.dtype} needs {hdr.nbytes} "
                 f"bytes of data, {len(raw)} present")
    arr = np.frombuffer(raw, dtype=hdr.dtype, count=hdr.count)
    return arr.reshape(hdr.shape, order="F" if hdr.fortran else "C")


def _load_npy(p: Path, name, seed, limit):
    nm = _own_name(p, name, p.stem)
    with _open(p) as f:
        hdr = _npy_header(p, "array", f.read, _file_size(f))
        dtype = _dense_check(p, "array", hdr, limit)
        arr = _npy_array(p, "array", f.read(hdr.nbytes), hdr)
    return [(nm, _dense_to_matrix(p, "array", arr, dtype))]


# ---- .npz ----------------------------------------------------------------
# scipy.sparse's archive formats (file formats, not kernel families)
SCIPY_CSR, SCIPY_CSC, SCIPY_COO, SCIPY_BSR = "csr", "csc", "coo", "bsr"
_SCIPY_FORMATS = (SCIPY_CSR, SCIPY_CSC, SCIPY_COO, SCIPY_BSR)


@contextmanager
def _zip_errors(p, member: Optional[str] = None):
    """zipfile raises many kinds on a corrupt archive: each names the file
    (and the member)."""
    try:
        yield
    except (WeightFileError, MemoryError):
        raise
    except Exception as e:
        if member is not None:
            _fail(p, f"member {member!r} cannot be read, truncated or corrupt "
                     f"({type(e).__name__}: {_clip(str(e), 120)})")
        if isinstance(e, zipfile.BadZipFile):
            _fail(p, f"not a valid .npz (zip) archive, truncated or corrupt ({e})")
        _fail(p, f"corrupt .npz archive ({type(e).__name__}: {_clip(str(e), 120)})")


class _Npz:
    """An open .npz archive: every member's .npy header, checked against
    the sizes the zip directory records, and each member's data on demand."""

    def __init__(self, p: Path, f):
        self.p = p
        size = _file_size(f)
        with _zip_errors(p):
            self.z = zipfile.ZipFile(f)
            infos = [i for i in self.z.infolist() if not i.is_dir()]
        self.members: dict[str, tuple[zipfile.ZipInfo, _NpyHeader]] = {}
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            self.members[key] = (info, self._header(info, key, size))

    def _header(self, info: zipfile.ZipInfo, key: str, size: int) -> _NpyHeader:
        p, what = self.p, f"array {key!r}"
        usize, csize = info.file_size, info.compress_size
        if csize > size:
            _fail(p, f"{what}: the zip directory records {csize} compressed bytes, more than "
                     f"the whole archive ({size} bytes)")
        if info.compress_type == zipfile.ZIP_STORED and usize != csize:
            _fail(p, f"{what}: stored uncompressed, but the zip directory records {usize} bytes "
                     f"for {csize} stored")
        if info.compress_type == zipfile.ZIP_DEFLATED and usize > _DEFLATE_MAX_RATIO * csize + 64:
            _fail(p, f"{what}: the zip directory records {usize} bytes from {csize} compressed, "
                     "more than deflate can expand (corrupt, or a zip bomb)")
        with _zip_errors(p, info.filename):
            f = self.z.open(info)

        def read(n):
            with _zip_errors(p, info.filename):
                return f.read(n)

        try:
            hdr = _npy_header(p, what, read, usize)
        finally:
            f.close()
        if hdr.data_start + hdr.nbytes != usize:
            _fail(p, f"{what}: the zip directory records {usize} bytes, its header and data "
                     f"(shape {_clip(repr(hdr.shape), 80)} of {hdr.dtype}) take "
                     f"{hdr.data_start + hdr.nbytes}")
        return hdr

    def __contains__(self, key: str) -> bool:
        return key in self.members

    def hdr(self, key: str) -> _NpyHeader:
        return self.members[key][1]

    def array(self, key: str) -> np.ndarray:
        info, hdr = self.members[key]
        with _zip_errors(self.p, info.filename):
            with self.z.open(info) as f:
                f.read(hdr.data_start)
                raw = f.read(hdr.nbytes)
                f.read(1)  # the end of the member, where zipfile checks the CRC
        return _npy_array(self.p, f"array {key!r}", raw, hdr)

    def small(self, key: str) -> np.ndarray:
        """A member that must be a scalar or a short vector (format, shape,
        names, dtypes)."""
        hdr = self.hdr(key)
        if hdr.count > 16 or hdr.nbytes > _SMALL_MEMBER:
            _fail(self.p, f"array {key!r} has {hdr.count} elements of {hdr.dtype}: expected a "
                          "scalar or a short vector")
        return self.array(key)

    def perm(self, key: str, m: int) -> np.ndarray:
        what = f"array {key!r}"
        _perm_count(self.p, what, self.hdr(key).count, m)
        return _check_perm(self.p, what, self.array(key), m)


def _scalar_str(v: np.ndarray) -> str:
    x = v.item() if v.size == 1 else v
    if isinstance(x, bytes):
        return x.decode("ascii", "replace")
    return str(x)


def _load_npz(p: Path, name, seed, limit):
    with _open(p) as f:
        z = _Npz(p, f)
        if "format" in z and "shape" in z and "data" in z:
            yield _scipy_to_matrix(p, z, name, limit)
        else:
            yield from _load_npz_dense(p, z, name, limit)


def _load_npz_dense(p: Path, z: _Npz, name, limit):
    keys = list(z.members)
    dense_keys = [k for k in keys
                  if not (k.endswith(".perm") and k[:-5] in z)
                  and not (k.endswith(".dtype") and k[:-6] in z)]
    if name is not None:
        if name not in z:
            _fail(p, f"no array named {name!r} (arrays: {_list_names(dense_keys)})")
        selected = [name]
    else:
        selected = [k for k in dense_keys
                    if len(z.hdr(k).shape) == 2 and z.hdr(k).dtype.kind in "fV"]
        if not selected:
            _fail(p, f"no 2-D floating-point array in the archive (arrays: {_list_names(keys)})")
    for k in selected:
        what = f"array {k!r}"
        dtype = None
        if k + ".dtype" in z:
            dtype = _scalar_str(z.small(k + ".dtype"))
            if dtype not in DTYPES:
                _fail(p, f"array {k + '.dtype'!r} names unknown dtype {_clip(repr(dtype))}")
        dtype = _dense_check(p, what, z.hdr(k), limit, dtype)
        m = _dense_to_matrix(p, what, z.array(k), dtype)
        if k + ".perm" in z:
            m.perm = z.perm(k + ".perm", m.rows)
        yield k, m


def _list_names(names: Iterable[str], limit: int = 12) -> str:
    names = [_clip(n) for n in names]
    s = ", ".join(repr(n) for n in names[:limit])
    return s + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"


def _int_member(p, z: _Npz, key: str, fmt: str, count: int, expected: str) -> np.ndarray:
    """An integer array of a scipy archive, its dtype and entry count
    checked from its header before it is read."""
    if key not in z:
        _fail(p, f"scipy {fmt} archive lacks the {key!r} array")
    hdr = z.hdr(key)
    if hdr.dtype.kind not in "iu":
        _fail(p, f"array {key!r} has dtype {hdr.dtype}, expected integers")
    if hdr.count != count:
        _fail(p, f"{key!r} has {hdr.count} entries, {expected}")
    a = z.array(key).ravel()
    if a.size and a.dtype.kind == "u" and int(a.max()) > np.iinfo(np.int64).max:
        _fail(p, f"array {key!r} holds {int(a.max())}, beyond 64-bit signed indices")
    return a.astype(np.int64)


def _check_indptr(p, key: str, indptr: np.ndarray, nnz: int):
    """Offsets start at 0, never decrease and end at nnz (their count is
    checked before they are read)."""
    if indptr[0] != 0:
        _fail(p, f"{key!r} does not start at 0 (starts at {indptr[0]})")
    d = np.diff(indptr)
    if np.any(d < 0):
        i = int(np.flatnonzero(d < 0)[0])
        _fail(p, f"{key!r} is out of order: entry {i + 1} ({indptr[i + 1]}) < entry {i} ({indptr[i]})")
    if indptr[-1] != nnz:
        _fail(p, f"{key!r} ends at {indptr[-1]}, not at the number of stored entries {nnz}")


def _scipy_to_matrix(p, z: _Npz, name, limit) -> tuple[str, SparseMatrix]:
    fmt = _scalar_str(z.small("format"))
    if fmt not in _SCIPY_FORMATS:
        _fail(p, f"unsupported sparse format {_clip(repr(fmt))} "
                 f"(expected one of {', '.join(_SCIPY_FORMATS)})")
    own = _scalar_str(z.small("sparseforge_name")) if "sparseforge_name" in z else p.stem
    nm = _own_name(p, name, own, "one sparse matrix (a scipy archive)",
                   "a .npz of dense arrays or a .safetensors")
    shape = z.small("shape").ravel()
    if shape.size != 2:
        _fail(p, f"sparse matrix is not 2-D (shape {shape.tolist()})")
    if shape.dtype.kind not in "iu":
        _fail(p, f"array 'shape' has dtype {shape.dtype}, expected integers")
    if np.any(shape < 0):
        _fail(p, f"sparse matrix has a negative shape {shape.tolist()}")
    m, k = int(shape[0]), int(shape[1])
    _check_shape(p, "sparse matrix", m, k, limit)
    dh = z.hdr("data")
    dtype = _float_dtype_name(p, "array 'data'", dh.dtype)
    if "sparseforge_dtype" in z:
        dtype = _scalar_str(z.small("sparseforge_dtype"))
        if dtype not in DTYPES:
            _fail(p, f"'sparseforge_dtype' names unknown dtype {_clip(repr(dtype))}")
    if dh.count > m * k:
        _fail(p, f"array 'data' holds {dh.count} values, more than the {m} x {k} matrix has elements")
    if fmt == SCIPY_BSR:
        if len(dh.shape) != 3:
            _fail(p, f"bsr 'data' must be (blocks, br, bc), got shape {dh.shape}")
        nb, br, bc = dh.shape
        if br == 0 or bc == 0 or m % br or k % bc:
            _fail(p, f"bsr block {br}x{bc} does not divide the shape {m}x{k}")
        indptr = _int_member(p, z, "indptr", fmt, m // br + 1, f"expected block rows + 1 = {m // br + 1}")
        bcols = _int_member(p, z, "indices", fmt, nb, f"for {nb} blocks")
        _check_indptr(p, "indptr", indptr, nb)
        if nb and (bcols.min() < 0 or bcols.max() >= k // bc):
            _fail(p, f"block column index out of range [0, {k // bc})")
        data = z.array("data")
        _check_values(p, "array 'data'", data, dtype)
        brow = np.repeat(np.arange(m // br), np.diff(indptr))
        # every element of every block: (block, i, j)
        rows = (brow[:, None, None] * br + np.arange(br)[None, :, None]) + np.zeros((1, 1, bc), np.int64)
        cols = (bcols[:, None, None] * bc + np.arange(bc)[None, None, :]) + np.zeros((1, br, 1), np.int64)
        rows, cols = rows.ravel(), cols.ravel()
    else:
        nnz = dh.count
        if fmt == SCIPY_COO:
            if "row" in z and "col" in z:
                rows = _int_member(p, z, "row", fmt, nnz, f"'data' has {nnz}")
                cols = _int_member(p, z, "col", fmt, nnz, f"'data' has {nnz}")
            elif "coords" in z and z.hdr("coords").shape == (2, nnz):
                rows, cols = _int_member(p, z, "coords", fmt, 2 * nnz, "").reshape(2, nnz)
            else:
                _fail(p, "scipy coo archive lacks the 'row' and 'col' arrays")
        else:
            n_major = m if fmt == SCIPY_CSR else k
            major_name = "rows" if fmt == SCIPY_CSR else "columns"
            indptr = _int_member(p, z, "indptr", fmt, n_major + 1,
                                 f"expected {major_name} + 1 = {n_major + 1}")
            idx = _int_member(p, z, "indices", fmt, nnz, f"'data' has {nnz}")
            _check_indptr(p, "indptr", indptr, nnz)
            major = np.repeat(np.arange(n_major), np.diff(indptr))
            rows, cols = (major, idx) if fmt == SCIPY_CSR else (idx, major)
        data = z.array("data")
        _check_values(p, "array 'data'", data, dtype)
    mat = _coo_to_matrix(p, (m, k), rows, cols, data.ravel(), dtype, one_based=False)
    if "perm" in z:
        mat.perm = z.perm("perm", m)
    return nm, mat


def _coo_to_matrix(p, shape, rows, cols, vals, dtype, one_based: bool,
                   perm=None, **kw) -> SparseMatrix:
    """Entries (any order) to a SparseMatrix; rejects out-of-range and
    duplicate entries.  `vals` were checked (finite, within `dtype`)."""
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
    with _open(p) as f:
        size = _file_size(f)
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
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        _fail(p, f"bad header JSON: {_clip(str(e), 120) or type(e).__name__}")
    if not isinstance(header, dict):
        _fail(p, f"bad header JSON: expected an object, got {type(header).__name__}")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict):
        _fail(p, "bad header: __metadata__ is not an object")
    data_start = 8 + n
    data_size = size - data_start
    for tname, info in header.items():
        what = f"tensor {_clip(tname)!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            _fail(p, f"bad header: {what} lacks dtype, shape or data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or dt not in _ST_DTYPES:
            _fail(p, f"{what} has unsupported dtype {_clip(repr(dt))}")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            _fail(p, f"bad header: {what} has shape {_clip(repr(shape), 80)}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(type(o) is int for o in offs)
                or offs[0] < 0 or offs[1] < offs[0]):
            _fail(p, f"bad header: {what} has data_offsets {_clip(repr(offs), 80)}")
        need = math.prod(shape) * _ST_DTYPES[dt][1]
        if offs[1] - offs[0] != need:
            _fail(p, f"{what}: data_offsets {offs} span {offs[1] - offs[0]} bytes, shape "
                     f"{_clip(repr(shape), 80)} of {dt} needs {need}")
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


def _load_safetensors(p: Path, name, seed, limit):
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
    with _open(p) as f:
        for tname in names:
            info = header[tname]
            what = f"tensor {_clip(tname)!r}"
            if len(info["shape"]) != 2:
                _fail(p, f"{what} is not 2-D (shape {_clip(repr(info['shape']), 80)})")
            if info["dtype"] not in _ST_MATRIX_DTYPES:
                _fail(p, f"{what} has unsupported dtype {info['dtype']} for weights "
                         "(expected F32, F16 or BF16)")
            _check_shape(p, what, *info["shape"], limit)
            raw = _st_tensor(p, f, info, data_start)
            if info["dtype"] == "BF16":
                arr = (raw.astype(np.uint32) << 16).view(np.float32)
            else:
                arr = raw
            m = _dense_to_matrix(p, what, arr, _ST_MATRIX_DTYPES[info["dtype"]])
            pname = tname + ".perm"
            if pname in header:
                pinfo, pwhat = header[pname], f"tensor {_clip(pname)!r}"
                if pinfo["dtype"] not in _ST_INT_DTYPES:
                    _fail(p, f"{pwhat} has dtype {pinfo['dtype']}, expected integers")
                _perm_count(p, pwhat, math.prod(pinfo["shape"]), m.rows)
                m.perm = _check_perm(p, pwhat, _st_tensor(p, f, pinfo, data_start), m.rows)
            if meta:
                m.meta["safetensors_metadata"] = dict(meta)
            yield tname, m


# ---- text formats ----------------------------------------------------------
def _parse_numbers(p, what: str, tokens: Sequence[str], kind) -> np.ndarray:
    try:
        return np.array(tokens, dtype=kind)
    except (ValueError, OverflowError, TypeError):
        pass
    conv = int if kind is np.int64 else float
    for i, t in enumerate(tokens):
        try:
            v = conv(t)
        except (ValueError, OverflowError):
            _fail(p, f"{what}: token {i} ({_clip(t)!r}) is not "
                     f"{'an integer' if conv is int else 'a number'}")
        if conv is int and not -2 ** 63 <= v < 2 ** 63:
            _fail(p, f"{what}: token {i} ({_clip(t)!r}) is out of range (more than 64 bits)")
    try:  # tokens Python reads and numpy does not (e.g. non-ASCII digits)
        return np.array([conv(t) for t in tokens], dtype=kind)
    except (ValueError, OverflowError) as e:
        _fail(p, f"{what}: {e}")


def _check_room(p, claim: str, numbers: int, chars: int, after: str):
    """Before a text body is parsed: it holds at most (chars + 1) // 2
    numbers (one character and one separator each)."""
    room = (max(chars, 0) + 1) // 2
    if numbers > room:
        _fail(p, f"truncated: {claim} {numbers} numbers; the {max(chars, 0)} characters after "
                 f"{after} hold at most {room}")


# ---- .mtx ----------------------------------------------------------------
def _load_mtx(p: Path, name, seed, limit):
    nm = _own_name(p, name, p.stem)
    text = _read_text(p)
    lines = text.split("\n")
    if not lines or not lines[0].lower().startswith("%%matrixmarket"):
        _fail(p, "missing the '%%MatrixMarket' header line")
    banner = lines[0].split()
    if len(banner) != 5:
        _fail(p, f"bad header line {_clip(lines[0].strip(), 80)!r}: expected "
                 "'%%MatrixMarket matrix <format> <field> <symmetry>'")
    obj, fmt, field_, sym = (_clip(b.lower()) for b in banner[1:])
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
    i, used = 1, len(lines[0]) + 1
    while i < len(lines) and (lines[i].startswith("%") or not lines[i].strip()):
        line = lines[i]
        if line.startswith("%sparseforge-dtype"):
            dtype = line.split()[1] if len(line.split()) > 1 else ""
            if dtype not in DTYPES:
                _fail(p, f"line {i + 1}: unknown dtype {_clip(repr(dtype))}")
        elif line.startswith("%sparseforge-perm"):
            perm = _parse_numbers(p, f"line {i + 1}", line.split()[1:], np.int64)
        used += len(line) + 1
        i += 1
    if i >= len(lines):
        _fail(p, "truncated: no size line after the header")
    size_line = _clip(lines[i].strip(), 80)
    size_tokens = lines[i].split()
    rest = max(0, len(text) - used - len(lines[i]) - 1)  # characters after the size line
    want = 3 if fmt == "coordinate" else 2
    if len(size_tokens) != want:
        _fail(p, f"line {i + 1}: size line {size_line!r} must have {want} numbers")
    sizes = _parse_numbers(p, f"line {i + 1} (size line)", size_tokens, np.int64)
    if np.any(sizes < 0):
        _fail(p, f"line {i + 1}: negative size in {size_line!r}")
    m, k = int(sizes[0]), int(sizes[1])
    if sym != "general" and m != k:
        _fail(p, f"{sym} matrix must be square, size line says {m}x{k}")
    if fmt == "array":
        if sym == "general":
            count = m * k
        else:
            count = m * (m + 1) // 2 if sym == "symmetric" else m * (m - 1) // 2
        _check_room(p, f"array of {m}x{k} ({sym}) needs", count, rest, "the size line")
    else:
        nnz = int(sizes[2])
        per = 2 if field_ == "pattern" else 3
        _check_room(p, f"the size line promises {nnz} entries:", nnz * per, rest, "it")
    _check_shape(p, "matrix", m, k, limit)
    if perm is not None:
        perm = _check_perm(p, "%sparseforge-perm", perm, m)
    body = " ".join(lines[i + 1:]).split()
    if fmt == "array":
        if len(body) < count:
            _fail(p, f"truncated: array of {m}x{k} ({sym}) needs {count} values, found {len(body)}")
        if len(body) > count:
            _fail(p, f"{len(body)} values after the size line, the {m}x{k} ({sym}) array has {count}")
        vals = _parse_numbers(p, "values", body, np.float64)
        _check_values(p, "values", vals, dtype)
        vals = vals.astype(np.float32)
        dense = np.zeros((m, k), np.float32)
        if sym == "general":
            dense[:, :] = vals.reshape(k, m).T
        else:
            lo = 0 if sym == "symmetric" else 1
            cc, rr = np.triu_indices(m, lo)  # column-major lower triangle
            dense[rr, cc] = vals
            dense[cc, rr] = vals if sym == "symmetric" else -vals
        return [(nm, SparseMatrix.from_dense(dense, dtype=dtype, perm=perm))]
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
        vals = _parse_numbers(p, "values", body[2::per], np.float64)
        _check_values(p, "values", vals, dtype, lambda j: f"entry {j} (row {rows[j]}, col {cols[j]})")
        vals = vals.astype(np.float32)
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
    return [(nm, mat)]


# ---- .smtx ---------------------------------------------------------------
def _load_smtx(p: Path, name, seed, limit):
    nm = _own_name(p, name, p.stem)
    text = _read_text(p).strip("\n")
    lines = text.split("\n") if text.strip() else []
    if len(lines) < 1:
        _fail(p, "empty file: expected 3 lines (sizes, row offsets, column indices)")
    head = [t for t in re.split(r"[,\s]+", lines[0].strip()) if t]
    if len(head) != 3:
        _fail(p, f"line 1 {_clip(lines[0].strip(), 80)!r} must be 'rows, cols, nnz'")
    m, k, nnz = (int(v) for v in _parse_numbers(p, "line 1", head, np.int64))
    if m < 0 or k < 0 or nnz < 0:
        _fail(p, f"line 1: negative size in {_clip(lines[0].strip(), 80)!r}")
    if len(lines) < 2 or (nnz > 0 and len(lines) < 3):
        _fail(p, f"truncated: {len(lines)} line(s), expected 3 (sizes, row offsets, column indices)")
    if len(lines) > 3 and any(l.strip() for l in lines[3:]):
        _fail(p, f"{len(lines)} lines, expected 3")
    _check_shape(p, "matrix", m, k, limit)
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
    return [(nm, mat)]


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
