"""Where tuning time goes: per-phase wall-clock totals, kept cheaply (two
perf_counter calls per phase) and printed as one line at the end of a run.

Two kinds of phase.  The measuring thread's phases are spent one after the
other, so with "other" they add up to the run's wall time:

    wait      waiting for a kernel still being generated or compiled
    reference the float64 reference and the input X of each (matrix, N)
    load      the trial's transfer to the worker, module load and upload of
              the packed weights
    verify    the verification launch and the comparison with the reference
    time      the timing repetitions
    turn      (--lanes) waiting while another lane of the same GPU has it
    peer      cuBLAS timed for the table
    store     the stored winners re-timed, the layers written

The background phases run in the compile threads, beside the measuring
thread, and are summed over the threads (so they can exceed the wall time):

    plan      generating kernels (planning, packing, rendering the source)
    compile   NVRTC

A worker that reports no split of its trial (a replaying test worker)
leaves the whole trial in "load".

SPARSEFORGE_TRACE=FILE also writes every phase as an event (start, end,
thread, phase, what) to FILE as JSON lines when the process ends: where
the totals do not say why the measuring thread waits, the timeline does.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import contextmanager

_TRACE_FILE = os.environ.get("SPARSEFORGE_TRACE")
_events: list = []


def trace(phase: str, t0: float, t1: float, what: str = "") -> None:
    """Records one event where SPARSEFORGE_TRACE names a file."""
    if _TRACE_FILE:
        _events.append((round(t0, 4), round(t1, 4), threading.current_thread().name, phase, what))


@atexit.register
def _write_trace() -> None:
    if _TRACE_FILE and _events:
        with open(_TRACE_FILE, "w") as f:
            for e in _events:
                f.write(json.dumps(e) + "\n")

FOREGROUND = ("wait", "reference", "load", "verify", "time", "peer", "store", "turn")
BACKGROUND = ("plan", "compile")


class Phases:
    """Wall-clock seconds per phase; safe to add to from several threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(FOREGROUND + BACKGROUND, 0.0)
        self.started = time.perf_counter()

    def add(self, phase: str, seconds: float, what: str = "") -> None:
        if phase not in self.seconds:
            raise KeyError(f"unknown phase {phase!r}; known: {', '.join(self.seconds)}")
        with self._lock:
            self.seconds[phase] += seconds
        if _TRACE_FILE:
            now = time.perf_counter()
            trace(phase, now - seconds, now, what)

    def move(self, seconds: float, into: str, out_of: str, what: str = "") -> None:
        """Seconds of a block counted (or yet to be counted) as `out_of`
        that were spent in `into`: a lane's wait for its turn on the GPU
        inside its setup, trial or peer timing."""
        if out_of not in self.seconds:
            raise KeyError(f"unknown phase {out_of!r}; known: {', '.join(self.seconds)}")
        with self._lock:
            self.seconds[out_of] -= seconds
        self.add(into, seconds, what)

    @contextmanager
    def __call__(self, phase: str):
        """`with phases("reference"): ...` adds the block's wall time."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)

    def add_trial(self, wall: float, split: dict | None) -> None:
        """One trial's wall time in the measuring thread, split as the worker
        reports it ({"load": s, "verify": s, "time": s}); what the worker does
        not account for (the pipe, pickling) counts as load."""
        split = split or {}
        told = 0.0
        for phase in ("verify", "time"):
            s = float(split.get(phase, 0.0))
            self.add(phase, s)
            told += s
        self.add("load", max(0.0, wall - told))

    def merge(self, other: "Phases | dict") -> None:
        """Adds another's totals (a Phases, or its `seconds` dict)."""
        for phase, s in (other.seconds if isinstance(other, Phases) else other).items():
            self.add(phase, s)

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self.seconds)

    def since(self, snapshot: dict) -> dict:
        """Seconds per phase spent after `snapshot` was taken."""
        now = self.snapshot()
        return {p: now[p] - snapshot.get(p, 0.0) for p in now}

    def wall(self) -> float:
        return time.perf_counter() - self.started

    def as_dict(self, wall: float | None = None, lanes: int = 1) -> dict:
        """Seconds per phase, with "wall" and "other" (the measuring threads'
        time in no phase; `lanes` of them, one per GPU, summed)."""
        wall = self.wall() if wall is None else wall
        with self._lock:
            out = dict(self.seconds)
        out["other"] = max(0.0, lanes * wall - sum(out[p] for p in FOREGROUND))
        out["wall"] = wall
        return out

    def format(self, wall: float | None = None, threads: int | None = None,
               lanes: int = 1, over: str = "GPUs") -> str:
        """One line: 'time 83.1 s: wait 4.0, reference 1.2, ... | in the
        background (16 threads): plan 20.3, compile 310.9'; the phases
        summed over `lanes` measuring threads (GPUs, ranks) where there are
        several."""
        d = self.as_dict(wall, lanes)
        fg = ", ".join(f"{p} {d[p]:.1f}" for p in FOREGROUND + ("other",) if d[p] >= 0.05)
        bg = ", ".join(f"{p} {d[p]:.1f}" for p in BACKGROUND if d[p] >= 0.05)
        over = f" (phases summed over {lanes} {over})" if lanes > 1 else ""
        line = f"time {d['wall']:.1f} s{over}: {fg or 'nothing measured'}"
        if bg:
            line += f" | in the background{f' ({threads} threads)' if threads else ''}: {bg}"
        return line
