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

A layer's packed weights (tens of MB) are shared by many configurations,
so they cross the pipe once: a Trial names them by `packed_key` (a digest
of the bytes) and carries the bytes only where the tuner does not know
the worker to hold them.  The worker keeps them on the GPU, least
recently used dropped beyond PACKED_CACHE_BYTES, and asks for them again
("need_packed") where it lacks them (evicted, or a fresh worker); `Worker`
resends the trial with the bytes, so its callers never see that reply.
A trial that fails its check or raises drops its packed copies (a faulty
kernel may have written over them).

Protocol (pickled tuples over a multiprocessing Pipe):
  ("setup", Setup)  -> ("ok", None)
  ("trial", Trial)  -> ("ok", {timing..., errors..., phases}) | ("wrong", {...})
                       | ("launch_fail", message)
                       | ("need_packed", packed_key): packed is None and the
                         worker lacks those bytes (or more copies of them)
  ("peer", PeerJob) -> ("ok", {timing...}) | ("error", message)
  ("info", None)    -> ("ok", device_info dict)
  ("exit", None)
"""
from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import time
import traceback
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np

# Repetitions of the probe that decides an early stop.
PROBE_REPS = 5
# Device bytes of packed weights (all copies) the worker keeps between trials.
PACKED_CACHE_BYTES = 2 << 30
# Packed buffers whose digest the tuner remembers (by identity).
DIGEST_MEMO = 8


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
    packed: Optional[bytes]            # None: the worker holds packed_key's bytes
    zero_output: bool
    cutoff_ms: Optional[float] = None   # stop timing early above this (see timed)
    packed_key: Optional[str] = None    # packed_digest(packed); Worker.trial sets it


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


def packed_digest(data: bytes) -> str:
    """The key of a packed buffer: a digest of its bytes."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass
class _Packed:
    """One packed buffer on the device: `size` its length as sent (0 for a
    family without packed data, uploaded as 16 zero bytes) and `bufs` its
    copies (the first, then the rotation copies made so far)."""
    size: int
    bufs: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.bufs)


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


def checked_output(raw: bytes, s: Setup, gathered: bool = False) -> np.ndarray:
    """The part of Y that the reference covers, as float32 in Y's
    orientation: the check columns alone are converted (all of Y where
    every column is checked).  `raw`: Y's device bytes as downloaded, or
    with `gathered` the checked columns' alone (fm: rows x columns, tm:
    columns x rows, as `_State.download_checked` returns them)."""
    from ..generator.matrix import from_device_bytes
    cols = s.n if s.check_columns is None else len(s.check_columns)
    shape = (s.rows, s.n) if s.layout == "fm" else (s.n, s.rows)
    if gathered:
        shape = (s.rows, cols) if s.layout == "fm" else (cols, s.rows)
    raw_y = np.frombuffer(raw, dtype=np.uint32 if _elem(s.dtype) == 4 else np.uint16,
                          count=shape[0] * shape[1]).reshape(shape)
    if s.check_columns is not None and not gathered:
        raw_y = raw_y[:, s.check_columns] if s.layout == "fm" else raw_y[s.check_columns, :]
    return from_device_bytes(np.ascontiguousarray(raw_y).tobytes(), s.dtype,
                             raw_y.size).reshape(raw_y.shape)


# Copies the checked columns of a feature-major Y (rows x n) into a rows x
# ncols block on the GPU, so that verifying a large N downloads kilobytes
# instead of all of Y (tens of MB through pageable memory: most of a
# trial's verification time before).
GATHER_NAME = "sf_gather_columns"
GATHER_SOURCE = r"""
extern "C" __global__ void sf_gather_columns(const unsigned char *__restrict__ y,
    unsigned char *__restrict__ out, const int *__restrict__ cols, int rows, int n,
    int ncols, int elem) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= (long long)rows * ncols) return;
  const long long r = i / ncols;
  const unsigned char *src = y + (r * n + cols[i % ncols]) * elem;
  if (elem == 4)
    *reinterpret_cast<unsigned *>(out + i * 4) = *reinterpret_cast<const unsigned *>(src);
  else
    *reinterpret_cast<unsigned short *>(out + i * 2) =
        *reinterpret_cast<const unsigned short *>(src);
}
"""


