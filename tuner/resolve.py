"""The kernels a framework runs for a model's layers: for each layer (an
Entry of tuner/model.py: its weights, bias, pattern and operation), the
record of the database that serves the GPU at hand, tuning what the
database lacks, then the layer's kernels made for its own weights and bias
from the record's configurations, with their cubins (from the database,
else compiled here: never when the layer runs).

Which record serves an architecture (`record_for_arch`, shared with
`sparseforge export`): the layer tuned on this very GPU, else tuned on
another GPU of the architecture, else its untuned record for it (made by
`tune` without a GPU).  A record serves a layer only when it was made for
the same matrix (fingerprint) and operation.

The kernels are made again from the configurations rather than taken as
stored, because the matrix fingerprint that keys a record does not cover
the bias: two layers with one weight and different biases share trials,
never packed bytes.  Making them is the family's plan and render, and the
cubin of an unchanged source comes from the database.
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..generator.families import family_of
from ..generator.kernel import canonical_config
from .driver import NO_GPU_ARCHS, Tuner
from .model import Entry, tune_entry


class MissingLayersError(LookupError):
    """Layers the database holds no usable record of (with tune=False)."""

    def __init__(self, message: str, names: list):
        super().__init__(message)
        self.names = list(names)


@dataclass
class VariantCode:
    """One N bucket of a layer, ready to load: the kernel, its launch
    record, the packed weights it reads and its cubin; the times measured
    when it was tuned (NaN where nothing was measured)."""
    n_bucket: int
    kernel_name: str
    launch: dict
    config: dict
    packed: bytes
    cubin: bytes
    median_ms: float = math.nan
    peer_ms: float = math.nan
    layout: str = "fm"           # X and Y as the kernel takes them: the entry's operation's
                                 # ("dense": no kernel, cuBLAS serves the bucket; see
                                 # sparseforge/torch/convert.py)
    sparse_ms: float = math.nan  # "dense": the time of the sparse kernel that lost

    @property
    def speedup(self) -> float:
        return self.peer_ms / self.median_ms if self.median_ms > 0 else math.nan

    @property
    def sparse_speedup(self) -> float:
        """A "dense" variant's: the speedup of the kernel that lost."""
        return self.peer_ms / self.sparse_ms if self.sparse_ms > 0 else math.nan


@dataclass
class ArchCode:
    """A layer's kernels for one architecture, from the record of `gpu_name`
    (a GPU's name, or "untuned (sm_90a)")."""
    arch: str
    gpu_name: str
    variants: list = field(default_factory=list)

    @property
    def tuned(self) -> bool:
        return not self.gpu_name.startswith("untuned")


@dataclass
class LayerCode:
    entry: Entry
    archs: dict = field(default_factory=dict)     # arch -> ArchCode
    tuned_now: bool = False


def arch_of_record(rec: dict, env_arch: dict) -> Optional[str]:
    """The architecture a layer record is for: an untuned record's own, else
    that of the GPU it was tuned on (None when the database lacks the
    GPU's environment)."""
    m = re.fullmatch(r"untuned \((sm_\w+)\)", rec["gpu_name"])
    return m.group(1) if m else env_arch.get(rec["gpu_name"])


def record_for_arch(records: list, arch: str, env_arch: dict,
                    gpu_name: Optional[str] = None) -> Optional[dict]:
    """The record that serves `arch`: the one tuned on `gpu_name` (a GPU of
    that architecture, when given), else one tuned on a GPU of the
    architecture, else the untuned one; None when none is for it."""
    exact = [r for r in records if gpu_name is not None and r["gpu_name"] == gpu_name]
    recs = exact or [r for r in records if arch_of_record(r, env_arch) == arch]
    tuned = [r for r in recs if not r["gpu_name"].startswith("untuned")]
    return (tuned or recs or [None])[0]


def env_archs(cache) -> dict:
    """GPU name -> architecture, from the environments the database holds."""
    return {e["name"]: e["arch"] for e in cache.envs() if e.get("arch")}


def op_tag(entry: Entry) -> str:
    """The operation string the entry's records and trials carry."""
    fam, params = family_of(entry.pattern)
    return entry.op.tag(fam.tag(params))


def _usable(cache, entry: Entry) -> list:
    """The records of the entry's name made for its matrix and operation."""
    fp, tag = entry.get_matrix().fingerprint(), op_tag(entry)
    return [r for r in cache.layers(entry.name)
            if not r["problem"] and r["matrix_fp"] == fp and r["op"] == tag]


def _missing_buckets(recs: list, ns: list, device: Optional[dict], archs: list,
                     env_arch: dict) -> list:
    """The N buckets tuning must add: with a GPU, those the record tuned
    on it lacks; without one, all of them where an architecture has no
    record (compiling, untuned)."""
    if device:
        have = next((r for r in recs if r["gpu_name"] == device["name"]), None)
        stored = {v["n_bucket"] for v in have["variants"]} if have else set()
        return [n for n in ns if n not in stored]
    lacking = any(record_for_arch(recs, a, env_arch) is None for a in archs)
    return list(ns) if lacking else []


