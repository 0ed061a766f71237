"""Tuning on several GPUs of one host (`--gpus all` or `--gpus 0,1`).

One tuner per GPU, each with its own measurement worker process on that
GPU; one compile pool and one database connection (this process's) for
all of them.  With `lanes` > 1 a GPU has that many tuners (searches in
flight), whose workers take turns on it: a search waiting for its next
candidates to compile leaves the GPU to another, and nothing is timed
beside another lane's work.  The work items are (layer, N bucket) pairs
in one queue per GPU model, taken by that model's GPUs (lanes) as they
come free; a layer is stored once all its buckets are done.  Identical matrices wait for their first
to be done (they are then served from its trials).

Winners are per GPU model, so a run refuses GPUs of different models
unless asked (`mixed=True`, `--mixed-gpus`): then every model's GPUs tune
every layer, and the results are stored under each GPU's name (layers by
gpu_name, trials by the GPU's environment key), one table per model.
"""
from __future__ import annotations

import queue
import sys
import threading
from typing import Callable, Optional

from .compiler import Compiler
from .driver import Tuner
from .model import Entry, ModelRow
from .phases import Phases


def parse_gpus(text: str):
    """`all`, or GPU ordinals separated by commas ("0,2"): "all" or a list
    of distinct non-negative ints; ValueError otherwise."""
    t = text.strip().lower()
    if t == "all":
        return "all"
    try:
        ordinals = [int(x) for x in t.split(",") if x.strip()]
    except ValueError:
        ordinals = []
    if not ordinals or any(o < 0 for o in ordinals):
        raise ValueError(f"--gpus takes 'all' or GPU ordinals separated by commas "
                         f"(such as 0,1), got {text!r}")
    if len(set(ordinals)) != len(ordinals):
        raise ValueError(f"--gpus names a GPU twice: {text!r}")
    return ordinals


def resolve_gpus(gpus, count: Callable[[], int], available: Callable[[], tuple]) -> list[int]:
    """The ordinals `gpus` ("all" or a list) means on this host; ValueError
    without a GPU or for an ordinal the host lacks."""
    ok, reason = available()
    if not ok:
        raise ValueError(f"--gpus: no GPU here ({reason}); without a GPU tuning compiles "
                         "only, on every core: leave --gpus out")
    n = count()
    if gpus == "all":
        return list(range(n))
    missing = [o for o in gpus if o >= n]
    if missing:
        raise ValueError(f"--gpus names GPU {missing[0]} but this host has {n} "
                         f"(ordinals 0 to {n - 1})")
    return list(gpus)


def gpu_count() -> int:
    from .. import native
    with native.Context(0) as ctx:
        return ctx.device_count()


def check_models(names: dict, mixed: bool) -> None:
    """Refuses GPUs of different models (`names`: ordinal or rank -> GPU
    name) unless `mixed`."""
    models = sorted(set(names.values()))
    if len(models) > 1 and not mixed:
        listed = ", ".join(f"{k}: {v}" for k, v in sorted(names.items()))
        raise ValueError(f"GPUs of different models ({listed}); winners are per GPU model: "
                         "name GPUs of one model with --gpus, or pass --mixed-gpus to tune "
                         "every layer on each model (stored under each GPU's name)")


