"""The launch of a SparseLinear on a GPU: the custom op
`sparseforge::linear` and the layers it runs.

    torch.ops.sparseforge.linear(x, packed, layer, out_features) -> y
    torch.ops.sparseforge.linear_act(x, packed, layer, out_features, act) -> act(y)
    torch.ops.sparseforge.linear_fm(xt, packed, layer, out_features) -> yt
    torch.ops.sparseforge.transpose(x, layer) -> x^T
    torch.ops.sparseforge.rms_norm_t(x, yt, w, eps, round_first, layer) -> (h, xt)

`x` is (..., K), token-major; `packed` holds one uint8 tensor per variant
of the layer (its packed weights, tables and bias: the module's buffers);
`layer` is the key `load` gave the loaded layer; `y` is (..., M) in x's
dtype.  The CUDA kernel allocates y with torch and calls the C runtime's
sf_layer_run_packed, the one implementation of a layer's launch (the
variant tuned for the N nearest to the number of tokens, the grid rule,
Y zeroed first where the kernel accumulates), with the tensors' addresses
and torch.cuda.current_stream(): nothing synchronizes, copies or
allocates outside torch's allocator, so the op runs inside CUDA graph
capture.  An input that is not contiguous, or not 16-byte aligned (the
kernels read X in 16-byte pieces), is first copied by torch.  The fake
implementation gives y's shape and dtype, so torch.compile traces the op
without running it (fullgraph: no graph break).

A variant is token-major (the layout of a Linear) or feature-major: a
bucket whose token-major kernel lost to the feature-major route when the
layer was converted (convert.py) runs X^T (K x n, templates/transpose.cu
into a torch tensor), the feature-major kernel, and Y = (Y^T)^T, all on
the same stream.  The variants of each layout form one C layer; the
bucket nearest to n (the C runtime's rule: nearest in ratio, the first on
ties) names the layout, and that layout's C layer, choosing among its own
buckets, picks the same one.

A "dense" variant (a bucket whose kernels lost to cuBLAS when the
layer was converted, convert.py) has no kernel: its packed tensor is the
weight made dense, M x K values then the M of the bias where the layer
has one, and the op runs F.linear on them (a fused layer's activation
applied by torch after it).

Under torch.compile, a bucket with a feature-major variant (its route,
or the second variant of its bucket: the kernel faster than the
token-major one while the two transposes launched around it are not
worth it) runs `linear_fm` (X^T, K x n, in; Y^T, M x n, out) between
transposes that SparseLinear.forward leaves in the graph: Inductor
writes X^T from the op that produces x (a norm, a gate) and reads Y^T in
the op that consumes y, with no launch of their own.  A norm's
reduction would store X^T column by column (bench/RESULTS.md): where x
comes from one, the graph pass of _passes.py (set by `load` for a layer
with a feature-major kernel) gives the layers that read it
`transpose(x, layer)` instead (templates/transpose.cu, with the
layer's transpose kernel), one for all of them; where x is an RMSNorm's
output read by those layers alone, `rms_norm_t` computes the norm and
writes X^T in one kernel (sm_90), with the residual sum before it where
that sum adds a feature-major layer's Y^T.

`linear_act` is `linear` followed by an activation ("gelu": GELU's tanh
form; "gelu_erf": an exact GELU computed as the tanh form, where the
layer's module allows it; "relu") in the kernels' epilogue, as a fused
layer: the
same tuned configurations and packed tensors, rebuilt with the
activation (SparseLinear builds them, at most once a layer and
activation, and registers itself as the layer's `fuser`).  Under
torch.compile the graph pass of _passes.py puts it where a layer's only
reader is that activation, and builds the fused layer then; the op
builds it at its first call where it was not (a graph from Inductor's
cache, whose pass ran in another process), outside CUDA graph capture.

The C runtime's context for a GPU is the device's primary context
(cuDevicePrimaryCtxRetain), the one the CUDA runtime under PyTorch uses:
the kernels read and write torch's memory directly.  A loaded layer holds
the modules of its cubins (loaded once, never compiled here); a released
one is closed at the next load outside capture, once its device is idle.
"""
from __future__ import annotations

import ctypes
import itertools
import math
import threading
import weakref
from typing import Optional

import torch

from .. import native

