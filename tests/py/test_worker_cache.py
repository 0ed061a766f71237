"""The measurement worker keeps packed weights on the GPU between trials
and the tuner sends them only where the worker lacks them, held without a
GPU: the worker's state runs on a fake context that records what it
uploads, allocates and frees, and the tuner's handle talks to a fake
process that holds packed keys as the real one does."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sparseforge.tuner import worker as worker_mod
from sparseforge.tuner.worker import Setup, Trial, Worker, _State, packed_digest

ROWS, N = 4, 8          # Y: 32 fp32 values, 128 bytes
Y_BYTES = ROWS * N * 4


class FakeBuf:
    def __init__(self, ctx, nbytes: int, data: bytes = b""):
        self.ctx, self.nbytes, self.data, self.freed = ctx, nbytes, data, False

    def free(self):
        assert not self.freed, "freed twice"
        self.freed = True
        self.ctx.frees.append(self)


class FakeCtx:
    """Records uploads, allocations, frees and memsets; every kernel "writes"
    `output` (zeros match a zero reference; 0xFF is NaN: a wrong kernel)."""

    def __init__(self):
        self.uploads, self.allocs, self.frees, self.memsets = [], [], [], []
        self.timed_sets = []
        self.output = b"\0"
        self.raise_on_launch = None

    def load(self, binary):
        ctx = self

        class Module:
            def kernel(self, name):
                return type("Fn", (), {"attributes": lambda _: {"regs": 32}})()

            def unload(self):
                ctx.unloads = getattr(ctx, "unloads", 0) + 1
        return Module()

    def upload(self, data):
        assert len(data) > 0
        b = FakeBuf(self, len(data), bytes(data))
        self.uploads.append(b)
        return b

    def alloc(self, nbytes):
        b = FakeBuf(self, nbytes)
        self.allocs.append(b)
        return b

    def memset(self, buf, value, nbytes=None):
        assert not buf.freed
        self.memsets.append((buf, value))

    def kernel_args(self, fn, packed, x, y, n):
        for b in (packed, x, y):
            assert not b.freed, "a freed buffer in a launch"
        return (packed, x, y)

    def launch(self, fn, grid, block, args, shared=0):
        if self.raise_on_launch is not None:
            raise self.raise_on_launch

    def synchronize(self):
        pass

    def download(self, buf, nbytes):
        return self.output * nbytes

    def time_sets(self, fn, grid, block, sets, shared=0, **timing):
        self.timed_sets.append(list(sets))
        return {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0, "min_ms": 1.0,
                "mean_ms": 1.0, "reps": 30}

    def uploads_of(self, data: bytes) -> int:
        return sum(1 for b in self.uploads if b.data == data)


def setup(x: bytes = b"\1" * 64, rotate_bytes: int = 0) -> Setup:
    timing = {"rotate_bytes": rotate_bytes} if rotate_bytes else {}
    return Setup("fp32", "fm", ROWS, N, x, None, np.zeros((ROWS, N)), timing)


def trial(packed, name="k", zero_output=False, key=None) -> Trial:
    return Trial(name, b"cubin", False, (1, 1, 1), (32, 1, 1), 0, packed, zero_output,
                 packed_key=key if key is not None else packed_digest(packed))


@pytest.fixture
def state():
    st = _State(ctx=FakeCtx())
    st.do_setup(setup())
    return st


def test_a_second_trial_with_the_same_packed_does_not_upload_it(state):
    packed = b"\7" * 1000
    assert state.do_trial(trial(packed))[0] == "ok"
    status, info = state.do_trial(replace(trial(packed, name="k2"), packed=None))
    assert status == "ok" and "median_ms" in info
    assert state.ctx.uploads_of(packed) == 1
    assert not any(b.freed for b in state.packed[packed_digest(packed)].bufs)
    # the bytes sent again (a tuner that did not know) are not uploaded again
    assert state.do_trial(trial(packed, name="k3"))[0] == "ok"
    assert state.ctx.uploads_of(packed) == 1


def test_an_unknown_key_without_bytes_asks_for_them(state):
    packed = b"\3" * 100
    t = replace(trial(packed), packed=None)
    assert state.do_trial(t) == ("need_packed", packed_digest(packed))
    assert state.ctx.uploads_of(packed) == 0 and not state.packed


def test_empty_packed_uploads_sixteen_zero_bytes_once(state):
    for name in ("a", "b"):
        assert state.do_trial(trial(b"", name=name))[0] == "ok"
    assert state.ctx.uploads_of(b"\0" * 16) == 1
    assert state.packed[packed_digest(b"")].size == 0


def test_rotation_copies_are_made_once_per_setup():
    ctx = FakeCtx()
    st = _State(ctx=ctx)
    x = b"\1" * 64
    packed = b"\5" * 64
    # per set: 64 (packed) + 64 (X) + 128 (Y) = 256 bytes; 1024 bytes: 4 sets
    st.do_setup(setup(x, rotate_bytes=1024))
    for name in ("a", "b", "c"):
        assert st.do_trial(trial(packed, name=name, zero_output=True))[0] == "ok"
    assert ctx.uploads_of(x) == 1 + 3          # X and its 3 copies, once
    assert ctx.uploads_of(packed) == 4         # packed and its 3 copies, once
    assert len(ctx.allocs) == 1 + 3            # Y and its 3 copies
    assert [len(s) for s in ctx.timed_sets] == [4, 4, 4]
    # each set names its own copies
    assert len({id(b) for s in ctx.timed_sets[0] for b in s}) == 12
    # the Y copies are zeroed before each zero-output trial's timing
    y_copies = set(map(id, st.y_copies))
    zeroed = [b for b, v in ctx.memsets if id(b) in y_copies and v == 0]
    assert len(zeroed) == 3 * 3
    # a non-zero-output kernel needs no zeroed copies
    before = len(ctx.memsets)
    assert st.do_trial(trial(packed, name="d"))[0] == "ok"
    assert [v for _, v in ctx.memsets[before:]] == [0xFF]   # Y poisoned for the check

    # a new setup frees X, Y and their copies; a smaller X makes more sets
    old = [st.x, st.y, *st.x_copies, *st.y_copies]
    x2 = b"\2" * 32
    st.do_setup(setup(x2, rotate_bytes=1024))
    assert all(b.freed for b in old)
    assert not st.x_copies and not st.y_copies
    # 64 + 32 + 128 = 224 bytes per set: 5 sets; the packed copies held are
    # 4, so a trial without the bytes asks for them
    key = packed_digest(packed)
    assert st.do_trial(replace(trial(packed), packed=None)) == ("need_packed", key)
    assert st.do_trial(trial(packed, name="e"))[0] == "ok"
    assert ctx.uploads_of(packed) == 5 and ctx.uploads_of(x2) == 1 + 4
    assert len(ctx.timed_sets[-1]) == 5


def test_the_byte_bound_evicts_the_least_recently_used(state, monkeypatch):
    monkeypatch.setattr(worker_mod, "PACKED_CACHE_BYTES", 2500)
    a, b, c = b"\1" * 1000, b"\2" * 1000, b"\3" * 1000
    state.do_trial(trial(a))
    state.do_trial(trial(b))
    buf_a = state.packed[packed_digest(a)].bufs[0]
    buf_b = state.packed[packed_digest(b)].bufs[0]
    state.do_trial(replace(trial(a), packed=None))    # a is now the more recent
    state.do_trial(trial(c))                          # 3000 > 2500: b goes
    assert buf_b.freed and not buf_a.freed
    assert list(state.packed) == [packed_digest(a), packed_digest(c)]
    assert state.do_trial(replace(trial(b), packed=None)) == ("need_packed", packed_digest(b))


def test_a_buffer_above_the_bound_is_used_but_not_kept(state, monkeypatch):
    monkeypatch.setattr(worker_mod, "PACKED_CACHE_BYTES", 2500)
    small, big = b"\1" * 1000, b"\2" * 3000
    state.do_trial(trial(small))
    assert state.do_trial(trial(big))[0] == "ok"
    big_buf = next(u for u in state.ctx.uploads if u.data == big)
    assert big_buf.freed
    assert list(state.packed) == [packed_digest(small)]   # not evicted for it
    assert not state.packed[packed_digest(small)].bufs[0].freed


def test_a_wrong_trial_drops_its_packed_buffer(state):
    packed = b"\4" * 100
    key = packed_digest(packed)
    assert state.do_trial(trial(packed))[0] == "ok"
    buf = state.packed[key].bufs[0]
    state.ctx.output = b"\xff"          # NaN: the kernel is wrong
    status, info = state.do_trial(trial(packed, name="bad"))
    assert status == "wrong" and info["unwritten"] == ROWS * N
    assert buf.freed and key not in state.packed
    state.ctx.output = b"\0"
    assert state.do_trial(replace(trial(packed), packed=None)) == ("need_packed", key)
    assert state.do_trial(trial(packed))[0] == "ok"
    assert state.ctx.uploads_of(packed) == 2


def test_a_trial_that_raises_drops_its_packed_buffer(state):
    packed = b"\6" * 100
    key = packed_digest(packed)
    state.do_trial(trial(packed))
    buf = state.packed[key].bufs[0]
    state.ctx.raise_on_launch = RuntimeError("too many resources requested")
    with pytest.raises(RuntimeError):
        state.do_trial(trial(packed, name="bad"))
    assert buf.freed and key not in state.packed
    assert state.ctx.unloads == 2


# ---- the tuner's side ---------------------------------------------------------

class FakeProcess:
    """Stands in for Worker._call: holds packed keys as a worker process does
    (bytes needed where it lacks the key), records what crossed the pipe,
    and can be restarted (forgetting everything), or fail a trial."""

    def __init__(self, w: Worker):
        self.w, self.held, self.sent = w, set(), []
        self.wrong_next = False
        self.restart_next = False

    def __call__(self, kind, payload, timeout=None):
        assert kind == "trial"
        if self.restart_next:           # the process had died: _call starts a fresh one
            self.restart_next = False
            self.w._kill()
            self.held = set()
        t = payload
        self.sent.append(t.packed)
        if t.packed is None and t.packed_key not in self.held:
            return "need_packed", t.packed_key
        if t.packed is not None:
            assert t.packed_key == packed_digest(t.packed)
        if self.wrong_next:
            self.wrong_next = False
            self.held.discard(t.packed_key)
            return "wrong", {"ok": False}
        self.held.add(t.packed_key)
        return "ok", {"median_ms": 1.0, "name": t.name}


@pytest.fixture
def worker(monkeypatch):
    w = Worker()
    proc = FakeProcess(w)
    monkeypatch.setattr(w, "_call", proc)
    return w, proc


def test_the_tuner_sends_packed_bytes_only_when_needed(worker):
    w, proc = worker
    packed = b"\1" * 5000
    t = Trial("k", b"cubin", False, (1, 1, 1), (32, 1, 1), 0, packed, False)
    assert w.trial(t) == ("ok", {"median_ms": 1.0, "name": "k"})
    assert w.trial(replace(t, name="k2"))[0] == "ok"
    assert w.trial(replace(t, name="k3"))[0] == "ok"
    assert proc.sent == [packed, None, None]
    assert t.packed is packed and t.packed_key is None   # the caller's Trial is untouched

    # the worker evicted it: one round trip more, and the caller sees "ok"
    proc.held.clear()
    assert w.trial(replace(t, name="k4")) == ("ok", {"median_ms": 1.0, "name": "k4"})
    assert proc.sent[3:] == [None, packed]

    # a restarted process holds nothing: the bytes go again, once
    proc.restart_next = True
    assert w.trial(replace(t, name="k5"))[0] == "ok"
    assert proc.sent[5:] == [None, packed]
    assert w.trial(replace(t, name="k6"))[0] == "ok"
    assert proc.sent[7:] == [None]

    # a wrong trial drops the key there, so the next one sends the bytes
    proc.wrong_next = True
    assert w.trial(replace(t, name="bad")) == ("wrong", {"ok": False})
    assert w.trial(replace(t, name="k7"))[0] == "ok"
    assert proc.sent[8:] == [None, packed]
    assert [s for s in proc.sent if s is not None] == [packed] * 4


def test_a_killed_process_resets_what_the_tuner_knows(worker):
    w, proc = worker
    packed = b"\2" * 100
    t = Trial("k", b"cubin", False, (1, 1, 1), (32, 1, 1), 0, packed, False)
    w.trial(t)
    w._kill()                           # a timeout kills the process
    proc.held = set()
    assert w.trial(t)[0] == "ok"
    assert proc.sent == [packed, packed]


def test_the_digest_is_computed_once_per_packed_object(worker, monkeypatch):
    w, proc = worker
    calls = []
    real = worker_mod.packed_digest
    monkeypatch.setattr(worker_mod, "packed_digest", lambda d: calls.append(len(d)) or real(d))
    buffers = [bytes([i]) * 100 for i in range(worker_mod.DIGEST_MEMO + 1)]
    base = Trial("k", b"cubin", False, (1, 1, 1), (32, 1, 1), 0, b"", False)
    for _ in range(3):
        w.trial(replace(base, packed=buffers[0]))
    assert len(calls) == 1
    # an equal but distinct object is digested again, and sent without bytes
    w.trial(replace(base, packed=buffers[0][:50] + buffers[0][50:]))
    assert len(calls) == 2 and proc.sent[-1] is None
    for b in buffers[1:]:               # the oldest drops out of the memo
        w.trial(replace(base, packed=b))
    n = len(calls)
    w.trial(replace(base, packed=buffers[0]))
    assert len(calls) == n + 1
    assert len(w._digests) == worker_mod.DIGEST_MEMO


def test_a_started_process_holds_no_packed_keys():
    """A fresh process (here one that never touches the GPU: it is asked
    for nothing) starts with no keys known."""
    w = Worker()
    w._held = {"stale"}
    try:
        w._start()
        assert w._held == set() and w._proc.is_alive()
    finally:
        w.close()
    assert w._proc is None and w._held == set()
