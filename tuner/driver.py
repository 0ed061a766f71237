"""The measurement driver: for one matrix, family and operation, search the
configurations for each N, verify every candidate, record every trial in
the cache and store the winners as a layer the runtime can open by name.

Where the time goes (tuner/phases.py) is kept per run.  The GPU is kept
busy: kernels are generated and compiled in a thread pool
(tuner/compiler.py) while the worker measures the ones already compiled,
and a strategy that knows its next batch has it compiled during the
current one.  A kernel generated for one N bucket serves the others.  A
matrix's search starts from the winners of the matrices of the same
family, operation and shape already in the database (a model's twelve
attention projections are searched once in full, then refined), and a
candidate that a short probe shows clearly slower than the best so far
is not timed to the end (recorded as an ok trial that says so).  Every
candidate is verified before its time counts.

Resuming is free: a trial already in the cache for this GPU, matrix,
operation, N and configuration is returned as recorded, and a binary
already in the cache is not compiled again.
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..generator.families import get_family
from ..generator.kernel import ConfigError, Kernel, Operation, canonical_config, reference
from ..generator.matrix import SparseMatrix, to_device_bytes
from .compiler import Built, Compiler
from .execute import random_input
from .phases import Phases
from .strategies import Budget, config_key, get_strategy, hinted
from .worker import PeerJob, Setup, Trial, Worker

# Y elements verified in full below this; above it, CHECK_COLUMNS random columns.
FULL_CHECK_LIMIT = 1 << 21
CHECK_COLUMNS = 32
# The median of at least 30 runs and 30 ms (DESIGN.md: "~30 runs or ~100 ms").
DEFAULT_TIMING = {"warmup": 3, "min_reps": 30, "max_reps": 1000, "min_total_ms": 30.0,
                  "flush_l2": True}
QUICK_TIMING = {"warmup": 2, "min_reps": 10, "max_reps": 200, "min_total_ms": 15.0,
                "flush_l2": True}
# Short kernels (N <= SHORT_N) are timed as they run in a model's forward
# pass: CUDA graphs of SHORT_GRAPH launches rotating through copies of
# their operands that hold twice the L2 (DESIGN.md, "Measuring"); so are
# the peers they are compared with.
SHORT_N = 256
SHORT_GRAPH = 16


def past_l2_bytes(device: dict) -> int:
    """Bytes that pass a device's L2 (its sf_device_info dict) through:
    twice its size (50 MB taken where the runtime could not say)."""
    return 2 * (int(device.get("l2_bytes") or 0) or (50 << 20))


def timing_for(timing: dict, n: int, device: Optional[dict]) -> dict:
    """The protocol of `timing` for N columns: short kernels rotate their
    operands through twice the device's L2 inside graphs of launches."""
    if n > SHORT_N or not device or timing.get("rotate_bytes") == 0:
        return dict(timing)
    return dict(timing, rotate_bytes=past_l2_bytes(device),
                graph_batch=max(SHORT_GRAPH, timing.get("graph_batch", 0)), flush_l2=False)


# Configurations compiled per layer and architecture where no GPU can
# measure them, and the architectures they are compiled for (Ampere and
# Hopper; --arch names others).
NO_GPU_COMPILES = 8
NO_GPU_ARCHS = ("sm_80", "sm_90a")
# A candidate whose probe's p20 exceeds EARLY_STOP x the best median so far
# is not timed further (tuner/worker.py `timed`).
EARLY_STOP = 1.5
# The automatic strategy: every configuration of a space this small (and no
# --budget); else a greedy search of a share of the space, smaller where
# earlier matrices of the same family, operation and shape have winners
# (the search starts from them).
AUTO_EXHAUSTIVE_MAX = 48
COLD_SHARE, COLD_MIN = 4, 8
WARM_SHARE, WARM_MIN = 16, 6
# Candidates per N bucket built before the layer's first search starts
# (Tuner._prebuild).
PREBUILD = 4
# Bytes of generated kernels (packed weights, source, cubin) kept per layer
# for the other N buckets, most recently used first.
KEEP_BUILT_BYTES = 256 << 20


@dataclass
class NResult:
    n: int
    config: Optional[dict] = None
    kernel_name: str = ""
    median_ms: float = math.nan
    p20_ms: float = math.nan
    p80_ms: float = math.nan
    max_error: float = math.nan
    peer_ms: float = math.nan
    peer_error: str = ""
    trials: int = 0
    failed: int = 0
    stopped_early: int = 0       # trials of this search whose timing stopped early
    filled: int = 0              # ... measured while the search waited for a compilation
    warm_hints: int = 0          # winners of earlier matrices it started from
    recorded: bool = False       # times as recorded when it was tuned (not re-timed)

    @property
    def speedup(self) -> float:
        return self.peer_ms / self.median_ms if self.median_ms > 0 else math.nan


