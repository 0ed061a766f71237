"""generator.io: every reader, the save helpers, and the error messages of
malformed files (written by hand into tmp_path)."""
import io as _io
import json
import struct

import numpy as np
import pytest

from sparseforge.generator import io
from sparseforge.generator.matrix import SparseMatrix, round_to_dtype


def sparse_dense(rng, m=24, k=40, density=0.3):
    d = rng.standard_normal((m, k)).astype(np.float32)
    d[rng.random((m, k)) > density] = 0
    return d


def st_file(path, header: dict, data: bytes = b"", raw_header: bytes = None):
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def npy_bytes(arr) -> bytes:
    f = _io.BytesIO()
    np.save(f, arr)
    return f.getvalue()


def raises(path, match):
    """pytest.raises for a message that names the file and the problem."""
    return pytest.raises(ValueError, match=rf"^{path}: .*{match}")


# =========================================================================
# round trips through save
# =========================================================================
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("ext,layout", [(".safetensors", None), (".npz", "csr"),
                                        (".npz", "dense"), (".mtx", None)])
def test_round_trip(tmp_path, rng, same_matrix, dtype, ext, layout):
    m = SparseMatrix.from_dense(sparse_dense(rng)).astype(dtype)
    m.perm = rng.permutation(m.rows)
    path = tmp_path / f"w{ext}"
    io.save(path, [("layer.0.weight", m)], **({"npz_layout": layout} if layout else {}))
    [(name, back)] = io.load(path)
    assert name == "layer.0.weight" or ext == ".mtx"
    same_matrix(back, m)
    assert back.meta["source"] == str(path)


@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_round_trip_several(tmp_path, rng, same_matrix, ext):
    mats = [("a", SparseMatrix.from_dense(sparse_dense(rng, 8, 12)).astype("bf16")),
            ("b.weight", SparseMatrix.from_dense(sparse_dense(rng, 16, 4)).astype("fp16")),
            ("c", SparseMatrix.from_dense(sparse_dense(rng, 5, 7)))]
    mats[1][1].perm = np.arange(16)[::-1]
    path = tmp_path / f"m{ext}"
    io.save(path, mats)
    back = io.load(path)
    assert [n for n, _ in back] == ["a", "b.weight", "c"]
    for (_, a), (_, b) in zip(mats, back):
        same_matrix(b, a)
    # one by name
    [(n, b)] = io.load(path, name="b.weight")
    same_matrix(b, mats[1][1])


def test_round_trip_npy(tmp_path, rng, same_matrix):
    for dtype in ("fp32", "fp16"):
        m = SparseMatrix.from_dense(sparse_dense(rng)).astype(dtype)
        io.save(tmp_path / "w.npy", m)
        [(name, back)] = io.load(tmp_path / "w.npy")
        assert name == "w"
        same_matrix(back, m)
    with pytest.raises(ValueError, match="bf16"):
        io.save(tmp_path / "x.npy", m.astype("bf16"))


def test_round_trip_smtx(tmp_path, same_matrix, rng):
    m = SparseMatrix.from_dense(sparse_dense(rng))
    io.save(tmp_path / "p.smtx", m)
    [(_, back)] = io.load(tmp_path / "p.smtx", seed=7)
    np.testing.assert_array_equal(back.mask(), m.mask())
    assert back.values_synthetic
    assert back.meta["note"] == "values drawn from a seeded normal generator (seed=7)"
    np.testing.assert_array_equal(back.values,
                                  np.random.default_rng(7).standard_normal(m.nnz).astype(np.float32))
    # a pattern loaded from smtx saves and loads back equal (same seed)
    io.save(tmp_path / "q.smtx", back)
    [(_, again)] = io.load(tmp_path / "q.smtx", seed=7)
    same_matrix(again, back)
    m.perm = np.arange(m.rows)
    with pytest.raises(ValueError, match="permutation"):
        io.save(tmp_path / "r.smtx", m)


