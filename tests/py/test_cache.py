"""The cache binding (sparseforge.cache): every record kind round trip, the
files it refuses (left untouched), corrupt blobs, merge, export, argument
errors and use from several threads.  CPU only.

The tests edit database files behind the library's back with Python's own
sqlite3 module."""
import ctypes
import hashlib
import math
import os
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from sparseforge import cache as sfcache
from sparseforge.cache import (Cache, CorruptError, DatabaseError, InvalidArgumentError,
                               NewerDatabaseError, NotADatabaseError, NotFoundError,
                               binary_key_hex, default_path)
from sparseforge._lib import SFError
from sparseforge.generator.kernel import make_launch

KEY = {"source": 'extern "C" __global__ void k() {}',
       "options": "--gpu-architecture=sm_90a -std=c++17 -default-device",
       "arch": "sm_90a", "nvrtc_version": "13.0", "generator_version": "0.1.0"}
DEVICE = {"name": "NVIDIA Test GPU", "cc_major": 9, "cc_minor": 0, "arch": "sm_90a",
          "sm_count": 132, "driver_version": 13000, "l2_bytes": 50 << 20,
          "total_mem_bytes": 80 << 30}
PACKED_A = b"packed-marker-AAAA\x00\x01\x02\xff"
PACKED_B = b"packed-marker-BBBB\x10\x11\x12\xfe"


def variants(tag="v"):
    return [
        {"n_bucket": 16, "source": "// k16\n", "kernel_name": "k16", "options": "",
         "generator_version": "0.1.0",
         "launch": {"grid": (96, 1, 1), "n_axis": 1, "n_tile": 16, "block": (128, 1, 1),
                    "shared_bytes": 4096, "zero_output": 0},
         "packed": PACKED_A, "config": f'{{"tag": "{tag}"}}'},
        {"n_bucket": 256, "source": "// k256\n", "kernel_name": "k256",
         "options": "-DSPLIT_K=2\n-DSTAGES=3", "generator_version": "0.1.0",
         "launch": {"grid": (48, 2, 3), "n_axis": -1, "n_tile": 0, "block": (256, 2, 1),
                    "shared_bytes": 98304, "zero_output": 1},
         "packed": PACKED_B, "config": f'{{"tag": "{tag}"}}'},
    ]


def put_layer(c, name="bert.l0.ffn1", gpu="NVIDIA H100", vs=None):
    c.put_layer(name, gpu, "fp-1", "shflbw64.fp16.fm.bias_gelu", 3072, 768, 2, 2,
                vs if vs is not None else variants())


@pytest.fixture
def db(tmp_path):
    with Cache(tmp_path / "c.db") as c:
        yield c


def snapshot(path):
    st = os.stat(path)
    return Path(path).read_bytes(), st.st_mtime_ns


# ---- paths and keys ---------------------------------------------------------

def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "sparseforge" / "sparseforge.db"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, never the cwd
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".cache" / "sparseforge" / "sparseforge.db"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_path() == tmp_path / "home" / ".cache" / "sparseforge" / "sparseforge.db"
    assert default_path().is_absolute()


def test_binary_key_hex():
    text = b"sparseforge-binary-key-v1\n"
    for f in ("source", "options", "arch", "nvrtc_version", "generator_version"):
        v = KEY[f].encode()
        text += b"%d:%s\n" % (len(v), v)
    assert binary_key_hex(KEY) == hashlib.sha256(text + b"5:cubin\n").hexdigest()
    assert binary_key_hex({**KEY, "ptx": True}) == hashlib.sha256(text + b"3:ptx\n").hexdigest()
    keys = {binary_key_hex({**KEY, f: KEY[f] + "x"}) for f in KEY}
    assert len(keys) == 5 and binary_key_hex(KEY) not in keys
    with pytest.raises(ValueError, match="binary key lacks arch, nvrtc_version"):
        binary_key_hex({"source": "s", "options": "", "generator_version": "g"})
    with pytest.raises(ValueError, match="unknown field"):
        binary_key_hex({**KEY, "kind": 1})
    with pytest.raises(TypeError, match=r"key\['source'\] must be a str"):
        binary_key_hex({**KEY, "source": b"bytes"})
    with pytest.raises(ValueError, match=r"key\['arch'\] is empty"):
        binary_key_hex({**KEY, "arch": ""})


