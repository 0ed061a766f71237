"""What makes tuning a whole model fast, held with a replaying worker
(compilation is real, NVRTC without a GPU): compilation overlaps
measurement (within a batch and for the next batch), a matrix's search
starts from the winners of earlier matrices of its shape, a clearly slower
candidate's timing stops after a probe (recorded as a verified ok trial
that says so), and the tuner keeps per-phase totals."""
from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest

from sparseforge.cache import Cache
from sparseforge.generator.families import get_family
from sparseforge.generator.kernel import Operation
from sparseforge.generator.matrix import SparseMatrix
from sparseforge.tuner import compiler as compiler_mod
from sparseforge.tuner.driver import Tuner
from sparseforge.tuner.phases import Phases
from sparseforge.tuner.strategies import exhaustive
from sparseforge.tuner.worker import PROBE_REPS, timed

from replay import DEVICE, SPLIT, ReplayWorker, replay_ms

OP = Operation("fp32", "fm")
OP_TAG = "csr.fp32.fm.plain"


@pytest.fixture(autouse=True)
def small_space(monkeypatch):
    """Every configuration is compiled for real: 8 of them per space; the
    one hint is the first of them, so that the tuner builds and measures
    them in the space's order (what these tests follow)."""
    fam = get_family("csr")
    full = fam.search_space
    monkeypatch.setattr(fam, "search_space", lambda *a, **k: full(*a, **k)[:8])
    monkeypatch.setattr(fam, "hint_configs",
                        lambda matrix, op, params, device=None, n=None:
                        fam.search_space(matrix, op, params, device)[:1])


def csr_matrix(seed: int, shape=(96, 80)) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal(shape).astype(np.float32)
    dense[rng.random(dense.shape) < 0.8] = 0
    return SparseMatrix.from_dense(dense, dtype="fp32")


def kernel_names(matrix) -> list[str]:
    fam = get_family("csr")
    return [fam.generate(matrix, OP, {}, c).name
            for c in fam.search_space(matrix, OP, {}, DEVICE)]


def gate_compiles(monkeypatch, should_wait):
    """Makes each compilation for which `should_wait(kernel)` holds wait (up
    to 10 s) for the event returned, and records whether it came in time."""
    event, waited = threading.Event(), []
    real = compiler_mod.Compiler._compile

    def gated(self, kernel, arch):
        if should_wait(kernel):
            waited.append(event.wait(10))
        return real(self, kernel, arch)

    monkeypatch.setattr(compiler_mod.Compiler, "_compile", gated)
    return event, waited


# ---- overlap ----------------------------------------------------------------
def test_a_candidate_is_measured_while_the_rest_of_its_batch_compiles(tmp_path, monkeypatch):
    """With one compile thread, the second kernel's compilation waits for
    the first kernel's measurement: it comes only if measuring does not
    wait for the whole batch to compile."""
    m = csr_matrix(1)
    first = kernel_names(m)[0]
    event, waited = gate_compiles(monkeypatch, lambda k: k.name != first)
    worker = ReplayWorker(on_trial=lambda w, t: event.set())
    with Cache(tmp_path / "t.db") as cache:
        Tuner(cache, strategy="exhaustive", worker=worker, jobs=1).tune(m, "csr", {}, OP, [16], "l")
    assert waited and all(waited), "compilations waited for a measurement that never came"
    assert worker.trials[0] == first and len(worker.trials) == 8


def test_the_next_batch_compiles_while_this_one_is_measured(tmp_path, monkeypatch):
    """Batches of 4: the last measurement of the first batch waits (up to
    10 s) until a kernel of the second batch is compiling, which happens
    only if the strategy named the next batch before measuring."""
    monkeypatch.setattr(exhaustive.Exhaustive, "batch", 4)
    m = csr_matrix(2)
    second_batch = set(kernel_names(m)[4:])
    started = threading.Event()
    gate_compiles(monkeypatch, lambda k: started.set() if k.name in second_batch else False)
    saw = []

    def last_of_first_batch(w, t):
        if len(w.trials) == 3:
            saw.append(started.wait(10))

    worker = ReplayWorker(on_trial=last_of_first_batch)
    with Cache(tmp_path / "t.db") as cache:
        Tuner(cache, strategy="exhaustive", worker=worker, jobs=2).tune(m, "csr", {}, OP, [16], "l")
        assert len(cache.trials(op=OP_TAG, n=16)) == 8
    assert saw == [True], "the second batch did not compile during the first's measurement"