OP = "sparseforge::linear"
_LIB = torch.library.Library("sparseforge", "FRAGMENT")
_LIB.define("linear(Tensor x, Tensor[] packed, int layer, int out_features) -> Tensor")
_LIB.define("linear_act(Tensor x, Tensor[] packed, int layer, int out_features, str act) -> Tensor")
_LIB.define("linear_fm(Tensor xt, Tensor[] packed, int layer, int out_features) -> Tensor")
_LIB.define("transpose(Tensor x, int layer) -> Tensor")
_LIB.define("rms_norm_t(Tensor x, Tensor? yt, Tensor w, float eps, bool round_first, int layer) "
            "-> (Tensor, Tensor)")

_lock = threading.Lock()
_contexts: dict = {}          # device ordinal -> (native.Context, lock)
_loaded: dict = {}            # layer key -> LoadedLayer
_released: list = []         # LoadedLayers to close
_keys = itertools.count(1)
_fusers: dict = {}            # layer key -> weakref to its SparseLinear (builds fused layers)
_fused: dict = {}             # (layer key, activation) -> key of the fused layer
FUSED_ACTS = {"gelu": "gelu", "gelu_erf": "gelu", "relu": "relu"}  # the op's act -> the kernels'
DENSE = "dense"               # the layout of a bucket cuBLAS serves (convert.py)


def context(device: int):
    """(native.Context, its lock) of a GPU by ordinal, one per process."""
    with _lock:
        if device not in _contexts:
            _contexts[device] = (native.Context(device), threading.Lock())
        return _contexts[device]


def device_info(device: int) -> dict:
    """The sf_device_info of a GPU by ordinal (its arch, name, ...)."""
    ctx, lock = context(device)
    with lock:
        return ctx.device_info()


class LoadedLayer:
    """A layer loaded on one GPU without its packed weights (the module's
    tensors hold them): one C layer per layout of its variants."""

    def __init__(self, key: int, device: int, name: str, parts: dict, buckets: list,
                 transpose=None, act: Optional[str] = None, shape: tuple = (0, 0)):
        self.key, self.device, self.name = key, device, name
        self.rows, self.cols = shape  # the weight's M x K
        self.parts = parts            # layout -> (native.Layer, indices of its variants)
        self.buckets = buckets        # [(n_bucket, layout)], in the variants' order
        self.has_dense = any(layout == DENSE for _, layout in buckets)
        self.act = act                # the kernels' epilogue activation (a fused layer)
        self.n_variants = len(buckets)
        self.transpose_fn = transpose  # (native.Module, its KernelFn) where a bucket is fm
        self._norm_fn = None          # the module's sf_rmsnorm_t_2 (sm_90), found on first use
        self.ctx, self.lock = context(device)
        self._arrays: dict = {}       # layout -> (packed addresses, their ctypes array)

    def layout_for(self, n: int) -> str:
        """The layout of the variant that runs n tokens."""
        return route(self.buckets, n)

    def dense(self, x: torch.Tensor, n: int, packed: list) -> Optional[torch.Tensor]:
        """y = act(x W^T + b) by torch (cuBLAS) where n tokens fall in a
        "dense" bucket (its packed tensor: W dense, then b); else None."""
        i = _nearest(self.buckets, n)
        if self.buckets[i][1] != DENSE:
            return None
        w, b = dense_parts(packed[i], self.rows, self.cols)
        y = torch.nn.functional.linear(x, w, b)
        if self.act == "gelu":
            return torch.nn.functional.gelu(y, approximate="tanh")
        return torch.relu(y) if self.act == "relu" else y

    def fm_for(self, n: int) -> bool:
        """Whether the bucket that runs n tokens has a feature-major variant
        (the one taken under torch.compile)."""
        return route_fm(self.buckets, n)

    def run(self, layout: str, x: int, y: int, n: int, packed: list, stream: int) -> None:
        """The C layer of `layout` on X and Y (addresses) for n tokens;
        `packed`: the address of every variant's packed tensor."""
        layer, idx = self.parts[layout]
        ptrs = tuple(packed[i] for i in idx)
        cached = self._arrays.get(layout)
        if cached is None or cached[0] != ptrs:
            cached = self._arrays[layout] = (ptrs, (ctypes.c_uint64 * len(ptrs))(*ptrs))
        with self.lock:
            layer.run_raw(x, y, n, cached[1], len(ptrs), stream)

    def transpose(self, src: int, dst: int, rows: int, cols: int, stream: int) -> None:
        """dst (cols x rows) = src (rows x cols)^T on `stream`."""
        with self.lock:
            launch_transpose(self.ctx, self.transpose_fn[1], src, dst, rows, cols, stream)

    def rms_norm_t(self, x: int, yt: int, w: int, h: int, xt: int, n: int, k: int, eps: float,
                   flags: int, stream: int) -> None:
        """xt (k x n) = RMSNorm(x [+ yt^T])^T, h = x + yt^T where yt and h
        are given (addresses; 0: none): templates/transpose.cu's
        sf_rmsnorm_t_2, 8-block clusters of 8 tokens."""
        with self.lock:
            if self._norm_fn is None:
                try:
                    self._norm_fn = self.transpose_fn[0].kernel("sf_rmsnorm_t_2")
                except native.NotFoundError as e:
                    raise RuntimeError("sparseforge::rms_norm_t needs an sm_90 GPU (its "
                                       f"kernel runs 8-block clusters): {e}") from None
            launch_rms_norm_t(self.ctx, self._norm_fn, x, yt, w, h, xt, n, k, eps, flags,
                              stream)

    def close(self) -> None:
        for layer, _ in self.parts.values():
            layer.close()
        if self.transpose_fn is not None:
            self.transpose_fn[0].unload()


