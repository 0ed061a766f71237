"""The tuner's driver with its measurement worker replaced by a replay of
timings: resume after an interruption, no re-measurement, no recompilation,
failed trials recorded, winners stored as a layer.  Compiles for real with
NVRTC (no GPU needed)."""
import json

import numpy as np
import pytest

from sparseforge.cache import Cache
from sparseforge.generator.families import get_family
from sparseforge.generator.kernel import Operation, canonical_config
from sparseforge.generator.matrix import SparseMatrix
from sparseforge.tuner.driver import Tuner

from replay import DEVICE, ReplayWorker, replay_ms

@pytest.fixture(autouse=True)
def small_space(monkeypatch):
    """Every configuration is compiled for real: keep the space to 8 of them
    so the suite stays quick on two cores."""
    fam = get_family("csr")
    full = fam.search_space
    monkeypatch.setattr(fam, "search_space", lambda *a, **k: full(*a, **k)[:8])


@pytest.fixture
def matrix():
    rng = np.random.default_rng(3)
    dense = rng.standard_normal((96, 80)).astype(np.float32)
    dense[rng.random(dense.shape) < 0.8] = 0
    return SparseMatrix.from_dense(dense, dtype="fp32")


def space_size(matrix, op):
    return len(get_family("csr").search_space(matrix, op, {}, DEVICE))


def test_resume_after_interrupt_measures_nothing_twice(tmp_path, matrix):
    db = str(tmp_path / "t.db")
    op = Operation("fp32", "fm")
    total = space_size(matrix, op)
    assert total > 5
    with Cache(db) as cache:
        t1 = Tuner(cache, strategy="exhaustive", worker=ReplayWorker(interrupt_after=5), jobs=2)
        with pytest.raises(KeyboardInterrupt):
            t1.tune(matrix, "csr", {}, op, [64], "layer0")
        assert len(cache.trials(op="csr.fp32.fm.plain")) == 5
    with Cache(db) as cache:
        w2 = ReplayWorker()
        t2 = Tuner(cache, strategy="exhaustive", worker=w2, jobs=2)
        res = t2.tune(matrix, "csr", {}, op, [64], "layer0")
        assert len(w2.trials) == total - 5          # the 5 recorded trials were reused
        assert t2.compiled <= total - 5             # their binaries too
        assert len(cache.trials(op="csr.fp32.fm.plain", n=64)) == total
        nres = res.per_n[64]
        best = min(cache.trials(op="csr.fp32.fm.plain", n=64), key=lambda t: t["median_ms"])
        assert nres.median_ms == best["median_ms"]
        assert nres.peer_ms == 0.5 and nres.speedup == pytest.approx(0.5 / best["median_ms"])
        layers = cache.layers("layer0")
        assert len(layers) == 1 and layers[0]["gpu_name"] == "Replay GPU"
        assert [v["n_bucket"] for v in layers[0]["variants"]] == [64]
        assert json.loads(layers[0]["variants"][0]["config"]) == nres.config


def test_second_run_is_served_from_the_database(tmp_path, matrix):
    db = str(tmp_path / "t.db")
    op = Operation("fp32", "fm")
    with Cache(db) as cache:
        Tuner(cache, strategy="exhaustive", worker=ReplayWorker(), jobs=2).tune(
            matrix, "csr", {}, op, [16, 256], "layer0")
    with Cache(db) as cache:
        w = ReplayWorker()
        t = Tuner(cache, strategy="exhaustive", worker=w, jobs=2)
        res = t.tune(matrix, "csr", {}, op, [16, 256], "layer0")
        assert res.from_cache
        assert t.compiled == 0                      # no compilation at all
        assert len(w.trials) == 2                   # the two winners, re-timed for the table
        assert w.peers == 2                         # and cuBLAS beside each