def test_explicit_zeros_kept_by_sparse_formats(tmp_path, same_matrix):
    m = SparseMatrix((2, 3), [0, 2, 3], [0, 2, 1], [1.5, 0.0, -2.0])
    for ext in (".npz", ".mtx"):
        io.save(tmp_path / f"z{ext}", m)
        same_matrix(io.load(tmp_path / f"z{ext}")[0][1], m)


def test_dtype_detect_and_override(tmp_path, rng):
    d = sparse_dense(rng)
    np.save(tmp_path / "h.npy", d.astype(np.float16))
    [(_, m)] = io.load(tmp_path / "h.npy")
    assert m.dtype == "fp16"
    [(_, b)] = io.load(tmp_path / "h.npy", dtype="bf16")
    assert b.dtype == "bf16"
    np.testing.assert_array_equal(b.values, round_to_dtype(m.values, "bf16"))
    np.save(tmp_path / "d.npy", d.astype(np.float64))
    [(_, m64)] = io.load(tmp_path / "d.npy")
    assert m64.dtype == "fp32" and "float64" in m64.meta["note"]
    with pytest.raises(ValueError, match="unknown dtype"):
        io.load(tmp_path / "h.npy", dtype="fp8")


def test_npy_fortran_order(tmp_path, rng):
    d = sparse_dense(rng)
    np.save(tmp_path / "f.npy", np.asfortranarray(d))
    np.testing.assert_array_equal(io.load(tmp_path / "f.npy")[0][1].to_dense(), d)


# =========================================================================
# safetensors written by hand
# =========================================================================
def test_safetensors_dtypes_and_scan(tmp_path):
    a = np.array([[1.0, 0.0], [0.0, -3.25]], np.float32)
    bf = (a.view(np.uint32) >> 16).astype("<u2")
    half = a.astype("<f2")
    blobs = [a.tobytes(), bf.tobytes(), half.tobytes(), np.arange(3, dtype="<i8").tobytes(),
             np.ones((2, 2), "<i4").tobytes()]
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for nm, dt, shape, blob in zip(["f32", "bf16", "f16", "ids", "mask"],
                                   ["F32", "BF16", "F16", "I64", "I32"],
                                   [[2, 2], [2, 2], [2, 2], [3], [2, 2]], blobs):
        header[nm] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
    p = st_file(tmp_path / "m.safetensors", header, b"".join(blobs))
    got = io.load(p)
    assert [(n, m.dtype) for n, m in got] == [("f32", "fp32"), ("bf16", "bf16"), ("f16", "fp16")]
    for _, m in got:
        np.testing.assert_array_equal(m.to_dense(), a)
        assert m.meta["safetensors_metadata"] == {"format": "pt"}
    with raises(p, "tensor 'ids' is not 2-D"):
        io.load(p, name="ids")
    with raises(p, "tensor 'mask' has unsupported dtype I32"):
        io.load(p, name="mask")
    with raises(p, "no tensor named 'nope'"):
        io.load(p, name="nope")