def dense_parts(flat: torch.Tensor, rows: int, cols: int) -> tuple:
    """(W, b or None) of a "dense" variant's packed tensor: rows x cols
    values of W, then the rows of b where the layer has a bias."""
    w = flat[:rows * cols].view(rows, cols)
    return w, (flat[rows * cols:] if flat.numel() > rows * cols else None)


def _nearest(buckets: list, n: int) -> int:
    """The index of the bucket nearest to n in ratio (the first on ties;
    the first for n < 1), as sf_layer_run chooses its variant: `buckets`
    is [(n_bucket, layout)] in the variants' order."""
    chosen, best = 0, math.inf
    for i, (b, _) in enumerate(buckets):
        if n < 1:
            break
        dist = abs(math.log(n / b))
        if dist < best:
            chosen, best = i, dist
    return chosen


def route(buckets: list, n: int) -> str:
    """The layout of the variant that runs n tokens: the first of the
    nearest bucket's (_nearest)."""
    return buckets[_nearest(buckets, n)][1]


def route_fm(buckets: list, n: int) -> bool:
    """Whether the bucket that runs n tokens has a feature-major variant."""
    return bool(buckets) and (buckets[_nearest(buckets, n)][0], "fm") in buckets


_TRANSPOSE_CUBINS: dict = {}   # arch -> cubin of templates/transpose.cu


def transpose_cubin(arch: str) -> bytes:
    """The cubin of the feature-major route's transposes for `arch`
    (compiled once a process; no GPU needed)."""
    ctx, lock = context(0)
    with lock:
        if arch not in _TRANSPOSE_CUBINS:
            from ..generator.kernel import TEMPLATE_DIR, amalgamate
            src = amalgamate((TEMPLATE_DIR / "transpose.cu").read_text())
            _TRANSPOSE_CUBINS[arch] = ctx.compile(src, "transpose.cu", arch=arch).data
        return _TRANSPOSE_CUBINS[arch]