def test_a_rerun_without_retime_runs_nothing_and_reports_the_recorded_times(tmp_path, matrix):
    """`sparseforge tune` on a complete database: the winners' times and
    cuBLAS's come from the trials recorded when they were tuned; nothing is
    compiled, verified or timed.  A bucket with no recorded trial of its
    winner (a layer imported from elsewhere) is re-timed."""
    db = str(tmp_path / "t.db")
    op = Operation("fp32", "fm")
    with Cache(db) as cache:
        first = Tuner(cache, strategy="exhaustive", worker=ReplayWorker(), jobs=2).tune(
            matrix, "csr", {}, op, [16, 256], "layer0")
    with Cache(db) as cache:
        w = ReplayWorker()
        t = Tuner(cache, strategy="exhaustive", worker=w, jobs=2, retime=False)
        res = t.tune(matrix, "csr", {}, op, [16, 256], "layer0")
        assert res.from_cache and t.compiled == 0
        assert w.trials == [] and w.peers == 0 and w.setups == 0
        for n in (16, 256):
            got, was = res.per_n[n], first.per_n[n]
            assert got.recorded and not was.recorded
            assert (got.median_ms, got.config, got.peer_ms) == (was.median_ms, was.config,
                                                                was.peer_ms)
            assert got.trials == was.trials
    # the winner's trial forgotten: that bucket alone is measured again
    import sqlite3
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM trials WHERE n = 16")
    with Cache(db) as cache:
        w = ReplayWorker()
        res = Tuner(cache, strategy="exhaustive", worker=w, jobs=2, retime=False).tune(
            matrix, "csr", {}, op, [16, 256], "layer0")
        assert len(w.trials) == 1 and w.peers == 1
        assert not res.per_n[16].recorded and res.per_n[256].recorded


def test_a_later_tune_adds_n_buckets_beside_the_stored_ones(tmp_path, matrix):
    """--n 16 then --n 256,16: the layer keeps 16 (re-timed, not re-tuned)
    and gains 256; a later --n 64 alone adds 64 and keeps both."""
    db = str(tmp_path / "t.db")
    op = Operation("fp32", "fm")
    total = space_size(matrix, op)
    with Cache(db) as cache:
        Tuner(cache, strategy="exhaustive", worker=ReplayWorker(), jobs=2).tune(
            matrix, "csr", {}, op, [16], "layer0")
        first = cache.layers("layer0")[0]["variants"]
        w = ReplayWorker()
        res = Tuner(cache, strategy="exhaustive", worker=w, jobs=2).tune(
            matrix, "csr", {}, op, [256, 16], "layer0")
        assert len(w.trials) == total + 1         # 256 searched, 16's winner re-timed
        assert res.from_cache and set(res.per_n) == {16, 256}
        (rec,) = cache.layers("layer0")
        assert [v["n_bucket"] for v in rec["variants"]] == [16, 256]
        assert rec["variants"][0] == first[0]     # the stored bucket is kept as it was
        w = ReplayWorker()
        Tuner(cache, strategy="exhaustive", worker=w, jobs=2).tune(matrix, "csr", {}, op, [64],
                                                                   "layer0")
        assert len(w.trials) == total
        assert [v["n_bucket"] for v in cache.layers("layer0")[0]["variants"]] == [16, 64, 256]
        # --force re-tunes the asked bucket and keeps the others
        w = ReplayWorker()
        Tuner(cache, strategy="exhaustive", worker=w, jobs=2).tune(matrix, "csr", {}, op, [64],
                                                                   "layer0", force=True)
        assert [v["n_bucket"] for v in cache.layers("layer0")[0]["variants"]] == [16, 64, 256]


def test_faulting_candidate_is_recorded_and_the_run_goes_on(tmp_path, matrix):
    op = Operation("fp32", "fm")
    space = get_family("csr").search_space(matrix, op, {}, DEVICE)
    victim = get_family("csr").generate(matrix, op, {}, space[0]).name
    with Cache(str(tmp_path / "t.db")) as cache:
        w = ReplayWorker(fail_names=[victim])
        Tuner(cache, strategy="exhaustive", worker=w, jobs=2).tune(matrix, "csr", {}, op, [32], "l")
        trials = cache.trials(n=32, op="csr.fp32.fm.plain")
        failed = [t for t in trials if t["status"] == "launch_fail"]
        assert len(failed) == 1 and "ILLEGAL_ADDRESS" in failed[0]["message"]
        assert len(trials) == len(space)
        assert cache.layers("l")


