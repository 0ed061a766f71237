"""A measurement worker that replays timings instead of running kernels:
the tuner's tests stand it in for a GPU (tuner.driver.Tuner(worker=...)).

Each kernel's time is a fixed function of its name (so one configuration
times alike on every matrix); candidates named in `slow` take 100 times as
long, those in `fail_names` fault.  Timing goes through the real early-stop
rule (tuner.worker.timed), and every trial reports a split of its phases
as the real worker does."""
from __future__ import annotations

import threading
import time
import zlib

from sparseforge.tuner.worker import timed

DEVICE = {"name": "Replay GPU", "cc_major": 9, "cc_minor": 0, "arch": "sm_90a", "sm_count": 132,
          "l2_bytes": 50 << 20, "smem_per_block_optin": 232448, "smem_per_sm": 233472,
          "regs_per_block": 65536, "max_threads_per_block": 1024, "clock_khz": 1980000,
          "driver_version": 13000, "total_mem_bytes": 80 << 30}
TIMING = {"warmup": 3, "min_reps": 30, "max_reps": 1000, "min_total_ms": 100.0, "flush_l2": True}
SPLIT = {"load": 0.001, "verify": 0.001, "time": 0.002}


def replay_ms(name: str) -> float:
    return 0.01 + (zlib.crc32(name.encode()) % 1000) / 1e4


class ReplayWorker:
    """Answers like tuner.worker.Worker, from a deterministic timing per kernel."""

    def __init__(self, interrupt_after=None, fail_names=(), name="Replay GPU", slow=(),
                 on_trial=None):
        self.trials = []
        self.interrupt_after = interrupt_after
        self.fail_names = set(fail_names)
        self.slow = set(slow)
        self.name = name
        self.on_trial = on_trial          # called with (worker, trial) before answering
        self.setups = 0
        self.peers = 0                    # peer (cuBLAS) timings asked for
        self.cutoffs = []                 # the cutoff each trial carried
        self.lock = threading.Lock()

    def info(self):
        return dict(DEVICE, name=self.name)

    def setup(self, s):
        self.setups += 1

    def trial(self, t):
        if self.interrupt_after is not None and len(self.trials) >= self.interrupt_after:
            raise KeyboardInterrupt
        if self.on_trial is not None:
            self.on_trial(self, t)
        with self.lock:
            self.trials.append(t.name)
            self.cutoffs.append(t.cutoff_ms)
        if any(f in t.name for f in self.fail_names):
            return "launch_fail", "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access"
        ms = replay_ms(t.name) * (100 if t.name in self.slow else 1)
        time.sleep(sum(SPLIT.values()))     # the phases it reports take their time

        def time_fn(**timing):
            reps = timing["min_reps"] if timing["min_reps"] == timing["max_reps"] else 30
            return {"median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.02,
                    "min_ms": ms * 0.95, "mean_ms": ms, "reps": reps}
        return "ok", {**timed(time_fn, TIMING, t.cutoff_ms), "max_rel_err": 1e-7,
                      "norm_rel_err": 1e-7, "tol": 1e-5, "unwritten": 0, "phases": dict(SPLIT)}

    def peer(self, p):
        self.peers += 1
        return "ok", {"median_ms": 0.5, "p20_ms": 0.49, "p80_ms": 0.51, "min_ms": 0.48,
                      "mean_ms": 0.5, "reps": 30}

    def close(self, kill=False):
        pass