def test_kernels_built_for_one_n_serve_the_others(tmp_path, monkeypatch):
    m = csr_matrix(3)
    made = []
    fam = get_family("csr")
    real = fam.generate
    monkeypatch.setattr(fam, "generate", lambda *a, **k: made.append(1) or real(*a, **k))
    with Cache(tmp_path / "t.db") as cache:
        w = ReplayWorker()
        Tuner(cache, strategy="exhaustive", worker=w, jobs=2).tune(m, "csr", {}, OP,
                                                                  [16, 64, 256], "l")
        assert len(w.trials) == 3 * 8
    assert len(made) == 8            # generated once, measured for three buckets


def test_every_buckets_first_candidates_build_before_the_first_search(tmp_path, monkeypatch):
    """Each N bucket's search starts from the winners of earlier matrices:
    their kernels are asked for before the first bucket measures anything,
    so the compile threads work ahead of the searches."""
    from sparseforge.tuner import driver
    from sparseforge.tuner.strategies import config_key
    asked = []
    real = driver.Tuner.build
    monkeypatch.setattr(driver.Tuner, "build",
                        lambda self, job, cfg, speculative=False, ahead=False:
                        asked.append(config_key(cfg)) or real(self, job, cfg, speculative, ahead))

    class ByN(ReplayWorker):
        """N = 256 ranks the kernels the other way round: its winner differs."""
        def setup(self, s):
            super().setup(s)
            self.slow = set(names) - {names[-1]} if s.n == 256 else set()

    with Cache(tmp_path / "t.db") as cache:
        names = sorted(kernel_names(csr_matrix(1)), key=replay_ms)
        first = Tuner(cache, strategy="exhaustive", worker=ByN(), jobs=2).tune(
            csr_matrix(1), "csr", {}, OP, [16, 256], "a")
        winners = {n: config_key(first.per_n[n].config) for n in (16, 256)}
        assert winners[16] != winners[256]
        asked.clear()
        seen = []
        w = ByN(on_trial=lambda w, t: seen.append(list(asked)) if not seen else None)
        Tuner(cache, strategy="greedy", budget="2", worker=w, jobs=2).tune(
            csr_matrix(2), "csr", {}, OP, [16, 256], "b")
    assert seen and winners[16] in seen[0] and winners[256] in seen[0]


# ---- warm start --------------------------------------------------------------
def test_a_search_starts_from_the_winners_of_earlier_matrices_of_its_shape(tmp_path):
    a, b, other_shape = csr_matrix(4), csr_matrix(5), csr_matrix(6, shape=(64, 80))
    with Cache(tmp_path / "t.db") as cache:
        Tuner(cache, strategy="exhaustive", worker=ReplayWorker(), jobs=2).tune(
            a, "csr", {}, OP, [16], "a")
        winner = json.loads(cache.trials(op=OP_TAG, n=16)[0]["config"])
        w = ReplayWorker()
        t = Tuner(cache, strategy="greedy", budget="3", worker=w, jobs=1)
        res = t.tune(b, "csr", {}, OP, [16], "b")
        assert res.per_n[16].warm_hints == 1
        fam = get_family("csr")
        assert w.trials[0] == fam.generate(b, OP, {}, winner).name   # measured first
        # another shape, or another N, starts cold
        res = t.tune(other_shape, "csr", {}, OP, [16], "c")
        assert res.per_n[16].warm_hints == 0
        res = t.tune(b, "csr", {}, OP, [64], "b64")
        assert res.per_n[64].warm_hints == 0