def test_budgeted_search_stays_in_budget(tmp_path, matrix):
    op = Operation("fp32", "fm")
    total = space_size(matrix, op)
    with Cache(str(tmp_path / "t.db")) as cache:
        w = ReplayWorker()
        Tuner(cache, strategy="greedy", budget="4", worker=w, jobs=2).tune(matrix, "csr", {}, op, [32], "l")
        assert len(w.trials) == min(4, total)


def test_measure_rounds_builds_once_and_alternates(tmp_path, matrix):
    """Configurations measured side by side: each compiled once, one X set
    up, then the trials in turn round after round, nothing recorded; a
    failing trial ends it with its status; measure is the one-config,
    one-round case."""
    op = Operation("fp32", "fm")
    space = get_family("csr").search_space(matrix, op, {}, DEVICE)
    a, b = space[0], space[1]
    with Cache(str(tmp_path / "t.db")) as cache:
        w = ReplayWorker()
        t = Tuner(cache, worker=w, jobs=2)
        status, infos = t.measure_rounds(matrix, "csr", {}, op, 64, [a, b], 3)
        assert status == "ok" and [len(i) for i in infos] == [3, 3]
        assert w.setups == 1 and t.compiled == 2
        assert len(w.trials) == 6 and w.trials[0::2] == [w.trials[0]] * 3
        assert w.trials[1::2] == [w.trials[1]] * 3 and w.trials[0] != w.trials[1]
        assert infos[0][0]["median_ms"] == pytest.approx(replay_ms(w.trials[0]))
        assert cache.trials(op="csr.fp32.fm.plain") == []
        status, info = t.measure(matrix, "csr", {}, op, 64, b)
        assert status == "ok" and info["median_ms"] == infos[1][0]["median_ms"]
        assert t.compiled == 2                       # the binary from the cache
        w.fail_names = {w.trials[1]}
        status, info = t.measure_rounds(matrix, "csr", {}, op, 64, [a, b], 3)
        assert status == "launch_fail" and len(w.trials) == 7 + 2
        assert info["config"] == canonical_config(b)     # which one failed
        t.close()


def test_untuned_layer_runs_each_n_on_its_regimes_first_hint(tmp_path):
    """No GPU: the untuned layer's N buckets run the first of the family's
    hints for their N that compiled (decode's tiles at 16 tokens,
    prefill's at 4096), not one configuration for all."""
    from sparseforge import native
    from sparseforge.generator.synth import random_matrix
    if native.gpu_available()[0]:
        pytest.skip("a GPU is here: the tuner measures instead of storing an untuned layer")
    mat = random_matrix("shflbw:64", 256, 256, 0.25, "fp16", seed=1)
    op = Operation("fp16", "tm")
    with Cache(str(tmp_path / "u.db")) as cache:
        t = Tuner(cache, arch="sm_90a", budget="4", jobs=2)
        try:
            res = t.tune(mat, "shflbw", {"v": 64}, op, [16, 4096], "l")
        finally:
            t.close()
        (rec,) = cache.layers("l")
    assert not res.measured and rec["gpu_name"] == "untuned (sm_90a)"
    cfg = {v["n_bucket"]: json.loads(v["config"]) for v in rec["variants"]}
    fam, target = get_family("shflbw"), {"arch": "sm_90a"}
    assert cfg[16] != cfg[4096]
    assert cfg[16]["bn"] <= 32 and cfg[16].get("ks") == 2 and cfg[4096].get("wg") == 1
    assert cfg[16] == fam.hint_configs(mat, op, {"v": 64}, target, n=16)[0]