# ---- round trip ---------------------------------------------------------------

def test_binaries(db):
    assert db.get_binary(KEY) is None
    db.put_binary(KEY, b"\x7fELF cubin bytes")
    db.put_binary(KEY, b"\x7fELF cubin bytes")  # again: nothing changes
    assert db.get_binary(KEY) == b"\x7fELF cubin bytes"
    ptx = {**KEY, "ptx": True}
    assert db.get_binary(ptx) is None
    db.put_binary(ptx, b".version 8.0\n")
    assert db.get_binary(ptx) == b".version 8.0\n\0"  # PTX comes back NUL-terminated
    assert db.summary()["binaries"] == 2
    with pytest.raises(ValueError, match="data is empty"):
        db.put_binary(KEY, b"")
    with pytest.raises(TypeError, match="data must be bytes-like"):
        db.put_binary(KEY, "text")


def test_env_and_matrix(db):
    env = db.put_env(DEVICE)
    assert env == hashlib.sha256(b"NVIDIA Test GPU|9.0|132|13000").hexdigest()
    assert db.put_env({**DEVICE, "clock_khz": 1980000}) == env
    (e,) = db.envs()
    assert e["env_key"] == env and e["name"] == "NVIDIA Test GPU" and e["arch"] == "sm_90a"
    assert (e["cc_major"], e["cc_minor"], e["sm_count"], e["driver_version"]) == (9, 0, 132, 13000)
    assert e["clock_khz"] == 1980000 and e["total_mem_bytes"] == 80 << 30
    with pytest.raises(ValueError, match="device info lacks sm_count"):
        db.put_env({k: v for k, v in DEVICE.items() if k != "sm_count"})
    with pytest.raises(InvalidArgumentError, match="dev->name is empty"):
        db.put_env({**DEVICE, "name": ""})

    db.put_matrix("fp-1", 3072, 768, 235930, "fp16", '{"pattern": "shflbw64"}')
    db.put_matrix("fp-2", 10, 20, 0, "fp32", {"b": 1, "a": 2})
    db.put_matrix("fp-3", 10, 20, 5, "fp32")
    ms = db.matrices()
    assert [m["fingerprint"] for m in ms] == ["fp-1", "fp-2", "fp-3"]
    assert ms[0] == {"fingerprint": "fp-1", "rows": 3072, "cols": 768, "nnz": 235930,
                     "dtype": "fp16", "info": '{"pattern": "shflbw64"}'}
    assert ms[1]["info"] == '{"a": 2, "b": 1}' and ms[2]["info"] is None
    assert db.matrices("fp-2")[0]["rows"] == 10 and db.matrices("nope") == []
    with pytest.raises(InvalidArgumentError, match="bad shape 10 x 20 with 201 nonzeros"):
        db.put_matrix("fp-4", 10, 20, 201, "fp32")


def test_trials_order_and_upsert(db):
    env = db.put_env(DEVICE)
    op = "shflbw64.fp16.fm.bias_gelu"
    for cfg, n, status, med in [("cfg-slow", 256, "ok", 2.0), ("cfg-wrong", 256, "wrong", None),
                                ("cfg-fast", 256, "ok", 1.0),
                                ("cfg-nocompile", 256, "compile_fail", None),
                                ("cfg-timeout", 1024, "timeout", None),
                                ("cfg-big", 1024, "ok", 7.5)]:
        if status == "ok":
            db.put_trial(env, "fp-1", op, n, cfg, status, median_ms=med, p20_ms=med * 0.9,
                         p80_ms=med * 1.1, min_ms=med * 0.8, reps=30, max_error=1e-3,
                         binary_key="bk")
        else:
            db.put_trial(env, "fp-1", op, n, cfg, status, message="it failed")
    ts = db.trials()
    assert [t["config"] for t in ts] == ["cfg-fast", "cfg-slow", "cfg-nocompile", "cfg-wrong",
                                         "cfg-big", "cfg-timeout"]
    assert [t["status"] for t in ts] == ["ok", "ok", "compile_fail", "wrong", "ok", "timeout"]
    best = ts[0]
    assert best["median_ms"] == 1.0 and best["reps"] == 30 and best["binary_key"] == "bk"
    assert best["message"] is None and best["created"] > 1.6e9
    assert math.isnan(ts[2]["median_ms"]) and math.isnan(ts[2]["max_error"])
    assert ts[2]["message"] == "it failed" and ts[2]["binary_key"] is None
    assert db.summary()["winners"] == 2
    # the same key replaces: cfg-slow becomes the best
    db.put_trial(env, "fp-1", op, 256, "cfg-slow", "ok", median_ms=0.5)
    assert db.summary()["trials"] == 6
    group = db.trials(env, "fp-1", op, 256)
    assert [t["config"] for t in group][:2] == ["cfg-slow", "cfg-fast"]
    assert len(db.trials(n=1024)) == 2 and db.trials(op="other") == []
    assert len(db.trials(env_key=env, n=None)) == 6
    with pytest.raises(ValueError, match="status must be one of ok, compile_fail, launch_fail, "
                                         "wrong, timeout; got 'fine'"):
        db.put_trial(env, "fp-1", op, 16, "c", "fine")
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        db.put_trial(env, "fp-1", op, -1, "c", "ok")
    with pytest.raises(TypeError, match="config must be a str"):
        db.put_trial(env, "fp-1", op, 16, {"a": 1}, "ok")


