"""The measurement worker: a separate process that owns the GPU context.

A candidate kernel that faults (illegal address, a hang) poisons or kills
the CUDA context of the process that ran it.  So the tuner never runs
candidates itself: it sends them to this worker over a pipe.  After a
fault the worker exits; after a hang the tuner kills it; either way the
trial is recorded as failed and a fresh worker is started, set up again
with the same inputs, and the search goes on.

Each worker owns one GPU, by ordinal (one worker per GPU where a run
uses several).

Every trial is verified before it is timed.  A trial may carry a cutoff:
after a short probe (PROBE_REPS repetitions) whose 20th percentile
exceeds it, the candidate is clearly slower than the best so far and its
timing stops there; it is still an "ok" trial, with the probe's times and
`stopped_early` set (see `timed`).

Protocol (pickled tuples over a multiprocessing Pipe):
  ("setup", Setup)  -> ("ok", None)
  ("trial", Trial)  -> ("ok", {timing..., errors..., phases}) | ("wrong", {...})
                       | ("launch_fail", message)
  ("peer", PeerJob) -> ("ok", {timing...}) | ("error", message)
  ("info", None)    -> ("ok", device_info dict)
  ("exit", None)
"""
from __future__ import annotations

import math
import multiprocessing as mp
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

# Repetitions of the probe that decides an early stop.
PROBE_REPS = 5


@dataclass
class Setup:
    dtype: str
    layout: str
    rows: int
    n: int
    x: bytes                       # X in device bytes
    check_columns: Optional[np.ndarray]  # columns of Y (indices into N) checked; None = all
    reference: np.ndarray          # float64 reference on those columns (orientation of Y)
    timing: dict = field(default_factory=dict)


@dataclass
class Trial:
    name: str
    binary: bytes
    ptx: bool
    grid: tuple
    block: tuple
    shared_bytes: int
    packed: bytes
    zero_output: bool
    cutoff_ms: Optional[float] = None   # stop timing early above this (see timed)


@dataclass
class PeerJob:
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    timing: dict = field(default_factory=dict)


