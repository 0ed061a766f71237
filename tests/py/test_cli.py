"""The command line as a user meets it: arguments refused when parsed with
a sentence, options before or after the cache action, one-line errors with
no trace (the trace with --debug), no database left by a failing command,
and the notes a silent conversion owes the user."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseforge import cli
from sparseforge.cache import Cache
from sparseforge.generator import io
from sparseforge.generator.matrix import SparseMatrix
from sparseforge.generator.synth import random_matrix

ROOT = Path(__file__).resolve().parents[2]


def run(*args, env=None):
    """(exit code, stdout, stderr) of `sparseforge ARGS` in a fresh process."""
    e = dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    r = subprocess.run([sys.executable, "-m", "sparseforge", *map(str, args)], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    d = tmp_path_factory.mktemp("w")
    io.save(d / "model.npz", [("a", random_matrix("bsr:32x32", 128, 96, 0.25, "fp16", seed=1))])
    dense = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    np.save(d / "dense.npy", dense)
    return d


@pytest.mark.parametrize("argv,message", [
    (["--budget", "0"], "argument --budget: bad budget '0'"),
    (["--budget", "-5"], "argument --budget: bad budget '-5'"),
    (["--budget", "0%"], "argument --budget: bad budget '0%'"),
    (["--strategy", "bogus"], "argument --strategy: invalid choice: 'bogus'"),
    (["--jobs", "0"], "argument --jobs: a positive whole number, got '0'"),
    (["--arch", "ampere"], "argument --arch: architectures such as sm_80"),
    (["--pattern", "shflbw:abc"],
     "argument --pattern: pattern 'shflbw:abc': the group size V must be a whole number"),
    (["--pattern", "bsr:0x4"], "the block's rows must be from 1 to 256, got 0"),
])
def test_bad_arguments_are_refused_when_parsed(argv, message, capsys):
    with pytest.raises(SystemExit) as ei:
        cli.build_parser().parse_args(["tune", "x.npz", *argv])
    assert ei.value.code == 2
    assert message in capsys.readouterr().err


def test_options_before_or_after_the_cache_action(tmp_path, capsys):
    db = tmp_path / "c.db"
    Cache(db).close()
    for argv in (["cache", "ls", "--db", str(db)], ["cache", "--db", str(db), "ls"],
                 ["--debug", "cache", "ls", "--db", str(db)], ["cache", "ls", "--db", str(db),
                                                                "--debug"]):
        assert cli.main(argv) == 0, argv
        assert f"database: {db}" in capsys.readouterr().out


def test_errors_are_one_sentence_and_the_trace_comes_with_debug(tmp_path):
    code, _, err = run("inspect", tmp_path / "missing.npz")
    assert code == 1 and "Traceback" not in err
    assert err.strip() == f"sparseforge inspect: error: {tmp_path / 'missing.npz'}: no such file"
    code, _, err = run("inspect", tmp_path / "missing.npz", "--debug")
    assert code == 1 and "Traceback" in err and "WeightFileError" in err
    # a library status is said as its sentence, not its C name
    (tmp_path / "notadb.db").write_bytes(b"hello, not sqlite" * 10)
    code, _, err = run("cache", "ls", "--db", tmp_path / "notadb.db")
    assert code == 1 and "SF_ERR" not in err and "not a SQLite database" in err


def test_a_failing_command_creates_no_database(tmp_path, weights):
    db = tmp_path / "fresh" / "new.db"
    code, _, err = run("tune", weights / "model.npz", "--db", db, "--pattern", "nm24",
                       "--arch", "sm_80")
    assert code == 1 and "not 2:4" in err, err
    assert not db.exists() and not db.parent.exists()


def test_a_read_only_database_is_named_as_such(tmp_path, weights):
    if os.geteuid() == 0:
        pytest.skip("root writes read-only files: nothing to refuse")
    db = tmp_path / "ro.db"
    Cache(db).close()
    db.chmod(0o444)
    code, _, err = run("tune", weights / "model.npz", "--db", db, "--arch", "sm_80")
    assert code == 1 and "is read-only" in err and "SF_CACHE_READONLY" not in err


def test_explicit_pattern_on_a_dense_matrix_is_said(tmp_path, weights):
    code, out, err = run("tune", weights / "dense.npy", "--db", tmp_path / "d.db", "--pattern",
                         "shflbw:16", "--arch", "sm_80", "--n", "16", "--budget", "1")
    assert code == 0, err
    assert "dense is dense (density 1.00); tuning it as shflbw:16 as asked" in err
    code, out, err = run("tune", weights / "dense.npy", "--db", tmp_path / "d2.db", "--arch",
                         "sm_80", "--n", "16", "--budget", "1")
    assert code == 0 and "skipped: dense (density 1.00)" in out


def test_pruning_a_pattern_only_file_says_its_values_are_drawn(tmp_path):
    m = random_matrix("csr", 32, 32, 0.5, "fp32", seed=2)
    io.save(tmp_path / "p.smtx", [("p", m)])
    code, _, err = run("prune", tmp_path / "p.smtx", "--pattern", "csr", "--sparsity", "0.75",
                       "-o", tmp_path / "out.npz")
    assert code == 0, err
    assert "holds a pattern only; its values were drawn from a seeded generator" in err


def test_generate_notes_a_matrix_that_does_not_fit(tmp_path):
    m = random_matrix("csr", 64, 64, 0.2, "fp16", seed=3)
    io.save(tmp_path / "u.npz", [("u", m)])
    code, _, err = run("generate", tmp_path / "u.npz", "--pattern", "shflbw:32", "--arch",
                       "sm_80", "-o", tmp_path / "gen")
    assert code == 0, err
    assert "does not fit shflbw:32 exactly: the kernel stores" in err
    assert (tmp_path / "gen" / "u.cu").exists()


def test_sweep_spec_errors_name_the_file(tmp_path):
    spec = tmp_path / "bin.toml"
    spec.write_bytes(b"\x00\xff\xfe binary")
    code, _, err = run("sweep", spec, "--arch", "sm_80")
    assert code == 1 and f"{spec}: not a valid TOML sweep spec" in err


def test_merge_copies_the_good_records_and_names_the_bad(tmp_path):
    import sqlite3
    from sparseforge.generator.kernel import make_launch
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    with Cache(src) as c:
        for name, packed in (("good", b"good-weights"), ("bad", b"bad-weights")):
            c.put_layer(name, "G", "fp", "op", 4, 4, 2, 2,
                        [{"n_bucket": 16, "source": "// s", "kernel_name": "k",
                          "launch": make_launch((1,), (32,)), "packed": packed}])
    con = sqlite3.connect(src)
    con.execute("UPDATE blobs SET data = CAST('bad-weightz' AS BLOB) WHERE size = 11")
    con.commit()
    con.close()
    code, out, err = run("cache", "merge", src, "--db", dst)
    assert code == 0, err
    assert f'warning: {src}: layer "bad" (G) skipped: the packed weights of variant 0' in err
    assert "1 damaged record(s) skipped" in out
    with Cache(dst, readonly=True) as c:
        assert [r["name"] for r in c.layers()] == ["good"]


def test_prune_with_jobs_writes_what_one_process_writes(tmp_path):
    """`prune --jobs 2` prunes a file's matrices in worker processes, and
    writes and reports them in the file's order, as `--jobs 1` does."""
    rng = np.random.default_rng(4)
    mats = [(f"w{i}", SparseMatrix.from_dense(rng.standard_normal((96, 64 + 32 * i)),
                                              dtype="fp32")) for i in range(3)]
    io.save(tmp_path / "w.npz", mats)
    outs = []
    for jobs in ("1", "2"):
        code, out, err = run("prune", tmp_path / "w.npz", "--pattern", "shflbw:16", "--sparsity",
                             "0.75", "--jobs", jobs, "-o", tmp_path / f"p{jobs}.npz")
        assert code == 0, err
        assert [ln.split(":")[0] for ln in out.splitlines()[:3]] == ["w0", "w1", "w2"]
        outs.append(io.load(tmp_path / f"p{jobs}.npz"))
    for (n1, a), (n2, b) in zip(*outs):
        assert n1 == n2 and np.array_equal(a.to_dense(), b.to_dense())
        assert np.array_equal(a.perm, b.perm)