def test_earlier_winners_come_most_frequent_first(tmp_path):
    """Three earlier matrices of the shape: two won with X, one with Y;
    a matrix of another shape won with Z (not offered)."""
    m = csr_matrix(7)
    x, y, z = ({"k": v} for v in (1, 2, 3))
    with Cache(tmp_path / "t.db") as cache:
        t = Tuner(cache, worker=ReplayWorker(), jobs=1)
        for fp, shape, best in (("f1", m.shape, y), ("f2", m.shape, x), ("f3", m.shape, x),
                                ("f4", (7, 7), z)):
            cache.put_matrix(fp, *shape, 1, "fp32")
            cache.put_trial(t.env_key, fp, OP_TAG, 16, json.dumps(best), "ok", median_ms=1.0)
            cache.put_trial(t.env_key, fp, OP_TAG, 16, json.dumps(z), "ok", median_ms=2.0)
        job = t.begin(m, "csr", {}, OP, "m")
        assert t.warm_hints(job, 16) == [x, y]
        assert t.warm_hints(job, 64) == []


def test_a_warm_search_gets_a_smaller_budget():
    t = Tuner.__new__(Tuner)
    t.budget_text, t.strategy = None, "auto"
    cold = t._search_plan(151, warm=False)
    warm = t._search_plan(151, warm=True)
    assert cold[0] == warm[0] == "greedy"
    assert cold[1].max_trials == 38 and warm[1].max_trials == 10
    assert t._search_plan(40, warm=True)[0] == "exhaustive"
    t.budget_text = "20"
    assert t._search_plan(151, warm=True)[1].max_trials == 20    # an asked budget is kept


# ---- early stop --------------------------------------------------------------
def test_timed_stops_after_the_probe_only_above_the_cutoff():
    calls = []

    def time_fn(ms):
        def f(**timing):
            calls.append(timing)
            reps = timing["max_reps"]
            return {"median_ms": ms, "p20_ms": ms, "p80_ms": ms, "min_ms": ms, "mean_ms": ms,
                    "reps": reps}
        return f

    timing = {"warmup": 3, "min_reps": 30, "max_reps": 1000, "min_total_ms": 100.0}
    slow = timed(time_fn(3.0), timing, 2.0)
    assert slow["stopped_early"] and slow["reps"] == PROBE_REPS and len(calls) == 1
    assert calls[0]["min_reps"] == calls[0]["max_reps"] == PROBE_REPS
    calls.clear()
    fast = timed(time_fn(1.0), timing, 2.0)
    assert not fast["stopped_early"] and fast["reps"] == 1000 and len(calls) == 2
    for cutoff in (None, math.inf, math.nan, 0.0):
        calls.clear()
        full = timed(time_fn(9.0), timing, cutoff)
        assert not full["stopped_early"] and len(calls) == 1 and calls[0] == timing


def test_a_clearly_slower_candidate_stops_early_and_says_so(tmp_path):
    m = csr_matrix(8)
    names = kernel_names(m)
    victim = names[-1]        # measured last (one compile thread): a best exists by then
    with Cache(tmp_path / "t.db") as cache:
        w = ReplayWorker(slow=[victim])
        res = Tuner(cache, strategy="exhaustive", worker=w, jobs=1).tune(m, "csr", {}, OP,
                                                                         [16], "l")
        trials = cache.trials(op=OP_TAG, n=16)
        assert len(trials) == 8 and all(t["status"] == "ok" for t in trials)   # never failed
        fam = get_family("csr")
        by_name = {fam.generate(m, OP, {}, json.loads(t["config"])).name: t for t in trials}
        slow = by_name[victim]
        assert slow["reps"] == PROBE_REPS and "stopped early" in slow["message"]
        assert "verified" in slow["message"]
        assert slow["median_ms"] == pytest.approx(100 * replay_ms(victim))
        assert w.cutoffs[0] is None and all(c is not None for c in w.cutoffs[1:])
        assert res.per_n[16].stopped_early >= 1
        best = min(trials, key=lambda t: t["median_ms"])
        assert best["reps"] == 30 and not best["message"]                # the winner ran in full
        assert res.per_n[16].median_ms == best["median_ms"]