# =========================================================================
# scipy-saved npz, written by hand with scipy's key layout
# =========================================================================
def test_scipy_npz_formats(tmp_path):
    dense = np.array([[0, 2, 0, 0], [1, 0, 0, 3], [0, 0, 0, 0], [0, 4, 5, 0]], np.float32)
    r, c = np.nonzero(dense)
    cases = {
        "csr": dict(indptr=np.array([0, 1, 3, 3, 5], np.int32), indices=np.array([1, 0, 3, 1, 2], np.int32),
                    data=dense[r, c]),
        "csc": dict(indptr=np.array([0, 1, 3, 4, 5], np.int32), indices=np.array([1, 0, 3, 3, 1], np.int32),
                    data=np.array([1, 2, 4, 5, 3], np.float32)),
        "coo": dict(row=r[::-1].astype(np.int32), col=c[::-1].astype(np.int32), data=dense[r, c][::-1]),
    }
    for fmt, arrays in cases.items():
        p = tmp_path / f"{fmt}.npz"
        np.savez(p, format=np.array(fmt.encode()), shape=np.array([4, 4]), **arrays)
        [(name, m)] = io.load(p)
        assert name == fmt
        np.testing.assert_array_equal(m.to_dense(), dense)
        assert m.nnz == 5
    # bsr 2x2: whole blocks stored, zeros included
    p = tmp_path / "bsr.npz"
    blocks = np.stack([dense[0:2, 0:2], dense[0:2, 2:4], dense[2:4, 0:2], dense[2:4, 2:4]])
    np.savez(p, format=np.array(b"bsr"), shape=np.array([4, 4]), data=blocks,
             indices=np.array([0, 1, 0, 1]), indptr=np.array([0, 2, 4]))
    [(_, m)] = io.load(p)
    np.testing.assert_array_equal(m.to_dense(), dense)
    assert m.nnz == 16
    np.savez(p, format=np.array(b"bsr"), shape=np.array([4, 4]), data=blocks[[1]].astype(np.float16),
             indices=np.array([1]), indptr=np.array([0, 1, 1]))
    [(_, m)] = io.load(p)
    assert m.dtype == "fp16" and m.nnz == 4
    np.testing.assert_array_equal(m.to_dense()[:2, 2:], dense[:2, 2:])


# =========================================================================
# Matrix Market variants
# =========================================================================
def test_mtx_variants(tmp_path):
    def w(text):
        p = tmp_path / "m.mtx"
        p.write_text(text)
        return io.load(p)[0][1]

    m = w("%%MatrixMarket matrix coordinate real symmetric\n% c\n3 3 3\n1 1 2.5\n3 1 -1\n2 2 4\n")
    np.testing.assert_array_equal(m.to_dense(), [[2.5, 0, -1], [0, 4, 0], [-1, 0, 0]])
    m = w("%%MatrixMarket matrix coordinate integer general\n2 3 2\n2 3 7\n1 1 -2\n")
    np.testing.assert_array_equal(m.to_dense(), [[-2, 0, 0], [0, 0, 7]])
    m = w("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 3\n")
    np.testing.assert_array_equal(m.to_dense(), [[0, -3], [3, 0]])
    m = w("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 2\n2 1\n")
    assert m.values_synthetic and m.nnz == 2 and "seed=0" in m.meta["note"]
    m = w("%%MatrixMarket matrix array real general\n2 3\n1\n0\n0\n4\n5\n0\n")
    np.testing.assert_array_equal(m.to_dense(), [[1, 0, 5], [0, 4, 0]])
    m = w("%%MatrixMarket matrix array real symmetric\n2 2\n1\n2\n3\n")
    np.testing.assert_array_equal(m.to_dense(), [[1, 2], [2, 3]])


# =========================================================================
# malformed files: each names the file and the problem
# =========================================================================
SMTX_BAD = [
    ("4, 4, 3\n0 1 2 3 3\n", "truncated: 2 line"),
    ("4, 4, 3\n0 1 2 3 3\n0 1\n", "wrong count: line 1 says nnz = 3, line 3 has 2"),
    ("4, 4, 3\n0 1 2 3\n0 1 2\n", "wrong count: line 2 has 4 row offsets, expected rows \\+ 1 = 5"),
    ("4, 4, 3\n1 1 2 3 3\n0 1 2\n", "row offsets do not start at 0"),
    ("4, 4, 3\n0 2 1 3 3\n0 1 2\n", "row offsets out of order: offset 2 \\(1\\) < offset 1 \\(2\\)"),
    ("4, 4, 3\n0 1 2 2 2\n0 1 2\n", "row offsets end at 2, not at nnz = 3"),
    ("4, 4, 3\n0 1 2 3 3\n0 1 4\n", "column index 4 \\(entry 2, row 2\\) out of range \\[0, 4\\)"),
    ("4, 4, 3\n0 2 2 3 3\n3 1 2\n", "column indices of row 0 are not strictly increasing"),
    ("4, 4, 3\n0 1 2 3 3\n0 x 2\n", "token 1 \\('x'\\) is not an integer"),
    ("4 4\n0\n", "line 1 '4 4' must be 'rows, cols, nnz'"),
    ("", "empty file"),
]