def resolve(cache, entries: list, ns: list, tune: bool = True,
            make_tuner: Optional[Callable[[], Tuner]] = None, device: Optional[dict] = None,
            archs: Optional[list] = None, compiler=None, log=None) -> list:
    """The LayerCode of every entry (none skipped).

    `device`: the GPU the kernels are for (a device-info dict; None: no
    GPU).  With one, each layer's record for its architecture; with
    `tune`, a layer whose record tuned on this GPU lacks an N of `ns` (or
    that has none) has the missing buckets tuned, on the Tuner
    `make_tuner` makes (once, when first needed).  Without a GPU, the
    records of `archs`: with `tune` (default: the tuner's architectures)
    an untuned record is compiled where one lacks; else (default: every
    architecture the layer has a record for).  A layer left without a
    record raises MissingLayersError naming every such layer.  The cubins
    come from the database or are compiled here, on `compiler` (default:
    the tuner's, or one made for the call)."""
    log = log or sys.stderr
    ns = sorted(set(int(n) for n in ns))
    made: list = []

    def tuner() -> Tuner:
        if not made:
            if make_tuner is None:
                raise ValueError("tuning needs a tuner (make_tuner)")
            made.append(make_tuner())
        return made[0]

    try:
        if tune and not device and not archs:
            archs = tuner().archs
        found = []
        env_arch = env_archs(cache)
        for entry in entries:
            recs = _usable(cache, entry)
            missing = _missing_buckets(recs, ns, device, archs or [], env_arch) if tune else []
            if missing:
                tune_entry(tuner(), entry, missing, log=log)
                recs = _usable(cache, entry)
            found.append((LayerCode(entry, tuned_now=bool(missing)), recs))
        env_arch = env_archs(cache)
        lacking = []
        for code, recs in found:
            targets = ([device["arch"]] if device else archs
                       or sorted({a for r in recs if (a := arch_of_record(r, env_arch))}))
            for arch in targets:
                rec = record_for_arch(recs, arch, env_arch, device["name"] if device else None)
                if rec is not None:
                    code.archs[arch] = ArchCode(arch, rec["gpu_name"], rec["variants"])
            if not code.archs:
                lacking.append(code.entry.name)
        if lacking:
            where = device["arch"] if device else ", ".join(archs or []) or "any architecture"
            raise MissingLayersError(
                f"the database {cache.path} holds no tuned layer for {where} of "
                f"{len(lacking)} layer(s): {', '.join(lacking)}; tune them first (tune=True, "
                "or `sparseforge tune`)", lacking)
        codes = [code for code, _ in found]
        if compiler is None and made:
            compiler = made[0].compiler
        if compiler is not None:
            _make_variants(cache, codes, compiler)
        else:
            import os
            from .compiler import Compiler
            own = Compiler(cache, os.cpu_count() or 2)
            try:
                _make_variants(cache, codes, own)
            finally:
                own.close()
        return codes
    finally:
        for t in made:
            t.close()


def _make_variants(cache, codes: list, compiler) -> None:
    """Each record's variants made for the layer's weights and bias, their
    cubins compiled in the pool (or found in the database); the times of
    the record's trials beside them."""
    envs: dict = {}
    for e in cache.envs():
        envs.setdefault(e["name"], []).append(e["env_key"])
    jobs = []
    for code in codes:
        entry = code.entry
        fam, params = family_of(entry.pattern)
        matrix = entry.get_matrix()
        for arch, ac in code.archs.items():
            stored, ac.variants = ac.variants, []
            futures: dict = {}
            for v in stored:
                cfg = json.loads(v["config"])
                key = canonical_config(cfg)
                if key not in futures:
                    futures[key] = compiler.submit(
                        lambda f=fam, m=matrix, e=entry, p=params, c=cfg:
                        f.generate(m, e.op, p, c, bias=e.bias), arch)
                jobs.append((code, ac, v["n_bucket"], key, futures[key]))
    for code, ac, n, key, fut in jobs:
        built = fut.result()
        if built.data is None:
            why = built.error.strip().splitlines()[0] if built.error.strip() else "unknown"
            raise RuntimeError(f"layer {code.entry.name!r}: its {ac.arch} kernel for N = {n} "
                               f"({key}) could not be made: {why}")
        k = built.kernel
        median, peer = _times(cache, envs.get(ac.gpu_name, []), code.entry, n, key)
        ac.variants.append(VariantCode(n, k.name, dict(k.launch), json.loads(key), k.packed,
                                       built.data, median, peer, code.entry.op.layout))


def _times(cache, env_keys: list, entry: Entry, n: int, config: str) -> tuple[float, float]:
    """(median ms of the configuration `config` (canonical), cuBLAS's median
    ms) for N, as measured when the layer was tuned; NaN where nothing
    was."""
    m = entry.get_matrix()
    tag, fp = op_tag(entry), m.fingerprint()
    peer_cfg = json.dumps({"m": m.rows, "k": m.cols})
    median = peer = math.nan
    for env in env_keys:
        for t in cache.trials(env, fp, tag, n):
            if t["status"] == "ok" and t["config"] == config:
                median = t["median_ms"]
        for t in cache.trials(env, "dense", f"cublas.{entry.op.dtype}.{entry.op.layout}", n):
            if t["status"] == "ok" and t["config"] == peer_cfg:
                peer = t["median_ms"]
    return median, peer


__all__ = ["MissingLayersError", "VariantCode", "ArchCode", "LayerCode", "arch_of_record",
           "record_for_arch", "env_archs", "op_tag", "resolve", "NO_GPU_ARCHS"]