def test_without_early_stop_every_candidate_is_timed_in_full(tmp_path):
    m = csr_matrix(8)
    victim = kernel_names(m)[-1]
    with Cache(tmp_path / "t.db") as cache:
        w = ReplayWorker(slow=[victim])
        Tuner(cache, strategy="exhaustive", worker=w, jobs=1, early_stop=None).tune(
            m, "csr", {}, OP, [16], "l")
        assert all(c is None for c in w.cutoffs)
        assert all(t["reps"] == 30 and not t["message"] for t in cache.trials(op=OP_TAG))


# ---- where the time goes ------------------------------------------------------
def test_the_tuner_keeps_per_phase_totals(tmp_path):
    m = csr_matrix(9)
    with Cache(tmp_path / "t.db") as cache:
        w = ReplayWorker()
        t = Tuner(cache, strategy="exhaustive", worker=w, jobs=2)
        res = t.tune(m, "csr", {}, OP, [16, 64], "l")
    d = t.phases.as_dict()
    trials = len(w.trials)
    assert d["verify"] == pytest.approx(trials * SPLIT["verify"])
    assert d["time"] == pytest.approx(trials * SPLIT["time"])
    assert d["load"] >= trials * SPLIT["load"]
    for phase in ("plan", "compile", "reference", "peer"):
        assert d[phase] > 0, phase
    fg = sum(d[p] for p in ("wait", "reference", "load", "verify", "time", "peer", "store", "turn",
                            "other"))
    assert fg == pytest.approx(d["wall"], rel=1e-6)
    line = t.phases.format(threads=2)
    assert line.startswith("time ") and "wait" in line and "background (2 threads)" in line
    assert res.seconds["verify"] == pytest.approx(d["verify"])


def test_phases_add_up_from_several_threads():
    p = Phases()
    threads = [threading.Thread(target=lambda: [p.add("compile", 0.001) for _ in range(1000)])
               for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert p.seconds["compile"] == pytest.approx(4.0)
    with pytest.raises(KeyError, match="unknown phase 'bogus'"):
        p.add("bogus", 1.0)
    line = p.format(wall=10.0, lanes=2, over="ranks")
    assert "(phases summed over 2 ranks)" in line and "other 20.0" in line
    p.add("load", 3.0)
    p.move(1.0, "turn", "load")             # a wait for the GPU inside a trial
    assert (p.seconds["load"], p.seconds["turn"]) == (2.0, 1.0)
    with pytest.raises(KeyError, match="unknown phase 'bogus'"):
        p.move(1.0, "turn", "bogus")


@pytest.mark.parametrize("dtype,layout", [("fp16", "fm"), ("bf16", "tm"), ("fp32", "fm"),
                                          ("fp32", "tm")])
def test_only_the_checked_columns_of_y_are_converted(dtype, layout):
    """The worker converts the checked columns alone: the same values as
    converting all of Y and then picking them."""
    from sparseforge.generator.matrix import from_device_bytes, round_to_dtype, to_device_bytes
    from sparseforge.tuner.worker import Setup, checked_output
    rows, n = 6, 10
    rng = np.random.default_rng(0)
    shape = (rows, n) if layout == "fm" else (n, rows)
    y = round_to_dtype(rng.standard_normal(shape).astype(np.float32), dtype)
    raw = to_device_bytes(y, dtype)
    for cols in (None, np.array([1, 4, 9])):
        s = Setup(dtype, layout, rows, n, b"", cols, np.zeros(1))
        full = from_device_bytes(raw, dtype, rows * n).reshape(shape)
        if cols is not None:
            full = full[:, cols] if layout == "fm" else full[cols, :]
        np.testing.assert_array_equal(checked_output(raw, s), full)
        if cols is not None:    # the checked block alone, as the worker gathers it
            np.testing.assert_array_equal(
                checked_output(to_device_bytes(full, dtype), s, gathered=True), full)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,layout", [("fp16", "fm"), ("fp32", "fm"), ("bf16", "tm")])
def test_the_worker_downloads_the_checked_columns_alone(dtype, layout):
    """On the GPU the worker gathers the checked columns (feature-major) or
    rows (token-major) of Y and downloads that block: equal to all of Y
    downloaded and then picked, NaN (unwritten) included."""
    from sparseforge.generator.matrix import round_to_dtype, to_device_bytes
    from sparseforge.tuner.worker import Setup, _State, checked_output
    rows, n = 1000, 3000
    rng = np.random.default_rng(1)
    shape = (rows, n) if layout == "fm" else (n, rows)
    y = round_to_dtype(rng.standard_normal(shape).astype(np.float32), dtype)
    y[7, 11] = np.nan
    cols = np.sort(rng.choice(n, size=32, replace=False))
    cols[0] = 11 if layout == "fm" else 7
    cols[-1] = n - 1
    state = _State(0)
    state.do_setup(Setup(dtype, layout, rows, n, b"\0" * 16, np.sort(cols), np.zeros(1)))
    state.ctx.copy_to(state.y, to_device_bytes(y, dtype))
    raw, gathered = state.download_checked()
    assert gathered and len(raw) == rows * 32 * (4 if dtype == "fp32" else 2)
    got = checked_output(raw, state.setup, gathered)
    want = checked_output(state.ctx.download(state.y), state.setup)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got).sum() == 1