def _elem(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def timed(time_fn: Callable[..., dict], timing: dict, cutoff_ms: Optional[float]) -> dict:
    """The timing of one verified candidate: `time_fn(**timing)` (the
    context's timer), unless a probe of PROBE_REPS repetitions shows it
    clearly slower than the best so far (its p20 above `cutoff_ms`): then
    the probe's times, with stopped_early and cutoff_ms.  No cutoff (None,
    or not a positive finite number): the full timing alone."""
    if cutoff_ms is not None and math.isfinite(cutoff_ms) and cutoff_ms > 0:
        probe = time_fn(**dict(timing, min_reps=PROBE_REPS, max_reps=PROBE_REPS,
                               min_total_ms=0.0))
        if probe["p20_ms"] > cutoff_ms:
            return {**probe, "stopped_early": True, "cutoff_ms": cutoff_ms}
    return {**time_fn(**timing), "stopped_early": False}


def checked_output(raw: bytes, s: Setup) -> np.ndarray:
    """The part of Y (device bytes, as downloaded) that the reference
    covers, as float32 in Y's orientation: the check columns alone are
    converted (all of Y where every column is checked)."""
    from ..generator.matrix import from_device_bytes
    shape = (s.rows, s.n) if s.layout == "fm" else (s.n, s.rows)
    raw_y = np.frombuffer(raw, dtype=np.uint32 if _elem(s.dtype) == 4 else np.uint16,
                          count=s.rows * s.n).reshape(shape)
    if s.check_columns is not None:
        raw_y = raw_y[:, s.check_columns] if s.layout == "fm" else raw_y[s.check_columns, :]
    return from_device_bytes(np.ascontiguousarray(raw_y).tobytes(), s.dtype,
                             raw_y.size).reshape(raw_y.shape)


class _State:
    def __init__(self, device: int = 0):
        from .. import native
        self.native = native
        self.ctx = native.Context(device)
        self.setup: Optional[Setup] = None
        self.x = None
        self.y = None

    def do_setup(self, s: Setup):
        for b in (self.x, self.y):
            if b is not None:
                b.free()
        self.setup = s
        self.x = self.ctx.upload(s.x)
        self.y = self.ctx.alloc(max(1, s.rows * s.n * _elem(s.dtype)))

    def do_trial(self, t: Trial):
        from .execute import POISON, compare
        s = self.setup
        t0 = time.perf_counter()
        binary = self.native.Binary.from_bytes(t.binary, ptx=t.ptx)
        module = self.ctx.load(binary)
        fn = module.kernel(t.name)
        attrs = fn.attributes()
        packed = self.ctx.upload(t.packed if t.packed else b"\0" * 16)
        t1 = time.perf_counter()
        try:
            nbytes = s.rows * s.n * _elem(s.dtype)
            self.ctx.memset(self.y, 0 if t.zero_output else POISON)
            args = self.ctx.kernel_args(fn, packed, self.x, self.y, s.n)
            self.ctx.launch(fn, t.grid, t.block, args, shared=t.shared_bytes)
            self.ctx.synchronize()
            y = checked_output(self.ctx.download(self.y, nbytes), s)
            err = compare(y, s.reference, s.dtype)
            t2 = time.perf_counter()
            if not err["ok"]:
                return "wrong", {**err, "attrs": attrs,
                                 "phases": {"load": t1 - t0, "verify": t2 - t1}}

            copies = self._rotation(t, packed, nbytes)
            sets = [args] + [self.ctx.kernel_args(fn, p, x, y, s.n) for p, x, y in copies]

            def time_fn(**timing):
                timing = {k: v for k, v in timing.items() if k != "rotate_bytes"}
                return self.ctx.time_sets(fn, t.grid, t.block, sets, shared=t.shared_bytes,
                                          **timing)
            try:
                timing = timed(time_fn, s.timing, t.cutoff_ms)
            finally:
                for c in copies:
                    for b in c:
                        b.free()
            phases = {"load": t1 - t0, "verify": t2 - t1, "time": time.perf_counter() - t2}
            return "ok", {**timing, **err, "attrs": attrs, "phases": phases}
        finally:
            for release in (packed.free, module.unload):
                try:
                    release()
                except Exception:  # noqa: BLE001 - a dead context fails here too
                    pass

    def _rotation(self, t: Trial, packed, y_bytes: int) -> list:
        """Copies (packed, X, Y) beyond the first set, so that all sets hold
        the setup's rotate_bytes (tuner/driver.py timing_for); none without
        rotation.  A zero-output kernel's copies of Y are zeroed (the
        timing's launches do not clear it)."""
        s = self.setup
        want = int(s.timing.get("rotate_bytes", 0) or 0)
        per_set = len(t.packed) + len(s.x) + y_bytes
        n_sets = min(64, -(-want // per_set)) if want > 0 else 1
        copies = []
        for _ in range(n_sets - 1):
            y = self.ctx.alloc(max(1, y_bytes))
            self.ctx.memset(y, 0)
            copies.append((self.ctx.upload(t.packed if t.packed else b"\0" * 16),
                           self.ctx.upload(s.x), y))
        return copies

    def do_peer(self, p: PeerJob):
        return "ok", self.ctx.time_gemm(p.dtype, p.m, p.n, p.k, layout="best", **p.timing)


def _serve(conn, device: int = 0):
    state = None
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:
            return
        if kind == "exit":
            return
        try:
            if state is None:
                state = _State(device)
            if kind == "info":
                conn.send(("ok", state.ctx.device_info()))
            elif kind == "setup":
                state.do_setup(payload)
                conn.send(("ok", None))
            elif kind == "trial":
                conn.send(state.do_trial(payload))
            elif kind == "peer":
                conn.send(state.do_peer(payload))
            else:
                conn.send(("error", f"unknown request {kind!r}"))
        except Exception as e:  # noqa: BLE001 - every failure is a reply
            msg = f"{type(e).__name__}: {e}"
            status = "launch_fail" if kind == "trial" else "error"
            dead = kind == "trial" and _context_dead(e)
            try:
                # the third element tells the tuner this worker is ending
                conn.send((status, msg, True) if dead else (status, msg))
            except Exception:
                pass
            if dead:
                return  # the CUDA context is gone: the tuner starts a new worker
            if kind not in ("trial", "peer"):
                traceback.print_exc()


def _context_dead(e: Exception) -> bool:
    """Whether the library said the context is gone (SF_ERR_FAULT: a kernel
    faulted; every later call on it would fail)."""
    from .._lib import STATUS
    return getattr(e, "status", None) == STATUS["SF_ERR_FAULT"]


class Worker:
    """The tuner's handle on a worker process for GPU `device` (an ordinal);
    restarts it after a fault."""

    def __init__(self, timeout_s: float = 60.0, device: int = 0):
        self.timeout_s = timeout_s
        self.device = device
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._setup: Optional[Setup] = None
        self.restarts = 0

    def _start(self):
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.device), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if self._setup is not None:
            self._call("setup", self._setup)

    def _kill(self):
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def _call(self, kind: str, payload: Any, timeout: Optional[float] = None):
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
            self._proc = None
            self._start()
        try:
            self._conn.send((kind, payload))
            if not self._conn.poll(timeout or self.timeout_s):
                self._kill()
                self.restarts += 1
                return "timeout", f"no answer from the worker within {timeout or self.timeout_s:.0f} s"
            reply = self._conn.recv()
        except (EOFError, OSError):
            self._kill()
            self.restarts += 1
            return "launch_fail", "the worker process died"
        if len(reply) == 3:  # the worker's context is gone and it is exiting
            self._proc.join(10)
            self._kill()
            self.restarts += 1
            reply = reply[:2]
        return reply

    def info(self) -> dict:
        status, val = self._call("info", None)
        if status != "ok":
            raise RuntimeError(val)
        return val

    def setup(self, s: Setup):
        self._setup = s
        status, val = self._call("setup", s)
        if status != "ok":
            raise RuntimeError(f"worker setup failed: {val}")

    def trial(self, t: Trial):
        return self._call("trial", t)

    def peer(self, p: PeerJob):
        return self._call("peer", p)

    def close(self, kill: bool = False):
        """Asks the worker to exit (waits up to 5 s), or with `kill` ends it
        at once (an interrupt must not wait for a kernel being timed)."""
        if not kill and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("exit", None))
                self._proc.join(5)
            except Exception:
                pass
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
