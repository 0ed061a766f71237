"""SparseLinear: a drop-in for nn.Linear whose weight is sparse, run on a GPU
by the kernels sparseforge tuned for that very matrix, and by torch on CPU.

What the module holds (all of it in state_dict()):
- the pruned weight as CSR buffers, `weight_indptr` (int64, M + 1),
  `weight_indices` (int32 columns) and `weight_values` (the layer's
  dtype), and `bias` (or None): the layer's math, computed by torch on CPU
  (`F.linear` with the weight made dense) and the source of every kernel;
- `packed_0`, `packed_1`, ... (uint8): the packed weights, index tables
  and bias the kernels read, one per distinct packing (a configuration can
  change the packing, so N buckets or architectures may differ);
- as extra state: for each architecture it has kernels for, the record
  they came from (the GPU they were tuned on) and each N bucket's kernel:
  its name, launch record, configuration, packed buffer, cubin and layout
  ("tm"; "fm" where the bucket runs the feature-major kernel between two
  transposes, see _op.py; a bucket's second variant, "fm", serves it under
  torch.compile alone; "dense" where cuBLAS serves the bucket, its
  kernels having lost to it: no kernel, F.linear with the weight made
  dense from the CSR buffers when the layer is loaded on a GPU, not
  kept in the state), and where a bucket has an "fm" one the
  transposes' cubin.

So a state_dict is what a user ships: the weights and, for each GPU
architecture, the compiled kernels.  Moving the module to a GPU (`.to()`,
`.cuda()`, or loading a state into a module on a GPU) loads the cubins for
that GPU's architecture through the C runtime, without compiling; a
module without kernels for it says so there.  `forward` on a GPU is the
custom op sparseforge::linear (_op.py) under torch.compile, and the op's
implementation called directly otherwise (the same launch, without the
dispatcher's host time); it never compiles or loads.

Under torch.compile, a GELU or ReLU that alone reads the layer's output
runs in its kernels' epilogue (the graph pass of _passes.py): the module
builds the fused layer then, from its own configurations and packed
tensors (`_build_fused`).  The kernels compute GELU's tanh form; an exact
(erf) GELU is fused only where `approximate_gelu` is True (sparsify's
argument of that name; not kept in the state).

Inference only: a forward whose input requires grad raises.
"""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import _op
from ._op import DENSE  # the layout of a bucket cuBLAS serves (convert.py)

FORMAT = 1            # the state's format
DENSE_FORMAT = 2      # ... where a bucket is "dense" (older versions refuse those)
READ_FORMATS = (FORMAT, DENSE_FORMAT)   # the formats this version reads
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


def dtype_tag(dtype: torch.dtype) -> str:
    """'fp16' for torch.float16 and so on; TypeError for other dtypes."""
    if dtype not in DTYPES:
        raise TypeError(f"sparseforge computes float32, float16 and bfloat16, not {dtype}")
    return DTYPES[dtype]


