"""Generating and compiling kernels in a thread pool, into the cache.

The measuring thread asks for a kernel by configuration and gets a future;
the pool generates it (the family's plan, packing and rendering) and
compiles it with NVRTC while the worker measures earlier candidates.  Each
binary is stored as soon as it is compiled (its own transaction, so an
interrupted run keeps it) and a binary already in the cache is not compiled
again: a kernel whose source depends only on shapes and configuration is
compiled once for every matrix of that shape.  Several tuners (one per GPU)
may share one Compiler.  With many jobs, NVRTC itself runs in a pool of
processes (the threads plan, render, look up and store): in one process
it stopped gaining beyond four threads.

Work is taken by priority: what a search waits for first, then what it
may need next (`speculative`: the neighbours of its best so far, the
first candidates of the buckets still to come), then the first
candidates of a layer tuned later (`ahead`), in order of asking within
each; asking again at a higher priority for a kernel still queued moves
it ahead (`promote`).  The threads are
otherwise idle most of a search (each greedy round waits for one
compilation), so speculating costs the measuring thread nothing.
"""
from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable, Optional

from .. import GENERATOR_VERSION
from ..generator.kernel import ConfigError, Kernel
from .phases import Phases, trace


@dataclass
class Built:
    """A generated and compiled kernel: `data` is the cubin, or None with
    `error` (a configuration the family refused, when `kernel` is None, or
    NVRTC's log)."""
    kernel: Optional[Kernel]
    data: Optional[bytes]
    hexkey: Optional[str]
    error: str = ""


def binary_key(source: str, options: str, arch: str, nvrtc: str) -> dict:
    return {"source": source, "options": options, "arch": arch, "nvrtc_version": nvrtc,
            "generator_version": GENERATOR_VERSION, "ptx": False}


class _Task:
    """A kernel to build: its future, how to make it, for which
    architecture; its queue priority (`level`: URGENT once anyone waits
    for it), `taken` once a thread has it (a promoted task is queued
    twice: the second entry finds it taken)."""
    __slots__ = ("future", "make", "arch", "level", "taken", "asked")

    def __init__(self, make: Callable[[], Kernel], arch: str, level: int):
        self.future: Future = Future()
        self.make, self.arch, self.level, self.taken = make, arch, level, False
        self.asked = time.perf_counter()


STOP, URGENT, SPECULATIVE, AHEAD = 0, 1, 2, 3   # queue priorities (lowest first)
LEVEL_NAMES = {URGENT: "urgent", SPECULATIVE: "speculative", AHEAD: "ahead"}
# More compile jobs than this: NVRTC runs in processes (see Compiler).
PROCESSES_ABOVE = 4