@dataclass
class LayerResult:
    name: str
    family_tag: str
    op_tag: str
    matrix: Optional[SparseMatrix]
    per_n: dict = field(default_factory=dict)
    compiled: int = 0
    from_cache: bool = False
    measured: bool = True
    note: str = ""
    gpu_name: str = ""
    seconds: dict = field(default_factory=dict)   # per phase, where one tuner did it all


def target_of_arch(arch: str) -> dict:
    """A device description from an arch name alone ("sm_90a" -> compute
    capability 9.0), for generating kernels with no GPU present."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", arch or "")
    if not m:
        return {"arch": arch}
    return {"arch": arch, "cc_major": int(m.group(1)), "cc_minor": int(m.group(2))}


def untuned_gpu_name(arch: str) -> str:
    """The GPU name a layer compiled without a GPU is stored under."""
    return f"untuned ({arch})"


class _BuiltKernels:
    """One layer's generated and compiled kernels by configuration (futures
    of Built), the most recently used kept up to KEEP_BUILT_BYTES, so that
    the other N buckets neither generate nor look them up again."""

    def __init__(self, limit: int = KEEP_BUILT_BYTES):
        self.limit = limit
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key) -> Optional[Future]:
        with self._lock:
            fut = self._items.get(key)
            if fut is not None:
                self._items.move_to_end(key)
            return fut

    def put(self, key, fut: Future) -> None:
        with self._lock:
            self._items[key] = fut
            total = sum(_size(f) for f in self._items.values())
            for k in list(self._items)[:-1]:       # the oldest first; never the newest
                if total <= self.limit:
                    break
                if self._items[k].done():           # what is still building stays
                    total -= _size(self._items.pop(k))

    def drain(self, wait: bool = True) -> None:
        """Cancels what has not started building and (with `wait`) waits
        for what has: nothing keeps compiling for a finished layer, and
        after an interrupt nothing waits."""
        with self._lock:
            futures = list(self._items.values())
        for f in futures:
            f.cancel()
        if wait:
            for f in futures:
                if not f.cancelled():
                    f.exception()   # waits; a failure was reported to whoever asked


def _size(fut: Future) -> int:
    if not fut.done() or fut.cancelled() or fut.exception() is not None:
        return 0
    b = fut.result()
    k = b.kernel
    return (len(k.packed) + len(k.source) if k is not None else 0) + len(b.data or b"")


@dataclass
class LayerJob:
    """One matrix being tuned under one name: what every N bucket shares."""
    name: str
    matrix: SparseMatrix
    fam: object
    params: dict
    op: Operation
    bias: Optional[np.ndarray]
    fp: str
    op_tag: str
    result: LayerResult
    space: list = field(default_factory=list)
    have: dict = field(default_factory=dict)     # N bucket -> stored variant
    fresh: dict = field(default_factory=dict)    # N bucket -> variant tuned now
    built: _BuiltKernels = field(default_factory=_BuiltKernels)
    compiled_before: int = 0

    def generate(self, config: dict) -> Kernel:
        return self.fam.generate(self.matrix, self.op, self.params, config, bias=self.bias)


def _naming(info, config: dict) -> dict:
    """A failed trial's info (a dict, or a message) with the configuration
    it ran (`config`, canonical JSON)."""
    rest = info.items() if isinstance(info, dict) else [("message", str(info))]
    # the configuration first: printed infos are cut
    return {"config": canonical_config(config), **{k: v for k, v in rest if k != "config"}}


class Tuner:
    """Tunes matrices into one cache.  Without a GPU it generates and
    compiles for `arch` (a comma-separated list; default NO_GPU_ARCHS),
    stores the binaries and an untuned layer per architecture, and measures
    nothing."""

    def __init__(self, cache, arch: Optional[str] = None, strategy: str = "auto",
                 budget: Optional[str] = None, jobs: Optional[int] = None,
                 timing: Optional[dict] = None, worker_timeout: float = 60.0,
                 progress: Optional[Callable[[str, int, int], None]] = None,
                 seed: Optional[int] = None, peer: bool = True, worker=None,
                 early_stop: Optional[float] = EARLY_STOP, compiler: Optional[Compiler] = None,
                 device: int = 0, retime: bool = True):
        """`worker` replaces the measurement process (tests replay recorded
        timings through it); with one, the tuner measures as on a GPU.
        `device`: the GPU (ordinal) the worker measures on.  `early_stop`:
        the factor over the best median past which a candidate's timing
        stops after its probe (None: every candidate timed in full).
        `compiler`: a Compiler shared with other tuners (one per GPU).
        `retime`: a stored winner is verified and timed again (with cuBLAS
        beside it) for the result; without, its time and cuBLAS's are those
        recorded when it was tuned on this GPU (nothing runs where both are
        recorded: a rerun on a complete database costs no GPU time)."""
        from .. import native
        self.native = native
        self.cache = cache
        self.strategy = strategy
        self.budget_text = budget
        self.jobs = jobs or os.cpu_count() or 2
        self.timing = dict(timing or DEFAULT_TIMING)
        self.progress = progress or (lambda label, done, total: None)
        self.seed = seed
        self.peer = peer
        self.retime = retime
        self.early_stop = early_stop
        self.phases = Phases()
        self._own_compiler = compiler is None
        self.compiler = compiler or Compiler(cache, self.jobs, self.phases)
        self.gpu, self.gpu_reason = (True, "") if worker is not None else native.gpu_available()
        self.worker = worker
        self.device = None
        if self.gpu:
            self.worker = worker or Worker(timeout_s=worker_timeout, device=device)
            self.device = self.worker.info()
            self.env_key = cache.put_env(self.device)
        archs = [a.strip() for a in arch.split(",") if a.strip()] if arch else []
        if self.gpu and len(archs) > 1:
            raise ValueError(f"--arch names one architecture where a GPU measures, got {arch!r}")
        self.archs = archs or ([self.device["arch"]] if self.device else list(NO_GPU_ARCHS))
        self.arch = self.archs[0]
        # what the kernels are generated for: the GPU, compiled for self.arch
        # (with no GPU, the arch alone: its compute capability and limits)
        self.target = dict(self.device, arch=self.arch) if self.device else target_of_arch(self.arch)
        self.nvrtc = self.compiler.nvrtc
        self._peers: dict = {}
        self._ahead: dict = {}      # name -> LayerJob begun by look_ahead
        self._inputs: dict = {}     # (n, op, id(bias)) -> future of _make_inputs, this layer's
        self._input_pool: Optional[ThreadPoolExecutor] = None

    def take_turns(self, lock) -> None:
        """This tuner's worker takes turns on its GPU with the workers of
        other tuners holding the same `lock` (lanes of one GPU)."""
        from .worker import TakingTurns
        if self.worker is not None:
            self.worker = TakingTurns(self.worker, lock, self.phases)

    @property
    def compiled(self) -> int:
        """Kernels compiled (not found in the cache) so far."""
        return self.compiler.compiled

    @property
    def recompiled_corrupt(self) -> int:
        """Stored cubins that failed their sha256 and were compiled again."""
        return self.compiler.recompiled_corrupt

    def close(self, kill: bool = False):
        """Ends the measurement worker (at once with `kill`: on an
        interrupt) and the compile threads this tuner owns."""
        self.drop_ahead()
        if self._input_pool is not None:
            self._input_pool.shutdown(wait=not kill, cancel_futures=True)
            self._input_pool = None
        if self.worker is not None:
            self.worker.close(kill=kill)
        if self._own_compiler:
            self.compiler.close(kill=kill)

    def compile_all(self, kernels: list[Kernel], arch: Optional[str] = None,
                    label: str = "") -> list[tuple[Optional[bytes], str, str]]:
        """Compiles in parallel what the cache lacks for `arch` (default: the
        tuner's), storing each binary as soon as it is compiled; (cubin or
        None, binary key hex, error) per kernel.  With `label`, the
        progress bar counts them."""
        progress = (lambda done, total: self.progress(label, done, total)) if label else None
        built = self.compiler.compile_all(kernels, arch or self.arch, progress)
        return [(b.data, b.hexkey, b.error) for b in built]

    # ---- one matrix ---------------------------------------------------------
    def tune(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation,
             ns: list[int], name: str, bias: Optional[np.ndarray] = None,
             force: bool = False) -> LayerResult:
        """Tunes (or, without a GPU, compiles) `matrix` for every N of `ns`
        and stores the layer `name`."""
        before = self.phases.snapshot()
        job = self._ahead.pop(name, None)
        if job is not None and (job.matrix is not matrix or job.op != op or job.params != params
                                or job.fam is not get_family(pattern) or job.bias is not bias):
            job.built.drain(wait=False)      # looked ahead at something else under this name
            job = None
        if job is None:
            job = self.begin(matrix, pattern, params, op, name, bias)
        else:
            job.compiled_before = self.compiled
        try:
            if not self.gpu:
                result = self._compile_only(job, ns)
            else:
                try:
                    todo = [n for n in ns if force or n not in job.have]
                    self._prebuild(job, todo)
                    self._inputs_ahead(matrix, op, todo, bias)
                    for n in ns:
                        self.run_bucket(job, n, force)
                except BaseException:
                    job.built.drain(wait=False)
                    self.drop_ahead()
                    raise
                result = self.finish(job)
        finally:
            matrix.drop_cached()
            self._inputs.clear()
        result.seconds = self.phases.since(before)
        return result

    def look_ahead(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation,
                   ns: list[int], name: str, bias: Optional[np.ndarray] = None,
                   force: bool = False) -> None:
        """Begins the search of a layer tuned after the current one and
        queues its first candidates behind all of the current layer's
        work, so that the compile threads, idle most of a search, have
        them (and the family's packings) ready when it starts: its first
        batch is otherwise one long wait.  `tune` of the same name,
        matrix and operation takes the job over."""
        if not self.gpu or name in self._ahead:
            return
        job = self.begin(matrix, pattern, params, op, name, bias)
        self._ahead[name] = job
        self._prebuild(job, [n for n in ns if force or n not in job.have], ahead=True)

    def drop_ahead(self) -> None:
        """Cancels what was queued for layers looked ahead at."""
        jobs, self._ahead = list(self._ahead.values()), {}
        for job in jobs:
            job.built.drain(wait=False)

    def begin(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation,
              name: str, bias: Optional[np.ndarray] = None) -> LayerJob:
        """Records the matrix and prepares its search (the space, the layer
        already stored); run_bucket per N, then finish, store the layer."""
        fam = get_family(pattern)
        tag = fam.tag(params)
        op_tag = op.tag(tag)
        fp = matrix.fingerprint()
        self.cache.put_matrix(fp, matrix.rows, matrix.cols, matrix.nnz, matrix.dtype,
                              json.dumps({"name": name, "pattern": tag,
                                          "synthetic_values": matrix.values_synthetic}))
        job = LayerJob(name, matrix, fam, params, op, bias, fp, op_tag,
                       LayerResult(name, tag, op_tag, matrix,
                                   gpu_name=self.device["name"] if self.device else ""),
                       compiled_before=self.compiled)
        if self.gpu:
            job.space = fam.search_space(matrix, op, params, self.target)
            if not job.space:
                raise ConfigError(f"{tag}: no valid configuration for this matrix and GPU")
            existing = self._existing_layer(name, fp, op_tag)
            job.have = {v["n_bucket"]: v for v in existing["variants"]} if existing else {}
        return job

    def run_bucket(self, job: LayerJob, n: int, force: bool = False) -> NResult:
        """One N bucket: re-timed from the stored layer (unless forced), else
        searched; the peer timed beside it."""
        if n in job.have and not force:
            nres = self._from_layer(job, n)
            job.result.from_cache = True
        else:
            nres, kernel = self._tune_n(job, n)
            if kernel is not None:
                job.fresh[n] = self._variant(kernel, n)
        if self.peer:
            self._time_peer(nres, job.matrix, job.op)
        job.result.per_n[n] = nres
        return nres

    def finish(self, job: LayerJob) -> LayerResult:
        """Stores the layer: the buckets tuned now beside the stored ones."""
        job.built.drain()
        if job.fresh:
            kept = [v for b, v in job.have.items() if b not in job.fresh]
            variants = sorted(kept + list(job.fresh.values()), key=lambda v: v["n_bucket"])
            m = job.matrix
            with self.phases("store"):
                self.cache.put_layer(job.name, self.device["name"], job.fp, job.op_tag, m.rows,
                                     m.cols, job.op.elem_size, job.op.elem_size, variants)
        job.result.compiled = self.compiled - job.compiled_before
        return job.result

    def _compile_only(self, job: LayerJob, ns: list[int]) -> LayerResult:
        """No GPU: nothing can be measured.  For each architecture, compile
        the family's hints and a spread of the rest of the space (the
        budget's worth, NO_GPU_COMPILES by default), and store an untuned
        layer whose every N bucket runs the default configuration, so that
        the database holds the compiled kernels and `cache show` names
        them.  Says so in the result's note."""
        result = job.result
        result.measured = False
        notes = []
        for arch in self.archs:
            target = target_of_arch(arch)
            picks, size = self._compile_picks(job, target)
            if not picks:
                notes.append(f"{arch}: no valid configuration")
                continue
            label = f"{job.name} {arch}"
            futures = [self.compiler.submit(lambda c=c: job.generate(c), arch) for c in picks]
            res = []
            for done, fut in enumerate(futures, 1):
                with self.phases("wait"):
                    res.append(fut.result())
                self.progress(label, done, len(futures))
            bad = sum(1 for b in res if b.data is None)
            notes.append(f"{arch}: {len(picks) - bad} of {size} configurations compiled"
                         + (f" ({bad} failed)" if bad else ""))
            if res[0].data is not None:
                m = job.matrix
                variants = [self._variant(self._untuned_pick(job, target, res, n), n)
                            for n in sorted(set(ns))]
                with self.phases("store"):
                    self.cache.put_layer(job.name, untuned_gpu_name(arch), job.fp, job.op_tag,
                                         m.rows, m.cols, job.op.elem_size, job.op.elem_size,
                                         variants)
        result.note = "no GPU, measured nothing; " + "; ".join(notes)
        result.compiled = self.compiled - job.compiled_before
        return result

    @staticmethod
    def _untuned_pick(job: LayerJob, target: dict, built: list, n: int) -> Kernel:
        """The kernel an untuned layer runs at N = n: the first of the
        family's hints for that N (decode's tiles for a few tokens,
        prefill's for many) among those compiled, else the first compiled."""
        ok = [b.kernel for b in built if b.data is not None]
        for hint in job.fam.hint_configs(job.matrix, job.op, job.params, target, n=n):
            hit = next((k for k in ok if k.config == hint), None)
            if hit is not None:
                return hit
        return ok[0]

    def _compile_picks(self, job: LayerJob, target: dict) -> tuple[list[dict], int]:
        """What compile-only compiles for `target`: the family's hints, then
        a spread of the space, the budget's worth; and the space's size."""
        space = job.fam.search_space(job.matrix, job.op, job.params, target)
        if not space:
            return [], 0
        budget = Budget.parse(self.budget_text, len(space)).max_trials or NO_GPU_COMPILES
        spread = [space[round(i * (len(space) - 1) / max(1, budget - 1))]
                  for i in range(min(budget, len(space)))]
        picks = hinted(space, job.fam.hint_configs(job.matrix, job.op, job.params, target))[:budget]
        picks += [c for c in spread if c not in picks][:budget - len(picks)]
        return picks, len(space)

    def _existing_layer(self, name, fp, op_tag):
        """The stored layer `name` of this GPU, matrix and operation, or None
        (a layer of another matrix or operation is replaced, not extended)."""
        for rec in self.cache.layers(name):
            if (rec["gpu_name"] == self.device["name"] and rec["matrix_fp"] == fp
                    and rec["op"] == op_tag and not rec.get("problem")):
                return rec
        return None

    def _variant(self, kernel: Kernel, n: int) -> dict:
        from .. import GENERATOR_VERSION
        return {"n_bucket": n, "source": kernel.source, "kernel_name": kernel.name,
                "options": "\n".join(kernel.options), "generator_version": GENERATOR_VERSION,
                "launch": kernel.launch, "packed": kernel.packed,
                "config": canonical_config(kernel.config)}

    def measure(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation, n: int,
                config: dict, bias: Optional[np.ndarray] = None) -> tuple[str, dict]:
        """One configuration measured as a trial is (fresh X, output
        poisoned, verified against float64, then timed in full), outside
        any search and not recorded: (status, info) with info's median_ms
        and max_rel_err.  For side-by-side variants of a winner (another
        dtype or epilogue with the same configuration)."""
        status, infos = self.measure_rounds(matrix, pattern, params, op, n, [config], 1, bias)
        return status, (infos[0][0] if status == "ok" else infos)

    def measure_rounds(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation,
                       n: int, configs: list[dict], rounds: int,
                       bias: Optional[np.ndarray] = None) -> tuple[str, object]:
        """Configurations measured side by side as `measure` measures one:
        each built once, one X, then `rounds` rounds in which every
        configuration is a trial in turn (verified, then timed).  ("ok",
        the trials' infos per configuration, in round order), or the first
        other status and its info, which names the configuration (`config`,
        canonical JSON): a probe of several configurations says which one
        failed (a compile error, a wrong result, a kernel that never
        finished)."""
        if self.worker is None:
            raise RuntimeError(f"no GPU ({self.gpu_reason}): nothing to measure on")
        fam = get_family(pattern)
        kernels = [fam.generate(matrix, op, params, c, bias=bias) for c in configs]
        built = self.compile_all(kernels)
        for config, (cubin, _, err) in zip(configs, built):
            if cubin is None:
                return "compile_fail", _naming(err, config)
        self._setup(matrix, op, n, bias)
        infos: list[list[dict]] = [[] for _ in configs]
        for _ in range(rounds):
            for config, kernel, (cubin, _, _), out in zip(configs, kernels, built, infos):
                status, info = self._trial(kernel, cubin, n, None)
                if status != "ok":
                    return status, _naming(info, config)
                out.append(info)
        return "ok", infos

    def _make_inputs(self, matrix, op, n, bias) -> tuple:
        """(X as device bytes, the checked columns, the float64 reference)
        of one (matrix, N)."""
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        rng = np.random.default_rng(seed)
        x = random_input(op, matrix.cols, n, rng)
        cols = None
        if matrix.rows * n > FULL_CHECK_LIMIT:
            cols = np.sort(rng.choice(n, size=min(n, CHECK_COLUMNS), replace=False))
        ref = reference(matrix, x, op, bias=bias, columns=cols)
        return to_device_bytes(x, op.dtype), cols, ref

    def _inputs_ahead(self, matrix, op, ns, bias) -> None:
        """Starts making the inputs of a layer's N buckets, in order, in a
        thread of their own (numpy leaves the GIL in its large
        operations): each bucket's reference is ready, or nearly, when its
        search measures its first candidate."""
        if self._input_pool is None:
            self._input_pool = ThreadPoolExecutor(1, thread_name_prefix="sf-inputs")
        for n in ns:
            key = (n, op, id(bias))
            if key not in self._inputs:
                self._inputs[key] = self._input_pool.submit(self._make_inputs, matrix, op, n, bias)

    def _setup(self, matrix, op, n, bias, timing: Optional[dict] = None):
        """X and the float64 reference of one (matrix, N), sent to the worker."""
        with self.phases("reference"):
            fut = self._inputs.pop((n, op, id(bias)), None)
            xb, cols, ref = fut.result() if fut is not None else self._make_inputs(matrix, op, n,
                                                                                   bias)
            self.worker.setup(Setup(op.dtype, op.layout, matrix.rows, n, xb, cols, ref,
                                    timing_for(timing or self.timing, n, self.device)))

    def _trial(self, kernel: Kernel, cubin: bytes, n: int, cutoff_ms: Optional[float]):
        """The worker's verdict on one compiled candidate (verified, then
        timed unless it fails), its wall time split into phases."""
        cfg = kernel.launch_config(n)
        t = Trial(kernel.name, cubin, False, cfg["grid"], cfg["block"], cfg["shared_bytes"],
                  kernel.packed, bool(kernel.launch["zero_output"]), cutoff_ms)
        t0 = time.perf_counter()
        status, info = self.worker.trial(t)
        split = info.get("phases") if isinstance(info, dict) else None
        self.phases.add_trial(time.perf_counter() - t0, split)
        return status, info

    def _record(self, fp, op_tag, n, config, status, info=None, binary_key=None, message=None):
        info = info or {}
        self.cache.put_trial(self.env_key, fp, op_tag, n, canonical_config(config), status,
                             median_ms=info.get("median_ms", math.nan),
                             p20_ms=info.get("p20_ms", math.nan),
                             p80_ms=info.get("p80_ms", math.nan),
                             min_ms=info.get("min_ms", math.nan), reps=info.get("reps", 0),
                             max_error=info.get("max_rel_err", math.nan),
                             binary_key=binary_key, message=message)

    # ---- one N bucket -------------------------------------------------------
    def warm_hints(self, job: LayerJob, n: int) -> list[dict]:
        """The winners for N of the other matrices of the same shape and
        operation (family included) measured on this GPU, the most frequent
        first (then the most recent): where this matrix's search starts."""
        shape = (job.matrix.rows, job.matrix.cols)
        same = {m["fingerprint"] for m in self.cache.matrices()
                if (m["rows"], m["cols"]) == shape and m["fingerprint"] != job.fp}
        if not same:
            return []
        count: dict = {}
        latest: dict = {}
        seen = set()
        for t in self.cache.trials(self.env_key, None, job.op_tag, n):
            # within one matrix, trials come best first: its first ok one won
            if t["matrix_fp"] in same and t["matrix_fp"] not in seen and t["status"] == "ok":
                seen.add(t["matrix_fp"])
                count[t["config"]] = count.get(t["config"], 0) + 1
                latest[t["config"]] = max(latest.get(t["config"], 0.0), t["created"])
        order = sorted(count, key=lambda c: (-count[c], -latest[c], c))
        return [json.loads(c) for c in order]

    def _search_plan(self, space_size: int, warm: bool) -> tuple[str, Budget]:
        """The strategy and budget of one search (see AUTO_* above)."""
        budget = Budget.parse(self.budget_text, space_size)
        strat = self.strategy
        if strat == "auto":
            strat = ("exhaustive" if space_size <= AUTO_EXHAUSTIVE_MAX and self.budget_text is None
                     else "greedy")
            if strat == "greedy" and budget.max_trials is None and budget.max_seconds is None:
                share, least = (WARM_SHARE, WARM_MIN) if warm else (COLD_SHARE, COLD_MIN)
                budget = Budget(max_trials=max(least, math.ceil(space_size / share)))
        return strat, budget

    def _prebuild(self, job: LayerJob, ns: list[int], ahead: bool = False) -> None:
        """Starts building the first candidates of every N bucket to search
        (the earlier matrices' winners, then the family's hints: where each
        search starts), N by N, so that the compile threads work ahead of
        the measuring thread instead of waiting for each search's batch;
        `ahead`: for a layer tuned later, behind the current layer's work."""
        for n in ns:
            hints = self.warm_hints(job, n) + job.fam.hint_configs(job.matrix, job.op,
                                                                   job.params, self.target, n=n)
            for cfg in hinted(job.space, hints)[:PREBUILD]:
                self.build(job, cfg, speculative=True, ahead=ahead)

    def _tune_n(self, job: LayerJob, n: int):
        warm = hinted(job.space, self.warm_hints(job, n))
        strat, budget = self._search_plan(len(job.space), bool(warm))
        search = _Search(self, job, n, budget)
        hints = warm + job.fam.hint_configs(job.matrix, job.op, job.params, self.target, n=n)
        get_strategy(strat).run(job.space, search, budget, seed=0, hints=hints)

        trials = self.cache.trials(self.env_key, job.fp, job.op_tag, n)
        nres = NResult(n, trials=len(trials), stopped_early=search.stopped_early,
                       filled=search.filled,
                       warm_hints=len(warm))
        nres.failed = sum(1 for t in trials if t["status"] != "ok")
        ok = [t for t in trials if t["status"] == "ok"]
        if not ok:
            return nres, None
        best = min(ok, key=lambda t: t["median_ms"])
        cfg = json.loads(best["config"])
        fut = job.built.get(config_key(cfg))
        kernel = fut.result().kernel if fut is not None and fut.done() else None
        kernel = kernel or job.generate(cfg)
        nres.config, nres.kernel_name = cfg, kernel.name
        nres.median_ms, nres.p20_ms, nres.p80_ms = best["median_ms"], best["p20_ms"], best["p80_ms"]
        nres.max_error = best["max_error"]
        return nres, kernel

    def build(self, job: LayerJob, config: dict, speculative: bool = False,
              ahead: bool = False) -> Future:
        """A future of `config`'s kernel for this layer, generated and
        compiled once for every N bucket; `speculative`: one the search
        may need later, built behind those it waits for; `ahead`: one of a
        layer tuned later, built behind those of the layer being tuned."""
        key = config_key(config)
        fut = job.built.get(key)
        if fut is None or fut.cancelled():
            fut = self.compiler.submit(lambda: job.generate(config), self.arch, speculative, ahead)
            job.built.put(key, fut)
        elif not ahead:
            self.compiler.promote(fut, speculative=speculative)
        return fut

    def _from_layer(self, job: LayerJob, n: int) -> NResult:
        """A stored winner for the table: its recorded trial (without
        `retime`, where one is recorded), else re-verified and re-timed (its
        cubin from the cache) with the quick protocol."""
        v = job.have[n]
        cfg = json.loads(v["config"])
        kernel = Kernel(v["kernel_name"], v["source"], v["packed"], v["launch"],
                        tuple(o for o in v["options"].split("\n") if o), cfg)
        nres = NResult(n, cfg, kernel.name)
        trials = self.cache.trials(self.env_key, job.fp, job.op_tag, n)
        nres.trials = len(trials)
        nres.failed = sum(1 for t in trials if t["status"] != "ok")
        if not self.retime:
            rec = next((t for t in trials if t["status"] == "ok" and t["config"] == v["config"]),
                       None)
            if rec is not None:
                nres.median_ms, nres.p20_ms, nres.p80_ms = (rec["median_ms"], rec["p20_ms"],
                                                           rec["p80_ms"])
                nres.max_error = rec["max_error"]
                nres.recorded = True
                return nres
        with self.phases("store"):
            cubin, _, err = self.compile_all([kernel])[0]
        if cubin is None:
            nres.peer_error = err
            return nres
        self._setup(job.matrix, job.op, n, job.bias, timing=QUICK_TIMING)
        status, info = self._trial(kernel, cubin, n, None)
        if status == "ok":
            nres.median_ms, nres.p20_ms, nres.p80_ms = info["median_ms"], info["p20_ms"], info["p80_ms"]
            nres.max_error = info["max_rel_err"]
        return nres

    def _time_peer(self, nres: NResult, matrix: SparseMatrix, op: Operation):
        """cuBLAS on the same shape, timed once per shape and N in a run."""
        key = (op.dtype, op.layout, matrix.rows, nres.n, matrix.cols)
        if key not in self._peers and nres.recorded:     # the winner's time is recorded: so is
            rec = next((t for t in self.cache.trials(    # cuBLAS's, measured beside it
                self.env_key, "dense", f"cublas.{op.dtype}.{op.layout}", nres.n)
                if t["status"] == "ok" and json.loads(t["config"]) == {"m": matrix.rows,
                                                                       "k": matrix.cols}), None)
            if rec is not None:
                self._peers[key] = ("ok", rec)
        if key not in self._peers:
            with self.phases("peer"):
                self._peers[key] = self.worker.peer(
                    PeerJob(op.dtype, op.layout, matrix.rows, nres.n, matrix.cols,
                            timing_for(self.timing, nres.n, self.device)))
            status, info = self._peers[key]
            if status == "ok":
                self.cache.put_trial(self.env_key, "dense", f"cublas.{op.dtype}.{op.layout}",
                                     nres.n, json.dumps({"m": matrix.rows, "k": matrix.cols}),
                                     "ok", median_ms=info["median_ms"], p20_ms=info["p20_ms"],
                                     p80_ms=info["p80_ms"], min_ms=info["min_ms"],
                                     reps=info["reps"])
        status, info = self._peers[key]
        if status == "ok":
            nres.peer_ms = info["median_ms"]
        else:
            nres.peer_error = str(info)


class _Search:
    """The `evaluate` of one (matrix, N) search (tuner/strategies): known
    trials come back as recorded; the others are built in the compile
    threads and each is measured as soon as it is compiled, while the rest
    of the batch (and what `prefetch` named) compiles."""

    def __init__(self, tuner: Tuner, job: LayerJob, n: int, budget: Budget):
        self.tuner, self.job, self.n, self.budget = tuner, job, n, budget
        self.known = {config_key(json.loads(t["config"])): t
                      for t in tuner.cache.trials(tuner.env_key, job.fp, job.op_tag, n)}
        self.best = min((t["median_ms"] for t in self.known.values() if t["status"] == "ok"),
                        default=math.inf)
        self.pending: dict = {}
        self.filled = 0             # speculative candidates measured while a batch compiled
        self.prepaid: set = set()   # ... of them, those the search has not asked for yet
        self.in_batch = 0           # trials the batch being measured adds to the budget
        self.ready = False
        self.done = 0
        self.total = budget.max_trials or len(job.space)
        self.stopped_early = 0
        self.label = f"{job.name} N={n}"

    def prefetch(self, configs: list[dict], speculative: bool = False) -> None:
        """Starts building `configs`: the strategy's next batch, or with
        `speculative` what it may ask for after that."""
        for c in configs:
            k = config_key(c)
            if k not in self.known and (k not in self.pending or not speculative):
                self.pending[k] = self.tuner.build(self.job, c, speculative)

    def __call__(self, batch: list[dict]) -> list[float]:
        out = [math.inf] * len(batch)
        waiting = {}
        keys = [config_key(c) for c in batch]
        self.in_batch = sum(1 for k in keys if k not in self.prepaid)
        self.prepaid.difference_update(keys)
        for i, c in enumerate(batch):
            k = keys[i]
            t = self.known.get(k)
            if t is not None:
                out[i] = t["median_ms"] if t["status"] == "ok" else math.inf
                continue
            fut = self.pending.pop(k, None)
            if fut is None or fut.cancelled():
                fut = self.tuner.build(self.job, c)
            else:
                self.tuner.compiler.promote(fut)     # named speculatively: waited for now
            waiting[fut] = i
        for fut in self._as_built(waiting):
            i = waiting[fut]
            out[i] = self._measure(batch[i], fut.result())
        self.budget.trials += self.in_batch
        self.in_batch = 0
        return out

    def _as_built(self, futures):
        """The futures as they complete.  While none of them is built, the
        GPU measures a speculative candidate that is (`_fill`: the search
        would ask for it later, and then finds it measured); the time
        spent waiting with nothing to measure is the "wait" phase."""
        left = set(futures)
        while left:
            done = [f for f in left if f.done()]
            if not done:
                if self._fill():
                    continue
                t0 = time.perf_counter()
                try:
                    done, _ = wait(left, return_when=FIRST_COMPLETED)
                finally:
                    self.tuner.phases.add("wait", time.perf_counter() - t0, self.label)
            for fut in done:
                left.discard(fut)
                yield fut

    def _fill(self) -> bool:
        """Measures one built speculative candidate (the earliest named),
        recorded like any trial and kept in `known` for when the search
        asks for it; False when none is built, or when the budget has no
        room for one more.  It is a trial of the budget when measured (not
        again when asked for): a search measures no more than its budget."""
        cap = self.budget.max_trials
        if cap is not None and self.budget.trials + self.in_batch >= cap:
            return False
        for k, fut in self.pending.items():
            if (fut.done() and not fut.cancelled() and fut.exception() is None
                    and k not in self.known):   # (a build that raised is the asker's to see)
                break
        else:
            return False
        del self.pending[k]
        value = self._measure(dict(k), fut.result())     # (a key is the sorted items)
        self.known[k] = {"status": "ok" if math.isfinite(value) else "failed",
                         "median_ms": value}
        self.filled += 1
        self.prepaid.add(k)
        self.budget.trials += 1
        return True

    def _measure(self, config: dict, built: Built) -> float:
        """Verifies and times one built candidate, records the trial; its
        median or inf."""
        t, job, n = self.tuner, self.job, self.n
        if built.kernel is None:      # the family refused the configuration
            t._record(job.fp, job.op_tag, n, config, "compile_fail", message=built.error)
            return math.inf
        if built.data is None:
            t._record(job.fp, job.op_tag, n, config, "compile_fail", binary_key=built.hexkey,
                      message=built.error[:4000])
            return math.inf
        if not self.ready:
            t._setup(job.matrix, job.op, n, job.bias)
            self.ready = True
        cutoff = (t.early_stop * self.best
                  if t.early_stop and math.isfinite(self.best) else None)
        status, info = t._trial(built.kernel, built.data, n, cutoff)
        value = math.inf
        if status == "ok":
            message = None
            if info.get("stopped_early"):
                self.stopped_early += 1
                message = (f"stopped early after {info['reps']} repetitions: p20 "
                           f"{info['p20_ms']:.4g} ms > {info['cutoff_ms']:.4g} ms "
                           f"({t.early_stop:g} x the best median so far); verified")
            t._record(job.fp, job.op_tag, n, config, "ok", info, built.hexkey, message=message)
            value = info["median_ms"]
            self.best = min(self.best, value)
        elif status == "wrong":
            t._record(job.fp, job.op_tag, n, config, "wrong", info, built.hexkey,
                      message=f"error {info['norm_rel_err']:.3g} > tol {info['tol']:.3g}, "
                              f"{info['unwritten']} unwritten")
        else:
            t._record(job.fp, job.op_tag, n, config, status, None, built.hexkey,
                      message=str(info)[:4000])
        self.done += 1
        t.progress(self.label, self.done, self.total)
        return value