class SparseLinear(nn.Module):
    """y = x W^T + b for a sparse W (out_features x in_features), as
    nn.Linear: x is (..., in_features), token-major.

    Build one with `SparseLinear.from_dense(weight, bias)` (the pruned
    dense weight) and give it kernels with `load_kernels(db)`, or let
    `sparseforge.torch.sparsify(model)` do both for every nn.Linear of a
    model.  `SparseLinear(in_features, out_features, bias)` is an empty
    layer (no nonzeros, no kernels) for load_state_dict() to fill."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 pattern: str = "csr", name: str = "weight", dtype: Optional[torch.dtype] = None,
                 device=None):
        super().__init__()
        from ..generator.families import family_of
        family_of(pattern)                       # a pattern some family parses
        dtype = dtype or torch.get_default_dtype()
        self.dtype_name = dtype_tag(dtype)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.pattern, self.name = pattern, name
        kw = {"device": device}
        self.register_buffer("weight_indptr", torch.zeros(self.out_features + 1, dtype=torch.int64, **kw))
        self.register_buffer("weight_indices", torch.zeros(0, dtype=torch.int32, **kw))
        self.register_buffer("weight_values", torch.zeros(0, dtype=dtype, **kw))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=dtype, **kw) if bias else None)
        self._kernels: dict = {}      # arch -> {"gpu": str, "variants": [dict]}
        self._cubins: list = []       # bytes, referenced by the variants
        self._n_blobs = 0             # packed_0 .. packed_{n-1}
        self._layer_key = 0           # the loaded layer (the op's `layer`); 0: none
        self._variant_blobs: tuple = ()
        self._buckets: tuple = ()     # (n_bucket, layout) of the loaded variants
        self._dense: Optional[torch.Tensor] = None  # on a GPU, for "dense" buckets: the
                                                     # weight made dense (not in the state)
        self._loaded_on: Optional[int] = None
        self._finalizer = None
        # under torch.compile, an exact (erf) GELU that reads this layer's
        # output may be fused into its kernels as their tanh form (_passes.py)
        self.approximate_gelu = False

    # ---- building ------------------------------------------------------------
    @classmethod
    def from_dense(cls, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                   pattern: str = "auto", name: str = "weight") -> "SparseLinear":
        """The layer of a pruned dense weight (out_features x in_features;
        its zeros are what was pruned) and optional bias, on the weight's
        device and in its dtype.  `pattern`: the family and parameters the
        kernels will use ("bsr:64x64", "nm24", ...), or "auto": the family
        analysis finds the weight fits, as `sparseforge tune` does.  It has
        no kernels yet: give it some with load_kernels(db) (sparsify does
        both)."""
        return cls._of_matrix(matrix_of(weight, name), bias, pattern=pattern, name=name,
                              dtype=weight.dtype, device=weight.device)

    @classmethod
    def _of_matrix(cls, matrix, bias: Optional[torch.Tensor], pattern: str, name: str,
                   dtype: torch.dtype, device) -> "SparseLinear":
        """from_dense from the weight's SparseMatrix."""
        from ..generator.families import auto_pattern, family_of
        if pattern == "auto":
            pattern = auto_pattern(matrix)
        fam, params = family_of(pattern)
        layer = cls(matrix.cols, matrix.rows, bias is not None, pattern=fam.spec(params),
                    name=name, dtype=dtype, device=device)
        layer._set_weights(matrix, bias)
        return layer

    def _set_weights(self, matrix, bias: Optional[torch.Tensor]) -> None:
        dev, dtype = self.weight_values.device, self.weight_values.dtype
        self.weight_indptr = torch.from_numpy(np.asarray(matrix.indptr, np.int64)).to(dev)
        self.weight_indices = torch.from_numpy(np.asarray(matrix.indices, np.int32)).to(dev)
        self.weight_values = torch.from_numpy(np.asarray(matrix.values, np.float32)).to(dev, dtype)
        if bias is not None:
            if tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"{self.name}: the bias has shape {tuple(bias.shape)}, expected "
                                 f"({self.out_features},)")
            self.bias = bias.detach().to(dev, dtype).clone()

    def matrix(self):
        """The weight as sparseforge's SparseMatrix (what the kernels were
        made for)."""
        from ..generator.matrix import SparseMatrix
        values = self.weight_values.detach().float().cpu().numpy()
        return SparseMatrix((self.out_features, self.in_features),
                            self.weight_indptr.cpu().numpy(), self.weight_indices.cpu().numpy(),
                            values, dtype=self.dtype_name)

    def bias_array(self) -> Optional[np.ndarray]:
        return None if self.bias is None else self.bias.detach().float().cpu().numpy()

    def load_kernels(self, db=None, n=None, tune: bool = True, progress: bool = False,
                     **tuning) -> "SparseLinear":
        """Gives the layer kernels from the database `db` (default: the
        user's), tuning the N buckets `n` it lacks unless `tune` is False
        (then a layer it lacks raises MissingLayersError), as sparsify does
        for a whole model (`tuning`: its keywords, min_speedup among them:
        a bucket whose kernels lose to cuBLAS runs cuBLAS); loads them when
        the layer is on a GPU.  Returns the layer."""
        from .convert import DEFAULT_N, kernels_for
        kernels_for([self], db, DEFAULT_N if n is None else n, tune, progress, **tuning)
        return self

    def attach(self, code) -> None:
        """Takes the kernels of a tuner/resolve.py LayerCode (every
        architecture it holds), replacing those the layer had, and loads
        the ones for its GPU."""
        blobs: list = []
        cubins: list = []
        kernels = {}

        def index(table: list, data: bytes) -> int:
            for i, d in enumerate(table):
                if d == data:
                    return i
            table.append(data)
            return len(table) - 1

        def variant(v) -> dict:
            d = {"n_bucket": v.n_bucket, "kernel": v.kernel_name, "launch": dict(v.launch),
                 "config": dict(v.config), "median_ms": _time(v.median_ms),
                 "peer_ms": _time(v.peer_ms), "layout": v.layout}
            if v.layout == DENSE:      # no kernel: cuBLAS (the kernel that lost: sparse_ms)
                return dict(d, blob=-1, cubin=-1, sparse_ms=_time(v.sparse_ms))
            return dict(d, blob=index(blobs, v.packed), cubin=index(cubins, v.cubin))

        for arch, ac in sorted(code.archs.items()):
            kernels[arch] = {"gpu": ac.gpu_name, "variants": [variant(v) for v in ac.variants]}
            if any(v.layout == "fm" for v in ac.variants):
                kernels[arch]["transpose"] = index(cubins, _op.transpose_cubin(arch))
        self._unload()
        dev = self.weight_values.device
        for i in range(max(self._n_blobs, len(blobs))):
            if i < len(blobs):
                data = torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8) if blobs[i] \
                    else torch.zeros(0, dtype=torch.uint8)
                self.register_buffer(f"packed_{i}", data.to(dev))
            else:
                delattr(self, f"packed_{i}")
        self._n_blobs, self._cubins, self._kernels = len(blobs), cubins, kernels
        self._sync_device()

    # ---- state ---------------------------------------------------------------
    def get_extra_state(self) -> dict:
        dense = any(v.get("layout") == DENSE for k in self._kernels.values()
                    for v in k["variants"])
        return {"format": DENSE_FORMAT if dense else FORMAT, "name": self.name,
                "pattern": self.pattern,
                "dtype": self.dtype_name, "in_features": self.in_features,
                "out_features": self.out_features, "bias": self.bias is not None,
                "blobs": self._n_blobs, "kernels": _copy(self._kernels),
                "cubins": list(self._cubins)}

    def set_extra_state(self, state: dict) -> None:
        _check_state(state, self._where())
        self._unload()
        self.name, self.pattern, self.dtype_name = state["name"], state["pattern"], state["dtype"]
        self._kernels, self._cubins = _copy(state["kernels"]), list(state["cubins"])
        self._sync_device()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        """Shapes the buffers as the incoming state's (its number of nonzeros,
        bias and packed buffers), then loads it as any module does."""
        state = state_dict.get(prefix + "_extra_state")
        if isinstance(state, dict):
            try:
                _check_state(state, self._where())
            except ValueError as e:
                error_msgs.append(str(e))
                return
            if (state["in_features"], state["out_features"]) != (self.in_features,
                                                                  self.out_features):
                error_msgs.append(
                    f"{self._where()}: the state is of a {state['out_features']} x "
                    f"{state['in_features']} layer, this one is {self.out_features} x "
                    f"{self.in_features}")
                return
            self._reshape_buffers(state_dict, prefix, state)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _reshape_buffers(self, state_dict, prefix, state) -> None:
        self._unload()
        dev = self.weight_values.device
        dtype = TORCH_DTYPES[state["dtype"]]

        def like(key, dt):
            t = state_dict.get(prefix + key)
            return torch.empty(t.shape if t is not None else (0,), dtype=dt, device=dev)

        self.weight_indices = like("weight_indices", torch.int32)
        self.weight_values = like("weight_values", dtype)
        self.bias = like("bias", dtype) if state["bias"] else None
        for i in range(max(self._n_blobs, state["blobs"])):
            if i < state["blobs"]:
                self.register_buffer(f"packed_{i}", like(f"packed_{i}", torch.uint8))
            else:
                delattr(self, f"packed_{i}")
        self._n_blobs = state["blobs"]
        self.dtype_name = state["dtype"]

    def __getstate__(self):
        d = dict(self.__dict__)
        d.update(_layer_key=0, _variant_blobs=(), _buckets=(), _loaded_on=None, _finalizer=None,
                 _dense=None)
        return d

    def __setstate__(self, d):
        super().__setstate__(d)
        self._sync_device()

    # ---- devices ---------------------------------------------------------------
    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._sync_device()
        return out

    def _sync_device(self) -> None:
        """Loads the kernels of the GPU the layer is on (once per move);
        on CPU, none."""
        dev = self.weight_values.device
        target = dev.index if dev.type == "cuda" else None
        if target is not None and target == self._loaded_on and self._layer_key:
            return
        self._unload()
        if target is None:
            return
        info = _op.device_info(target)
        arch = info["arch"]
        k = self._kernels.get(arch)
        if k is None:
            have = ", ".join(f"{a} (from {v['gpu']})" for a, v in sorted(self._kernels.items()))
            raise RuntimeError(
                f"{self._where()}: no kernels for {arch} ({info['name']}); it holds "
                f"{have or 'none'}: run sparseforge.torch.sparsify(model, db) or "
                ".load_kernels(db) with this GPU present to tune them")
        key = self._load(target, k, self._where(), [v["kernel"] for v in k["variants"]],
                         [self._cubins[v["cubin"]] if v["cubin"] >= 0 else None
                          for v in k["variants"]])
        self._layer_key, self._loaded_on = key, target
        _op.register_fuser(key, self)
        self._variant_blobs = tuple(v["blob"] for v in k["variants"])
        self._buckets = tuple((v["n_bucket"], v.get("layout", "tm")) for v in k["variants"])
        if any(layout == DENSE for _, layout in self._buckets):
            with torch.no_grad():      # W dense, then the bias (_op.dense_parts)
                w = self.dense_weight().reshape(-1)
                self._dense = w if self.bias is None else torch.cat([w, self.bias])
        self._finalizer = weakref.finalize(self, _op.release, key)

    def _load(self, device: int, k: dict, name: str, kernel_names: list, cubins: list,
              act: Optional[str] = None) -> int:
        """_op.load of the architecture record `k`'s variants on GPU
        `device`, with these kernel names and cubins (one a variant; None
        for a "dense" one), and `act` in their epilogue."""
        variants = [{"n_bucket": v["n_bucket"], "kernel_name": kname, "launch": v["launch"],
                     "binary": cubin, "layout": v.get("layout", "tm")}
                    for v, kname, cubin in zip(k["variants"], kernel_names, cubins)]
        elem = torch.empty(0, dtype=TORCH_DTYPES[self.dtype_name]).element_size()
        transpose = self._cubins[k["transpose"]] if "transpose" in k else None
        return _op.load(device, name, self.out_features, self.in_features, elem, variants,
                        transpose, act)

    def _build_fused(self, act: str) -> int:
        """Loads this layer with `act` ("gelu", "relu") in its kernels'
        epilogue on its GPU: each variant's configuration generated again
        with the activation and compiled (NVRTC, the variants at once), the
        same packed tensors (and launch records); returns the loaded
        layer's key (_op.fused_layer calls it once a layer and activation)."""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from .. import native
        from ..generator.families import family_of
        from ..generator.kernel import Epilogue, Operation
        from ..tuner.compiler import nvrtc_compile
        dev = self.weight_values.device
        if dev.type != "cuda" or not self._layer_key:
            raise RuntimeError(f"{self._where()}: its kernels are not loaded on a GPU")
        arch = _op.device_info(dev.index)["arch"]
        k = self._kernels[arch]
        fam, params = family_of(self.pattern)
        matrix, bias = self.matrix(), self.bias_array()
        blobs: dict = {}                 # blob index -> its bytes (variants may share one)
        kernels = []
        for v in k["variants"]:
            if v.get("layout") == DENSE:      # cuBLAS: the op applies the activation after it
                kernels.append(None)
                continue
            op = Operation(self.dtype_name, v.get("layout", "tm"),
                           Epilogue(bias=bias is not None, activation=act))
            kern = fam.generate(matrix, op, params, v["config"], bias=bias)
            if v["blob"] not in blobs:
                blobs[v["blob"]] = getattr(self, f"packed_{v['blob']}").cpu().numpy().tobytes()
            if kern.packed != blobs[v["blob"]] or _record(kern.launch) != _record(v["launch"]):
                raise RuntimeError(f"{self._where()}: configuration {v['config']} packs or "
                                   f"launches differently with {act}; it cannot share the "
                                   "layer's packed tensors")
            kernels.append(kern)
        local = threading.local()

        def build(kern):     # a context a thread, as the tuner's compiler
            if getattr(local, "ctx", None) is None:
                local.ctx = native.Context(dev.index)
            cubin, err = nvrtc_compile(kern.source, kern.name + ".cu", arch, tuple(kern.options),
                                       ctx=local.ctx)
            if cubin is None:
                raise RuntimeError(f"{self._where()}: {kern.name} with {act}: {err}")
            return cubin

        with ThreadPoolExecutor(max_workers=min(8, len(kernels)) or 1) as pool:
            cubins = list(pool.map(lambda kern: kern and build(kern), kernels))
        return self._load(dev.index, k, f"{self._where()} + {act}",
                          [kern.name if kern else "" for kern in kernels], cubins, act)

    def _unload(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._layer_key, self._loaded_on, self._variant_blobs, self._finalizer = 0, None, (), None
        self._buckets, self._dense = (), None

    # ---- running ---------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(f"{self._where()} is for inference only: its input requires "
                               "grad; run it under torch.no_grad() or torch.inference_mode()")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self._where()}: the input's last dimension must be "
                             f"in_features = {self.in_features}, got shape {tuple(x.shape)}")
        dtype = self.weight_values.dtype
        if x.dtype != dtype:
            raise TypeError(f"{self._where()} computes in {dtype}, the input is {x.dtype}")
        dev = self.weight_values.device
        if x.device != dev:
            raise RuntimeError(f"{self._where()} is on {dev}, the input on {x.device}: move "
                               "the module (.to(device)) or the input")
        if dev.type != "cuda":
            return F.linear(x, self.dense_weight(), self.bias)
        if not self._layer_key:
            raise RuntimeError(f"{self._where()}: its kernels are not loaded on {dev}")
        if DTYPES[dtype] != self.dtype_name:
            raise TypeError(f"{self._where()}: its kernels compute {self.dtype_name}, its "
                            f"weights were converted to {dtype}; sparsify the model in "
                            f"{dtype} instead")
        # a "dense" variant's packed tensor is the dense weight (_sync_device)
        packed = [getattr(self, f"packed_{i}") if i >= 0 else self._dense
                  for i in self._variant_blobs]
        if type(x) is torch.Tensor and not _compiling():
            # eager or under CUDA graph capture: the op's own implementation,
            # without the dispatcher's host time
            return _op._linear_cuda(x, packed, self._layer_key, self.out_features)
        n = x.numel() // self.in_features if self.in_features else 0
        if isinstance(n, int) and _op.route_fm(self._buckets, n):
            # the bucket's feature-major kernel between transposes that
            # Inductor fuses into the ops around it (_op's module note)
            xt = x.reshape(n, self.in_features).t().contiguous()
            yt = torch.ops.sparseforge.linear_fm(xt, packed, self._layer_key, self.out_features)
            return yt.t().contiguous().reshape(*x.shape[:-1], self.out_features)
        if isinstance(n, int) and _op.route(self._buckets, n) == DENSE:
            # cuBLAS's bucket, as torch ops the compiler sees
            w, _ = _op.dense_parts(self._dense, self.out_features, self.in_features)
            return F.linear(x, w, self.bias)
        return torch.ops.sparseforge.linear(x, packed, self._layer_key, self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """The pruned weight, dense (out_features x in_features), made from
        the CSR buffers (what forward computes with on CPU)."""
        nnz = self.weight_values.shape[0]
        dev = self.weight_values.device
        rows = torch.searchsorted(self.weight_indptr,
                                  torch.arange(nnz, device=dev, dtype=torch.int64),
                                  right=True) - 1
        flat = rows * self.in_features + self.weight_indices.to(torch.int64)
        w = torch.zeros(self.out_features * self.in_features, dtype=self.weight_values.dtype,
                        device=dev)
        return w.index_put((flat,), self.weight_values).view(self.out_features,
                                                            self.in_features)

    # ---- describing ------------------------------------------------------------
    @property
    def density(self) -> float:
        total = self.in_features * self.out_features
        return self.weight_values.shape[0] / total if total else 0.0

    @property
    def kernels(self) -> dict:
        """arch -> {"gpu": the GPU they were tuned on (or "untuned (arch)"),
        "variants": one dict per N bucket (n_bucket, kernel, launch, config,
        blob, cubin, layout, and median_ms and peer_ms: the kernel's and
        cuBLAS's times when it was tuned, None where nothing was measured;
        for a feature-major bucket, median_ms is the whole route's, the
        transposes included; for a "dense" one, cuBLAS's, the kernel
        that lost to it in sparse_ms)}."""
        return _copy(self._kernels)

    def _where(self) -> str:
        return f"SparseLinear {self.name!r}"

    def extra_repr(self) -> str:
        archs = ", ".join(sorted(self._kernels)) or "none"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, pattern={self.pattern}, "
                f"density={self.density:.3f}, kernels={archs}")