class _State:
    """The worker process's GPU state: the setup's X and Y with their
    rotation copies, and the packed buffers of recent trials (by key)."""

    def __init__(self, device: int = 0, ctx=None):
        from .. import native
        self.native = native
        self.ctx = ctx if ctx is not None else native.Context(device)
        self.setup: Optional[Setup] = None
        self.x = None
        self.y = None
        self.x_copies: list = []   # X and Y beyond the first set (see _rotation)
        self.y_copies: list = []
        self.packed: OrderedDict[str, _Packed] = OrderedDict()  # least recently used first
        self.cols = None           # the checked columns (int32) and their gathered block
        self.gathered = None
        self._gather = None        # (module, function), compiled at the first use

    def do_setup(self, s: Setup):
        for b in [self.x, self.y, self.cols, self.gathered, *self.x_copies, *self.y_copies]:
            if b is not None:
                b.free()
        self.x_copies, self.y_copies = [], []
        self.cols = self.gathered = None
        self.setup = s
        self.x = self.ctx.upload(s.x)
        self.y = self.ctx.alloc(max(1, s.rows * s.n * _elem(s.dtype)))
        if s.check_columns is not None and s.layout == "fm" and s.rows > 0:
            self.cols = self.ctx.upload(np.ascontiguousarray(s.check_columns, dtype=np.int32))
            self.gathered = self.ctx.alloc(s.rows * len(s.check_columns) * _elem(s.dtype))

    def download_checked(self) -> tuple[bytes, bool]:
        """Y's bytes for the check: (bytes, gathered).  Feature-major with
        check columns: gathered on the GPU (GATHER_SOURCE) and the block
        downloaded; token-major: each checked token's row of Y; else all
        of Y."""
        s = self.setup
        elem = _elem(s.dtype)
        if s.check_columns is None or s.rows == 0:
            return self.ctx.download(self.y, s.rows * s.n * elem), False
        if s.layout == "tm":
            row = s.rows * elem
            return b"".join(self.ctx.download(self.y.ptr + int(c) * row, row)
                            for c in s.check_columns), True
        if self._gather is None:
            module = self.ctx.load(self.ctx.compile(GATHER_SOURCE, name="sf_gather.cu"))
            self._gather = (module, module.kernel(GATHER_NAME))
        count = s.rows * len(s.check_columns)
        self.ctx.launch(self._gather[1], ((count + 255) // 256, 1, 1), (256, 1, 1),
                        [self.y, self.gathered, self.cols, s.rows, s.n,
                         len(s.check_columns), elem], sig="PPPiiii")
        return self.ctx.download(self.gathered, count * elem), True

    def do_trial(self, t: Trial):
        from .execute import POISON, compare
        s = self.setup
        key = t.packed_key or packed_digest(t.packed)
        nbytes = s.rows * s.n * _elem(s.dtype)
        entry = self.packed.get(key)
        if entry is None and t.packed is None:
            return "need_packed", key
        size = entry.size if entry is not None else len(t.packed)
        n_sets = self._n_sets(size, nbytes)
        if t.packed is None and len(entry.bufs) < n_sets:
            return "need_packed", key  # more rotation copies than it holds
        t0 = time.perf_counter()
        binary = self.native.Binary.from_bytes(t.binary, ptx=t.ptx)
        module = self.ctx.load(binary)
        try:
            fn = module.kernel(t.name)
            attrs = fn.attributes()
            packed = self._packed_copies(key, t.packed, size, n_sets)
            t1 = time.perf_counter()
            self.ctx.memset(self.y, 0 if t.zero_output else POISON)
            args = self.ctx.kernel_args(fn, packed[0], self.x, self.y, s.n)
            self.ctx.launch(fn, t.grid, t.block, args, shared=t.shared_bytes)
            self.ctx.synchronize()
            raw, gathered = self.download_checked()
            y = checked_output(raw, s, gathered)
            err = compare(y, s.reference, s.dtype)
            t2 = time.perf_counter()
            if not err["ok"]:
                self._drop(key)
                return "wrong", {**err, "attrs": attrs,
                                 "phases": {"load": t1 - t0, "verify": t2 - t1}}

            xs, ys = self._rotation(n_sets - 1, nbytes)
            if t.zero_output:
                for yc in ys:
                    self.ctx.memset(yc, 0)
            sets = [args] + [self.ctx.kernel_args(fn, p, x, yc, s.n)
                             for p, x, yc in zip(packed[1:], xs, ys)]

            def time_fn(**timing):
                timing = {k: v for k, v in timing.items() if k != "rotate_bytes"}
                return self.ctx.time_sets(fn, t.grid, t.block, sets, shared=t.shared_bytes,
                                          **timing)
            timing = timed(time_fn, s.timing, t.cutoff_ms)
            phases = {"load": t1 - t0, "verify": t2 - t1, "time": time.perf_counter() - t2}
            return "ok", {**timing, **err, "attrs": attrs, "phases": phases}
        except Exception as e:
            if not _context_dead(e):  # a dead context freed everything already
                self._drop(key)
            raise
        finally:
            kept = self.packed.get(key)
            if kept is not None and kept.nbytes > PACKED_CACHE_BYTES:
                self._drop(key)  # used for its trial, too large to keep
            try:
                module.unload()
            except Exception:  # noqa: BLE001 - a dead context fails here too
                pass

    def _n_sets(self, packed_size: int, y_bytes: int) -> int:
        """Sets of (packed, X, Y) that together hold the setup's
        rotate_bytes (tuner/driver.py timing_for); 1 without rotation."""
        s = self.setup
        want = int(s.timing.get("rotate_bytes", 0) or 0)
        per_set = packed_size + len(s.x) + y_bytes
        return min(64, -(-want // per_set)) if want > 0 else 1

    def _packed_copies(self, key: str, data: Optional[bytes], size: int, n_sets: int) -> list:
        """The first `n_sets` device copies of packed buffer `key`, uploading
        from `data` those not held yet (making room first by dropping the
        least recently used others, unless this one alone exceeds the bound
        and is not kept anyway)."""
        entry = self.packed.get(key)
        if entry is None:
            entry = self.packed[key] = _Packed(size)
        self.packed.move_to_end(key)
        missing = n_sets - len(entry.bufs)
        if missing > 0:
            host = data if data else b"\0" * 16
            total = entry.nbytes + missing * len(host)
            if total <= PACKED_CACHE_BYTES:
                while True:
                    held = sum(e.nbytes for e in self.packed.values())
                    oldest = next(iter(self.packed))
                    if held + missing * len(host) <= PACKED_CACHE_BYTES or oldest == key:
                        break
                    self._drop(oldest)
            for _ in range(missing):
                entry.bufs.append(self.ctx.upload(host))
        return entry.bufs[:n_sets]

    def _drop(self, key: str):
        """Forgets packed buffer `key` and frees its copies."""
        entry = self.packed.pop(key, None)
        for b in entry.bufs if entry is not None else ():
            try:
                b.free()
            except Exception:  # noqa: BLE001 - freeing must not hide the trial's reply
                pass

    def _rotation(self, n: int, y_bytes: int) -> tuple[list, list]:
        """`n` copies of X and of Y beyond the first set, made once per
        setup (grown when a trial needs more sets)."""
        s = self.setup
        while len(self.x_copies) < n:
            self.x_copies.append(self.ctx.upload(s.x))
        while len(self.y_copies) < n:
            self.y_copies.append(self.ctx.alloc(max(1, y_bytes)))
        return self.x_copies[:n], self.y_copies[:n]

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
    restarts it after a fault.  Sends a trial's packed bytes only where the
    process is not known to hold them (see the module docstring)."""

    def __init__(self, timeout_s: float = 60.0, device: int = 0):
        self.timeout_s = timeout_s
        self.device = device
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._setup: Optional[Setup] = None
        self.restarts = 0
        self._held: set[str] = set()  # packed keys the current process holds
        # id(packed) -> (packed, key): the reference keeps the id from reuse
        self._digests: OrderedDict[int, tuple[bytes, str]] = OrderedDict()

    def _start(self):
        self._held = set()
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
        self._held = set()

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
        """The worker's reply to trial `t` (never "need_packed": the trial is
        sent again with its bytes)."""
        key = t.packed_key or self._packed_key(t.packed)
        t = replace(t, packed_key=key)
        reply = None
        if key in self._held and t.packed is not None:
            reply = self._call("trial", replace(t, packed=None))
        if reply is None or reply[0] == "need_packed":
            self._held.discard(key)
            reply = self._call("trial", t)
        if reply[0] == "ok":
            self._held.add(key)
        else:  # failed trials drop their packed copies; a new process has none
            self._held.discard(key)
        if reply[0] == "need_packed":  # only where the caller sent packed=None
            return "launch_fail", f"the worker lacks packed buffer {key} and none was sent"
        return reply

    def _packed_key(self, packed: bytes) -> str:
        """packed_digest(packed), remembered for the last DIGEST_MEMO
        objects (a layer's configurations share one packed object)."""
        hit = self._digests.get(id(packed))
        if hit is not None and hit[0] is packed:
            self._digests.move_to_end(id(packed))
            return hit[1]
        key = packed_digest(packed)
        self._digests[id(packed)] = (packed, key)
        while len(self._digests) > DIGEST_MEMO:
            self._digests.popitem(last=False)
        return key

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


class TakingTurns:
    """A worker that takes turns on its GPU with the other lanes' workers
    there (`lock`, one per GPU): each request -- setup, trial, peer --
    holds the GPU, so what one lane times never runs beside another's
    work; a lane waiting for its kernels to compile leaves the GPU to the
    others (tuner/gpus.py, `--lanes`)."""

    def __init__(self, worker, lock, phases=None):
        self.worker, self.lock, self.phases = worker, lock, phases

    @contextmanager
    def _turn(self, within: str):
        """Holds the GPU; the wait for it moves from `within` (the phase
        the caller counts the request in) to "turn"."""
        t0 = time.perf_counter()
        with self.lock:
            if self.phases is not None:
                self.phases.move(time.perf_counter() - t0, "turn", within)
            yield

    def info(self) -> dict:
        with self.lock:
            return self.worker.info()

    def setup(self, s: Setup):
        with self._turn("reference"):
            return self.worker.setup(s)

    def trial(self, t: Trial):
        with self._turn("load"):          # Phases.add_trial: what the worker does not split
            return self.worker.trial(t)

    def peer(self, p: PeerJob):
        with self._turn("peer"):
            return self.worker.peer(p)

    def close(self, kill: bool = False):
        self.worker.close(kill=kill)

    def __getattr__(self, name):            # restarts and the like: the worker's
        return getattr(self.worker, name)