def test_speculative_builds_wait_behind_those_a_search_waits_for(monkeypatch):
    """The compile threads take what a search waits for first, then what
    it may need (speculative), then what a later layer will (ahead), each
    in the order asked; asking again at a higher priority moves a queued
    kernel ahead; closing cancels what is still queued."""
    from sparseforge.tuner.compiler import Compiler
    c = Compiler(cache=None, jobs=1)
    order, gate = [], threading.Event()

    def build(make, arch):
        name = make()
        if name == "busy":
            assert gate.wait(10)
        order.append(name)
        return name
    monkeypatch.setattr(c, "_build", build)
    busy = c.submit(lambda: "busy", "sm_80")           # holds the one thread
    s1 = c.submit(lambda: "s1", "sm_80", speculative=True)
    s2 = c.submit(lambda: "s2", "sm_80", speculative=True)
    urgent = c.submit(lambda: "urgent", "sm_80")
    a1 = c.submit(lambda: "a1", "sm_80", ahead=True)
    a2 = c.submit(lambda: "a2", "sm_80", ahead=True)
    s3 = c.submit(lambda: "s3", "sm_80", speculative=True)
    c.promote(s2)
    c.promote(a2, speculative=True)     # a search may need it now: among the speculative
    gate.set()
    assert [f.result(10) for f in (busy, urgent, s2, s1, a1, a2, s3)] == [
        "busy", "urgent", "s2", "s1", "a1", "a2", "s3"]
    assert order == ["busy", "urgent", "s2", "s1", "s3", "a2", "a1"]
    gate.clear()
    busy = c.submit(lambda: "busy", "sm_80")
    queued = c.submit(lambda: "queued", "sm_80", speculative=True)
    for _ in range(1000):
        if busy.running():
            break
        time.sleep(0.01)
    c.close(kill=True)
    gate.set()
    assert queued.cancelled() and busy.result(10) == "busy"
    assert "queued" not in order