class GpuPool:
    """`lanes` tuners per GPU, sharing one compile pool; `make_tuner(ordinal,
    compiler)` makes each (its worker on that GPU).  The lanes of one GPU
    take turns on it (tuner.worker.TakingTurns): one measures while
    another waits for its candidates to compile."""

    def __init__(self, ordinals: list[int], make_tuner: Callable[[int, Compiler], Tuner],
                 compiler: Compiler, mixed: bool = False, lanes: int = 1):
        if lanes < 1:
            raise ValueError(f"lanes: at least 1 a GPU, got {lanes}")
        self.compiler = compiler
        self.tuners: list[Tuner] = []
        self.lanes = lanes
        names = {}
        try:
            for o in ordinals:
                turns = threading.Lock()
                for _ in range(lanes):
                    t = make_tuner(o, compiler)
                    if lanes > 1:
                        t.take_turns(turns)
                    self.tuners.append(t)
                    names[o] = t.device["name"]
            check_models(names, mixed)
        except BaseException:
            self.close(kill=True)
            raise
        self.ordinals = list(ordinals)
        self.groups: dict[str, list[Tuner]] = {}
        for t in self.tuners:
            self.groups.setdefault(t.device["name"], []).append(t)

    def close(self, kill: bool = False) -> None:
        for t in self.tuners:
            t.close(kill=kill)
        self.compiler.close(kill=kill)

    @property
    def compiled(self) -> int:
        return self.compiler.compiled

    @property
    def recompiled_corrupt(self) -> int:
        return self.compiler.recompiled_corrupt

    @property
    def device(self) -> dict:
        """The first GPU's description (an MPI rank's pool has one GPU)."""
        return self.tuners[0].device

    @property
    def phases(self) -> Phases:
        """The GPUs' phases summed, with the compile pool's; its wall time
        counts from the pool's start."""
        total = Phases()
        total.started = self.compiler.phases.started
        for t in self.tuners:
            total.merge(t.phases)
        total.merge(self.compiler.phases)
        return total

    def run(self, entries: list[Entry], ns: list[int], force: bool = False,
            log=None) -> dict[str, list[ModelRow]]:
        """Tunes the entries on every GPU model: its rows per model, in
        the entries' order.  The first failure stops every GPU and is
        raised here."""
        out = {}
        for model, tuners in self.groups.items():
            rows = {e.index: ModelRow(e.name, None, e.skipped, e.index)
                    for e in entries if e.skipped}
            for wave in ([e for e in entries if not e.skipped and not e.first],
                         [e for e in entries if not e.skipped and e.first]):
                rows.update(_Wave(wave, tuners, ns, force, log).run())
            out[model] = [rows[i] for i in sorted(rows)]
        return out


class _Wave:
    """Entries whose (layer, N) items are shared out over one model's GPUs."""

    def __init__(self, entries: list[Entry], tuners: list[Tuner], ns: list[int], force: bool,
                 log):
        self.tuners, self.ns, self.force, self.log = tuners, ns, force, log or sys.stderr
        self.items: queue.Queue = queue.Queue()
        for e in entries:
            for n in ns:
                self.items.put((e, n))
        self.jobs: dict = {}
        self.left = {e.index: len(ns) for e in entries}
        self.rows: dict = {}
        self.lock = threading.Lock()
        self.failure: Optional[BaseException] = None

    def run(self) -> dict:
        threads = [threading.Thread(target=self._lane, args=(t,), daemon=True, name=f"sf-gpu-{i}")
                   for i, t in enumerate(self.tuners)]
        for th in threads:
            th.start()
        for th in threads:
            while th.is_alive():
                th.join(0.2)       # a KeyboardInterrupt reaches this thread here
        if self.failure is not None:
            raise self.failure
        return self.rows

    def _lane(self, tuner: Tuner) -> None:
        try:
            while self.failure is None:
                try:
                    entry, n = self.items.get_nowait()
                except queue.Empty:
                    return
                job = self._job(tuner, entry)
                tuner.run_bucket(job, n, self.force and not entry.first)
                with self.lock:
                    self.left[entry.index] -= 1
                    last = self.left[entry.index] == 0
                if last:
                    res = tuner.finish(job)
                    if entry.first:
                        res.note = f"same matrix as {entry.first}"
                    self.rows[entry.index] = ModelRow(entry.name, res, index=entry.index)
        except BaseException as e:  # noqa: BLE001 - raised in the calling thread
            with self.lock:
                self.failure = self.failure or e

    def _job(self, tuner: Tuner, entry: Entry):
        """The entry's job, begun by the first GPU that takes one of its items."""
        with self.lock:
            job = self.jobs.get(entry.index)
            if job is None:
                m = entry.get_matrix()
                fam, params = _parse(entry.pattern)
                if not entry.first:
                    print(f"tuning {entry.name}: {m.rows}x{m.cols} density {m.density:.3f} as "
                          f"{entry.pattern} ({entry.op.dtype}) on {tuner.device['name']}",
                          file=self.log)
                job = self.jobs[entry.index] = tuner.begin(m, fam, params, entry.op, entry.name)
            return job


def _parse(pattern: str):
    from ..generator.families import parse_pattern
    return parse_pattern(pattern)
