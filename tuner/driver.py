"""The measurement driver: for one matrix, family and operation, search the
configurations for each N, compile in parallel, measure serially in the
worker process, verify every candidate, record every trial in the cache and
store the winners as a layer the runtime can open by name.

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
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from .. import GENERATOR_VERSION
from ..generator.families import get_family
from ..generator.kernel import ConfigError, Kernel, Operation, canonical_config, reference
from ..generator.matrix import SparseMatrix, to_device_bytes
from .execute import random_input
from .strategies import Budget, config_key, get_strategy, hinted
from .worker import PeerJob, Setup, Trial, Worker

# Y elements verified in full below this; above it, CHECK_COLUMNS random columns.
FULL_CHECK_LIMIT = 1 << 21
CHECK_COLUMNS = 32
DEFAULT_TIMING = {"warmup": 3, "min_reps": 30, "max_reps": 1000, "min_total_ms": 100.0,
                  "flush_l2": True}
# Configurations compiled per layer and architecture where no GPU can
# measure them, and the architectures they are compiled for (Ampere and
# Hopper; --arch names others).
NO_GPU_COMPILES = 8
NO_GPU_ARCHS = ("sm_80", "sm_90a")
QUICK_TIMING = {"warmup": 2, "min_reps": 10, "max_reps": 200, "min_total_ms": 15.0,
                "flush_l2": True}


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

    @property
    def speedup(self) -> float:
        return self.peer_ms / self.median_ms if self.median_ms > 0 else math.nan


@dataclass
class LayerResult:
    name: str
    family_tag: str
    op_tag: str
    matrix: SparseMatrix
    per_n: dict = field(default_factory=dict)
    compiled: int = 0
    from_cache: bool = False
    measured: bool = True
    note: str = ""


def target_of_arch(arch: str) -> dict:
    """A device description from an arch name alone ("sm_90a" -> compute
    capability 9.0), for generating kernels with no GPU present."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", arch or "")
    if not m:
        return {"arch": arch}
    return {"arch": arch, "cc_major": int(m.group(1)), "cc_minor": int(m.group(2))}


def _binary_key(source: str, options: str, arch: str, nvrtc: str) -> dict:
    return {"source": source, "options": options, "arch": arch, "nvrtc_version": nvrtc,
            "generator_version": GENERATOR_VERSION, "ptx": False}


def untuned_gpu_name(arch: str) -> str:
    """The GPU name a layer compiled without a GPU is stored under."""
    return f"untuned ({arch})"


