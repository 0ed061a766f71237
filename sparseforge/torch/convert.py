"""Converting a PyTorch model: `sparsify` replaces each nn.Linear whose
weight is sparse enough by a SparseLinear with kernels tuned for it, and
`load_state_dict` loads a sparsified model's state into the dense model it
came from.

The choices are `sparseforge tune`'s (tuner/model.py plan_model): a weight
at or above the density limit stays dense; "auto" takes the family that
analysis finds the matrix fits.  The kernels come from the database
(tuner/resolve.py), tuned on the spot where it lacks them.  A layer whose
family has no token-major kernel in its dtype stays dense with the reason
under "auto", and is refused when the pattern was named.

The feature-major route: a Linear's activations are token-major, and some
families' token-major kernels are far slower than their feature-major ones
(shflbw gathers X element by element and scatters Y the same way; fp32
csr reads X across rows).  On a GPU, each N bucket whose token-major
kernel lost to cuBLAS when tuned also gets the layer's feature-major
kernel for that N (tuned under the layer's name + "#fm"), and both routes
are timed through the op, each as a CUDA graph of a few calls with the
layer's weights out of the L2 (as a model runs them): the token-major
kernel, against X transposed (templates/transpose.cu), the
feature-major kernel and Y transposed back.  The faster serves the
bucket (`layout` in the report and the module's kernels).

Decode buckets (at most FM_DECODE_N tokens) try the feature-major
kernel too: there a family whose token-major kernel gathers X element by
element (shflbw) reads 4x the bytes it uses, where feature-major a
column's tokens are one sector.  Where the route loses in eager (the two
transposes' launches) but the feature-major kernel alone is faster than
the token-major one (their tuned times), it is kept second in its
bucket: under torch.compile the transposes are Inductor's to fuse into
the ops around the layer (_op.py), and that kernel serves the bucket.

cuBLAS where the kernels lose (`min_speedup`, default 1.0): after the
routes, each bucket whose best time measured on this GPU (its kernel,
route or compiled variant) is below min_speedup x cuBLAS's is served
by cuBLAS instead (a "dense" variant: F.linear with the weight made
dense on the GPU when the layer is loaded there).  A layer whose every
measured bucket is served so stays an nn.Linear (sparsify leaves it in
the model, with the reason in the report), so that sparsify makes no
layer slower than the dense model at the N it tuned.  A layer with some
dense buckets keeps a dense copy of its weight on the GPU beside the
packed one: speed over memory.  `min_speedup=None` keeps every bucket on
the sparse kernels (as for a model sparsified to save memory).
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from torch import nn

from ..generator.families import family_of
from ..generator.kernel import Epilogue, Operation
from ..tuner.model import SPARSE_DENSITY_LIMIT, Entry, plan_model
from ._op import DENSE
from .linear import DTYPES, READ_FORMATS, TORCH_DTYPES, SparseLinear, matrix_of

DEFAULT_N = (16, 256, 4096)
LAYOUT = "tm"     # a Linear's activations: tokens x features
FM_NAME = "#fm"   # suffix of the database name of a layer's feature-major kernels
FM_TRY_BELOW = 1.0  # a bucket whose token-major kernel is below this speedup over
                    # cuBLAS tries the feature-major route
FM_DECODE_N = 64  # buckets of at most this many tokens try the feature-major kernel
FM_KEEP_BELOW = 1.0  # ... and keep it for torch.compile where its tuned time is below
                     # this fraction of the token-major kernel's
MIN_SPEEDUP = 1.0    # a bucket whose best measured speedup over cuBLAS is below this
                     # runs cuBLAS (module note); None: never


@dataclass
class LayerReport:
    """One nn.Linear of the model: converted (pattern, the kernels' GPU,
    per N bucket the configuration and the times measured when tuning)
    or kept dense (`dense`: why)."""
    name: str
    shape: tuple                  # (out_features, in_features)
    density: float
    pattern: str = ""
    dense: str = ""
    gpu: str = ""                 # what the kernels were tuned on, or "untuned (sm_90a)"
    buckets: dict = field(default_factory=dict)   # N -> {config, median_ms, peer_ms, speedup}
    tuned_now: bool = False
    cublas_bytes: int = 0         # the dense copy that its cuBLAS buckets keep on the GPU

    @property
    def converted(self) -> bool:
        return not self.dense


@dataclass
class Report:
    """What sparsify did: a row per nn.Linear, the database, the GPU and
    the wall time.  str() is the table."""
    layers: list
    database: str
    device: str
    seconds: float

    @property
    def converted(self) -> list:
        return [r for r in self.layers if r.converted]

    def table(self) -> str:
        head = (f"{'layer':36s} {'family':12s} {'N':>6s} {'config':40s} {'time ms':>9s} "
                f"{'cuBLAS ms':>9s} {'speedup':>8s}")
        out = [f"GPU: {self.device}; database: {self.database}", head, "-" * len(head)]
        for r in self.layers:
            if not r.converted:
                out.append(f"{r.name[:36]:36s} stays dense: {r.dense}")
                continue
            for n, b in sorted(r.buckets.items()):
                # the bucket's kernel, then the one it takes under torch.compile
                for label, e in (("", b), ("compiled: ", b.get("compiled"))):
                    if e is None:
                        continue
                    cfg = ",".join(f"{k}={v}" for k, v in sorted(e["config"].items()))
                    if e.get("layout") == "fm":
                        cfg = ("fm: " if label else "fm route: ") + cfg
                    elif e.get("layout") == DENSE:
                        cfg = f"cuBLAS (the kernel: {_x(e['sparse_speedup']).strip()})"
                    out.append(f"{r.name[:36]:36s} {r.pattern:12s} {n:6d} "
                               f"{(label + cfg)[:40]:40s} {_ms(e['median_ms'])} "
                               f"{_ms(e['peer_ms'])} {_x(e['speedup'])}")
        n_conv = len(self.converted)
        out.append(f"{n_conv} of {len(self.layers)} Linear layers converted in "
                   f"{self.seconds:.1f} s")
        copies = [r for r in self.converted if r.cublas_bytes]
        if copies:
            b = sum(r.cublas_bytes for r in copies)
            size = f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"
            out.append(f"{len(copies)} of them run cuBLAS at some N: their dense weights "
                       f"take {size} more on the GPU (min_speedup=None: none)")
        return "\n".join(out)

    __str__ = table


def _ms(v: float) -> str:
    return f"{v:9.4f}" if math.isfinite(v) else f"{'-':>9s}"


def _x(v: float) -> str:
    return f"{v:7.2f}x" if math.isfinite(v) else f"{'-':>8s}"


def _unsupported(pattern: str, dtype: str) -> str:
    """Why a family has no kernel for a Linear in `dtype` ("" when it has)."""
    fam, _ = family_of(pattern)
    if LAYOUT not in fam.layouts:
        return (f"{pattern} has no token-major kernel yet (its kernels take "
                f"{', '.join(fam.layouts)})")
    if dtype not in fam.dtypes:
        return f"{pattern} computes in {', '.join(fam.dtypes)}, the layer is {dtype}"
    return ""


def sparsify(model: nn.Module, db=None, pattern: str = "auto", n=DEFAULT_N, tune: bool = True,
             progress: bool = True, *, budget: Optional[str] = None, strategy: str = "auto",
             quick: bool = False, device: Optional[int] = None, archs=None,
             log=None, feature_major: bool = True, approximate_gelu: bool = False,
             min_speedup: Optional[float] = MIN_SPEEDUP) -> Report:
    """Replaces, in place, each nn.Linear of `model` whose weight is sparse
    enough (density below 0.75) by a SparseLinear, and returns the Report.

    `db`: the database (default: the user's, ~/.cache/sparseforge).
    `pattern`: "auto" (the family analysis finds each weight fits, as
    `sparseforge tune` does) or one pattern for every layer ("bsr:64x64").
    `n`: the N buckets (tokens per call) the kernels are tuned for.
    `tune`: tune what the database lacks for this GPU; False: a layer the
    database lacks raises MissingLayersError naming all of them.  Without
    a GPU, tuning compiles each layer's default configuration for `archs`
    (default sm_80 and sm_90a), untuned, as `sparseforge tune` does.
    `budget`, `strategy`, `quick` (the shorter timing protocol): as the
    command line's; `device`: the GPU ordinal to tune on (default: the
    model's, else 0).  `feature_major`: try the feature-major route for
    buckets whose token-major kernel loses to cuBLAS and for the decode
    buckets, and keep the feature-major kernel for torch.compile where it
    is the faster (the module note).  `approximate_gelu`: under
    torch.compile an exact (erf) GELU that alone reads a converted layer's
    output runs in the layer's kernels as their tanh form (at most 4.7e-4
    from erf); a tanh GELU or a ReLU there is fused either way
    (SparseLinear.approximate_gelu, _passes.py).  `min_speedup`: a bucket
    whose kernels, measured on this GPU, run below this speedup over
    cuBLAS is served by cuBLAS, and a layer where that is every bucket
    stays an nn.Linear (the module note); None: the sparse kernels serve
    every bucket.
    Progress and the tuning lines go to stderr unless `progress` is
    False."""
    t0 = time.perf_counter()
    log = log or (sys.stderr if progress else open(os.devnull, "w"))
    rows, candidates = [], []
    for name, mod in model.named_modules():
        if type(mod) is not nn.Linear:
            continue
        shape = tuple(mod.weight.shape)
        if mod.weight.dtype not in DTYPES:
            rows.append(LayerReport(name, shape, 1.0, dense=f"no kernels for {mod.weight.dtype}"))
            continue
        m = matrix_of(mod.weight, f"{name}.weight")
        if m.density >= SPARSE_DENSITY_LIMIT:
            rows.append(LayerReport(name, shape, m.density, dense=f"density {m.density:.2f}"))
            continue
        if not name:
            raise ValueError("sparsify: the model is itself an nn.Linear; build a SparseLinear "
                             "with SparseLinear.from_dense(weight, bias) instead")
        candidates.append((name, mod, m))
    entries = plan_model([(f"{name}.weight", m) for name, _, m in candidates],
                         None if pattern == "auto" else pattern, layout=LAYOUT, log=log)
    todo, refused = [], {}
    for (name, mod, m), entry in zip(candidates, entries):
        why = _unsupported(entry.pattern, m.dtype)
        if why and pattern != "auto":
            refused.setdefault(why, []).append(name)
        elif why:
            rows.append(LayerReport(name, tuple(mod.weight.shape), m.density, dense=why))
        else:
            todo.append((name, mod, entry.pattern, m))
    if refused:
        raise ValueError("sparsify: " + "; ".join(f"{why}: {', '.join(names)}"
                                                  for why, names in refused.items()))
    layers = [SparseLinear._of_matrix(m, mod.bias, pattern=pat, name=f"{name}.weight",
                                      dtype=mod.weight.dtype, device=mod.weight.device)
              for name, mod, pat, m in todo]
    if device is None:
        device = next((p.device.index for p in model.parameters() if p.device.type == "cuda"), 0)
    codes, where, gpu = kernels_for(layers, db, n, tune, progress, budget=budget,
                                    strategy=strategy, quick=quick, device=device, archs=archs,
                                    log=log, feature_major=feature_major,
                                    min_speedup=min_speedup)
    for (name, mod, pat, m), layer, code in zip(todo, layers, codes):
        why = _slower_everywhere(code)
        if why:
            rows.append(LayerReport(name, m.shape, m.density, pat, dense=why))
            continue
        layer.approximate_gelu = approximate_gelu
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
        rows.append(_row(name, m, pat, code))
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    rows.sort(key=lambda r: order.get(r.name, -1))
    return Report(rows, where, gpu, time.perf_counter() - t0)


def _row(name: str, m, pattern: str, code) -> LayerReport:
    """The report row of a converted layer: its first architecture's
    record (the GPU's own, where there is one)."""
    ac = next(iter(code.archs.values()))
    buckets: dict = {}
    for v in ac.variants:   # a bucket's first variant; a second: its kernel under torch.compile
        b = {"config": v.config, "median_ms": v.median_ms, "peer_ms": v.peer_ms,
             "speedup": v.speedup, "layout": v.layout}
        if v.layout == DENSE:
            b["sparse_speedup"] = v.sparse_speedup
        if v.n_bucket in buckets:
            buckets[v.n_bucket]["compiled"] = b
        else:
            buckets[v.n_bucket] = b
    elem = 4 if m.dtype == "fp32" else 2
    rows, cols = m.shape
    copy = (rows * cols + (rows if code.entry.bias is not None else 0)) * elem \
        if any(v.layout == DENSE for v in ac.variants) else 0
    return LayerReport(name, m.shape, m.density, pattern, gpu=ac.gpu_name, buckets=buckets,
                       tuned_now=code.tuned_now, cublas_bytes=copy)


def _dense_buckets(codes: list, arch: str, min_speedup: Optional[float]) -> None:
    """Gives cuBLAS each bucket (of the layers' records tuned on this GPU,
    `arch`) whose best measured variant runs below min_speedup x cuBLAS:
    its variants become one "dense" variant, with cuBLAS's time and the
    time of the kernel that lost (module note).  Where only the bucket's
    first variant (the one eager runs) loses and a second one (its
    feature-major kernel, kept for torch.compile) wins, the first alone
    becomes "dense": eager runs cuBLAS, torch.compile that kernel.
    Buckets measured nowhere keep their kernels."""
    if min_speedup is None:
        return
    import dataclasses

    def loses(v) -> bool:
        return math.isfinite(v.speedup) and v.speedup < min_speedup

    def dense(v):
        return dataclasses.replace(v, kernel_name="", launch={}, config={}, packed=b"",
                                   cubin=b"", median_ms=v.peer_ms, layout=DENSE,
                                   sparse_ms=v.median_ms)

    for code in codes:
        ac = code.archs.get(arch)
        if ac is None or not ac.tuned:
            continue
        by_n: dict = {}
        for v in ac.variants:
            by_n.setdefault(v.n_bucket, []).append(v)
        out = []
        for n, vs in by_n.items():
            best = max(vs, key=lambda v: v.speedup if math.isfinite(v.speedup) else -math.inf)
            if loses(best):
                out.append(dense(best))
            elif loses(vs[0]):
                out += [dense(vs[0])] + vs[1:]
            else:
                out += vs
        ac.variants[:] = out


def _slower_everywhere(code) -> str:
    """Why a converted layer should stay an nn.Linear: every bucket of its
    record tuned on this GPU is served by cuBLAS ("" otherwise, and for a
    record without a GPU's measurements)."""
    ac = next(iter(code.archs.values()), None)
    if ac is None or not ac.tuned or not ac.variants or \
            any(v.layout != DENSE for v in ac.variants):
        return ""
    best = max(ac.variants, key=lambda v: v.sparse_speedup)
    return (f"its kernels lose to cuBLAS at every N (best {best.sparse_speedup:.2f}x, "
            f"N = {best.n_bucket}; min_speedup=None converts it)")


def _entry(index: int, layer: SparseLinear) -> Entry:
    op = Operation(layer.dtype_name, LAYOUT, Epilogue(bias=layer.bias is not None))
    why = _unsupported(layer.pattern, layer.dtype_name)
    if why:
        raise ValueError(f"{layer._where()}: {why}")
    return Entry(index, layer.name, layer.matrix(), pattern=layer.pattern, op=op,
                 bias=layer.bias_array())


def _fm_entry(entry: Entry) -> Optional[Entry]:
    """The entry of the layer's feature-major kernels (None when its family
    has none in its dtype, or says its token-major ones are as fast)."""
    fam, _ = family_of(entry.pattern)
    if ("fm" not in fam.layouts or entry.op.dtype not in fam.dtypes
            or fam.token_major_as_fast(entry.op.dtype)):
        return None
    return Entry(entry.index, entry.name + FM_NAME, entry.matrix, pattern=entry.pattern,
                 op=Operation(entry.op.dtype, "fm", entry.op.epilogue), bias=entry.bias)


def _fm_candidates(codes: list, arch: str) -> list:
    """(index of the layer, its feature-major entry, the N buckets to try)
    for each layer with a bucket whose token-major kernel, tuned on this
    GPU, lost to cuBLAS, or a decode bucket."""
    out = []
    for i, code in enumerate(codes):
        ac = code.archs.get(arch)
        if ac is None or not ac.tuned:
            continue
        ns = [v.n_bucket for v in ac.variants if v.layout == LAYOUT and
              (v.speedup < FM_TRY_BELOW or
               (v.n_bucket <= FM_DECODE_N and math.isfinite(v.speedup)))]
        fm = _fm_entry(code.entry) if ns else None
        if fm is not None:
            out.append((i, fm, ns))
    return out


def _time_routes(mods: tuple, code, variant, n: int, device: int, flush_bytes: int,
                 rounds: int = 5, reps: int = 5) -> tuple[float, float]:
    """(the bucket's ms, `variant`'s ms) at n tokens on GPU `device`: the
    two modules `mods` (copies of one layer) take the layer's kernels, the
    second with `variant` (the feature-major route's kernel) for the
    bucket n.  Each is captured as a CUDA graph of `reps` calls (as a
    model runs them: the launches' CPU cost out of the time), each call
    after a read of `flush_bytes` (twice the L2), so that the layer's weights come from
    device memory as in a model's forward, where the other layers'
    weights pass through the L2 between two calls of one layer; a graph
    of the reads alone is timed too and taken off.  The graphs are
    replayed in alternating rounds (CUDA events; the best round of
    each)."""
    import torch

    from ..tuner.resolve import ArchCode, LayerCode
    ac = next(iter(code.archs.values()))
    swapped = [variant if v.n_bucket == n else v for v in ac.variants]
    for mod, variants in zip(mods, (ac.variants, swapped)):
        mod.attach(LayerCode(code.entry, {ac.arch: ArchCode(ac.arch, ac.gpu_name, variants)}))
    best = [math.inf, math.inf, math.inf]
    with torch.no_grad(), torch.cuda.device(device):
        dev = f"cuda:{device}"
        x = torch.randn(n, mods[0].in_features, device=dev).to(mods[0].weight_values.dtype)
        flush = torch.ones(flush_bytes // 4, dtype=torch.float32, device=dev)
        sink = torch.empty((), dtype=torch.float32, device=dev)
        calls = [lambda: None] + [lambda mod=mod: mod(x) for mod in mods]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.sum(flush, dim=0, out=sink)
            for call in calls:
                call()                             # first calls outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graphs = []
        for call in calls:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(reps):
                    torch.sum(flush, dim=0, out=sink)
                    call()
            graphs.append(graph)
        for _ in range(rounds):
            for r, graph in enumerate(graphs):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                best[r] = min(best[r], start.elapsed_time(end))
        del graphs, flush
    floor = 1e-4        # 0.1 us: the difference of two graphs never reads as no time
    return (max(floor, (best[1] - best[0]) / reps), max(floor, (best[2] - best[0]) / reps))


def _route(layers: list, codes: list, cache, tune: bool, make_tuner, info: dict, device: int,
           log) -> None:
    """The feature-major route (module note) for each bucket that tries
    it: its feature-major kernel from the database (tuned now where it
    lacks one, if `tune`), both routes timed, the outcome kept in `codes`:
    the route that serves the bucket, and for torch.compile alone the
    feature-major kernel second in its bucket where it alone is the
    faster."""
    import dataclasses

    import torch

    from ..tuner.driver import past_l2_bytes
    from ..tuner.resolve import MissingLayersError, resolve
    arch = info["arch"]
    groups: dict = {}                              # one resolve (one tuner) per set of buckets
    for cand in _fm_candidates(codes, arch):
        groups.setdefault(tuple(cand[2]), []).append(cand)
    found = []
    for ns, cands in groups.items():
        entries = [fm for _, fm, _ in cands]
        try:
            fm_codes = resolve(cache, entries, list(ns), tune, make_tuner, info, log=log)
        except MissingLayersError as e:            # tune=False: those with a record
            have = [fm for fm in entries if fm.name not in e.names]
            fm_codes = resolve(cache, have, list(ns), False, make_tuner, info, log=log) \
                if have else []
            cands = [c for c in cands if c[1].name not in e.names]
        found += [(i, fm, ns, code) for (i, fm, ns), code in zip(cands, fm_codes)]
    for i, fm_entry, ns, fm_code in found:
        fm_ac, ac = fm_code.archs.get(arch), codes[i].archs[arch]
        if fm_ac is None or not fm_ac.tuned:
            continue
        layer = layers[i]
        mods = tuple(SparseLinear._of_matrix(fm_entry.get_matrix(), layer.bias, layer.pattern,
                                             layer.name, layer.weight_values.dtype, f"cuda:{device}")
                     for _ in range(2))
        for fv in fm_ac.variants:
            if fv.n_bucket not in ns:
                continue
            try:
                t_tm, t_fm = _time_routes(mods, codes[i], fv, fv.n_bucket, device,
                                          past_l2_bytes(info))
            except torch.cuda.OutOfMemoryError as e:   # the two copies and their graphs
                print(f"{layer.name}: N = {fv.n_bucket}: the routes could not be timed "
                      f"({str(e).splitlines()[0]}); it stays token-major", file=log)
                torch.cuda.empty_cache()
                continue
            tv = next(v for v in ac.variants if v.n_bucket == fv.n_bucket)
            at = ac.variants.index(tv)
            compiled = t_fm >= t_tm and fv.median_ms < FM_KEEP_BELOW * tv.median_ms
            print(f"{layer.name}: N = {fv.n_bucket}: token-major {t_tm:.4f} ms, "
                  f"feature-major route {t_fm:.4f} ms: "
                  f"{'feature-major' if t_fm < t_tm else 'token-major'}"
                  + (f"; under torch.compile the feature-major kernel ({fv.median_ms:.4f} "
                     f"ms against {tv.median_ms:.4f} tuned)" if compiled else ""), file=log)
            if t_fm < t_tm:
                # the report's times stay in the tuner's protocol: the
                # token-major kernel's tuned time scaled by the routes' ratio
                ac.variants[at] = dataclasses.replace(
                    fv, median_ms=tv.median_ms * t_fm / t_tm, peer_ms=tv.peer_ms)
            elif compiled:   # second in its bucket: taken under torch.compile alone
                ac.variants.insert(at + 1, dataclasses.replace(fv, peer_ms=tv.peer_ms))


def kernels_for(layers: list, db=None, n=DEFAULT_N, tune: bool = True, progress: bool = False,
                *, budget: Optional[str] = None, strategy: str = "auto", quick: bool = False,
                device: int = 0, archs=None, log=None, feature_major: bool = True,
                min_speedup: Optional[float] = MIN_SPEEDUP):
    """Gives each SparseLinear of `layers` its kernels from the database
    (tuning what it lacks: see sparsify) and loads them where the layer is
    on a GPU.  Returns (the tuner/resolve.py LayerCodes, the database's
    path, the GPU's name or what was compiled for)."""
    from .. import native
    from ..cache import Cache, default_path
    from ..tuner.driver import DEFAULT_TIMING, NO_GPU_ARCHS, QUICK_TIMING, Tuner
    from ..tuner.model import Progress
    from ..tuner.resolve import resolve
    from . import _op
    log = log or (sys.stderr if progress else open(os.devnull, "w"))
    if isinstance(archs, str):
        archs = [a.strip() for a in archs.split(",") if a.strip()]
    entries = [_entry(i, layer) for i, layer in enumerate(layers)]
    ok, why = native.gpu_available()
    info = _op.device_info(device) if ok else None
    path = Path(db) if db else default_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    with Cache(path) as cache:
        def make_tuner():
            return Tuner(cache, arch=None if ok else ",".join(archs or NO_GPU_ARCHS),
                         strategy=strategy, budget=budget,
                         timing=QUICK_TIMING if quick else DEFAULT_TIMING,
                         progress=Progress(log) if progress else None, device=device)
        if not ok and tune and entries:
            print(f"no GPU ({why}): compiling for {', '.join(archs or NO_GPU_ARCHS)}, untuned; "
                  "nothing is measured", file=log)
        codes = resolve(cache, entries, list(n), tune, make_tuner, info,
                        None if ok else (archs or (list(NO_GPU_ARCHS) if tune else None)),
                        log=log)
        if ok and feature_major:
            _route(layers, codes, cache, tune, make_tuner, info, device, log)
        if ok:
            _dense_buckets(codes, info["arch"], min_speedup)
    for layer, code in zip(layers, codes):
        layer.attach(code)
    gpu = info["name"] if info else f"none (kernels for {', '.join(archs or NO_GPU_ARCHS)})"
    return codes, str(path), gpu


def load_state_dict(model: nn.Module, state_dict: dict, strict: bool = True):
    """Loads the state_dict of a sparsified model into `model`, the same
    model before sparsify: each nn.Linear the state holds as a SparseLinear
    is replaced by one (on the Linear's device) before the state is loaded,
    so its kernels load with it.  Returns what Module.load_state_dict
    returns."""
    suffix = "._extra_state"
    for key, state in state_dict.items():
        if not (key.endswith(suffix) and isinstance(state, dict) and "cubins" in state
                and state.get("format") in READ_FORMATS):
            continue
        path = key[:-len(suffix)]
        mod = model.get_submodule(path)
        if type(mod) is nn.Linear:
            layer = SparseLinear(state["in_features"], state["out_features"], state["bias"],
                                 pattern=state["pattern"], name=state["name"],
                                 dtype=TORCH_DTYPES.get(state["dtype"]),
                                 device=mod.weight.device)
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)
    return model.load_state_dict(state_dict, strict=strict)