def test_layers(db):
    put_layer(db)
    put_layer(db, gpu="NVIDIA A100")
    put_layer(db, name="bert.l1.ffn1", vs=variants("other"))
    s = db.summary()
    assert (s["layers"], s["layer_variants"], s["blobs"]) == (3, 6, 2)  # packed stored once
    recs = db.layers("bert.l0.ffn1")
    assert [r["gpu_name"] for r in recs] == ["NVIDIA A100", "NVIDIA H100"]
    r = recs[1]
    assert (r["name"], r["matrix_fp"], r["op"], r["rows"], r["cols"]) == (
        "bert.l0.ffn1", "fp-1", "shflbw64.fp16.fm.bias_gelu", 3072, 768)
    assert (r["x_elem_size"], r["y_elem_size"]) == (2, 2)
    assert r["variants"] == variants()
    assert [x["name"] for x in db.layers()] == ["bert.l0.ffn1", "bert.l0.ffn1", "bert.l1.ffn1"]
    assert db.layers("none") == []
    # replace with one variant; the bytes nobody uses go away
    put_layer(db, name="bert.l1.ffn1", vs=[{**variants()[0], "packed": b"unique"}])
    assert db.summary()["blobs"] == 3
    db.delete_layer("bert.l1.ffn1")
    assert db.summary()["blobs"] == 2
    db.delete_layer("bert.l0.ffn1")
    assert db.summary()["layers"] == 0 and db.summary()["blobs"] == 0
    with pytest.raises(NotFoundError, match="no layer named bert.l0.ffn1") as ei:
        db.delete_layer("bert.l0.ffn1")
    assert isinstance(ei.value, SFError) and ei.value.name == "SF_ERR_NOT_FOUND"
    # packed may be any buffer
    import numpy as np
    launch = make_launch(grid=(7,), block=(32,))
    db.put_layer("np", "G", "fp", "op", 4, 4, 4, 4,
                 [{"n_bucket": 1, "source": "s", "kernel_name": "k", "launch": launch,
                   "packed": np.arange(4, dtype=np.float32)}])
    (r,) = db.layers("np")
    v = r["variants"][0]
    assert v["launch"] == {**launch, "grid": (7, 1, 1), "block": (32, 1, 1)}
    assert v["packed"] == np.arange(4, dtype=np.float32).tobytes()
    assert r["problem"] is None


def test_layer_argument_errors(db):
    with pytest.raises(ValueError, match="layer 'L': no variants"):
        db.put_layer("L", "G", "fp", "op", 4, 4, 4, 4, [])
    with pytest.raises(ValueError, match="layer 'L' variant 0 lacks kernel_name"):
        db.put_layer("L", "G", "fp", "op", 4, 4, 4, 4,
                     [{"n_bucket": 1, "source": "s", "launch": make_launch((1,), (1,)),
                       "packed": b""}])
    bad = variants()
    bad[1]["n_bucket"] = 16
    with pytest.raises(InvalidArgumentError, match="variants 0 and 1 both have n_bucket 16"):
        put_layer(db, vs=bad)
    zero_grid = {**variants()[0]["launch"], "grid": (0, 1, 1)}
    with pytest.raises(InvalidArgumentError, match="a grid or block dimension is 0"):
        put_layer(db, vs=[{**variants()[0], "launch": zero_grid}])
    with pytest.raises(ValueError, match=r"launch: the launch record has exactly grid, n_axis"):
        put_layer(db, vs=[{**variants()[0], "launch": {"grid": (1, 1, 1)}}])
    with pytest.raises(ValueError, match=r"launch.grid must be 3 integers, got \(1,\)"):
        put_layer(db, vs=[{**variants()[0], "launch": {**zero_grid, "grid": (1,)}}])
    with pytest.raises(ValueError, match="unknown field"):
        put_layer(db, vs=[{**variants()[0], "colour": 1}])
    with pytest.raises(TypeError, match="variants must be a list of dicts"):
        db.put_layer("L", "G", "fp", "op", 4, 4, 4, 4, variants()[0])
    assert db.summary()["layers"] == 0