@pytest.mark.parametrize("text,match", SMTX_BAD)
def test_smtx_malformed(tmp_path, text, match):
    p = tmp_path / "bad.smtx"
    p.write_text(text)
    with raises(p, match):
        io.load(p)


MTX_BAD = [
    ("1 1 1\n1 1 1\n", "missing the '%%MatrixMarket' header"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 3\n1 1 1\n2 2 2\n", "truncated: the size line promises 3 entries"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 1\n1 1 1\n2 2 2\n", "wrong count: 6 numbers"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 1\n0 1 1\n", "row index 0 of entry 0 out of range \\[1, 4\\) \\(1-based\\)"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 1\n1 4 1\n", "column index 4 of entry 0 out of range"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1\n2 2 nan\n", "values contains 1 NaN/inf"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 1\n1 1 inf\n", "NaN/inf"),
    ("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n", "unsupported field 'complex'"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1\n1 1 2\n", "duplicate entry at row 1, column 1"),
    ("%%MatrixMarket matrix coordinate real symmetric\n3 3 1\n1 2 1\n", "above the diagonal"),
    ("%%MatrixMarket matrix coordinate real general\n", "truncated: no size line"),
    ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n", "truncated: array of 2x2"),
]


@pytest.mark.parametrize("text,match", MTX_BAD)
def test_mtx_malformed(tmp_path, text, match):
    p = tmp_path / "bad.mtx"
    p.write_text(text)
    with raises(p, match):
        io.load(p)


def test_npy_malformed(tmp_path):
    good = npy_bytes(np.ones((4, 5), np.float32))
    p = tmp_path / "a.npy"
    p.write_bytes(good[:-7])
    with raises(p, r"truncated: shape \(4, 5\) of float32 needs 80 bytes of data, 73 present"):
        io.load(p)
    p.write_bytes(good[:6])
    with raises(p, "truncated"):
        io.load(p)
    p.write_bytes(b"PK\x03\x04" + good)
    with raises(p, "bad magic"):
        io.load(p)
    np.save(p, np.ones((2, 3, 4), np.float32))
    with raises(p, r"array is not 2-D \(shape \(2, 3, 4\)\)"):
        io.load(p)
    np.save(p, np.ones((2, 3), np.int32))
    with raises(p, "unsupported dtype int32"):
        io.load(p)
    np.save(p, np.zeros((2, 3), "V2"))
    with raises(p, "cannot hold bfloat16"):
        io.load(p)
    bad = np.ones((3, 3), np.float32)
    bad[1, 2] = np.nan
    bad[2, 0] = np.inf
    np.save(p, bad)
    with raises(p, "contains 2 NaN/inf value\\(s\\) \\(first: nan at row 1, col 2\\)"):
        io.load(p)
    (tmp_path / "o.npy").write_bytes(npy_bytes(np.array([[None]], dtype=object)))
    with raises(tmp_path / "o.npy", "object arrays"):
        io.load(tmp_path / "o.npy")


def test_npz_malformed(tmp_path, rng):
    p = tmp_path / "a.npz"
    p.write_bytes(b"not a zip at all")
    with raises(p, "not a valid .npz \\(zip\\) archive"):
        io.load(p)
    np.savez(p, w=np.ones((3, 3), np.float32))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with raises(p, "not a valid .npz"):
        io.load(p)
    np.savez(p, w=np.ones((3, 3), np.float32), v=np.ones(3, np.float32))
    with raises(p, "no array named 'x'"):
        io.load(p, name="x")
    with raises(p, r"array 'v' is not 2-D"):
        io.load(p, name="v")
    np.savez(p, v=np.ones(3, np.float32))
    with raises(p, "no 2-D floating-point array"):
        io.load(p)

    def scipy(**kw):
        base = dict(format=np.array(b"csr"), shape=np.array([2, 3]), data=np.ones(3, np.float32),
                    indices=np.array([0, 2, 1]), indptr=np.array([0, 2, 3]))
        base.update(kw)
        np.savez(p, **base)
        return p

    with raises(scipy(format=np.array(b"dia")), "unsupported sparse format 'dia'"):
        io.load(p)
    with raises(scipy(indptr=np.array([0, 2, 2])), "'indptr' ends at 2, not at the number of stored entries 3"):
        io.load(p)
    with raises(scipy(indptr=np.array([1, 2, 3])), "'indptr' does not start at 0"):
        io.load(p)
    with raises(scipy(indptr=np.array([0, 3, 2, 3]), shape=np.array([3, 3])), "'indptr' is out of order"):
        io.load(p)
    with raises(scipy(indices=np.array([0, 3, 1])), "column index 3 of entry 1 out of range \\[0, 3\\)"):
        io.load(p)
    with raises(scipy(indices=np.array([0, 1])), "'indices' has 2 entries, 'data' has 3"):
        io.load(p)
    with raises(scipy(indices=np.array([2, 2, 1])), "duplicate entry at row 0, column 2"):
        io.load(p)
    with raises(scipy(data=np.array([1, np.inf, 2], np.float32)), "array 'data' contains 1 NaN/inf"):
        io.load(p)
    with raises(scipy(shape=np.array([2, 3, 4])), "not 2-D"):
        io.load(p)
    with raises(scipy(data=np.ones(3, np.int64)), "unsupported dtype int64"):
        io.load(p)


def test_safetensors_malformed(tmp_path):
    p = tmp_path / "a.safetensors"
    ok = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    data = np.ones(4, np.float32).tobytes()
    p.write_bytes(b"\x01\x02")
    with raises(p, "truncated: 2 bytes"):
        io.load(p)
    st_file(p, ok, data)
    whole = p.read_bytes()
    p.write_bytes(whole[:20])
    with raises(p, "truncated: header length \\d+ exceeds the 12 bytes after it"):
        io.load(p)
    p.write_bytes(whole[:-4])
    with raises(p, r"tensor 'w': data_offsets \[0, 16\] lie outside the file \(its data section has 12 bytes"):
        io.load(p)
    st_file(p, None, data, raw_header=b'{"w": {"dtype": "F32",')
    with raises(p, "bad header JSON"):
        io.load(p)
    st_file(p, None, data, raw_header=b'[1, 2]')
    with raises(p, "bad header JSON: expected an object"):
        io.load(p)
    st_file(p, {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}, data)
    with raises(p, r"data_offsets \[8, 24\] lie outside the file"):
        io.load(p)
    st_file(p, {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, data)
    with raises(p, r"data_offsets \[0, 16\] span 16 bytes, shape \[2, 3\] of F32 needs 24"):
        io.load(p)
    st_file(p, {"w": {"dtype": "Q4", "shape": [2, 2], "data_offsets": [0, 16]}}, data)
    with raises(p, "tensor 'w' has unsupported dtype 'Q4'"):
        io.load(p)
    st_file(p, {"w": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]}}, data)
    with raises(p, "tensor 'w' has unsupported dtype F8_E4M3 for weights"):
        io.load(p)
    st_file(p, {"w": {"dtype": "F32", "shape": [2, 2]}}, data)
    with raises(p, "tensor 'w' lacks dtype, shape or data_offsets"):
        io.load(p)
    st_file(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, data)
    with raises(p, "no 2-D floating-point tensor"):
        io.load(p)
    nan = np.array([1, 2, np.nan, 4], np.float32).tobytes()
    st_file(p, ok, nan)
    with raises(p, r"tensor 'w' contains 1 NaN/inf value\(s\) \(first: nan at row 1, col 0\)"):
        io.load(p)
    st_file(p, {**ok, "w.perm": {"dtype": "I64", "shape": [2], "data_offsets": [16, 32]}},
            data + np.array([0, 0], "<i8").tobytes())
    with raises(p, "tensor 'w.perm' is not a permutation of the 2 rows"):
        io.load(p)


