"""generator.io against hostile inputs: small files declaring huge or empty
matrices, indices beyond 32 bits, paths that are not files, values that
overflow the dtype, and `name` on a file that holds one matrix.  Each is
refused with a WeightFileError whose message starts as written here, fast
and without a large allocation."""
import errno
import json
import os
import struct
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from sparseforge.generator import io
from sparseforge.generator.matrix import SparseMatrix

LIMIT_HINT = "raise it with SPARSEFORGE_MAX_ELEMENTS=N or load(..., max_elements=N)"
DEFAULT_LIMIT = f"17179869184 elements per matrix (set by the default, MAX_ELEMENTS); {LIMIT_HINT}"


@pytest.fixture(autouse=True)
def default_limit(monkeypatch):
    monkeypatch.delenv("SPARSEFORGE_MAX_ELEMENTS", raising=False)


def refused(path, start, **kw):
    """io.load(path) raises WeightFileError "<path>: <start>..." within a
    second, allocating no more than a few MiB on the way."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(io.WeightFileError) as info:
            io.load(path, **kw)
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    msg = str(info.value)
    assert msg.startswith(f"{path}: {start}"), msg
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert peak < 16 << 20, f"peak {peak} bytes"
    return msg


def write_st(path, header: dict, data: bytes = b""):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def npy_header(shape, descr="<f4") -> bytes:
    """The bytes of a version 1.0 .npy header (no data)."""
    h = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    h += b" " * (-(10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


def scipy_npz(path, fmt="coo", shape=(4, 4), **arrays):
    base = {"coo": dict(row=np.zeros(0, np.int32), col=np.zeros(0, np.int32)),
            "csr": dict(indices=np.zeros(0, np.int32), indptr=np.zeros(min(max(shape[0], 0), 1000) + 1, np.int64))}[fmt]
    base.update(arrays)
    base.setdefault("data", np.zeros(0, np.float32))
    np.savez(path, format=np.array(fmt.encode()), shape=np.array(shape, np.int64), **base)
    return path


# =========================================================================
# 1. small files that declare huge matrices
# =========================================================================
def test_mtx_huge_shape(tmp_path):
    p = tmp_path / "big.mtx"
    p.write_text("%%MatrixMarket matrix coordinate real general\n2000000000 2000000000 0")
    assert p.stat().st_size < 70
    refused(p, "matrix is 2000000000 x 2000000000 = 4000000000000000000 elements "
               f"(dense-equivalent), over the limit of {DEFAULT_LIMIT}")


def test_mtx_huge_nnz_and_array(tmp_path):
    p = tmp_path / "big.mtx"
    p.write_text("%%MatrixMarket matrix coordinate real general\n4 4 5000000000\n1 1 1\n")
    refused(p, "truncated: the size line promises 5000000000 entries: 15000000000 numbers; "
               "the 6 characters after it hold at most 3")
    p.write_text("%%MatrixMarket matrix array real general\n100000 100000\n1\n")
    refused(p, "truncated: array of 100000x100000 (general) needs 10000000000 numbers; "
               "the 2 characters after the size line hold at most 1")


def test_mtx_number_beyond_64_bits(tmp_path):
    p = tmp_path / "big.mtx"
    p.write_text("%%MatrixMarket matrix coordinate real general\n99999999999999999999 4 1\n1 1 1\n")
    refused(p, "line 2 (size line): token 0 ('99999999999999999999') is out of range "
               "(more than 64 bits)")


def test_npz_coo_huge_shape(tmp_path):
    p = scipy_npz(tmp_path / "coo.npz", shape=(3_000_000_000, 0))
    refused(p, "sparse matrix is 3000000000 x 0 and has no columns: nothing to tune")
    scipy_npz(p, shape=(2_000_000_000, 2_000_000_000))
    refused(p, "sparse matrix is 2000000000 x 2000000000 = 4000000000000000000 elements "
               f"(dense-equivalent), over the limit of {DEFAULT_LIMIT}")
    scipy_npz(p, fmt="csr", shape=(3, 3), indices=np.zeros(20, np.int32),
              data=np.ones(20, np.float32))
    refused(p, "array 'data' holds 20 values, more than the 3 x 3 matrix has elements")


def test_npz_member_larger_than_its_bytes(tmp_path):
    # a member whose header declares 40 GB of data it does not have
    p = tmp_path / "w.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("w.npy", npy_header((100000, 100000)))
    refused(p, "array 'w': truncated: shape (100000, 100000) of float32 needs 40000000000 bytes "
               "of data, 0 present")
    # the zip directory records 40 GB uncompressed for a member of a few bytes
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("w.npy", npy_header((100000, 100000)) + b"\0" * 64)
    data = bytearray(p.read_bytes())
    cd = data.rindex(b"PK\x01\x02")
    struct.pack_into("<I", data, cd + 24, 0xFFFFFFF0)  # uncompressed size
    p.write_bytes(bytes(data))
    msg = refused(p, "array 'w': the zip directory records 4294967280 bytes from ")
    assert msg.endswith("more than deflate can expand (corrupt, or a zip bomb)")
    # stored, but the sizes disagree
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("w.npy", npy_header((4, 4)) + b"\0" * 64)
    data = bytearray(p.read_bytes())
    cd = data.rindex(b"PK\x01\x02")
    struct.pack_into("<I", data, cd + 24, 10_000_000)
    p.write_bytes(bytes(data))
    refused(p, "array 'w': stored uncompressed, but the zip directory records 10000000 bytes "
               "for 192 stored")


def test_npz_dense_over_the_limit(tmp_path):
    p = tmp_path / "w.npz"
    np.savez(p, w=np.ones((16, 16), np.float32))
    refused(p, "array 'w' is 16 x 16 = 256 elements (dense-equivalent), over the limit of 100 "
               f"elements per matrix (set by the max_elements argument); {LIMIT_HINT}",
            max_elements=100)


def test_safetensors_huge_shape(tmp_path, monkeypatch):
    p = write_st(tmp_path / "a.safetensors",
                 {"w": {"dtype": "F32", "shape": [3_000_000_000, 0], "data_offsets": [0, 0]}})
    refused(p, "tensor 'w' is 3000000000 x 0 and has no columns: nothing to tune")
    write_st(p, {"w": {"dtype": "F32", "shape": [100000, 100000],
                       "data_offsets": [0, 40_000_000_000]}})
    refused(p, "tensor 'w': data_offsets [0, 40000000000] lie outside the file")
    write_st(p, {"w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 16384]}},
             np.ones(4096, np.float32).tobytes())
    monkeypatch.setenv("SPARSEFORGE_MAX_ELEMENTS", "1000")
    refused(p, "tensor 'w' is 64 x 64 = 4096 elements (dense-equivalent), over the limit of 1000 "
               f"elements per matrix (set by SPARSEFORGE_MAX_ELEMENTS=1000); {LIMIT_HINT}")
    monkeypatch.setenv("SPARSEFORGE_MAX_ELEMENTS", "1e4")
    assert io.load(p)[0][1].shape == (64, 64)


def test_safetensors_hostile_header(tmp_path):
    p = write_st(tmp_path / "a.safetensors",
                 {"w": {"dtype": ["F32"], "shape": [2, 2], "data_offsets": [0, 16]}}, bytes(16))
    refused(p, "tensor 'w' has unsupported dtype ['F32']")
    raw = b"[" * 100000 + b"]" * 100000
    p.write_bytes(struct.pack("<Q", len(raw)) + raw)
    refused(p, "bad header JSON: ")


def test_smtx_huge_shape(tmp_path):
    p = tmp_path / "k.smtx"
    p.write_text("2, 5000000000, 2\n0 1 2\n4294967297 3\n")
    refused(p, "matrix is 2 x 5000000000: more than 2147483647 columns (row and column indices "
               "are 32-bit)")
    p.write_text("200000, 200000, 0\n" + "0 " * 200001 + "\n")
    refused(p, "matrix is 200000 x 200000 = 40000000000 elements (dense-equivalent), over the "
               f"limit of {DEFAULT_LIMIT}")


def test_npy_huge_shape(tmp_path):
    p = tmp_path / "w.npy"
    p.write_bytes(npy_header((3_000_000_000, 0)))
    refused(p, "array is 3000000000 x 0 and has no columns: nothing to tune")
    p.write_bytes(npy_header((100000, 100000)) + bytes(64))
    refused(p, "array: truncated: shape (100000, 100000) of float32 needs 40000000000 bytes of "
               "data, 64 present")


# =========================================================================
# 1b. no rows or no columns: nothing to tune
# =========================================================================
def empty_file(tmp_path, ext, m, k):
    p = tmp_path / f"e{ext}"
    if ext == ".npy":
        np.save(p, np.zeros((m, k), np.float32))
    elif ext == ".npz":
        np.savez(p, w=np.zeros((m, k), np.float32))
    elif ext == ".safetensors":
        write_st(p, {"w": {"dtype": "F32", "shape": [m, k], "data_offsets": [0, 0]}})
    elif ext == ".mtx":
        p.write_text(f"%%MatrixMarket matrix coordinate real general\n{m} {k} 0\n")
    elif ext == ".smtx":
        p.write_text(f"{m}, {k}, 0\n" + " ".join(["0"] * (m + 1)) + "\n")
    return p


@pytest.mark.parametrize("m,k,none", [(0, 0, "rows or columns"), (16, 0, "columns"),
                                      (0, 16, "rows")])
@pytest.mark.parametrize("ext,what", [(".npy", "array"), (".npz", "array 'w'"),
                                      (".safetensors", "tensor 'w'"), (".mtx", "matrix"),
                                      (".smtx", "matrix")])
def test_empty_matrix(tmp_path, ext, what, m, k, none):
    refused(empty_file(tmp_path, ext, m, k), f"{what} is {m} x {k} and has no {none}: nothing to tune")


@pytest.mark.parametrize("m,k", [(0, 0), (16, 0)])
def test_empty_matrix_scipy_and_mtx_array(tmp_path, m, k):
    none = "rows or columns" if m == 0 else "columns"
    p = scipy_npz(tmp_path / "e.npz", fmt="csr", shape=(m, k))
    refused(p, f"sparse matrix is {m} x {k} and has no {none}: nothing to tune")
    p = tmp_path / "e.mtx"
    p.write_text(f"%%MatrixMarket matrix array real general\n{m} {k}\n")
    refused(p, f"matrix is {m} x {k} and has no {none}: nothing to tune")


# =========================================================================
# 2. indices beyond 32 bits
# =========================================================================
INDEX_WRAP = [  # 2**32 + 1 used to wrap to 1 in the int32 column indices
    ("k.smtx", "2, 5000000000, 2\n0 1 2\n4294967297 4294967298\n",
     "matrix is 2 x 5000000000: more than 2147483647 columns"),
    ("k.mtx", "%%MatrixMarket matrix coordinate real general\n1 5000000000 1\n1 4294967298 1\n",
     "matrix is 1 x 5000000000: more than 2147483647 columns"),
    ("r.smtx", "3000000000, 4, 0\n0\n", "matrix is 3000000000 x 4: more than 2147483647 rows"),
    ("c.smtx", "1, 8, 1\n0 1\n4294967297\n",
     "column index 4294967297 (entry 0, row 0) out of range [0, 8)"),
]


@pytest.mark.parametrize("fname,text,start", INDEX_WRAP)
def test_index_wrap_text(tmp_path, fname, text, start):
    (tmp_path / fname).write_text(text)
    refused(tmp_path / fname, start)


def test_index_wrap_npz(tmp_path):
    p = scipy_npz(tmp_path / "k.npz", fmt="csr", shape=(1, 5_000_000_000),
                  indices=np.array([2 ** 32 + 1], np.int64), indptr=np.array([0, 1]),
                  data=np.ones(1, np.float32))
    refused(p, "sparse matrix is 1 x 5000000000: more than 2147483647 columns")
    scipy_npz(p, shape=(4, 4), row=np.array([2 ** 64 - 1], np.uint64), col=np.array([0]),
              data=np.ones(1, np.float32))
    refused(p, "array 'row' holds 18446744073709551615, beyond 64-bit signed indices")


def test_sparse_matrix_refuses_indices_beyond_int32():
    with pytest.raises(ValueError, match="column index 4294967297 does not fit the int32 column indices"):
        SparseMatrix((1, 2 ** 33), [0, 1], np.array([2 ** 32 + 1], np.int64), [1.0])
    with pytest.raises(ValueError, match=r"column index out of range \[0, 8\)"):
        SparseMatrix((1, 8), [0, 1], np.array([2 ** 32 + 1], np.int64), [1.0])


# =========================================================================
# 3. paths that are not readable files; misleading messages
# =========================================================================
def test_directory(tmp_path):
    (tmp_path / "w.npy").mkdir()
    refused(tmp_path / "w.npy", "is a directory, not a weights file")
    (tmp_path / "weights").mkdir()
    refused(tmp_path / "weights", "is a directory, not a weights file")


def test_symlink_loop_and_broken_link(tmp_path):
    (tmp_path / "a.npy").symlink_to(tmp_path / "b.npy")
    (tmp_path / "b.npy").symlink_to(tmp_path / "a.npy")
    refused(tmp_path / "a.npy", "is a symbolic link loop: the path cannot be resolved")
    (tmp_path / "self.mtx").symlink_to("self.mtx")
    refused(tmp_path / "self.mtx", "is a symbolic link loop: the path cannot be resolved")
    (tmp_path / "gone.npz").symlink_to(tmp_path / "nowhere.npz")
    refused(tmp_path / "gone.npz",
            f"is a broken symbolic link (to {str(tmp_path / 'nowhere.npz')!r}, which does not exist)")
    refused(tmp_path / "none.npy", "no such file")


def test_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "pipe.npy")
    refused(tmp_path / "pipe.npy", "is not a regular file (a device, pipe or socket)")


def test_permission_denied(tmp_path, monkeypatch):
    p = tmp_path / "w.npy"
    np.save(p, np.eye(3, dtype=np.float32))

    def denied(path, *a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(io, "open", denied, raising=False)  # io's own open()
    refused(p, "permission denied: cannot read it")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_real(tmp_path):
    p = tmp_path / "w.npy"
    np.save(p, np.eye(3, dtype=np.float32))
    p.chmod(0)
    refused(p, "permission denied: cannot read it")


def test_fp16_overflow(tmp_path):
    p = tmp_path / "o.npy"
    np.save(p, np.array([[1e6, 0], [0, 1]], np.float64))
    refused(p, "matrix 'o': values overflow fp16 (largest |w| = 1e+06; fp16 holds up to 65504)",
            dtype="fp16")
    m = tmp_path / "o.mtx"
    m.write_text("%%MatrixMarket matrix coordinate real general\n%sparseforge-dtype fp16\n"
                 "2 2 2\n1 1 1e6\n2 2 1\n")
    refused(m, "values overflow fp16 (largest |w| = 1e+06; fp16 holds up to 65504)")
    z = scipy_npz(tmp_path / "o.npz", fmt="csr", shape=(2, 2), indices=np.array([0]),
                  indptr=np.array([0, 1, 1]), data=np.array([-1e6], np.float32),
                  sparseforge_dtype=np.array(b"fp16"))
    refused(z, "array 'data': values overflow fp16 (largest |w| = 1e+06; fp16 holds up to 65504)")
    np.savez(z, w=np.array([[7e4, 1]], np.float32), **{"w.dtype": np.array(b"fp16")})
    refused(z, "array 'w': values overflow fp16 (largest |w| = 70000; fp16 holds up to 65504)")
    # the same for fp32 (float64 files) and bf16
    np.save(p, np.array([[1e39, 1]]))
    refused(p, "array: values overflow fp32 (largest |w| = 1e+39; fp32 holds up to 3.40282e+38)")
    np.save(p, np.array([[3.4e38, 1]], np.float32))
    refused(p, "matrix 'o': values overflow bf16 (largest |w| = 3.4e+38; bf16 holds up to "
               "3.38953e+38)", dtype="bf16")
    # NaN/inf are still called so, and 65504 is fine
    np.save(p, np.array([[np.inf, 1]], np.float32))
    refused(p, "array contains 1 NaN/inf value(s) (first: inf at row 0, col 0)")
    np.save(p, np.array([[65504, 1]], np.float32))
    assert io.load(p, dtype="fp16")[0][1].values.max() == 65504


def test_negative_shape(tmp_path):
    p = scipy_npz(tmp_path / "n.npz", fmt="csr", shape=(-3, 4))
    refused(p, "sparse matrix has a negative shape [-3, 4]")
    q = tmp_path / "n.npy"
    q.write_bytes(npy_header((-3, 4)))
    refused(q, "array: bad .npy header: negative shape (-3, 4)")


# =========================================================================
# 4. name selects, it does not rename
# =========================================================================
def test_name_on_a_single_matrix_file(tmp_path):
    m = SparseMatrix.from_dense(np.eye(3, dtype=np.float32))
    for ext in (".npy", ".mtx", ".smtx"):
        p = tmp_path / f"x{ext}"
        io.save(p, m)
        refused(p, f"x{ext} holds one matrix, named 'x'; --name selects a tensor of a .npz or "
                   ".safetensors (got 'y')", name="y")
        assert [n for n, _ in io.load(p)] == ["x"]
        assert [n for n, _ in io.load(p, name="x")] == ["x"]
    p = tmp_path / "s.npz"
    io.save(p, [("layer.0", m)])  # a scipy archive that records its name
    refused(p, "s.npz holds one sparse matrix (a scipy archive), named 'layer.0'; --name selects "
               "a tensor of a .npz of dense arrays or a .safetensors (got 's')", name="s")
    assert [n for n, _ in io.load(p, name="layer.0")] == ["layer.0"]


# =========================================================================
# 5. the limit's configuration; nothing but WeightFileError escapes
# =========================================================================
def test_element_limit(monkeypatch):
    assert io.element_limit() == (2 ** 34, "the default, MAX_ELEMENTS")
    assert io.element_limit(10) == (10, "the max_elements argument")
    monkeypatch.setenv("SPARSEFORGE_MAX_ELEMENTS", "1e12")
    assert io.element_limit() == (10 ** 12, "SPARSEFORGE_MAX_ELEMENTS=1e12")
    assert io.element_limit(7)[0] == 7  # the argument wins
    for bad in ("lots", "0", "-5", "1.5"):
        monkeypatch.setenv("SPARSEFORGE_MAX_ELEMENTS", bad)
        with pytest.raises(ValueError, match="SPARSEFORGE_MAX_ELEMENTS=.* is not a positive integer"):
            io.load("whatever.npy")
    monkeypatch.delenv("SPARSEFORGE_MAX_ELEMENTS")
    with pytest.raises(ValueError, match="max_elements must be a positive integer"):
        io.load("whatever.npy", max_elements=0)


def test_memory_and_unexpected_errors_are_named(tmp_path, monkeypatch):
    p = tmp_path / "w.npy"
    np.save(p, np.eye(3, dtype=np.float32))

    def oom(*a, **kw):
        raise MemoryError()

    monkeypatch.setattr(io, "_dense_to_matrix", oom)
    refused(p, "not enough memory to read it (MemoryError); the element limit (17179869184, set "
               "by the default, MAX_ELEMENTS) is more than this machine holds")

    def bug(*a, **kw):
        raise TypeError("something odd")

    monkeypatch.setattr(io, "_dense_to_matrix", bug)
    refused(p, "cannot be read (unexpected TypeError: something odd)")