def test_compiling_processes_give_the_threads_cubins(tmp_path):
    """With more compile jobs than PROCESSES_ABOVE, NVRTC runs in a pool of
    processes: a cubin of each kernel, the same error where NVRTC refuses
    a kernel, the same records in the cache as compiling in the threads."""
    from dataclasses import replace
    from sparseforge.tuner.compiler import PROCESSES_ABOVE, Compiler
    fam = get_family("csr")
    m = csr_matrix(3)
    kernels = [fam.generate(m, OP, {}, c) for c in fam.search_space(m, OP, {}, DEVICE)[:3]]
    kernels.append(replace(kernels[0], source=kernels[0].source + "\nint broken(;\n"))
    out = {}
    for procs in (True, False):
        with Cache(tmp_path / f"{procs}.db") as cache:
            c = Compiler(cache, 2, processes=procs)
            try:
                out[procs] = c.compile_all(kernels, "sm_80")
                assert (c._procs is not None) == procs and c.compiled == 3
            finally:
                c.close()
    # the same records and a cubin of each kernel (the bytes are not compared:
    # a fresh process's and its threads' agree byte for byte, but inside the
    # whole suite's process, whose library an earlier test set up otherwise,
    # they differed)
    for k, a, b in zip(kernels, out[True], out[False]):
        assert a.hexkey == b.hexkey
        if a.data is not None:
            assert a.data[:4] == b.data[:4] == b"\x7fELF" and k.name.encode() in a.data
    assert all(b.data for b in out[True][:3]) and out[True][3].data is None
    assert "broken" in out[True][3].error and out[True][3].error == out[False][3].error
    assert Compiler(None, PROCESSES_ABOVE + 1).processes and not Compiler(None, PROCESSES_ABOVE).processes


def test_a_kernel_named_speculatively_moves_ahead_once_measured(tmp_path, monkeypatch):
    """A configuration the strategy named speculatively and then measures
    without naming it again is moved ahead of the speculative work: the
    search waits for it now."""
    from sparseforge.tuner.driver import _Search
    from sparseforge.tuner.strategies import Budget, config_key
    m = csr_matrix(7)
    with Cache(tmp_path / "t.db") as cache:
        t = Tuner(cache, strategy="greedy", worker=ReplayWorker(), jobs=1)
        try:
            promoted = []
            real = t.compiler.promote
            monkeypatch.setattr(t.compiler, "promote", lambda f, **kw: promoted.append(f) or real(f, **kw))
            job = t.begin(m, "csr", {}, OP, "a")
            search = _Search(t, job, 16, Budget(max_trials=2))
            cfg = job.space[0]
            search.prefetch([cfg], speculative=True)
            fut = search.pending[config_key(cfg)]
            assert math.isfinite(search([cfg])[0])
            assert promoted == [fut]
        finally:
            t.close()


# ---- looking ahead at the next layer -------------------------------------------
def test_the_next_cold_layer_builds_ahead_and_its_tune_takes_the_job_over(tmp_path, monkeypatch):
    """While one layer is tuned, the first candidates of the next layer
    that starts cold (not a copy, not the same shape as an earlier layer)
    are queued `ahead`; its tune takes that job over (its kernels built
    once) and finds what a tune without looking ahead finds."""
    from sparseforge.tuner import driver
    from sparseforge.tuner.model import cold_entries, plan_model, tune_entries
    asked = []
    real = driver.Tuner.build
    monkeypatch.setattr(driver.Tuner, "build",
                        lambda self, job, cfg, speculative=False, ahead=False:
                        asked.append((job.name, ahead)) or real(self, job, cfg, speculative,
                                                                ahead))
    mats = [("a", csr_matrix(1)), ("b", csr_matrix(2)), ("c", csr_matrix(3, shape=(64, 80))),
            ("d", csr_matrix(1))]
    entries = plan_model(mats, pattern="csr")
    assert cold_entries(entries) == [0, 2]   # b: a's shape; d: a's matrix
    seen = {}

    def on_trial(w, t):
        seen.setdefault(len(w.trials), list(asked))
    with Cache(tmp_path / "t.db") as cache:
        t = Tuner(cache, strategy="exhaustive", worker=ReplayWorker(on_trial=on_trial), jobs=2)
        rows = tune_entries(entries, t, [16])
        t.close()
    assert ("c", True) in seen[0]            # before a's first trial
    assert not any(ahead for name, ahead in asked if name != "c")
    assert not t._ahead
    with Cache(tmp_path / "u.db") as cache:
        alone = Tuner(cache, strategy="exhaustive", worker=ReplayWorker(), jobs=2).tune(
            csr_matrix(3, shape=(64, 80)), "csr", {}, OP, [16], "c")
    by_name = {r.name: r.result for r in rows}
    assert by_name["c"].per_n[16].config == alone.per_n[16].config
    assert by_name["c"].per_n[16].trials == alone.per_n[16].trials == 8