def test_reopen_and_readonly(tmp_path):
    p = tmp_path / "deep" / "folder" / "c.db"  # folders are created
    with Cache(p) as c:
        put_layer(c)
        c.put_trial("e", "fp", "op", 16, "cfg", "ok", median_ms=1.0)
    before = snapshot(p)
    with Cache(p, readonly=True) as c:
        assert c.layers()[0]["variants"] == variants()
        with pytest.raises(DatabaseError, match="cannot store a trial: the cache was opened "
                                                r"read-only \(SF_CACHE_READONLY\)"):
            c.put_trial("e", "fp", "op", 16, "cfg2", "ok")
        with pytest.raises(DatabaseError, match="read-only"):
            c.delete_layer("bert.l0.ffn1")
    assert snapshot(p) == before
    c = Cache(p, create=False)
    c.close()
    c.close()
    with pytest.raises(ValueError, match="is closed"):
        c.trials()
    assert "closed" in repr(c)


# ---- refused files --------------------------------------------------------------

def test_missing(tmp_path):
    p = tmp_path / "missing.db"
    with pytest.raises(NotFoundError, match="no such file .open with SF_CACHE_CREATE"):
        Cache(p, create=False)
    with pytest.raises(NotFoundError, match="a read-only open never creates one"):
        Cache(p, readonly=True)
    assert not p.exists()