class Compiler:
    """A pool of `jobs` threads that generate and compile kernels into
    `cache`; counts what it compiled and the background phases."""

    def __init__(self, cache, jobs: int, phases: Optional[Phases] = None,
                 processes: Optional[bool] = None):
        """`processes`: NVRTC runs in a pool of `jobs` processes (default:
        where jobs > PROCESSES_ABOVE; threads of one process stopped
        gaining beyond four on a 16-core H100 host: 14 kernels/s from 4
        threads to 16, against 0.55 s per kernel in one)."""
        from .. import native
        self.native = native
        self.cache = cache
        self.jobs = jobs
        self.phases = phases or Phases()
        self.nvrtc = "%d.%d" % native.nvrtc_version()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._waiting: dict = {}        # future -> its _Task, until a thread takes it
        self._generation = 0            # bumped by close: the threads of before stop
        self.compiled = 0
        self.recompiled_corrupt = 0     # stored cubins that failed their sha256, replaced
        self.processes = jobs > PROCESSES_ABOVE if processes is None else processes
        self._procs: Optional[ProcessPoolExecutor] = None
        self._procs_broken = False

    # ---- the pool ---------------------------------------------------------
    def submit(self, make: Callable[[], Kernel], arch: str, speculative: bool = False,
               ahead: bool = False) -> Future:
        """A future of the Built kernel `make()` returns, compiled for
        `arch`; `speculative`: behind every kernel asked for without it;
        `ahead` (for a layer not being tuned yet): behind those too."""
        level = AHEAD if ahead else SPECULATIVE if speculative else URGENT
        task = _Task(make, arch, level)
        with self._lock:
            while len(self._threads) < self.jobs:
                t = threading.Thread(target=self._serve, args=(self._generation,), daemon=True,
                                     name=f"sf-compile-{len(self._threads)}")
                t.start()
                self._threads.append(t)
            self._waiting[task.future] = task
            self._queue.put((level, next(self._order), task))
        return task.future

    def promote(self, fut: Future, speculative: bool = False) -> None:
        """Moves a kernel not yet taken ahead of those of lower priority:
        someone waits for it now (or, `speculative`, a search may)."""
        level = SPECULATIVE if speculative else URGENT
        with self._lock:
            task = self._waiting.get(fut)
            if task is not None and task.level > level:
                task.level = level
                self._queue.put((level, next(self._order), task))

    def close(self, kill: bool = False) -> None:
        """Ends the pool: what is queued is cancelled; compilations already
        running finish (waited for, unless `kill`: an interrupt)."""
        with self._lock:
            threads, self._threads = self._threads, []
            for task in self._waiting.values():
                task.taken = True
                task.future.cancel()
            self._waiting.clear()
            self._generation += 1
            for _ in threads:
                self._queue.put((STOP, next(self._order), None))
            procs, self._procs = self._procs, None
        if not kill:
            for t in threads:
                t.join()
        if procs is not None:
            procs.shutdown(wait=not kill, cancel_futures=True)

    def _serve(self, generation: int) -> None:
        while generation == self._generation:
            _, _, task = self._queue.get()
            if task is None:
                if generation == self._generation:   # a stop meant for older threads
                    continue
                return
            with self._lock:
                if task.taken:
                    continue
                task.taken = True
                self._waiting.pop(task.future, None)
            if not task.future.set_running_or_notify_cancel():
                continue        # cancelled while queued
            trace("queued", task.asked, time.perf_counter(), LEVEL_NAMES[task.level])
            try:
                task.future.set_result(self._build(task.make, task.arch))
            except BaseException as e:  # noqa: BLE001 - the asker gets it
                task.future.set_exception(e)

    def compile_all(self, kernels: list[Kernel], arch: str,
                    progress: Optional[Callable[[int, int], None]] = None) -> list[Built]:
        """Compiles `kernels` in parallel (what the cache lacks); one Built
        per kernel, in order.  `progress(done, total)` as they complete."""
        futures = {self.submit(lambda k=k: k, arch): i for i, k in enumerate(kernels)}
        results: list = [None] * len(kernels)
        try:
            for done, fut in enumerate(as_completed(futures), 1):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(done, len(kernels))
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return results

    # ---- in the threads -----------------------------------------------------
    def _ctx(self):
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = self.native.Context(0)
        return ctx

    def _build(self, make: Callable[[], Kernel], arch: str) -> Built:
        t0 = time.perf_counter()
        try:
            kernel = make()
        except ConfigError as e:
            return Built(None, None, None, str(e))
        finally:
            self.phases.add("plan", time.perf_counter() - t0)
        t0 = time.perf_counter()
        try:
            data, hexkey, err = self._compile(kernel, arch)
        finally:
            self.phases.add("compile", time.perf_counter() - t0, kernel.name)
        return Built(kernel, data, hexkey, err)

    def _compile(self, kernel: Kernel, arch: str):
        """(cubin or None, binary key hex, error): from the cache, else
        compiled and stored at once."""
        from ..cache import CorruptError, binary_key_hex
        ctx = self._ctx()
        options = ctx.canonical_options(arch, ptx=False, options=kernel.options)
        key = binary_key(kernel.source, options, arch, self.nvrtc)
        hexkey = binary_key_hex(key)
        corrupt = False
        try:
            data = self.cache.get_binary(key)
        except CorruptError:  # recompiled (and replaced, and reported), never loaded
            data, corrupt = None, True
        if data is not None:
            return data, hexkey, ""
        args = (kernel.source, kernel.name + ".cu", arch, tuple(kernel.options))
        pool = self._processes()
        data = err = None
        if pool is not None:
            try:
                data, err = pool.submit(nvrtc_compile, *args).result()
            except (BrokenProcessPool, OSError):    # a process died: the threads compile
                with self._lock:
                    self._procs_broken = True
            except RuntimeError:                    # the pool was closed meanwhile
                pass
        if data is None and err is None:
            data, err = nvrtc_compile(*args, ctx=ctx)
        if data is None:
            return None, hexkey, err                # recorded as compile_fail
        self.cache.put_binary(key, data)   # its own transaction: kept
        with self._lock:
            self.compiled += 1
            self.recompiled_corrupt += corrupt
        return data, hexkey, ""

    def _processes(self) -> Optional[ProcessPoolExecutor]:
        """The pool of compiling processes, started at the first use; None
        where the threads compile themselves."""
        if not self.processes or self._procs_broken:
            return None
        with self._lock:
            if self._procs is None:
                # spawn: this process holds threads (a fork would copy their locks)
                self._procs = ProcessPoolExecutor(self.jobs,
                                                  mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_ignore_interrupts)
            return self._procs


_PROCESS_CTX = None


def _ignore_interrupts() -> None:
    """A compiling process leaves Ctrl-C to the tuner (which ends the pool)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def nvrtc_compile(source: str, name: str, arch: str, options: tuple, ctx=None):
    """(cubin, None) or (None, NVRTC's error): in a compiling process (its
    own context, made at the first call) or with `ctx`."""
    global _PROCESS_CTX
    if ctx is None:
        if _PROCESS_CTX is None:
            from .. import native
            _PROCESS_CTX = native.Context(0)
        ctx = _PROCESS_CTX
    try:
        return ctx.compile(source, name=name, arch=arch, options=options).data, None
    except Exception as e:  # noqa: BLE001 - the caller records it
        return None, str(e)