def test_the_inputs_of_a_layers_buckets_are_made_ahead(tmp_path, monkeypatch):
    """Each bucket's X and reference are made in a thread of their own as
    its layer starts, one per bucket, and each is used once."""
    from sparseforge.tuner import driver
    made = []
    real = driver.Tuner._make_inputs
    monkeypatch.setattr(driver.Tuner, "_make_inputs", lambda self, m, op, n, bias: (
        made.append((n, threading.current_thread().name)) or real(self, m, op, n, bias)))
    with Cache(tmp_path / "t.db") as cache:
        w = ReplayWorker()
        t = Tuner(cache, strategy="exhaustive", worker=w, jobs=2)
        t.tune(csr_matrix(1), "csr", {}, OP, [16, 64, 256], "a")
        t.close()
    assert sorted(n for n, _ in made) == [16, 64, 256] and w.setups == 3
    assert all(name.startswith("sf-inputs") for _, name in made)
    assert not t._inputs


def test_while_a_batch_compiles_a_built_speculative_candidate_is_measured(tmp_path, monkeypatch):
    """The GPU does not idle while the candidate a search waits for
    compiles: a speculative candidate already built is measured (recorded
    like any trial), and when the search asks for it later it is not
    measured again."""
    from sparseforge.tuner.driver import _Search
    from sparseforge.tuner.strategies import Budget, config_key
    m = csr_matrix(7)
    fam = get_family("csr")
    with Cache(tmp_path / "t.db") as cache:
        space = fam.search_space(m, OP, {}, DEVICE)
        a, b = space[0], space[1]
        name_a, name_b = (fam.generate(m, OP, {}, c).name for c in (a, b))
        event, waited = gate_compiles(monkeypatch, lambda k: k.name == name_a)
        w = ReplayWorker(on_trial=lambda w, tr: event.set() if tr.name == name_b else None)
        t = Tuner(cache, strategy="greedy", worker=w, jobs=2)
        try:
            job = t.begin(m, "csr", {}, OP, "a")
            search = _Search(t, job, 16, Budget(max_trials=4))
            search.prefetch([b], speculative=True)
            search.pending[config_key(b)].result(60)         # built, not yet measured
            assert math.isfinite(search([a])[0])
            assert w.trials == [name_b, name_a] and waited == [True] and search.filled == 1
            value_b = search([b])[0]
            assert w.trials == [name_b, name_a]                # served from the fill
            assert value_b == replay_ms(name_b)
            assert len(cache.trials(op=OP_TAG, n=16)) == 2
        finally:
            t.close()


def test_a_search_measures_ahead_no_more_than_its_budget(tmp_path, monkeypatch):
    """What is measured ahead and not yet asked for counts against the
    budget: with room for only the batch, nothing is measured ahead; with
    room for one more, the built speculative candidate is."""
    from sparseforge.tuner.driver import _Search
    from sparseforge.tuner.strategies import Budget, config_key
    m = csr_matrix(8)
    fam = get_family("csr")
    space = fam.search_space(m, OP, {}, DEVICE)
    names = [fam.generate(m, OP, {}, c).name for c in space[:4]]
    event, waited = gate_compiles(monkeypatch, lambda k: k.name in (names[0], names[2]))
    with Cache(tmp_path / "t.db") as cache:
        w = ReplayWorker()
        t = Tuner(cache, strategy="greedy", worker=w, jobs=2)
        try:
            job = t.begin(m, "csr", {}, OP, "a")
            for cap, waited_for, ahead in ((1, space[0], space[1]), (2, space[2], space[3])):
                search = _Search(t, job, 16 * cap, Budget(max_trials=cap))
                search.prefetch([ahead], speculative=True)
                search.pending[config_key(ahead)].result(60)
                event.clear()
                threading.Timer(1.0, event.set).start()
                search([waited_for])
                assert search.filled == cap - 1, cap
            assert w.trials == [names[0], names[3], names[2]]
        finally:
            t.close()