@pytest.mark.parametrize("mode", [dict(), dict(create=False), dict(readonly=True)])
def test_refuses_other_files(tmp_path, mode):
    text = tmp_path / "notes.txt"
    text.write_text("These are notes, not a database. " * 10)
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.executescript("PRAGMA application_id = 1234; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
    con.close()
    newer = tmp_path / "newer.db"
    Cache(newer).close()
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.close()
    cases = [(text, NotADatabaseError, "not a SQLite database"),
             (foreign, NotADatabaseError, "a SQLite database of another application "
                                          r"\(application_id 0x000004d2"),
             (newer, NewerDatabaseError, "schema version 99 is newer than this library's 1")]
    for path, exc, msg in cases:
        before = snapshot(path)
        with pytest.raises(exc, match=msg) as ei:
            Cache(path, **mode)
        assert str(path) in ei.value.message
        assert snapshot(path) == before, f"{path} was modified"


def test_corrupt_blobs(tmp_path):
    p = tmp_path / "c.db"
    fine = [{**v, "packed": b"fine-%d" % i} for i, v in enumerate(variants())]
    with Cache(p) as c:
        c.put_binary(KEY, b"cubin-marker-0123456789")
        put_layer(c)
        put_layer(c, name="good.layer", vs=fine)
        c.put_trial("env", "fp", "op", 16, "cfg", "ok", median_ms=1.0)
    con = sqlite3.connect(p)
    con.execute("UPDATE binaries SET blob = CAST(replace(CAST(blob AS TEXT), 'cubin-marker', "
                "'cubin-markeR') AS BLOB)")
    con.execute("UPDATE blobs SET data = CAST(replace(CAST(data AS TEXT), 'packed-marker-BBBB', "
                "'packed-marker-BBBC') AS BLOB)")
    con.commit()
    con.close()
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    with Cache(p) as c:
        with pytest.raises(CorruptError, match=f"binary {binary_key_hex(KEY)} is corrupt"):
            c.get_binary(KEY)
        # the bad layer is listed, named and unusable; listing does not fail
        bad, good = c.layers()
        assert bad["name"] == "bert.l0.ffn1" and bad["variants"] == []
        assert "variant 1" in bad["problem"] and "256" in bad["problem"], bad["problem"]
        assert good["name"] == "good.layer" and good["variants"] == fine
        assert good["problem"] is None
        # merge copies every good record and reports each damaged one,
        # naming the source file and the record
        skipped = [f"{p}: binary {binary_key_hex(KEY)} (sm_90a) skipped: its bytes failed their "
                   f"sha256: 23 bytes hash to {sha(b'cubin-markeR-0123456789')}, not the stored "
                   f"{sha(b'cubin-marker-0123456789')}",
                   f'{p}: layer "bert.l0.ffn1" (NVIDIA H100) skipped: {bad["problem"]}']
        other = Cache(tmp_path / "other.db")
        assert other.merge_report(p) == (1 + 1 + 2 + 2, skipped)  # trial, good.layer
        s = other.summary()
        assert (s["binaries"], s["layers"], s["layer_variants"], s["trials"]) == (0, 1, 2, 1)
        assert other.layers()[0]["variants"] == fine
        assert other.merge(p) == 0  # the count alone, as before
        # export likewise (KEY's source is no variant's: not exported);
        # an export that fails leaves no file
        assert c.export_report(tmp_path / "exp.db") == (1 + 2 + 2, skipped[1:])
        assert c.export_to(tmp_path / "exp2.db", ["good.layer"]) == 1 + 2 + 2
        with pytest.raises(NotFoundError, match="no layer named nope to export"):
            c.export_report(tmp_path / "never.db", ["good.layer", "nope"])
        assert not (tmp_path / "never.db").exists()
        with Cache(tmp_path / "newer.db") as n:  # refused after the temporary file exists
            put_layer(n)
            con = sqlite3.connect(tmp_path / "newer.db")
            con.execute("PRAGMA user_version = 99")
            con.close()
            with pytest.raises(NewerDatabaseError, match="newer.db: schema version 99"):
                n.export_report(tmp_path / "never.db")
        assert not (tmp_path / "never.db").exists()
        assert [f.name for f in tmp_path.iterdir() if "export-tmp" in f.name] == []
        # storing again repairs, and merging again adds what was skipped
        c.put_binary(KEY, b"cubin-marker-0123456789")
        assert c.get_binary(KEY) == b"cubin-marker-0123456789"
        put_layer(c)
        assert c.layers()[0]["variants"] == variants()
        assert other.merge_report(p) == (1 + 1 + 2 + 2, [])  # binary, layer, variants, blobs
        assert [r["problem"] for r in other.layers()] == [None, None]
        other.close()


def test_readonly_directory(tmp_path):
    """A cache copied into a read-only directory (file 0444, folder 0555)
    opens with readonly=True, WAL or not, and no side file appears.  Root
    writes anywhere, so for it SQLite's usual -wal/-shm may appear beside
    the WAL copy (the C test test_cache_readonly drops privileges to check
    that case); the exported, self-contained file never gets any."""
    src = tmp_path / "src.db"
    with Cache(src) as c:
        put_layer(c)
        c.put_binary({**KEY, "source": "// k16\n"}, b"cubin of k16")
        c.put_trial("env", "fp", "op", 16, "cfg", "ok", median_ms=1.0)
        c.export_to(tmp_path / "exported.db")
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(src, ro / "wal.db")  # closed cleanly: no -wal to copy
    shutil.copy(tmp_path / "exported.db", ro / "exported.db")
    assert (ro / "wal.db").read_bytes()[18:20] == b"\x02\x02"       # WAL
    assert (ro / "exported.db").read_bytes()[18:20] == b"\x01\x01"  # DELETE journal
    for f in ro.iterdir():
        f.chmod(0o444)
    ro.chmod(0o555)
    try:
        before = sorted(os.listdir(ro))
        for name, trials in (("exported.db", 0), ("wal.db", 1)):
            snap = snapshot(ro / name)
            with Cache(ro / name, readonly=True) as c:
                assert c.layers()[0]["variants"] == variants()
                assert c.get_binary({**KEY, "source": "// k16\n"}) == b"cubin of k16"
                assert c.summary()["trials"] == trials
                with pytest.raises(DatabaseError, match="read-only"):
                    c.delete_layer("bert.l0.ffn1")
            assert snapshot(ro / name) == snap
            if name == "exported.db" or os.geteuid() != 0:
                assert sorted(os.listdir(ro)) == before
    finally:
        ro.chmod(0o755)


# ---- whole files ------------------------------------------------------------------

def test_merge_and_export(tmp_path):
    pa, pb = tmp_path / "a.db", tmp_path / "b.db"
    with Cache(pa) as a, Cache(pb) as b:
        for i in range(10):
            a.put_trial("env", "fp-1", "op", 256, f"cfg-{i}", "ok", median_ms=1 + i,
                        message="from a")
        for i in range(5, 20):
            b.put_trial("env", "fp-1", "op", 256, f"cfg-{i}", "ok", median_ms=1 + i,
                        message="from b")
        put_layer(a, name="shared")
        put_layer(b, name="shared", vs=[{**variants()[0], "n_bucket": 32}])
        put_layer(b, name="b.only")
        b.put_matrix("fp-1", 3072, 768, 1000, "fp16")
        b.put_binary({**KEY, "source": "// k16\n"}, b"cubin of k16")
        b.put_binary(KEY, b"unrelated")
    before = snapshot(pb)
    with Cache(pa) as a:
        added = a.merge(pb)
        assert added == 10 + 1 + 2 + 1 + 2  # trials, matrix, binaries, layer + variants
        assert a.merge(pb) == 0
        assert snapshot(pb) == before
        ts = a.trials()
        assert len(ts) == 20
        assert {t["config"]: t["message"] for t in ts}["cfg-5"] == "from a"
        (shared,) = a.layers("shared")
        assert shared["variants"] == variants()  # b's variants did not mix in
        assert len(a.layers("b.only")) == 1
        with pytest.raises(NotFoundError):
            a.merge(tmp_path / "nothing.db")
        (tmp_path / "t.txt").write_text("x" * 200)
        with pytest.raises(NotADatabaseError):
            a.merge(tmp_path / "t.txt")

        out = tmp_path / "export" / "one.db"
        assert a.export_to(out, ["b.only"]) == 1 + 1 + 2 + 2 + 1
        with pytest.raises(NotFoundError, match="no layer named nope to export"):
            a.export_to(tmp_path / "never.db", ["b.only", "nope"])
        assert not (tmp_path / "never.db").exists()
        assert a.export_to(tmp_path / "all.db") > 0
    with Cache(out, readonly=True) as c:
        s = c.summary()
        assert (s["layers"], s["layer_variants"], s["binaries"], s["matrices"], s["trials"]) == (
            1, 2, 1, 1, 0)
        assert c.get_binary({**KEY, "source": "// k16\n"}) == b"cubin of k16"
        assert c.get_binary(KEY) is None
    with Cache(tmp_path / "all.db", readonly=True) as c:
        assert [r["name"] for r in c.layers()] == ["b.only", "shared"]


# ---- plumbing -----------------------------------------------------------------------

def test_handle_and_callback_errors(db, monkeypatch):
    assert isinstance(db._handle, ctypes.c_void_p) and db._handle.value
    from sparseforge import native
    assert native._cache_handle(db) == db._handle.value
    # one library object, every signature from the headers' generated table
    from sparseforge import _abi
    from sparseforge._lib import load
    fn = load().sf_cache_put_layer
    assert (fn.restype, fn.argtypes) == (_abi.PROTOTYPES["sf_cache_put_layer"][0],
                                         _abi.PROTOTYPES["sf_cache_put_layer"][1])
    db.put_trial("e", "fp", "op", 16, "cfg", "ok", median_ms=1.0)

    def boom(t):
        raise RuntimeError("callback failed")

    monkeypatch.setattr(sfcache, "_trial_dict", boom)
    with pytest.raises(RuntimeError, match="callback failed"):
        db.trials()


def test_threads_and_processes_share(tmp_path):
    p = tmp_path / "shared.db"
    with Cache(p) as c, Cache(p) as c2:
        errors = []

        def work(cache, k):
            try:
                for i in range(50):
                    cache.put_trial("env", "fp", "op", 16, f"t{k}-{i}", "ok", median_ms=i)
                    cache.put_binary({**KEY, "source": f"s{k}-{i}"}, b"bytes")
                    assert cache.get_binary({**KEY, "source": f"s{k}-{i}"}) == b"bytes"
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(c if k % 2 else c2, k)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert c.summary()["trials"] == 200 and c2.summary()["binaries"] == 200