def test_unknown_extension_and_missing(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text("1 2 3")
    with raises(p, "unknown extension '.txt'"):
        io.load(p)
    with raises(tmp_path / "none.npy", "no such file"):
        io.load(tmp_path / "none.npy")
    with pytest.raises(ValueError, match="cannot save to extension"):
        io.save(tmp_path / "w.txt", SparseMatrix.from_dense(np.eye(2)))


# =========================================================================
# DLMC subset
# =========================================================================
def test_dlmc_subset_loads(dlmc_files, dlmc_dir):
    import csv
    assert len(dlmc_files) == 18
    rows = {r["path"]: r for r in csv.DictReader(open(dlmc_dir / "dlmc_subset.csv"))}
    for f in dlmc_files:
        [(name, m)] = io.load(f, seed=3)
        rel = "dlmc/" + str(f.relative_to(dlmc_dir))
        assert name == f.stem
        assert m.values_synthetic and "seed=3" in m.meta["note"]
        assert m.dtype == "fp32"
        if rel in rows:
            r = rows[rel]
            assert m.shape == (int(r["nrows"]), int(r["ncols"]))
            assert m.nnz == int(float(r["nnz"]))
    assert set(rows) == {"dlmc/" + str(f.relative_to(dlmc_dir)) for f in dlmc_files}


@pytest.mark.parametrize("ext", [".npy", ".npz", ".safetensors", ".mtx", ".smtx"])
def test_damaged_files_give_named_value_errors(tmp_path, rng, ext):
    """Truncations and overwritten bytes spread over the file: either it
    still loads, or a ValueError that starts with the file's path."""
    d = sparse_dense(rng, 6, 9, 0.4)
    m = SparseMatrix.from_dense(d)
    if ext not in (".npy", ".smtx"):
        m.perm = rng.permutation(6)
    src = tmp_path / f"src{ext}"
    io.save(src, m)
    data = src.read_bytes()
    cases = [data[:i] for i in range(0, len(data), max(1, len(data) // 120))]
    for i in range(0, len(data), max(1, len(data) // 60)):
        for b in (0x00, 0x20, 0xFF, ord("9"), ord("-")):
            x = bytearray(data)
            x[i] = b
            cases.append(bytes(x))
    p = tmp_path / f"bad{ext}"
    for c in cases:
        p.write_bytes(c)
        try:
            io.load(p)
        except ValueError as e:
            assert str(e).startswith(f"{p}: "), str(e)


@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_iterate_reads_a_matrix_when_it_is_asked_for(tmp_path, rng, monkeypatch, ext):
    """io.iterate gives a file's matrices one at a time, each read when
    asked for (a model's layers are not held at once), the same as load();
    a bad tensor is raised when it is reached, after the good ones before
    it."""
    mats = [(f"w{i}", SparseMatrix.from_dense(rng.standard_normal((8, 6 + i)), dtype="fp16"))
            for i in range(3)]
    io.save(tmp_path / f"m{ext}", mats)
    made = []
    real = io._dense_to_matrix
    monkeypatch.setattr(io, "_dense_to_matrix", lambda *a: made.append(a[1]) or real(*a))
    it = io.iterate(tmp_path / f"m{ext}")
    first = next(it)
    assert first[0] == "w0" and len(made) == 1
    rest = list(it)
    assert [n for n, _ in rest] == ["w1", "w2"] and len(made) == 3
    loaded = io.load(tmp_path / f"m{ext}")
    for (n1, a), (n2, b) in zip([first] + rest, loaded):
        assert n1 == n2 and np.array_equal(a.to_dense(), b.to_dense())

    def fails_on_w1(p, what, arr, dtype):
        if "w1" in what:
            raise ValueError("boom")
        return real(p, what, arr, dtype)
    monkeypatch.setattr(io, "_dense_to_matrix", fails_on_w1)
    it = io.iterate(tmp_path / f"m{ext}")
    assert next(it)[0] == "w0"
    with pytest.raises(io.WeightFileError, match="cannot be read .*ValueError: boom"):
        next(it)