def load(device: int, name: str, rows: int, cols: int, elem_size: int, variants: list,
         transpose: Optional[bytes] = None, act: Optional[str] = None) -> int:
    """Loads a layer on GPU `device` from its variants (dicts with
    n_bucket, kernel_name, launch, binary and layout, "tm", "fm" or
    "dense" (no kernel); no packed bytes) and, where a variant is
    feature-major, the cubin of transpose_cubin; `act`: the activation
    in the kernels' epilogue (a fused layer: "gelu", "relu").  Returns
    its key for the op.  Closes the layers released before, when the GPU
    is not capturing a graph."""
    _close_released()
    ctx, lock = context(device)
    if any(v.get("layout", "tm") == "fm" for v in variants) and transpose is None:
        raise ValueError(f"layer {name!r}: feature-major variants need the transpose cubin")
    parts: dict = {}
    fn = None
    by_layout: dict = {}
    for i, v in enumerate(variants):
        if v.get("layout", "tm") != DENSE:
            by_layout.setdefault(v.get("layout", "tm"), []).append(i)
    with lock:
        try:
            for layout, idx in by_layout.items():
                code = [{k: variants[i][k] for k in ("n_bucket", "kernel_name", "launch", "binary")}
                        for i in idx]
                for c in code:
                    c["packed"] = None
                parts[layout] = (ctx.load_layer(name, rows, cols, elem_size, elem_size, code),
                                 idx)
            if transpose is not None:
                module = ctx.load(native.Binary.from_bytes(transpose))
                fn = (module, module.kernel(f"sf_transpose_{elem_size}"))
        except Exception:
            for layer, _ in parts.values():
                layer.close()
            raise
    # under torch.compile the graph pass (_passes.py) fuses an activation
    # that reads the layer's output into its kernels, and moves a
    # feature-major kernel's transposes around a norm
    from . import _passes
    _passes.install()
    buckets = [(int(v["n_bucket"]), v.get("layout", "tm")) for v in variants]
    entry = LoadedLayer(next(_keys), device, name, parts, buckets, fn, act, (rows, cols))
    with _lock:
        _loaded[entry.key] = entry
    return entry.key


def release(key: int) -> None:
    """The layer `key` is no longer used: it is closed at a later load (a
    graph captured earlier may still launch its kernels until then)."""
    with _lock:
        entry = _loaded.pop(key, None)
        if entry is not None:
            _released.append(entry)
        _fusers.pop(key, None)
        for k in [k for k in _fused if k[0] == key]:
            fused = _loaded.pop(_fused.pop(k), None)
            if fused is not None:
                _released.append(fused)


def register_fuser(key: int, module) -> None:
    """`module` (a SparseLinear, held weakly) builds layer `key`'s fused
    layers: module._build_fused(act) -> the fused layer's key."""
    with _lock:
        _fusers[key] = weakref.ref(module)


def fused_act(act: str, approximate: str = "none") -> Optional[str]:
    """The op's act for a torch activation: "relu"; GELU as "gelu"
    (approximate="tanh", the kernels' form) or "gelu_erf" ("none")."""
    if act == "gelu":
        return {"tanh": "gelu", "none": "gelu_erf"}.get(approximate)
    return act if act in FUSED_ACTS else None


def fusable(key: int, act: str) -> bool:
    """Whether layer `key` can take the activation `act` (the op's word,
    fused_act) into its kernels: "gelu_erf" only where its module allows
    the tanh form for an exact GELU (SparseLinear.approximate_gelu)."""
    with _lock:
        ref = _fusers.get(key)
    module = ref() if ref is not None else None
    if module is None or act not in FUSED_ACTS:
        return False
    return act != "gelu_erf" or bool(module.approximate_gelu)


def fused_layer(key: int, act: str) -> int:
    """The key of layer `key` with `act` in its epilogue, built (compiled
    and loaded) at the first request."""
    with _lock:
        fused = _fused.get((key, act))
        ref = _fusers.get(key)
    if fused is not None:
        return fused
    module = ref() if ref is not None else None
    if module is None:
        raise RuntimeError(f"{OP}_act: layer {key} is not loaded or cannot be rebuilt with "
                           f"an activation; call the module, not the op")
    if act not in FUSED_ACTS:
        raise RuntimeError(f"{OP}_act: no fused activation {act!r} (one of "
                           f"{', '.join(FUSED_ACTS)})")
    if not fusable(key, act):
        raise RuntimeError(f"{OP}_act: {module._where()} does not allow an exact GELU computed "
                           "as its tanh form (approximate_gelu is False); this graph came "
                           "from a compile where it did: clear Inductor's cache")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{OP}_act: {module._where()} with {act} is not built yet, and a "
                           "CUDA graph is being captured: run the compiled model once before "
                           "capturing it")
    new = module._build_fused(FUSED_ACTS[act])
    with _lock:
        if (key, act) in _fused:            # built meanwhile by another thread
            dup = _loaded.pop(new, None)
            if dup is not None:
                _released.append(dup)
            return _fused[(key, act)]
        _fused[(key, act)] = new
        return new


def loaded(key: int) -> Optional[LoadedLayer]:
    return _loaded.get(key)