class Tuner:
    """Tunes matrices into one cache.  Without a GPU it generates and
    compiles for `arch` (a comma-separated list; default NO_GPU_ARCHS),
    stores the binaries and an untuned layer per architecture, and measures
    nothing."""

    def __init__(self, cache, arch: Optional[str] = None, strategy: str = "auto",
                 budget: Optional[str] = None, jobs: Optional[int] = None,
                 timing: Optional[dict] = None, worker_timeout: float = 60.0,
                 progress: Optional[Callable[[str, int, int], None]] = None,
                 seed: Optional[int] = None, peer: bool = True, worker=None):
        """`worker` replaces the measurement process (tests replay recorded
        timings through it); with one, the tuner measures as on a GPU."""
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
        self.gpu, self.gpu_reason = (True, "") if worker is not None else native.gpu_available()
        self.worker = worker
        self.device = None
        if self.gpu:
            self.worker = worker or Worker(timeout_s=worker_timeout)
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
        self.nvrtc = "%d.%d" % native.nvrtc_version()
        self._local = threading.local()
        self.compiled = 0
        self.recompiled_corrupt = 0     # stored cubins that failed their sha256, replaced

    def close(self, kill: bool = False):
        """Ends the measurement worker (at once with `kill`: on an interrupt)."""
        if self.worker is not None:
            self.worker.close(kill=kill)

    # ---- compilation ------------------------------------------------------
    def _ctx(self):
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = self.native.Context(0)
        return ctx

    def _compile_one(self, kernel: Kernel, arch: str):
        """(cubin, binary key hex, error, key of a fresh compilation or None
        when the cubin came from the cache, whether a corrupt stored cubin
        was replaced).  Runs in the compile threads; the Cache binding
        serializes its calls."""
        from ..cache import CorruptError, binary_key_hex
        ctx = self._ctx()
        options = ctx.canonical_options(arch, ptx=False, options=kernel.options)
        key = _binary_key(kernel.source, options, arch, self.nvrtc)
        hexkey = binary_key_hex(key)
        corrupt = False
        try:
            data = self.cache.get_binary(key)
        except CorruptError:  # recompiled (and replaced, and reported), never loaded
            data, corrupt = None, True
        if data is not None:
            return data, hexkey, "", None, False
        try:
            binary = ctx.compile(kernel.source, name=kernel.name + ".cu", arch=arch,
                                 options=kernel.options)
        except Exception as e:  # noqa: BLE001 - recorded as compile_fail
            return None, hexkey, str(e), None, corrupt
        return binary.data, hexkey, "", key, corrupt

    def compile_all(self, kernels: list[Kernel], arch: Optional[str] = None,
                    label: str = "") -> list[tuple[Optional[bytes], str, str]]:
        """Compiles in parallel what the cache lacks for `arch` (default: the
        tuner's) and stores each binary as soon as it is compiled, so that
        an interrupted run keeps them; (cubin or None, binary key hex,
        error) per kernel.  With `label`, the progress bar counts them."""
        arch = arch or self.arch
        results: list = [None] * len(kernels)
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            futures = {pool.submit(self._compile_one, k, arch): i for i, k in enumerate(kernels)}
            for done, fut in enumerate(as_completed(futures), 1):
                data, hexkey, err, fresh_key, corrupt = fut.result()
                if fresh_key is not None:
                    self.cache.put_binary(fresh_key, data)   # its own transaction: kept
                    self.compiled += 1
                    self.recompiled_corrupt += corrupt
                results[futures[fut]] = (data, hexkey, err)
                if label:
                    self.progress(label, done, len(kernels))
        except BaseException:
            # an interrupt: stop at once; compilations already running finish
            # in their threads but nothing waits for them
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return results

    # ---- one matrix ---------------------------------------------------------
    def tune(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation,
             ns: list[int], name: str, bias: Optional[np.ndarray] = None,
             force: bool = False) -> LayerResult:
        fam = get_family(pattern)
        tag = fam.tag(params)
        op_tag = op.tag(tag)
        fp = matrix.fingerprint()
        result = LayerResult(name, tag, op_tag, matrix)
        self.cache.put_matrix(fp, matrix.rows, matrix.cols, matrix.nnz, matrix.dtype,
                              json.dumps({"name": name, "pattern": tag,
                                          "synthetic_values": matrix.values_synthetic}))
        if not self.gpu:
            return self._compile_only(fam, matrix, op, params, ns, name, bias, fp, op_tag,
                                      result)
        space = fam.search_space(matrix, op, params, self.target)
        if not space:
            raise ConfigError(f"{tag}: no valid configuration for this matrix and GPU")
        compiled_before = self.compiled
        # N buckets: those the stored layer has are re-timed from it (unless
        # forced), the others tuned and added beside them
        existing = self._existing_layer(name, fp, op_tag)
        have = {v["n_bucket"]: v for v in existing["variants"]} if existing else {}
        fresh = {}
        for n in ns:
            if n in have and not force:
                nres, kernel = self._from_layer(have[n], n, matrix, op, bias, fp, op_tag)
                result.from_cache = True
            else:
                nres, kernel = self._tune_n(fam, matrix, op, params, n, bias, space, fp, op_tag, name)
                if kernel is not None:
                    fresh[n] = self._variant(kernel, n)
            if self.peer:
                self._time_peer(nres, matrix, op)
            result.per_n[n] = nres
        if fresh:
            kept = [v for b, v in have.items() if b not in fresh]
            variants = sorted(kept + list(fresh.values()), key=lambda v: v["n_bucket"])
            self.cache.put_layer(name, self.device["name"], fp, op_tag, matrix.rows, matrix.cols,
                                 op.elem_size, op.elem_size, variants)
        result.compiled = self.compiled - compiled_before
        return result

    def _compile_only(self, fam, matrix, op, params, ns, name, bias, fp, op_tag, result):
        """No GPU: nothing can be measured.  For each architecture, compile
        the family's hints and a spread of the rest of the space (the
        budget's worth, NO_GPU_COMPILES by default), and store an untuned
        layer whose every N bucket runs the default configuration, so that
        the database holds the compiled kernels and `cache show` names
        them.  Says so in the result's note."""
        result.measured = False
        compiled_before = self.compiled
        notes = []
        for arch in self.archs:
            target = target_of_arch(arch)
            space = fam.search_space(matrix, op, params, target)
            if not space:
                notes.append(f"{arch}: no valid configuration")
                continue
            budget = Budget.parse(self.budget_text, len(space)).max_trials or NO_GPU_COMPILES
            spread = [space[round(i * (len(space) - 1) / max(1, budget - 1))]
                      for i in range(min(budget, len(space)))]
            picks = hinted(space, fam.hint_configs(matrix, op, params, target))[:budget]
            picks += [c for c in spread if c not in picks][:budget - len(picks)]
            kernels = [fam.generate(matrix, op, params, c, bias=bias) for c in picks]
            res = self.compile_all(kernels, arch, label=f"{name} {arch}")
            bad = sum(1 for d, _, _ in res if d is None)
            notes.append(f"{arch}: {len(picks) - bad} of {len(space)} configurations compiled"
                         + (f" ({bad} failed)" if bad else ""))
            default = kernels[0] if res[0][0] is not None else None
            if default is not None:
                self.cache.put_layer(name, untuned_gpu_name(arch), fp, op_tag, matrix.rows,
                                     matrix.cols, op.elem_size, op.elem_size,
                                     [self._variant(default, n) for n in sorted(set(ns))])
        result.note = "no GPU, measured nothing; " + "; ".join(notes)
        result.compiled = self.compiled - compiled_before
        return result

    def _existing_layer(self, name, fp, op_tag):
        """The stored layer `name` of this GPU, matrix and operation, or None
        (a layer of another matrix or operation is replaced, not extended)."""
        for rec in self.cache.layers(name):
            if (rec["gpu_name"] == self.device["name"] and rec["matrix_fp"] == fp
                    and rec["op"] == op_tag and not rec.get("problem")):
                return rec
        return None

    def _variant(self, kernel: Kernel, n: int) -> dict:
        return {"n_bucket": n, "source": kernel.source, "kernel_name": kernel.name,
                "options": "\n".join(kernel.options), "generator_version": GENERATOR_VERSION,
                "launch": kernel.launch, "packed": kernel.packed,
                "config": canonical_config(kernel.config)}

    def measure(self, matrix: SparseMatrix, pattern: str, params: dict, op: Operation, n: int,
                config: dict, bias: Optional[np.ndarray] = None) -> tuple[str, dict]:
        """One configuration measured as a trial is (fresh X, output
        poisoned, verified against float64, then timed), outside any search
        and not recorded: (status, info) with info's median_ms and
        max_rel_err.  For side-by-side variants of a winner (another dtype
        or epilogue with the same configuration)."""
        if self.worker is None:
            raise RuntimeError(f"no GPU ({self.gpu_reason}): nothing to measure on")
        fam = get_family(pattern)
        kernel = fam.generate(matrix, op, params, config, bias=bias)
        (cubin, _, err), = self.compile_all([kernel])
        if cubin is None:
            return "compile_fail", {"message": err}
        self._n = n
        self._setup(matrix, op, n, bias)
        return self._measure(kernel, cubin)

    def _setup(self, matrix, op, n, bias):
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        rng = np.random.default_rng(seed)
        x = random_input(op, matrix.cols, n, rng)
        cols = None
        if matrix.rows * n > FULL_CHECK_LIMIT:
            cols = np.sort(rng.choice(n, size=min(n, CHECK_COLUMNS), replace=False))
        ref = reference(matrix, x, op, bias=bias, columns=cols)
        self.worker.setup(Setup(op.dtype, op.layout, matrix.rows, n,
                                to_device_bytes(x, op.dtype), cols, ref, self.timing))

    def _measure(self, kernel: Kernel, cubin: bytes):
        cfg = kernel.launch_config(self._n)
        t = Trial(kernel.name, cubin, False, cfg["grid"], cfg["block"], cfg["shared_bytes"],
                  kernel.packed, bool(kernel.launch["zero_output"]))
        return self.worker.trial(t)

    def _record(self, fp, op_tag, n, config, status, info=None, binary_key=None, message=None):
        info = info or {}
        self.cache.put_trial(self.env_key, fp, op_tag, n, canonical_config(config), status,
                             median_ms=info.get("median_ms", math.nan),
                             p20_ms=info.get("p20_ms", math.nan),
                             p80_ms=info.get("p80_ms", math.nan),
                             min_ms=info.get("min_ms", math.nan), reps=info.get("reps", 0),
                             max_error=info.get("max_rel_err", math.nan),
                             binary_key=binary_key, message=message)

    def _tune_n(self, fam, matrix, op, params, n, bias, space, fp, op_tag, name):
        known = {}
        for t in self.cache.trials(self.env_key, fp, op_tag, n):
            known[config_key(json.loads(t["config"]))] = t
        self._n = n
        nres = NResult(n)
        ready = {"setup": False}
        kernels: dict = {}

        def evaluate(batch: list[dict]) -> list[float]:
            out = [None] * len(batch)
            todo = []
            for i, c in enumerate(batch):
                t = known.get(config_key(c))
                if t is not None:
                    out[i] = t["median_ms"] if t["status"] == "ok" else math.inf
                else:
                    todo.append(i)
            gen = []
            for i in todo:
                try:
                    gen.append((i, fam.generate(matrix, op, params, batch[i], bias=bias)))
                except ConfigError as e:
                    self._record(fp, op_tag, n, batch[i], "compile_fail", message=str(e))
                    out[i] = math.inf
            compiled = self.compile_all([k for _, k in gen]) if gen else []
            for (i, kernel), (cubin, hexkey, err) in zip(gen, compiled):
                kernels[config_key(batch[i])] = kernel
                if cubin is None:
                    self._record(fp, op_tag, n, batch[i], "compile_fail", binary_key=hexkey,
                                 message=err[:4000])
                    out[i] = math.inf
                    continue
                if not ready["setup"]:
                    self._setup(matrix, op, n, bias)
                    ready["setup"] = True
                status, info = self._measure(kernel, cubin)
                if status == "ok":
                    self._record(fp, op_tag, n, batch[i], "ok", info, hexkey)
                    out[i] = info["median_ms"]
                elif status == "wrong":
                    self._record(fp, op_tag, n, batch[i], "wrong", info, hexkey,
                                 message=f"error {info['norm_rel_err']:.3g} > tol {info['tol']:.3g}, "
                                         f"{info['unwritten']} unwritten")
                    out[i] = math.inf
                else:
                    self._record(fp, op_tag, n, batch[i], status, None, hexkey, message=str(info)[:4000])
                    out[i] = math.inf
                self._done += 1
                self.progress(f"{name} N={n}", self._done, self._total)
            budget.trials += len(batch)
            return out

        budget = Budget.parse(self.budget_text, len(space))
        strat = self.strategy
        if strat == "auto":
            strat = "exhaustive" if len(space) <= 48 and self.budget_text is None else "greedy"
            if strat == "greedy" and budget.max_trials is None and budget.max_seconds is None:
                budget = Budget(max_trials=max(8, math.ceil(len(space) / 4)))
        self._done = 0
        self._total = budget.max_trials or len(space)
        get_strategy(strat).run(space, evaluate, budget, seed=0,
                                hints=fam.hint_configs(matrix, op, params, self.target))

        trials = self.cache.trials(self.env_key, fp, op_tag, n)
        nres.trials = len(trials)
        nres.failed = sum(1 for t in trials if t["status"] != "ok")
        ok = [t for t in trials if t["status"] == "ok"]
        if not ok:
            return nres, None
        best = min(ok, key=lambda t: t["median_ms"])
        cfg = json.loads(best["config"])
        kernel = kernels.get(config_key(cfg)) or fam.generate(matrix, op, params, cfg, bias=bias)
        nres.config, nres.kernel_name = cfg, kernel.name
        nres.median_ms, nres.p20_ms, nres.p80_ms = best["median_ms"], best["p20_ms"], best["p80_ms"]
        nres.max_error = best["max_error"]
        return nres, kernel

    def _from_layer(self, v, n, matrix, op, bias, fp, op_tag):
        """Re-times a stored winner `v` (its cubin from the cache) for the table."""
        cfg = json.loads(v["config"])
        kernel = Kernel(v["kernel_name"], v["source"], v["packed"], v["launch"],
                        tuple(o for o in v["options"].split("\n") if o), cfg)
        nres = NResult(n, cfg, kernel.name)
        cubin, _, err = self.compile_all([kernel])[0]
        if cubin is None:
            nres.peer_error = err
            return nres, kernel
        self._n = n
        self._setup(matrix, op, n, bias)
        status, info = self._measure(kernel, cubin)
        if status == "ok":
            nres.median_ms, nres.p20_ms, nres.p80_ms = info["median_ms"], info["p20_ms"], info["p80_ms"]
            nres.max_error = info["max_rel_err"]
        trials = self.cache.trials(self.env_key, fp, op_tag, n)
        nres.trials = len(trials)
        nres.failed = sum(1 for t in trials if t["status"] != "ok")
        return nres, kernel

    def _time_peer(self, nres: NResult, matrix: SparseMatrix, op: Operation):
        status, info = self.worker.peer(PeerJob(op.dtype, op.layout, matrix.rows, nres.n,
                                                matrix.cols, self.timing))
        if status == "ok":
            nres.peer_ms = info["median_ms"]
            self.cache.put_trial(self.env_key, "dense", f"cublas.{op.dtype}.{op.layout}",
                                 nres.n, json.dumps({"m": matrix.rows, "k": matrix.cols}), "ok",
                                 median_ms=info["median_ms"], p20_ms=info["p20_ms"],
                                 p80_ms=info["p80_ms"], min_ms=info["min_ms"], reps=info["reps"])
        else:
            nres.peer_error = str(info)
