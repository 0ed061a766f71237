"""Generating and compiling kernels in a thread pool, into the cache.

The measuring thread asks for a kernel by configuration and gets a future;
the pool generates it (the family's plan, packing and rendering) and
compiles it with NVRTC while the worker measures earlier candidates.  Each
binary is stored as soon as it is compiled (its own transaction, so an
interrupted run keeps it) and a binary already in the cache is not compiled
again: a kernel whose source depends only on shapes and configuration is
compiled once for every matrix of that shape.  Several tuners (one per GPU)
may share one Compiler.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Optional

from .. import GENERATOR_VERSION
from ..generator.kernel import ConfigError, Kernel
from .phases import Phases


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


class Compiler:
    """A pool of `jobs` threads that generate and compile kernels into
    `cache`; counts what it compiled and the background phases."""

    def __init__(self, cache, jobs: int, phases: Optional[Phases] = None):
        from .. import native
        self.native = native
        self.cache = cache
        self.jobs = jobs
        self.phases = phases or Phases()
        self.nvrtc = "%d.%d" % native.nvrtc_version()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self.compiled = 0
        self.recompiled_corrupt = 0     # stored cubins that failed their sha256, replaced

    # ---- the pool ---------------------------------------------------------
    def submit(self, make: Callable[[], Kernel], arch: str) -> Future:
        """A future of the Built kernel `make()` returns, compiled for `arch`."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.jobs,
                                                thread_name_prefix="sf-compile")
            return self._pool.submit(self._build, make, arch)

    def close(self, kill: bool = False) -> None:
        """Ends the pool: at once with `kill` (an interrupt: compilations
        already running finish in their threads, nothing waits for them)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=not kill, cancel_futures=True)

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
            self.phases.add("compile", time.perf_counter() - t0)
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
        try:
            binary = ctx.compile(kernel.source, name=kernel.name + ".cu", arch=arch,
                                 options=kernel.options)
        except Exception as e:  # noqa: BLE001 - recorded as compile_fail
            return None, hexkey, str(e)
        self.cache.put_binary(key, binary.data)   # its own transaction: kept
        with self._lock:
            self.compiled += 1
            self.recompiled_corrupt += corrupt
        return binary.data, hexkey, ""