def _close_released() -> None:
    with _lock:
        if not _released or torch.cuda.is_current_stream_capturing():
            return
        entries, _released[:] = list(_released), []
    for device in {e.device for e in entries}:
        torch.cuda.synchronize(device)
    for e in entries:
        with e.lock:
            e.close()


def _checked_entry(x: torch.Tensor, packed: list, layer: int) -> LoadedLayer:
    """The loaded layer `layer`, checked against the op's input and packed tensors."""
    entry = _loaded.get(layer)
    if entry is None:
        raise RuntimeError(f"{OP}: no layer {layer} is loaded (its module was deleted, moved "
                           "or loaded again); call the module, not the op")
    if x.device.index != entry.device:
        raise RuntimeError(f"{OP}: layer {entry.name!r} is loaded on cuda:{entry.device}, "
                           f"the input is on {x.device}")
    if len(packed) != entry.n_variants:
        raise RuntimeError(f"{OP}: layer {entry.name!r} has {entry.n_variants} variants, "
                           f"{len(packed)} packed tensors were given")
    return entry


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x contiguous and 16-byte aligned (the kernels read X in 16-byte
    pieces), copied by torch where it is not."""
    if not x.is_contiguous():
        x = x.contiguous()
    return x.clone() if x.data_ptr() % 16 else x


def _linear_cuda(x: torch.Tensor, packed: list, layer: int, out_features: int) -> torch.Tensor:
    """The op's CUDA implementation; SparseLinear.forward calls it directly
    outside torch.compile (the dispatcher's host time saved)."""
    entry = _checked_entry(x, packed, layer)
    n = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if n and entry.has_dense:
        y = entry.dense(x, n, packed)
        if y is not None:
            return y
    x = _aligned(x)
    y = torch.empty((*x.shape[:-1], out_features), dtype=x.dtype, device=x.device)
    if n == 0 or out_features == 0:
        return y
    ptrs = [p.data_ptr() for p in packed]
    if torch.cuda.current_device() == entry.device:
        _run(entry, x, y, n, ptrs, out_features)
    else:
        with torch.cuda.device(x.device):
            _run(entry, x, y, n, ptrs, out_features)
    return y


def _stream(device: int) -> int:
    """The raw handle of the current stream of GPU `device`."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _run(entry: LoadedLayer, x: torch.Tensor, y: torch.Tensor, n: int, ptrs: list,
         out_features: int) -> None:
    """y = layer(x) on the current stream, through the feature-major
    kernel and two transposes where n's bucket routes there."""
    stream = _stream(entry.device)
    layout = entry.layout_for(n)
    if layout == "tm":
        entry.run("tm", x.data_ptr(), y.data_ptr(), n, ptrs, stream)
        return
    k = x.shape[-1]
    xt = torch.empty((k, n), dtype=x.dtype, device=x.device)
    yt = torch.empty((out_features, n), dtype=y.dtype, device=y.device)
    entry.transpose(x.data_ptr(), xt.data_ptr(), n, k, stream)
    entry.run(layout, xt.data_ptr(), yt.data_ptr(), n, ptrs, stream)
    entry.transpose(yt.data_ptr(), y.data_ptr(), out_features, n, stream)


def _linear_fake(x: torch.Tensor, packed: list, layer: int, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


def _linear_act_cuda(x: torch.Tensor, packed: list, layer: int, out_features: int,
                     act: str) -> torch.Tensor:
    """act(linear(x)): the fused layer of `layer` (fused_layer)."""
    return _linear_cuda(x, packed, fused_layer(layer, act), out_features)


def _linear_act_fake(x: torch.Tensor, packed: list, layer: int, out_features: int,
                     act: str) -> torch.Tensor:
    return _linear_fake(x, packed, layer, out_features)   # (an activation keeps the shape)


def _linear_fm_cuda(xt: torch.Tensor, packed: list, layer: int,
                    out_features: int) -> torch.Tensor:
    """Y^T (M x n) = the layer's feature-major kernel on X^T (K x n); the
    layer's bucket for n must have one (LoadedLayer.fm_for)."""
    entry = _checked_entry(xt, packed, layer)
    if xt.dim() != 2:
        raise RuntimeError(f"{OP}_fm: the input is K x n, got shape {tuple(xt.shape)}")
    n = xt.shape[1]
    if not entry.fm_for(n):
        raise RuntimeError(f"{OP}_fm: layer {entry.name!r} has no feature-major kernel for "
                           f"{n} tokens")
    xt = _aligned(xt)
    yt = torch.empty((out_features, n), dtype=xt.dtype, device=xt.device)
    if n == 0 or out_features == 0:
        return yt
    ptrs = [p.data_ptr() for p in packed]
    with torch.cuda.device(xt.device):
        entry.run("fm", xt.data_ptr(), yt.data_ptr(), n, ptrs, _stream(entry.device))
    return yt


def _linear_fm_fake(xt: torch.Tensor, packed: list, layer: int,
                    out_features: int) -> torch.Tensor:
    return xt.new_empty((out_features, xt.shape[1]))


def _transpose_entry(op: str, layer: int) -> LoadedLayer:
    """Loaded layer `layer`, which must hold the transpose module (a
    feature-major variant): the kernels of `transpose` and `rms_norm_t`."""
    entry = _loaded.get(layer)
    if entry is None or entry.transpose_fn is None:
        raise RuntimeError(f"sparseforge::{op}: layer {layer} is not loaded or has no "
                           "feature-major kernel")
    return entry


def _transpose_cuda(x: torch.Tensor, layer: int) -> torch.Tensor:
    """x^T (contiguous) of a matrix x, by the transpose kernel of loaded
    layer `layer` (one with a feature-major variant)."""
    entry = _transpose_entry("transpose", layer)
    if x.dim() != 2:
        raise RuntimeError(f"sparseforge::transpose takes a matrix, got shape {tuple(x.shape)}")
    x = x.contiguous()
    out = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)
    if x.numel():
        with torch.cuda.device(x.device):
            entry.transpose(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                            _stream(entry.device))
    return out


def _transpose_fake(x: torch.Tensor, layer: int) -> torch.Tensor:
    return x.new_empty((x.shape[1], x.shape[0]))


def launch_transpose(ctx, fn, src: int, dst: int, rows: int, cols: int, stream: int) -> None:
    """dst (cols x rows) = src (rows x cols)^T by templates/transpose.cu's
    kernel `fn` (sf_transpose_2 or _4), 64 x 64 tiles."""
    ctx.launch(fn, ((cols + 63) // 64, (rows + 63) // 64, 1), (32, 16, 1),
               (src, dst, rows, cols), sig="PPii", stream=stream)


# sf_rmsnorm_t_2 (templates/transpose.cu): a cluster of NORM_CTAS blocks
# takes NORM_TOKENS tokens, a block at most NORM_SLICE features
NORM_CTAS, NORM_TOKENS, NORM_SLICE = 8, 8, 1024
NORM_MAX_K = NORM_CTAS * NORM_SLICE


def norm_flags(dtype, round_first: bool, n: int) -> int:
    """sf_rmsnorm_t_2's flags: bf16 (1), round first (2), Y^T and X^T rows
    of n tokens in 16-byte pieces (4: n % 8 == 0)."""
    return (1 if dtype == torch.bfloat16 else 0) | (2 if round_first else 0) | \
        (4 if n % 8 == 0 else 0)


def launch_rms_norm_t(ctx, fn, x: int, yt: int, w: int, h: int, xt: int, n: int, k: int,
                      eps: float, flags: int, stream: int) -> None:
    """sf_rmsnorm_t_2 (`fn`) on addresses (yt, h: 0 for none)."""
    ctx.launch(fn, (NORM_CTAS, (n + NORM_TOKENS - 1) // NORM_TOKENS, 1), (256, 1, 1),
               (x, yt, w, h, xt, n, k, eps, flags), sig="PPPPPiifi", stream=stream)


def _norm_problem(x, w) -> Optional[str]:
    """Why rms_norm_t cannot take x (..., k) with weight w (tensors or fake
    tensors), or None: it takes 16-bit x, w (k,) of x's dtype, k a
    multiple of 8 up to NORM_MAX_K."""
    if x.dim() < 1 or w.dim() != 1 or w.shape[0] != x.shape[-1] or w.dtype != x.dtype:
        return (f"x is n x k and w (k,) of x's dtype, got {tuple(x.shape)} {x.dtype} and "
                f"{tuple(w.shape)} {w.dtype}")
    if x.dtype not in (torch.float16, torch.bfloat16) or not 0 < x.shape[-1] <= NORM_MAX_K or \
            x.shape[-1] % 8:
        return (f"fp16 or bf16 with 8 to {NORM_MAX_K} features, a multiple of 8, got "
                f"{x.dtype} and {x.shape[-1]}")
    return None


def norm_fusable(x, w) -> bool:
    """Whether rms_norm_t takes x (rows x k) and weight w (tensors or fake
    tensors, _norm_problem) on the device of x: an sm_90 GPU."""
    if _norm_problem(x, w) is not None or x.device.type != "cuda":
        return False
    try:
        return torch.cuda.get_device_capability(x.device)[0] >= 9
    except (RuntimeError, AssertionError):          # no GPU here
        return False


def _rms_norm_t_check(x, yt, w) -> None:
    problem = "x is a matrix n x k" if x.dim() != 2 else _norm_problem(x, w)
    if problem is not None:
        raise RuntimeError(f"sparseforge::rms_norm_t: {problem}")
    if yt is not None and (tuple(yt.shape) != (x.shape[1], x.shape[0]) or yt.dtype != x.dtype):
        raise RuntimeError(f"sparseforge::rms_norm_t: yt is k x n ({x.shape[1]} x "
                           f"{x.shape[0]}) of x's dtype, got {tuple(yt.shape)} {yt.dtype}")


def _rms_norm_t_cuda(x: torch.Tensor, yt: Optional[torch.Tensor], w: torch.Tensor, eps: float,
                     round_first: bool, layer: int):
    """(h, xt): h = x + yt^T (x's shape; empty without yt), xt = RMSNorm(h)^T
    (k x n), by the kernel in loaded layer `layer`'s transpose module."""
    entry = _transpose_entry("rms_norm_t", layer)
    _rms_norm_t_check(x, yt, w)
    x, w = _aligned(x), w.contiguous()
    yt = None if yt is None else _aligned(yt)
    n, k = x.shape
    h = torch.empty_like(x) if yt is not None else x.new_empty((0,))
    xt = x.new_empty((k, n))
    if n:
        with torch.cuda.device(x.device):
            entry.rms_norm_t(x.data_ptr(), 0 if yt is None else yt.data_ptr(), w.data_ptr(),
                             h.data_ptr() if yt is not None else 0, xt.data_ptr(), n, k,
                             float(eps), norm_flags(x.dtype, round_first, n),
                             _stream(entry.device))
    return h, xt


def rms_norm_t_reference(x: torch.Tensor, yt: Optional[torch.Tensor], w: torch.Tensor,
                         eps: float, round_first: bool):
    """rms_norm_t computed by torch ops (any device): what the kernel
    computes, the model's own rounding (the sum and, round_first, the
    normalized x rounded to x's dtype)."""
    h = x if yt is None else (x + yt.t())
    hf = h.float()
    v = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    out = (v.to(x.dtype) * w) if round_first else (v * w.float()).to(x.dtype)
    return (h.contiguous() if yt is not None else x.new_empty((0,))), out.t().contiguous()


def _rms_norm_t_fake(x, yt, w, eps, round_first, layer):
    return (x.new_empty(x.shape) if yt is not None else x.new_empty((0,)),
            x.new_empty((x.shape[1], x.shape[0])))


_LIB.impl("linear", _linear_cuda, "CUDA")
_LIB.impl("linear_act", _linear_act_cuda, "CUDA")
_LIB.impl("linear_fm", _linear_fm_cuda, "CUDA")
_LIB.impl("transpose", _transpose_cuda, "CUDA")
_LIB.impl("rms_norm_t", _rms_norm_t_cuda, "CUDA")
for _name, _fake in ((OP, _linear_fake), (OP + "_act", _linear_act_fake),
                     (OP + "_fm", _linear_fm_fake),
                     ("sparseforge::transpose", _transpose_fake),
                     ("sparseforge::rms_norm_t", _rms_norm_t_fake)):
    if hasattr(torch.library, "register_fake"):            # torch >= 2.4
        torch.library.register_fake(_name, _fake, lib=_LIB)
    else:                                                   # torch 2.3
        torch.library.impl_abstract(_name, _fake, lib=_LIB)
