"""Property-based fuzzing of every weights reader, and of the pattern parser.

Each reader gets files derived from valid ones (written by io.save, and
small hand-written ones): format-aware mutations (npy header shape/dtype,
safetensors header fields, npz members and zip directory sizes, numbers and
banner words of the text formats, each set to huge, negative or odd values)
followed by byte flips, truncations, insertions and deletions; plus files
of random bytes.  io.load may return matrices or raise WeightFileError naming
the file; any other exception fails the test, and so does a WeightFileError
that came from load's catch-all (a malformed input no check foresaw).

Derandomized (the same examples every run) and bounded: a deadline per
example, a few hundred examples per format; the file runs in well under a
minute on two cores.
"""
import io as _pyio
import json
import re
import struct
import tempfile
import zipfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparseforge.generator import io
from sparseforge.generator.matrix import SparseMatrix

EXTS = (".npy", ".npz", ".safetensors", ".mtx", ".smtx")
# the element limit of fuzzed loads: a mutated shape may not make the test allocate much
LIMIT = 1 << 20


def fuzz_settings(max_examples: int):
    return settings(derandomize=True, database=None, max_examples=max_examples,
                    deadline=timedelta(seconds=2), print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


# =========================================================================
# valid files to start from
# =========================================================================
def npy_bytes(arr) -> bytes:
    f = _pyio.BytesIO()
    np.save(f, arr)
    return f.getvalue()


def zip_bytes(members: dict, compression=zipfile.ZIP_STORED) -> bytes:
    f = _pyio.BytesIO()
    with zipfile.ZipFile(f, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return f.getvalue()


def npz_of(compression=zipfile.ZIP_STORED, **arrays) -> bytes:
    return zip_bytes({k + ".npy": npy_bytes(v) for k, v in arrays.items()}, compression)


def st_bytes(tensors: dict, meta=None) -> bytes:
    """A safetensors file: tensors is name -> (dtype, shape, bytes)."""
    header, blobs, off = ({"__metadata__": meta} if meta is not None else {}), [], 0
    for name, (dt, shape, blob) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def build_seeds() -> dict[str, list[bytes]]:
    rng = np.random.default_rng(7)

    def sparse(m, k, density=0.4):
        d = rng.standard_normal((m, k)).astype(np.float32)
        d[rng.random((m, k)) > density] = 0
        return SparseMatrix.from_dense(d)

    a, b, c = sparse(5, 7), sparse(4, 4).astype("fp16"), sparse(3, 6).astype("bf16")
    a_perm = sparse(5, 7)
    a_perm.perm = rng.permutation(5)
    seeds = {ext: [] for ext in EXTS}
    with tempfile.TemporaryDirectory() as tmp:
        def saved(ext, matrices, **kw):
            p = Path(tmp) / f"w{ext}"
            io.save(p, matrices, **kw)
            return p.read_bytes()

        seeds[".npy"] += [saved(".npy", a), saved(".npy", b)]
        seeds[".npz"] += [saved(".npz", [("w", a_perm)]), saved(".npz", [("w", c)]),
                          saved(".npz", [("a", a_perm), ("b.weight", b), ("c", c)])]
        seeds[".safetensors"] += [saved(".safetensors", [("w", a_perm)]),
                                  saved(".safetensors", [("a", a), ("b.weight", b), ("c", c)])]
        seeds[".mtx"] += [saved(".mtx", a_perm), saved(".mtx", b)]
        seeds[".smtx"] += [saved(".smtx", a)]
    dense = np.array([[0, 2, 0, 0], [1, 0, 0, 3], [0, 0, 0, 0], [0, 4, 5, 0]], np.float32)
    seeds[".npy"] += [npy_bytes(np.asfortranarray(dense)), npy_bytes(dense.astype(np.float64)),
                      npy_bytes(np.ones((1, 1), np.float16))]
    fmt = {k: np.array(k.encode()) for k in ("csr", "csc", "coo", "bsr")}
    shape = np.array([4, 4])
    seeds[".npz"] += [
        npz_of(format=fmt["coo"], shape=shape, row=np.array([1, 0, 1, 3, 3]),
               col=np.array([0, 1, 3, 1, 2]), data=np.array([1, 2, 3, 4, 5], np.float32)),
        npz_of(format=fmt["csc"], shape=shape, indptr=np.array([0, 1, 3, 4, 5], np.int32),
               indices=np.array([1, 0, 3, 3, 1], np.int32), data=np.array([1, 2, 4, 5, 3], np.float32)),
        npz_of(format=fmt["bsr"], shape=shape, indptr=np.array([0, 1, 2]), indices=np.array([1, 0]),
               data=np.ones((2, 2, 2), np.float16)),
        npz_of(format=fmt["coo"], shape=shape, coords=np.array([[0, 3], [1, 2]]),
               data=np.array([1.5, -2], np.float64)),
        npz_of(zipfile.ZIP_DEFLATED, w=dense, v=np.ones(3, np.float32)),
        npz_of(zipfile.ZIP_DEFLATED, format=fmt["csr"], shape=shape,
               indptr=np.array([0, 1, 3, 3, 5]), indices=np.array([1, 0, 3, 1, 2]),
               data=dense[dense != 0]),
    ]
    bf = (dense.view(np.uint32) >> 16).astype("<u2")
    seeds[".safetensors"] += [
        st_bytes({"w": ("F64", [4, 4], dense.astype("<f8").tobytes()),
                  "w.perm": ("I64", [4], np.array([3, 2, 1, 0], "<i8").tobytes()),
                  "ids": ("I32", [2], np.array([1, 2], "<i4").tobytes())}, meta={"format": "pt"}),
        st_bytes({"b": ("BF16", [4, 4], bf.tobytes()), "h": ("F16", [2, 2], np.ones(4, "<f2").tobytes())}),
    ]
    seeds[".mtx"] += [s.encode() for s in (
        "%%MatrixMarket matrix coordinate real symmetric\n% c\n3 3 3\n1 1 2.5\n3 1 -1\n2 2 4\n",
        "%%MatrixMarket matrix coordinate integer general\n2 3 2\n2 3 7\n1 1 -2\n",
        "%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 3\n",
        "%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 2\n2 1\n",
        "%%MatrixMarket matrix array real general\n2 3\n1\n0\n0\n4\n5\n0\n",
        "%%MatrixMarket matrix array real symmetric\n2 2\n1\n2\n3\n",
        "%%MatrixMarket matrix coordinate real general\n%sparseforge-dtype fp16\n"
        "%sparseforge-perm 1 0\n2 2 2\n1 1 1.5\n2 2 -3\n")]
    seeds[".smtx"] += [b"4, 4, 5\n0 1 3 3 5\n1 0 3 1 2\n", b"1, 1, 1\n0 1\n0\n", b"2, 3, 0\n0 0 0\n"]
    return seeds


SEEDS = build_seeds()

# =========================================================================
# mutations
# =========================================================================
INTS = [0, 1, 2, 3, 7, -1, -2, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 53, 2 ** 63 - 1,
        2 ** 63, 2 ** 64, 10 ** 30, -2 ** 31, -2 ** 63, 3_000_000_000, 5_000_000_000, 65536]
FLOATS = ["1e6", "65504", "65520", "1e39", "-1e39", "nan", "inf", "-inf", "3.4e38", "1e-45",
          "-0.0", "1e", "0x10", "1_0"]


def ints():
    return st.one_of(st.sampled_from(INTS), st.integers(-3, 40))


def splice(data: bytes, start: int, end: int, new: bytes) -> bytes:
    return data[:start] + new + data[end:]


@st.composite
def byte_mutations(draw, data: bytes, most: int = 3) -> bytes:
    """Flips, overwrites, truncations, insertions and deletions."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, most))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "number"]))
        pos = draw(st.integers(0, 1 << 16)) % (len(out) + 1)
        if kind in ("flip", "set") and out:
            pos %= len(out)
            if kind == "flip":
                out[pos] ^= 1 << draw(st.integers(0, 7))
            else:
                out[pos] = draw(st.one_of(st.sampled_from(b"\x00 \n\xff\x7f\x80\x939-,.e%"),
                                          st.integers(0, 255)))
        elif kind == "truncate":
            del out[pos:]
        elif kind == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del out[pos:pos + draw(st.integers(1, 16))]
        else:
            out[pos:pos] = str(draw(ints())).encode()
    return bytes(out)


DESCRS = ["<f4", "<f2", "<f8", ">f4", "|V2", "<V2", "<i8", "<i4", "|u1", "|O", "|S0", "|S4", "<U3",
          "|b1", "<c8", "<M8[s]", "(2,)<f4", "|V0", "f16", "nope", [("a", "<f4")], [("a", "<f4", (2,))],
          5, None]


@st.composite
def npy_mutation(draw, data: bytes) -> bytes:
    """A .npy image with its header's shape, dtype or order changed (the
    header length kept consistent, or not), or its data damaged."""
    if len(data) < 12 or not data.startswith(b"\x93NUMPY") or data[6] not in (1, 2, 3):
        return draw(byte_mutations(data))
    start = 10 if data[6] == 1 else 12
    hlen = struct.unpack_from("<H" if data[6] == 1 else "<I", data, 8)[0]
    header, body = data[start:start + hlen], data[start + hlen:]
    kind = draw(st.sampled_from(["shape", "shape", "descr", "order", "data", "header"]))
    if kind == "shape":
        dims = draw(st.lists(ints(), max_size=4))
        new = ("(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")").encode()
        header = re.sub(rb"'shape': \([^)]*\)", lambda _: b"'shape': " + new, header)
    elif kind == "descr":
        header = re.sub(rb"'descr': '[^']*'", lambda _: b"'descr': " + repr(draw(st.sampled_from(DESCRS))).encode(),
                        header)
    elif kind == "order":
        header = header.replace(b"False", b"True") if b"False" in header else header.replace(b"True", b"False")
    elif kind == "data":
        body = draw(byte_mutations(body)) if body else body
    else:
        header = draw(byte_mutations(header))
    n = len(header) if draw(st.integers(0, 4)) or kind == "header" else hlen
    n = min(n, 0xFFFF if data[6] == 1 else 0xFFFFFFFF)
    return data[:8] + struct.pack("<H" if data[6] == 1 else "<I", n) + header + body


# odd replacements for the members of an npz, by what the member holds
ODD_SHAPES = [np.array([3_000_000_000, 0]), np.array([0, 0]), np.array([16, 0]), np.array([-3, 4]),
              np.array([2 ** 31, 2 ** 31]), np.array([2_000_000_000, 2_000_000_000]),
              np.array([2 ** 62, 2 ** 62], np.uint64), np.array([4, 4, 4]), np.array([4.0, 4.0]),
              np.array([1, 5_000_000_000]), np.array([4, 4], np.int8), np.array(4)]
ODD_INDICES = [np.array([2 ** 32 + 1]), np.array([0, 2 ** 40]), np.array([0, 1, 2 ** 33]),
               np.array([], np.int64), np.arange(5)[::-1].copy(), np.array([0, 5, 3]), np.array([-1, 0]),
               np.array([[0, 1], [1, 0]]), np.array([0, 1, 3, 3, 5], np.uint64), np.array([0.0, 1.0]),
               np.array([0, 1, 2, 3, 4]), np.array([3, 2, 1, 0])]
ODD_DATA = [np.array([1e6], np.float32), np.array([np.nan], np.float32), np.array([1e39]),
            np.zeros((2, 2, 2), np.float32), np.zeros((0, 3), np.float32), np.zeros((1, 2), "V2"),
            np.array([[1e6, 0]], np.float64), np.ones((2, 2), np.int32), np.ones(5, np.float16),
            np.ones((5, 0, 2), np.float32), np.zeros((3_000_000_000, 0), np.float32)]
ODD_STRINGS = [np.array(b"coo"), np.array(b"bsr"), np.array(b"csc"), np.array(b"csr"), np.array(b"dia"),
               np.array("csr"), np.array(b"fp16"), np.array(b"bf16"), np.array(b"x"), np.array(1.5),
               np.array([b"csr", b"coo"]), np.array(b"w")]
NPZ_KEYS = {"shape": ODD_SHAPES, "indices": ODD_INDICES, "indptr": ODD_INDICES, "row": ODD_INDICES,
            "col": ODD_INDICES, "coords": ODD_INDICES, "perm": ODD_INDICES, "w.perm": ODD_INDICES,
            "data": ODD_DATA, "w": ODD_DATA, "format": ODD_STRINGS, "sparseforge_dtype": ODD_STRINGS,
            "sparseforge_name": ODD_STRINGS, "w.dtype": ODD_STRINGS, "a.dtype": ODD_STRINGS}
# (offset, width) of the size, name-length and method fields of a zip record
CENTRAL_FIELDS = [(10, 2), (20, 4), (24, 4), (28, 2), (42, 4)]
LOCAL_FIELDS = [(8, 2), (18, 4), (22, 4), (26, 2)]


@st.composite
def npz_mutation(draw, data: bytes) -> bytes:
    """A member's .npy mutated or replaced by an odd array, a member
    dropped, or a size field of the zip directory (or a local header) set
    to an odd value."""
    try:
        with zipfile.ZipFile(_pyio.BytesIO(data)) as z:
            infos = z.infolist()
            members = {i.filename: z.read(i) for i in infos}
    except Exception:  # an earlier mutation broke the archive
        return draw(byte_mutations(data))
    if not members:
        return draw(byte_mutations(data))
    compression = infos[0].compress_type
    kind = draw(st.sampled_from(["member", "member", "replace", "replace", "drop", "directory"]))
    if kind == "member":
        name = draw(st.sampled_from(sorted(members)))
        members[name] = draw(npy_mutation(members[name]))
    elif kind == "replace":
        key = draw(st.sampled_from(sorted(NPZ_KEYS)))
        members[key + ".npy"] = npy_bytes(draw(st.sampled_from(NPZ_KEYS[key])))
    elif kind == "drop":
        del members[draw(st.sampled_from(sorted(members)))]
    out = zip_bytes(members, compression)
    if kind == "directory":
        buf = bytearray(out)
        central = draw(st.booleans())
        starts = [m.start() for m in re.finditer(rb"PK\x01\x02" if central else rb"PK\x03\x04", buf)]
        if starts:
            at = draw(st.sampled_from(starts))
            off, width = draw(st.sampled_from(CENTRAL_FIELDS if central else LOCAL_FIELDS))
            value = draw(st.sampled_from([0, 1, 8, 64, 1000, 10 ** 6, 2 ** 31, 0xFFFFFFF0, 0xFFFFFFFF]))
            if at + off + width <= len(buf):
                buf[at + off:at + off + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        out = bytes(buf)
    return out


ST_DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "Q4", "", 1, None,
             ["F32"], {"a": 1}]
ODD_JSON = ["x", 1.5, None, True, [1.5, 2], [[2]], {}, [True, False], [2 ** 64], [-1, 4]]


@st.composite
def safetensors_mutation(draw, data: bytes) -> bytes:
    """A header field (shape, data_offsets, dtype, __metadata__) set to an
    odd value, a field dropped or a tensor added; the header length kept
    consistent, or not; or the data damaged."""
    try:
        (n,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8:8 + n])
        body = data[8 + n:]
        names = [k for k in header if k != "__metadata__"]
        assert names
    except Exception:
        return draw(byte_mutations(data))
    kind = draw(st.sampled_from(["shape", "shape", "offsets", "offsets", "dtype", "drop", "metadata",
                                 "add", "data"]))
    t = header[draw(st.sampled_from(names))]
    if kind == "shape":
        t["shape"] = draw(st.one_of(st.lists(ints(), max_size=4), st.sampled_from(ODD_JSON)))
    elif kind == "offsets":
        t["data_offsets"] = draw(st.one_of(st.lists(ints(), min_size=2, max_size=3), st.sampled_from(ODD_JSON)))
    elif kind == "dtype":
        t["dtype"] = draw(st.sampled_from(ST_DTYPES))
    elif kind == "drop":
        del t[draw(st.sampled_from(sorted(t)))]
    elif kind == "metadata":
        header["__metadata__"] = draw(st.sampled_from([None, [], "x", {"a": "b"}, 5]))
    elif kind == "add":
        header[draw(st.sampled_from(["w.perm", "a.perm", "x", ""]))] = {
            "dtype": draw(st.sampled_from(ST_DTYPES)), "shape": draw(st.lists(ints(), max_size=3)),
            "data_offsets": draw(st.lists(ints(), min_size=2, max_size=2))}
    else:
        body = draw(byte_mutations(body)) if body else body
    raw = json.dumps(header).encode()
    size = len(raw) if draw(st.integers(0, 4)) else n
    return struct.pack("<Q", size) + raw + body


NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
BANNER_WORDS = [b"matrix", b"coordinate", b"array", b"real", b"integer", b"pattern", b"complex",
                b"general", b"symmetric", b"skew-symmetric", b"hermitian", b"vector"]
EXTRA_LINES = [b"%sparseforge-dtype fp16", b"%sparseforge-dtype bf16", b"%sparseforge-dtype x",
               b"%sparseforge-perm 0 1 2", b"%sparseforge-perm 1 0", b"%sparseforge-perm 99999999999999999999",
               b"% comment", b"", b"1 1 1", b"0", b"\xff\xfe"]


@st.composite
def text_mutation(draw, data: bytes) -> bytes:
    """A number (size, nnz, offset, index or value) set to an odd one, a
    banner word swapped, or a line inserted."""
    kind = draw(st.sampled_from(["number", "number", "number", "word", "line"]))
    if kind == "number":
        found = list(NUMBER.finditer(data))
        if found:
            mt = found[draw(st.integers(0, len(found) - 1))]
            new = draw(st.one_of(ints().map(str), st.sampled_from(FLOATS)))
            return splice(data, mt.start(), mt.end(), new.encode())
    elif kind == "word":
        old, new = draw(st.sampled_from(BANNER_WORDS)), draw(st.sampled_from(BANNER_WORDS))
        return data.replace(old, new, 1)
    lines = data.split(b"\n")
    at = draw(st.integers(0, len(lines)))
    return b"\n".join(lines[:at] + [draw(st.sampled_from(EXTRA_LINES))] + lines[at:])


STRUCTURAL = {".npy": npy_mutation, ".npz": npz_mutation, ".safetensors": safetensors_mutation,
              ".mtx": text_mutation, ".smtx": text_mutation}


@st.composite
def mutated_file(draw, ext: str) -> bytes:
    data = draw(st.sampled_from(SEEDS[ext]))
    for _ in range(draw(st.integers(0, 2))):
        data = draw(STRUCTURAL[ext](data))
    if draw(st.integers(0, 3)) == 0:
        data = draw(byte_mutations(data))
    return data


load_options = st.fixed_dictionaries({
    "name": st.sampled_from([None] * 6 + ["w", "w", "a", "b.weight", "x"]),
    "dtype": st.sampled_from([None, None, "fp32", "fp16", "bf16"]),
})


def check_load(path: Path, data: bytes, options: dict):
    """io.load returns sound matrices or raises a WeightFileError naming the
    file; any other exception propagates and fails the test."""
    path.write_bytes(data)
    try:
        mats = io.load(path, max_elements=LIMIT, **options)
    except io.WeightFileError as e:
        msg = str(e)
        assert msg.startswith(f"{path}: "), msg
        assert "cannot be read (unexpected " not in msg, msg
        assert "not enough memory" not in msg, msg
        return
    for name, m in mats:
        assert isinstance(m, SparseMatrix) and m.name == name
        assert 1 <= m.rows and 1 <= m.cols and m.rows * m.cols <= LIMIT
        assert m.nnz <= m.rows * m.cols and np.all(np.isfinite(m.values))
        assert options["dtype"] in (None, m.dtype)


# =========================================================================
# the readers
# =========================================================================
@pytest.mark.parametrize("ext", EXTS)
def test_seeds_load(tmp_path, ext):
    """The mutations start from files that load."""
    for data in SEEDS[ext]:
        (tmp_path / f"w{ext}").write_bytes(data)
        assert io.load(tmp_path / f"w{ext}")


@pytest.mark.parametrize("ext", EXTS)
@fuzz_settings(max_examples=300)
@given(data=st.data())
def test_fuzz_mutated_files(tmp_path, ext, data):
    check_load(tmp_path / f"w{ext}", data.draw(mutated_file(ext), label="file"),
               data.draw(load_options, label="options"))


MAGIC = {".npy": [b"", b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00"],
         ".npz": [b"", b"PK\x03\x04", b"PK\x05\x06"],
         ".safetensors": [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"w\":"],
         ".mtx": [b"", b"%%MatrixMarket matrix coordinate real general\n",
                  b"%%MatrixMarket matrix array real general\n"],
         ".smtx": [b"", b"4, 4, 3\n"]}


@pytest.mark.parametrize("ext", EXTS)
@fuzz_settings(max_examples=60)
@given(data=st.data())
def test_fuzz_random_bytes(tmp_path, ext, data):
    prefix = data.draw(st.sampled_from(MAGIC[ext]), label="prefix")
    body = data.draw(st.one_of(st.binary(max_size=400),
                               st.text("0123456789 ,.-e\n%", max_size=200).map(str.encode)), label="body")
    check_load(tmp_path / f"w{ext}", prefix + body, {"name": None, "dtype": None})


# =========================================================================
# the pattern parser
# =========================================================================
VALID_PATTERNS = ["csr", "nm24", "bsr:32x32", "bsr:16", "shflbw:64"]


def parse_pattern():
    families = pytest.importorskip("sparseforge.generator.families")
    fn = getattr(families, "parse_pattern", None)
    if fn is None:  # before the families refactor the parser lives in generator.kernel
        fn = getattr(pytest.importorskip("sparseforge.generator.kernel"), "parse_pattern", None)
    if fn is None:
        pytest.skip("no parse_pattern in this tree")
    return fn


def test_valid_patterns_parse():
    fn = parse_pattern()
    for spec in VALID_PATTERNS:
        assert fn(spec) is not None, spec


PATTERN_PIECES = ["", ":", "x", "X", "0", "-1", "1e3", "0x10", " ", "\t", "\x00", "٣", "３２", "_",
                  "99999999999999999999", "1" * 5000, "bsr", "csr", ":32x32", "x0", "::", "é"]


@st.composite
def mutated_pattern(draw) -> str:
    s = draw(st.sampled_from(VALID_PATTERNS))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "number", "case"]))
        pos = draw(st.integers(0, len(s)))
        piece = draw(st.one_of(st.sampled_from(PATTERN_PIECES), st.text(max_size=3)))
        if kind == "insert":
            s = s[:pos] + piece + s[pos:]
        elif kind == "delete":
            s = s[:pos] + s[pos + draw(st.integers(1, 4)):]
        elif kind == "replace":
            s = s[:pos] + piece + s[pos + 1:]
        elif kind == "number":
            s = re.sub(r"\d+", lambda _: piece if draw(st.booleans()) else str(draw(ints())), s, count=1)
        else:
            s = s.upper() if draw(st.booleans()) else s.swapcase()
    return s


@fuzz_settings(max_examples=400)
@given(spec=st.one_of(st.text(max_size=40), mutated_pattern()))
def test_fuzz_parse_pattern(spec):
    """Any string either parses or raises ValueError (PatternError)."""
    fn = parse_pattern()
    try:
        fn(spec)
    except ValueError:
        pass
