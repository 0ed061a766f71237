"""Tuning survives being killed: every compiled kernel is committed as it
completes, so a `tune` killed with SIGKILL at any moment keeps what it
compiled and the rerun compiles only what is missing; Ctrl-C (SIGINT) stops
within 2 s and keeps everything.  Compile-only tuning (no GPU: the driver
is pointed at a missing file), so it runs the same everywhere."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparseforge.generator import io
from sparseforge.generator.synth import random_matrix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.npz"
    # two kernels' worth of distinct sources (equal shapes and group sizes
    # would share their binaries)
    mats = [("layer0", random_matrix("shflbw:64", 256, 192, 0.25, "fp16", seed=0)),
            ("layer1", random_matrix("bsr:32x32", 256, 192, 0.25, "fp16", seed=1))]
    io.save(path, mats)
    return path


def _tune(model, db, **kw):
    env = dict(os.environ, SF_CUDA_DRIVER="/nonexistent/libcuda.so.1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "sparseforge", "tune", str(model), "--db", str(db),
           "--arch", "sm_80", "--n", "16", "--jobs", "2", "--budget", "6"]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _binaries(db) -> int:
    """Binaries committed so far, read without disturbing the writer."""
    if not Path(db).exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute("SELECT count(*) FROM binaries").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _wait_for(db, count, proc, limit=240.0) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        n = _binaries(db)
        if n >= count:
            return n
        if proc.poll() is not None:
            pytest.fail(f"tune ended before {count} binaries: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail(f"no {count} binaries within {limit} s")


def _compiled_in(out: str) -> int:
    return int(re.search(r"kernels compiled in this run: (\d+)", out).group(1))


@pytest.fixture(scope="module")
def total(model, tmp_path_factory):
    """Kernels one uninterrupted run compiles."""
    db = tmp_path_factory.mktemp("full") / "full.db"
    out, err = _tune(model, db).communicate(timeout=600)
    assert "nothing was measured" in out, (out, err)
    n = _compiled_in(out)
    assert n == _binaries(db) >= 8
    return n


@pytest.mark.parametrize("kill_after", [1, 5])
def test_sigkill_keeps_every_compiled_kernel(model, tmp_path, total, kill_after):
    db = tmp_path / "k.db"
    proc = _tune(model, db)
    _wait_for(db, kill_after, proc)
    proc.kill()                          # SIGKILL: no handler runs
    proc.communicate()
    kept = _binaries(db)
    assert kept >= kill_after
    out, err = _tune(model, db).communicate(timeout=600)
    assert _compiled_in(out) == total - kept, (out, err)   # only what was missing
    assert _binaries(db) == total


def test_ctrl_c_stops_within_two_seconds_and_keeps_the_work(model, tmp_path, total):
    db = tmp_path / "c.db"
    # SIGINT as a terminal delivers it: a test run started in the
    # background of a non-interactive shell inherits SIGINT ignored, and
    # the tune (rightly) keeps the disposition it was given
    proc = _tune(model, db, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(db, 2, proc)
    assert proc.poll() is None, "the run ended before Ctrl-C could be sent"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 130, (out, err)
    assert took < 2.0, f"took {took:.2f} s to stop"
    assert "interrupted; every kernel compiled and every trial measured so far is stored" in err
    assert "Traceback" not in err
    kept = _binaries(db)
    assert kept >= 2
    out, _ = _tune(model, db).communicate(timeout=600)
    assert _compiled_in(out) == total - kept


def test_no_gpu_tune_stores_untuned_layers_that_cache_lists(model, tmp_path, total):
    db = tmp_path / "u.db"
    out, err = _tune(model, db).communicate(timeout=600)
    assert "no GPU" in err and "compiling for sm_80" in err
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ls = subprocess.run([sys.executable, "-m", "sparseforge", "cache", "ls", "--db", str(db)],
                        env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "layer0" in ls and "untuned (sm_80)" in ls, ls
    show = subprocess.run([sys.executable, "-m", "sparseforge", "cache", "show", "layer1",
                           "--db", str(db)], env=env, cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert "layer layer1 on untuned (sm_80)" in show and "N=16" in show, show


def test_a_corrupt_stored_kernel_is_compiled_again_and_reported(model, tmp_path, total):
    db = tmp_path / "x.db"
    out, err = _tune(model, db).communicate(timeout=600)
    con = sqlite3.connect(db)
    blob = bytearray(con.execute("SELECT blob FROM binaries LIMIT 1").fetchone()[0])
    blob[len(blob) // 2] ^= 0xFF
    con.execute("UPDATE binaries SET blob = ? WHERE rowid = (SELECT min(rowid) FROM binaries)",
                (bytes(blob),))
    con.commit()
    con.close()
    out, err = _tune(model, db).communicate(timeout=600)
    assert _compiled_in(out) == 1, (out, err)
    assert "1 stored kernel(s) failed their checksum and were compiled again and replaced" in err