def _compiling() -> bool:
    """Whether torch.compile (or torch.export) is tracing."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    return torch._dynamo.is_compiling()


def matrix_of(weight: torch.Tensor, name: str = "weight"):
    """sparseforge's SparseMatrix of a dense 2-D weight (its nonzeros)."""
    from ..generator.matrix import SparseMatrix
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"{name}: a weight is a 2-D tensor, got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    tag = dtype_tag(weight.dtype)
    return SparseMatrix.from_dense(weight.detach().float().cpu().numpy(), dtype=tag)


_STATE_KEYS = ("format", "name", "pattern", "dtype", "in_features", "out_features", "bias",
               "blobs", "kernels", "cubins")


def _check_state(state, where: str) -> None:
    if not isinstance(state, dict) or sorted(state) != sorted(_STATE_KEYS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{where}: not a SparseLinear state (expected the keys "
                         f"{', '.join(_STATE_KEYS)}; got {got})")
    if state["format"] not in READ_FORMATS:
        raise ValueError(f"{where}: the state is of format {state['format']}, this "
                         f"sparseforge reads formats {', '.join(map(str, READ_FORMATS))}")
    if state["dtype"] not in TORCH_DTYPES:
        raise ValueError(f"{where}: unknown dtype {state['dtype']!r} in the state")


def _time(ms: float) -> Optional[float]:
    """A time measured when tuning, None where nothing was (NaN would not
    compare equal to itself after a round trip)."""
    return ms if ms == ms else None


def _record(launch: dict) -> dict:
    """A launch record with its sequences as tuples (a record read from
    the database or a state holds lists where a generated one holds tuples)."""
    return {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in launch.items()}


def _copy(kernels: dict) -> dict:
    return {arch: dict(k, variants=[dict(v, launch=dict(v["launch"]), config=dict(v["config"]))
                                    for v in k["variants"]])
            for arch, k in kernels.items()}
