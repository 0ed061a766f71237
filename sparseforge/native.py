"""ctypes binding of the libsparseforge runtime (runtime/sparseforge.h).

One implementation of compile, load, launch and timing lives in C; this
module only converts arguments and turns status codes into exceptions:

    from sparseforge import native
    ok, why = native.gpu_available()
    with native.Context(0) as ctx:
        binary = ctx.compile(source, arch="sm_90a")
        fn = ctx.load(binary).kernel("my_kernel")
        x = ctx.upload(np.arange(1024, dtype=np.float32))
        y = ctx.alloc(4096)
        ctx.launch(fn, grid=4, block=256, args=[x, y, 1024], sig="PPi")
        ctx.synchronize()
        out = np.frombuffer(ctx.download(y), dtype=np.float32)

Errors raise SFError subclasses (see _ERRORS): NoDriverError and
NoDeviceError where there is no GPU, CompileError (with .log) when NVRTC
rejects a source, InvalidArgumentError (also a ValueError) for arguments the
library refuses.  Arguments that are wrong before they reach the library
raise ValueError or TypeError with a precise message.

The cache's own binding (the sf_cache_* calls) is not here; a Cache object
from it, or a raw sf_cache pointer, is what Context.open_layer takes.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char, c_char_p, c_int, c_int64, c_size_t, c_uint64, c_void_p
from typing import Any, Optional, Sequence

from . import _abi
from ._abi import (sf_blocked_ell_desc, sf_compile_options, sf_csr_desc, sf_csr_timing,
                   sf_device_info, sf_gemm_desc, sf_gemm_timing, sf_kernel_args, sf_kernel_attrs,
                   sf_launch_config, sf_launch_record, sf_sparselt_desc, sf_sparselt_timing,
                   sf_timing, sf_timing_options)
from ._lib import STATUS, SFError, error_for, load, raises

__all__ = [
    "SFError", "InvalidArgumentError", "NoDriverError", "NoDeviceError", "CudaError", "FaultError",
    "CompileError", "NvrtcError", "NotFoundError", "LaunchError", "NoBinaryError",
    "CorruptError", "gpu_available", "nvrtc_version", "version", "Context", "Binary",
    "Module", "KernelFn", "DeviceBuffer", "Layer",
]

# ---------------------------------------------------------------------------
# Status codes (the header's SF_STATUS_TABLE, through _abi) and exceptions
# ---------------------------------------------------------------------------
# every status code by name (SF_OK, SF_ERR_INVALID_ARG, ...), from the header's table
globals().update(STATUS)
SF_OK = STATUS["SF_OK"]
SF_BINARY_CUBIN = _abi.CONSTANTS["SF_BINARY_CUBIN"]
SF_BINARY_PTX = _abi.CONSTANTS["SF_BINARY_PTX"]


@raises("SF_ERR_INVALID_ARG")
class InvalidArgumentError(SFError, ValueError):
    """SF_ERR_INVALID_ARG: the library refused an argument."""


@raises("SF_ERR_NO_DRIVER")
class NoDriverError(SFError):
    """SF_ERR_NO_DRIVER: libcuda could not be loaded."""


@raises("SF_ERR_NO_DEVICE")
class NoDeviceError(SFError):
    """SF_ERR_NO_DEVICE: a driver but no (such) GPU."""


@raises("SF_ERR_CUDA")
class CudaError(SFError):
    """SF_ERR_CUDA: a CUDA driver call failed (the message names the
    error)."""


@raises("SF_ERR_FAULT")
class FaultError(CudaError):
    """SF_ERR_FAULT: a kernel faulted (e.g. CUDA_ERROR_ILLEGAL_ADDRESS); the
    context is unusable and must be closed, and every later GPU call on it
    fails the same way."""


@raises("SF_ERR_COMPILE")
class CompileError(SFError):
    """SF_ERR_COMPILE: NVRTC rejected the source.  `log` is the compiler's
    log (the message holds it too)."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(status, name, message)
        self.log = _log_from_message(message)


@raises("SF_ERR_NVRTC")
class NvrtcError(SFError):
    """SF_ERR_NVRTC: NVRTC failed for another reason (e.g. an unknown
    option)."""


@raises("SF_ERR_NOT_FOUND")
class NotFoundError(SFError, LookupError):
    """SF_ERR_NOT_FOUND: no such kernel, layer, ..."""


@raises("SF_ERR_LAUNCH")
class LaunchError(SFError):
    """SF_ERR_LAUNCH: the driver refused a launch (configuration, shared
    memory, ...)."""


@raises("SF_ERR_NO_BINARY")
class NoBinaryError(SFError):
    """SF_ERR_NO_BINARY: no cubin for this GPU and compiling failed."""


@raises("SF_ERR_CORRUPT")
class CorruptError(SFError):
    """SF_ERR_CORRUPT: stored data failed its checksum."""


def _log_from_message(message: str) -> str:
    """The compiler log inside an SF_ERR_COMPILE message: what follows the
    first line, without the "(include path: ...)" note."""
    head, sep, log = message.partition("\n")
    if not sep:
        return message
    note = log.rfind("\n(include path: ")
    if note >= 0 and log.endswith(")"):
        log = log[:note]
    return log


_clib = load   # every prototype is declared by the loader
_local = threading.local()


def _timing_options(warmup, min_reps, max_reps, min_total_ms, flush_l2, graph_batch,
                    rotate_bytes=0):
    o = sf_timing_options()
    o.warmup = _as_int(warmup, "warmup") if warmup else -1  # 0: none
    o.min_reps = _as_int(min_reps, "min_reps")
    o.max_reps = _as_int(max_reps, "max_reps")
    # 0 would mean "the default" to the library: ask for no minimum
    o.min_total_ms = float(min_total_ms) or 1e-9
    o.flush_l2 = 1 if flush_l2 else 0
    o.graph_batch = _as_int(graph_batch, "graph_batch")
    rotate = _as_int(rotate_bytes, "rotate_bytes")
    if rotate < 0:
        raise ValueError(f"rotate_bytes must not be negative, got {rotate}")
    o.rotate_bytes = rotate
    if o.min_reps < 1 or o.max_reps < o.min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {o.min_reps}, {o.max_reps}")
    if o.min_total_ms < 0 or o.graph_batch < 0 or o.warmup < -1:
        raise ValueError("warmup, min_total_ms and graph_batch must not be negative")
    return o


def _find_sparselt() -> None:
    """Points $SF_CUSPARSELT at the cuSPARSELt of an installed
    `nvidia-cusparselt` wheel (as PyTorch brings it) when the variable is
    unset; the C library then tries the usual names."""
    import os
    if os.environ.get("SF_CUSPARSELT"):
        return
    import glob
    import sys
    for base in sys.path:
        for pattern in ("nvidia/cusparselt/lib/libcusparseLt.so*",
                        "nvidia/cu*/lib/libcusparseLt.so*"):
            found = sorted(glob.glob(os.path.join(base, pattern)))
            if found:
                os.environ["SF_CUSPARSELT"] = found[0]
                return


_DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2}  # sf_dtype
_LAYOUTS = {"fm": 0, "tm": 1, "best": -1}


def _timing_dict(t: sf_timing) -> dict:
    return {"median_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
            "min_ms": t.min_ms, "mean_ms": t.mean_ms, "reps": t.reps}


def _check(status: int, ctx_handle: Optional[c_void_p] = None) -> None:
    """Raises the exception for a failed call, with the message kept on the
    context (else the status's description)."""
    if status == SF_OK:
        return
    lib = _clib()
    message = lib.sf_errmsg(ctx_handle).decode("utf-8", "replace") if ctx_handle else ""
    raise error_for(status, message or lib.sf_errstr(status).decode())


def _bytes(s: str, what: str) -> bytes:
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str, not {type(s).__name__}")
    if "\0" in s:
        raise ValueError(f"{what} contains a NUL character")
    return s.encode("utf-8")


def _str_array(items: Sequence[str], what: str):
    """A NULL-terminated char*[] (or None for an empty sequence)."""
    if isinstance(items, str):
        raise TypeError(f"{what} must be a sequence of str, not a single str")
    items = list(items)
    if not items:
        return None
    arr = (c_char_p * (len(items) + 1))()
    for i, s in enumerate(items):
        arr[i] = _bytes(s, f"{what}[{i}]")
    arr[len(items)] = None
    return arr


# ---------------------------------------------------------------------------
# The launch record (SF_LAUNCH_RECORD_FIELDS), as a dict on the Python side
# ---------------------------------------------------------------------------
LAUNCH_FIELDS = tuple(name for name, _, _, _ in _abi.LAUNCH_RECORD_FIELDS)


def launch_record(launch: dict, what: str = "launch") -> sf_launch_record:
    """The C record of a launch dict: every field of the header's table,
    arrays as sequences of their length, integers (a bool is 0 or 1)."""
    if not isinstance(launch, dict):
        raise TypeError(f"{what} must be a dict with {', '.join(LAUNCH_FIELDS)}, "
                        f"not {type(launch).__name__}")
    missing = [f for f in LAUNCH_FIELDS if f not in launch]
    unknown = sorted(set(launch) - set(LAUNCH_FIELDS))
    if missing or unknown:
        raise ValueError(f"{what}: the launch record has exactly {', '.join(LAUNCH_FIELDS)}; "
                         f"missing {missing}, unknown {unknown}")
    rec = sf_launch_record()
    for name, ctype, count, _ in _abi.LAUNCH_RECORD_FIELDS:
        value = launch[name]
        lo, hi = (0, 2 ** 32 - 1) if ctype.startswith("unsigned") else (-2 ** 31, 2 ** 31 - 1)
        values = list(value) if count else [value]
        if count and (isinstance(value, (str, bytes)) or len(values) != count):
            raise ValueError(f"{what}.{name} must be {count} integers, got {value!r}")
        for v in values:
            if isinstance(v, bool):
                v = int(v)
            if not hasattr(v, "__index__") or not lo <= v.__index__() <= hi:
                raise ValueError(f"{what}.{name}: {v!r} is not a {ctype} value")
        if count:
            getattr(rec, name)[:] = [int(v) for v in values]
        else:
            setattr(rec, name, int(values[0]))
    return rec


def launch_dict(rec: sf_launch_record) -> dict:
    """The launch dict of a C record (arrays as tuples)."""
    return {name: (tuple(getattr(rec, name)) if count else getattr(rec, name))
            for name, _, count, _ in _abi.LAUNCH_RECORD_FIELDS}


def launch_config(launch: dict, n: int, ctx: Optional["Context"] = None) -> dict:
    """grid, block and shared_bytes of `launch` for N columns, by the C
    library's one grid rule (sf_launch_config_for).  ValueError
    (InvalidArgumentError) naming N and the axis past CUDA's limits."""
    rec = launch_record(launch)
    cfg = sf_launch_config()
    if ctx is None:   # a context only to hold the message (it never touches a GPU here)
        ctx = getattr(_local, "ctx", None) or Context(0)
        _local.ctx = ctx
    h = ctx._live_handle()
    _check(_clib().sf_launch_config_for(h, byref(rec), _as_int(n, "n"), None, byref(cfg)), h)
    return {"grid": tuple(cfg.grid), "block": tuple(cfg.block), "shared_bytes": cfg.shared_bytes}


# ---------------------------------------------------------------------------
# Module-level helpers
# ---------------------------------------------------------------------------
def version() -> str:
    """The library's version string."""
    return _clib().sf_version().decode()


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC the library uses."""
    major, minor = c_int(), c_int()
    _check(_clib().sf_nvrtc_version(byref(major), byref(minor)))
    return major.value, minor.value


_gpu_state: Optional[tuple[bool, str]] = None


def gpu_available() -> tuple[bool, str]:
    """(True, "<GPU name> (<arch>)") when device 0 answers, else (False,
    why): the library's own message ("no CUDA driver found: ...", "no CUDA
    device: ...") or why the library could not be loaded.  Never raises.
    Asked once per process."""
    global _gpu_state
    if _gpu_state is not None:
        return _gpu_state
    try:
        with Context(0) as ctx:
            info = ctx.device_info()
        _gpu_state = (True, f"{info['name']} ({info['arch']})")
    except SFError as e:
        _gpu_state = (False, e.message)
    except Exception as e:  # noqa: BLE001 - the library is missing or broken
        _gpu_state = (False, f"{type(e).__name__}: {e}")
    return _gpu_state


# ---------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------
class Binary:
    """A compiled program: `data` (cubin bytes, or PTX text with its NUL),
    `log` (the compiler's log) and `ptx` (True for PTX)."""

    __slots__ = ("data", "log", "ptx")

    def __init__(self, data: bytes, log: str = "", ptx: bool = False):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"binary data must be bytes, not {type(data).__name__}")
        data = bytes(data)
        if not data:
            raise ValueError("binary data is empty")
        if ptx and not data.endswith(b"\0"):
            data += b"\0"
        self.data = data
        self.log = log
        self.ptx = bool(ptx)

    @classmethod
    def from_bytes(cls, data: bytes, ptx: bool = False) -> "Binary":
        """Wraps bytes read from a cache or a file."""
        return cls(data, "", ptx)

    @property
    def kind(self) -> int:
        return SF_BINARY_PTX if self.ptx else SF_BINARY_CUBIN

    @property
    def text(self) -> str:
        """The PTX as text (ValueError for a cubin)."""
        if not self.ptx:
            raise ValueError("a cubin is not text")
        return self.data.rstrip(b"\0").decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Binary({'PTX' if self.ptx else 'cubin'}, {len(self.data)} bytes)"


class _Owned:
    """Something that belongs to a Context and dies with it."""

    def __init__(self, ctx: "Context"):
        self._ctx = ctx

    def _handle_of_ctx(self) -> c_void_p:
        return self._ctx._live_handle()


class DeviceBuffer(_Owned):
    """Device memory allocated by a Context.  `.ptr` is the device address
    (int), `.nbytes` its size.  Freed by free(), by garbage collection, or
    when its context closes."""

    def __init__(self, ctx: "Context", ptr: int, nbytes: int):
        super().__init__(ctx)
        self.ptr = ptr
        self.nbytes = nbytes

    def free(self) -> None:
        """Frees the memory (again: no-op)."""
        if not self.ptr:
            return
        ptr, self.ptr = self.ptr, 0
        if self._ctx._h is None:  # the context freed it already
            return
        _check(_clib().sf_mem_free(self._ctx._h, ptr), self._ctx._h)

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - a faulted context cannot free
            pass

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"DeviceBuffer(0x{self.ptr:x}, {self.nbytes} bytes)"


class KernelFn:
    """A kernel in a loaded module."""

    def __init__(self, module: "Module", handle: c_void_p, name: str):
        self.module = module
        self._h = handle
        self.name = name

    def attributes(self) -> dict:
        """dict(num_regs, shared_bytes, local_bytes, max_threads)."""
        ctx = self.module._ctx
        h = ctx._live_handle()
        self.module._live()
        a = sf_kernel_attrs()
        _check(_clib().sf_kernel_attributes(h, self._h, byref(a)), h)
        return {"num_regs": a.num_regs, "shared_bytes": a.shared_bytes,
                "local_bytes": a.local_bytes, "max_threads": a.max_threads}

    def __repr__(self) -> str:
        return f"KernelFn({self.name!r})"


class Module(_Owned):
    """A binary loaded on the context's GPU."""

    def __init__(self, ctx: "Context", handle: c_void_p):
        super().__init__(ctx)
        self._h = handle
        self._kernels: dict[str, KernelFn] = {}

    def _live(self) -> c_void_p:
        if self._h is None:
            raise ValueError("the module was unloaded")
        return self._h

    def kernel(self, name: str) -> KernelFn:
        """The kernel `name` (extern "C" or mangled); NotFoundError if the
        module has none."""
        if name in self._kernels:
            return self._kernels[name]
        h = self._handle_of_ctx()
        k = c_void_p()
        _check(_clib().sf_kernel_get(h, self._live(), _bytes(name, "kernel name"), byref(k)), h)
        fn = self._kernels[name] = KernelFn(self, k, name)
        return fn

    def unload(self) -> None:
        """Unloads the module (again: no-op); its kernels become invalid."""
        if self._h is None:
            return
        h, self._h = self._h, None
        self._kernels.clear()
        if self._ctx._h is not None:
            _clib().sf_module_unload(h)

    def __del__(self):
        try:
            self.unload()
        except Exception:  # noqa: BLE001
            pass


class Layer(_Owned):
    """A tuned layer: opened from the cache (Context.open_layer) or loaded
    from memory (Context.load_layer)."""

    def __init__(self, ctx: "Context", handle: c_void_p, name: str):
        super().__init__(ctx)
        self._h = handle
        self.name = name

    def _live(self) -> c_void_p:
        if self._h is None:
            raise ValueError(f"layer {self.name!r} is closed")
        return self._h

    def run(self, x, y, n: int, stream=None, packed: Optional[Sequence] = None) -> None:
        """Y = layer(X) for n columns; x and y are device pointers
        (DeviceBuffer, int, or a CUDA array).  `packed`: one device pointer
        per variant, in the order they were loaded, holding its packed
        weights (sf_layer_run_packed), for a layer loaded without them.
        Does not wait, allocates and copies nothing."""
        h = self._handle_of_ctx()
        n = _as_int(n, "n")
        if packed is None:
            _check(_clib().sf_layer_run(h, self._live(), _device_ptr(x, "x"),
                                        _device_ptr(y, "y"), n, _stream(stream)), h)
            return
        ptrs = [_device_ptr(p, f"packed[{i}]") for i, p in enumerate(packed)]
        arr = (c_uint64 * max(1, len(ptrs)))(*ptrs)
        self.run_raw(_device_ptr(x, "x"), _device_ptr(y, "y"), n, arr, len(ptrs),
                     _stream(stream))

    def run_raw(self, x: int, y: int, n: int, packed, count: int, stream) -> None:
        """Layer.run(packed=...) for a caller holding plain ints and a ctypes
        uint64 array of `count` packed addresses: no conversions, only the
        runtime's own checks (sparseforge.torch's launch, on the host's
        critical path when a model runs outside a CUDA graph)."""
        h = self._handle_of_ctx()
        _check(_clib().sf_layer_run_packed(h, self._live(), packed, count, x, y, n,
                                           stream or None), h)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows, cols, n_variants)."""
        rows, cols, nv = c_int64(), c_int64(), c_int()
        _check(_clib().sf_layer_shape(self._live(), byref(rows), byref(cols), byref(nv)))
        return rows.value, cols.value, nv.value

    @property
    def compiled_count(self) -> int:
        """How many variants opening the layer had to compile."""
        return _clib().sf_layer_compiled_count(self._live())

    def close(self) -> None:
        if self._h is None:
            return
        h, self._h = self._h, None
        if self._ctx._h is not None:
            _clib().sf_layer_close(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "Layer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------
# Argument conversion
# ---------------------------------------------------------------------------
def _as_int(v, what: str) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{what} must be an int, not {type(v).__name__}")
    return v.__index__()


def _device_ptr(v, what: str) -> int:
    """A device address from a DeviceBuffer, an int, None (0), a torch
    tensor (data_ptr()) or an object with __cuda_array_interface__."""
    if v is None:
        return 0
    if isinstance(v, DeviceBuffer):
        if not v.ptr:
            raise ValueError(f"{what}: the DeviceBuffer was freed")
        return v.ptr
    if isinstance(v, bool):
        raise TypeError(f"{what}: a bool is not a device pointer")
    if isinstance(v, int) or hasattr(v, "__index__"):
        p = v.__index__()
        if p < 0 or p >= 1 << 64:
            raise ValueError(f"{what}: {p} is not a 64-bit device address")
        return p
    if hasattr(v, "data_ptr"):
        return int(v.data_ptr())
    cai = getattr(v, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    raise TypeError(f"{what}: {type(v).__name__} is not a device pointer "
                    "(DeviceBuffer, int, or a CUDA array)")


def _stream(s) -> Optional[int]:
    """A CUstream handle from None, an int, or a torch/cupy stream."""
    if s is None:
        return None
    if isinstance(s, int):
        return s or None
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(s, attr):
            return int(getattr(s, attr)) or None
    raise TypeError(f"stream: {type(s).__name__} is not a CUDA stream")


def _dims(v, what: str) -> tuple[int, int, int]:
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int or 1 to 3 ints")
    if hasattr(v, "__index__"):
        v = (v.__index__(),)
    try:
        dims = [_as_int(d, what) for d in v]
    except TypeError:
        raise TypeError(f"{what} must be an int or 1 to 3 ints, not {v!r}") from None
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {len(dims)}")
    if any(d < 1 or d >= 1 << 32 for d in dims):
        raise ValueError(f"{what} dimensions must be in 1..2**32-1, got {tuple(dims)}")
    dims += [1] * (3 - len(dims))
    return dims[0], dims[1], dims[2]


_SIG = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "q": ctypes.c_int64,
        "f": ctypes.c_float, "d": ctypes.c_double}


def _infer_sig(args) -> str:
    out = []
    for i, a in enumerate(args):
        if isinstance(a, DeviceBuffer) or hasattr(a, "data_ptr") or \
                hasattr(a, "__cuda_array_interface__"):
            out.append("P")
        elif isinstance(a, float):
            out.append("f")
        else:
            dtype = getattr(a, "dtype", None)
            kinds = {"float32": "f", "float64": "d", "int32": "i", "int64": "q"}
            if dtype is not None and str(dtype) in kinds:
                out.append(kinds[str(dtype)])
            else:
                raise ValueError(
                    f"argument {i} ({a!r}) is ambiguous without sig: pass sig= "
                    "(P pointer, i int32, q int64, f float32, d float64)")
    return "".join(out)


class KernelArgs:
    """The arguments of one launch of a generated kernel (packed, X, Y, N
    and, where its module declares them, the tensor maps of X and Y), as
    Context.kernel_args makes them (sf_kernel_args_set).  launch(), time()
    and time_sets() take it in place of an argument list."""

    def __init__(self, raw: sf_kernel_args, keep: tuple):
        self._raw = raw
        self._keep = keep   # the buffers it points at

    @property
    def maps(self) -> int:
        """The tensor maps the kernel takes (0, 1 or 2)."""
        return self._raw.n_args - 4


def _kernel_args(args, sig: Optional[str]):
    """(void*[] array, keep-alive list) for cuLaunchKernel."""
    if isinstance(args, KernelArgs):
        return args._raw.ptrs, args
    args = list(args)
    if sig is None:
        sig = _infer_sig(args)
    if not isinstance(sig, str):
        raise TypeError("sig must be a str such as \"PPPi\"")
    if len(sig) != len(args):
        raise ValueError(f"sig {sig!r} names {len(sig)} arguments but {len(args)} were given")
    values = []
    for i, (c, a) in enumerate(zip(sig, args)):
        ctype = _SIG.get(c)
        if ctype is None:
            raise ValueError(f"sig {sig!r}: {c!r} is not one of P (pointer), i (int32), "
                             "q (int64), f (float32), d (float64)")
        if c == "P":
            values.append(ctype(_device_ptr(a, f"argument {i}")))
        elif c in "iq":
            v = _as_int(a, f"argument {i}")
            bits = 32 if c == "i" else 64
            if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
                raise ValueError(f"argument {i} = {v} does not fit in int{bits}")
            values.append(ctype(v))
        else:
            try:
                values.append(ctype(float(a)))
            except (TypeError, ValueError):
                raise TypeError(f"argument {i} ({a!r}) is not a number") from None
    arr = (c_void_p * max(1, len(values)))()
    for i, v in enumerate(values):
        arr[i] = ctypes.cast(byref(v), c_void_p)
    return arr, values


def _int32_matrix(v, what: str):
    """A C-contiguous int32 copy of a 2-D integer array with at least one
    column (values checked to fit)."""
    import numpy as np
    a = np.asarray(v)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"{what} must be a 2-D array with at least one column, "
                         f"got shape {a.shape}")
    return _int32(a, what)


def _int32_vector(v, what: str):
    """A C-contiguous int32 copy of a 1-D integer array (values checked to
    fit)."""
    import numpy as np
    a = np.asarray(v)
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array, got shape {a.shape}")
    return _int32(a, what)


def _int32(a, what: str):
    import numpy as np
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers, not {a.dtype}")
    if a.size and (a.min() < -(1 << 31) or a.max() >= 1 << 31):
        raise ValueError(f"{what} holds values outside int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _host_buffer(data):
    """(address, nbytes, keep-alive) of bytes-like data or a numpy array."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = None
    if np is not None and isinstance(data, np.ndarray):
        arr = np.ascontiguousarray(data)
        return arr.ctypes.data, arr.nbytes, arr
    if isinstance(data, bytes):
        return ctypes.cast(c_char_p(data), c_void_p).value, len(data), data
    if isinstance(data, (bytearray, memoryview)):
        mv = memoryview(data).cast("B")
        if mv.readonly:
            b = mv.tobytes()
            return ctypes.cast(c_char_p(b), c_void_p).value, len(b), b
        buf = (c_char * len(mv)).from_buffer(mv)
        return ctypes.addressof(buf), len(mv), (buf, mv)
    raise TypeError(f"cannot upload {type(data).__name__}: give bytes or a numpy array")


# ---------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------
class Context:
    """One GPU (by ordinal) and everything loaded or allocated on it.
    Creating it never touches the GPU; compiling for a named arch works
    without one.  Use from one thread at a time."""

    def __init__(self, device: int = 0):
        device = _as_int(device, "device")
        if device < 0:
            raise ValueError(f"device ordinal must be >= 0, got {device}")
        lib = _clib()
        h = c_void_p()
        _check(lib.sf_context_create(device, byref(h)))
        self._h: Optional[c_void_p] = h
        self.device = device
        self._info: Optional[dict] = None

    # ---- lifetime ----------------------------------------------------------
    def _live_handle(self) -> c_void_p:
        if self._h is None:
            raise ValueError("the context is closed")
        return self._h

    def close(self) -> None:
        """Frees everything the context owns: modules, layers and device
        memory (objects that refer to them become invalid)."""
        if self._h is None:
            return
        h, self._h = self._h, None
        _clib().sf_context_destroy(h)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # ---- device ------------------------------------------------------------
    def device_info(self) -> dict:
        """The sf_device_info fields as a dict (name, cc_major, cc_minor,
        arch, sm_count, l2_bytes, smem_per_block_optin, smem_per_sm,
        regs_per_block, max_threads_per_block, clock_khz, driver_version,
        total_mem_bytes)."""
        if self._info is None:
            h = self._live_handle()
            info = sf_device_info()
            _check(_clib().sf_device_info_get(h, byref(info)), h)
            d = {}
            for name, _ in sf_device_info._fields_:
                v = getattr(info, name)
                d[name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            self._info = d
        return dict(self._info)

    def device_count(self) -> int:
        """Number of CUDA devices (NoDriverError without a driver)."""
        h = self._live_handle()
        n = c_int()
        _check(_clib().sf_device_count(h, byref(n)), h)
        return n.value

    # ---- compiling ---------------------------------------------------------
    @staticmethod
    def _options(arch, ptx, include_dirs=(), options=(), cuda_include_dir=None):
        if arch is not None:
            _bytes(arch, "arch")
        o = sf_compile_options()
        keep = []
        o.arch = arch.encode() if arch is not None else None
        o.kind = SF_BINARY_PTX if ptx else SF_BINARY_CUBIN
        inc = _str_array([str(d) for d in include_dirs], "include_dirs")
        ext = _str_array(options, "options")
        keep += [inc, ext]
        o.include_dirs = ctypes.cast(inc, POINTER(c_char_p)) if inc is not None else None
        o.extra_options = ctypes.cast(ext, POINTER(c_char_p)) if ext is not None else None
        if cuda_include_dir is not None:
            o.cuda_include_dir = _bytes(str(cuda_include_dir), "cuda_include_dir")
        return o, keep

    def compile(self, source: str, name: str = "kernel.cu", arch: Optional[str] = None,
                ptx: bool = False, include_dirs: Sequence[str] = (),
                options: Sequence[str] = (), cuda_include_dir: Optional[str] = None) -> Binary:
        """Compiles CUDA C++ with NVRTC to a cubin (or PTX with ptx=True).
        arch None or "native" means this context's GPU.  Raises
        CompileError (with .log) when the source does not compile."""
        h = self._live_handle()
        o, keep = self._options(arch, ptx, include_dirs, options, cuda_include_dir)
        b = c_void_p()
        lib = _clib()
        _check(lib.sf_compile(h, _bytes(source, "source"), _bytes(name, "name"), byref(o),
                              byref(b)), h)
        try:
            size = c_size_t()
            ptr = lib.sf_binary_data(b, byref(size))
            data = ctypes.string_at(ptr, size.value)
            log = lib.sf_binary_log(b).decode("utf-8", "replace")
        finally:
            lib.sf_binary_free(b)
        del keep
        return Binary(data, log, ptx)

    def canonical_options(self, arch: Optional[str] = None, ptx: bool = False,
                          options: Sequence[str] = ()) -> str:
        """The option string that keys a binary (no include paths)."""
        h = self._live_handle()
        o, keep = self._options(arch, ptx, (), options)
        out = c_void_p()
        lib = _clib()
        _check(lib.sf_compile_canonical_options(h, byref(o), byref(out)), h)
        try:
            return ctypes.string_at(out.value).decode("utf-8")
        finally:
            lib.sf_free_buffer(out)

    # ---- modules and launches -----------------------------------------------
    def load(self, binary: Binary) -> Module:
        """Loads a Binary on this GPU."""
        if not isinstance(binary, Binary):
            raise TypeError(f"load() takes a Binary, not {type(binary).__name__}")
        h = self._live_handle()
        lib = _clib()
        b = c_void_p()
        _check(lib.sf_binary_from_memory(binary.data, len(binary.data), binary.kind, byref(b)))
        try:
            m = c_void_p()
            _check(lib.sf_module_load(h, b, byref(m)), h)
        finally:
            lib.sf_binary_free(b)
        return Module(self, m)

    def _kernel_handle(self, kfn: KernelFn) -> c_void_p:
        if not isinstance(kfn, KernelFn):
            raise TypeError(f"expected a KernelFn, not {type(kfn).__name__}")
        if kfn.module._ctx is not self:
            raise ValueError(f"kernel {kfn.name!r} belongs to another context")
        kfn.module._live()
        return kfn._h

    @staticmethod
    def _config(grid, block, shared, stream) -> sf_launch_config:
        cfg = sf_launch_config()
        cfg.grid[:] = _dims(grid, "grid")
        cfg.block[:] = _dims(block, "block")
        shared = _as_int(shared, "shared")
        if not 0 <= shared < 1 << 32:
            raise ValueError(f"shared must be in 0..2**32-1 bytes, got {shared}")
        cfg.shared_bytes = shared
        cfg.stream = _stream(stream)
        return cfg

    def kernel_args(self, kfn: KernelFn, packed, x, y, n: int) -> KernelArgs:
        """The arguments of a generated kernel's launch on device buffers
        (see sf_kernel_args_set): with the TMA map of X where its module
        declares one."""
        h = self._live_handle()
        k = self._kernel_handle(kfn)
        raw = sf_kernel_args()
        _check(_clib().sf_kernel_args_set(h, k, _device_ptr(packed, "packed"), _device_ptr(x, "X"),
                                          _device_ptr(y, "Y"), _as_int(n, "n"), byref(raw)), h)
        return KernelArgs(raw, (packed, x, y))

    def launch(self, kfn: KernelFn, grid, block, args: Sequence[Any] = (),
               sig: Optional[str] = None, shared: int = 0, stream=None) -> None:
        """Launches kfn(*args) without waiting.  sig gives each argument's
        type: P pointer (DeviceBuffer, int, CUDA array), i int32, q int64,
        f float32, d float64; without it, types are inferred where that is
        unambiguous (a plain int is not)."""
        h = self._live_handle()
        k = self._kernel_handle(kfn)
        cfg = self._config(grid, block, shared, stream)
        arr, keep = _kernel_args(args, sig)
        _check(_clib().sf_launch(h, k, byref(cfg), arr), h)
        del keep

    def time(self, kfn: KernelFn, grid, block, args: Sequence[Any] = (),
             sig: Optional[str] = None, shared: int = 0, warmup: int = 3, min_reps: int = 30,
             max_reps: int = 1000, min_total_ms: float = 100.0, flush_l2: bool = True,
             graph_batch: int = 0, stream=None) -> dict:
        """Times kfn with CUDA events (see sf_time_kernel): dict(median_ms,
        p20_ms, p80_ms, min_ms, mean_ms, reps).  To rotate a kernel's
        operands, make the copies and use time_sets."""
        return self.time_sets(kfn, grid, block, [args], sig, shared, warmup, min_reps,
                              max_reps, min_total_ms, flush_l2, graph_batch, stream)

    def time_sets(self, kfn: KernelFn, grid, block, arg_sets: Sequence[Sequence[Any]],
                  sig: Optional[str] = None, shared: int = 0, warmup: int = 3,
                  min_reps: int = 30, max_reps: int = 1000, min_total_ms: float = 100.0,
                  flush_l2: bool = True, graph_batch: int = 0, stream=None) -> dict:
        """Times kfn launched with each argument list of `arg_sets` in turn
        (each naming its own copy of the operands: see sf_time_kernel_sets),
        as time() does for one list."""
        h = self._live_handle()
        k = self._kernel_handle(kfn)
        cfg = self._config(grid, block, shared, stream)
        sets = list(arg_sets)
        if not sets:
            raise ValueError("arg_sets is empty")
        built = [_kernel_args(a, sig) for a in sets]
        arr = (c_void_p * len(built))()
        for i, (a, _) in enumerate(built):
            arr[i] = ctypes.cast(a, c_void_p)
        o = _timing_options(warmup, min_reps, max_reps, min_total_ms, flush_l2, graph_batch)
        t = sf_timing()
        if len(built) == 1:
            _check(_clib().sf_time_kernel(h, k, byref(cfg), built[0][0], byref(o), byref(t)), h)
        else:
            _check(_clib().sf_time_kernel_sets(h, k, byref(cfg), arr, len(built), byref(o),
                                               byref(t)), h)
        del built
        return _timing_dict(t)

    def time_gemm(self, dtype: str, m: int, n: int, k: int, layout: str = "best",
                  warmup: int = 3, min_reps: int = 30, max_reps: int = 1000,
                  min_total_ms: float = 100.0, flush_l2: bool = True,
                  graph_batch: int = 0, rotate_bytes: int = 0) -> dict:
        """Times cuBLAS on Y (M x N) = W (M x K) X with the protocol of
        time() (see sf_time_dense_gemm; rotate_bytes > 0: the launches
        rotate through copies of W, X and Y holding that many bytes).
        layout: "fm", "tm" or "best" (both, the faster counts).
        dict(median_ms, ..., layout)."""
        h = self._live_handle()
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
        if layout not in _LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; expected fm, tm or best")
        d = sf_gemm_desc(_DTYPES[dtype], m, n, k, _LAYOUTS[layout])
        o = _timing_options(warmup, min_reps, max_reps, min_total_ms, flush_l2, graph_batch,
                            rotate_bytes)
        t = sf_gemm_timing()
        _check(_clib().sf_time_dense_gemm(h, byref(d), byref(o), byref(t)), h)
        return {**_timing_dict(t.timing), "layout": ("fm", "tm")[t.layout_used]}

    def time_blocked_ell(self, dtype: str, m: int, k: int, n: int, block: int,
                         block_cols_index, layout: str = "fm", warmup: int = 3,
                         min_reps: int = 30, max_reps: int = 1000,
                         min_total_ms: float = 100.0, flush_l2: bool = True,
                         graph_batch: int = 0) -> dict:
        """Times cuSPARSE's Blocked-ELL SpMM on Y (M x N) = W (M x K) X with
        the protocol of time() (see sf_time_blocked_ell).  W is the pattern
        `block_cols_index`: a 2-D integer array, one row per block-row of W
        (M / block of them), each entry a block-column of W or -1 for an
        empty slot, as generator.analysis.blocked_ell_columns gives it.  dtype: "fp16" or
        "bf16"; layout: "fm" or "tm".  dict(median_ms, ..., layout)."""
        h = self._live_handle()
        if dtype not in ("fp16", "bf16"):
            raise ValueError(f"unknown dtype {dtype!r}; Blocked-ELL SpMM takes fp16 or bf16")
        if layout not in ("fm", "tm"):
            raise ValueError(f"unknown layout {layout!r}; expected fm or tm")
        m, k, n, block = (_as_int(v, name) for v, name in
                          ((m, "m"), (k, "k"), (n, "n"), (block, "block")))
        cols = _int32_matrix(block_cols_index, "block_cols_index")
        if block > 0 and m % block == 0 and cols.shape[0] != m // block:
            raise ValueError(f"block_cols_index has {cols.shape[0]} rows; M / block = "
                             f"{m} / {block} = {m // block} block-rows")
        d = sf_blocked_ell_desc(_DTYPES[dtype], m, n, k, block, cols.shape[1] * block,
                                cols.ctypes.data_as(POINTER(ctypes.c_int32)), _LAYOUTS[layout])
        o = _timing_options(warmup, min_reps, max_reps, min_total_ms, flush_l2, graph_batch)
        t = sf_timing()
        _check(_clib().sf_time_blocked_ell(h, byref(d), byref(o), byref(t)), h)
        return {**_timing_dict(t), "layout": layout}

    def time_csr(self, dtype: str, m: int, k: int, n: int, row_ptr, col_ind,
                 layout: str = "fm", alg: int = -1, warmup: int = 3, min_reps: int = 30,
                 max_reps: int = 1000, min_total_ms: float = 100.0, flush_l2: bool = True,
                 graph_batch: int = 0, rotate_bytes: int = 0) -> dict:
        """Times cuSPARSE's CSR SpMM on Y (M x N) = W (M x K) X, W the
        pattern `row_ptr` (M + 1 offsets) and `col_ind`, with the protocol
        of time() (see sf_time_csr; rotate_bytes > 0: the launches rotate
        through copies of W, X and Y holding that many bytes).  alg: a
        cusparseSpMMAlg_t, or -1 for the fastest CSR algorithm.  dtype
        "fp32", "fp16" or "bf16"; layout "fm" or "tm".
        dict(median_ms, ..., layout, alg)."""
        import numpy as np
        h = self._live_handle()
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
        if layout not in ("fm", "tm"):
            raise ValueError(f"unknown layout {layout!r}; expected fm or tm")
        m, k, n, alg = (_as_int(v, name) for v, name in ((m, "m"), (k, "k"), (n, "n"),
                                                          (alg, "alg")))
        ptr = _int32_vector(row_ptr, "row_ptr")
        col = _int32_vector(col_ind, "col_ind")
        if ptr.size != m + 1:
            raise ValueError(f"row_ptr has {ptr.size} entries, expected M + 1 = {m + 1}")
        nnz = int(ptr[-1]) if ptr.size else 0
        if col.size < nnz:
            raise ValueError(f"col_ind has {col.size} entries, row_ptr says {nnz}")
        if col.size == 0:
            col = np.zeros(1, np.int32)          # a valid pointer for an empty matrix
        d = sf_csr_desc(_DTYPES[dtype], m, n, k, nnz,
                        ptr.ctypes.data_as(POINTER(ctypes.c_int32)),
                        col.ctypes.data_as(POINTER(ctypes.c_int32)), _LAYOUTS[layout], alg)
        o = _timing_options(warmup, min_reps, max_reps, min_total_ms, flush_l2, graph_batch,
                            rotate_bytes)
        t = sf_csr_timing()
        _check(_clib().sf_time_csr(h, byref(d), byref(o), byref(t)), h)
        return {**_timing_dict(t.timing), "layout": layout, "alg": t.alg_used}

    def time_sparselt(self, dtype: str, m: int, k: int, n: int, layout: str = "fm",
                      warmup: int = 3, min_reps: int = 30, max_reps: int = 1000,
                      min_total_ms: float = 100.0, flush_l2: bool = True,
                      graph_batch: int = 0, rotate_bytes: int = 0) -> dict:
        """Times cuSPARSELt's 2:4 matmul, after its own configuration
        search, on Y (M x N) = W (M x K) X with the protocol of time() (see
        sf_time_sparselt).  dtype "fp16" or "bf16"; layout "fm" or "tm".
        The library is found as $SF_CUSPARSELT, else by its usual names,
        else inside an installed `nvidia-cusparselt` wheel.
        dict(median_ms, ..., layout, alg_id)."""
        h = self._live_handle()
        if dtype not in ("fp16", "bf16"):
            raise ValueError(f"unknown dtype {dtype!r}; cuSPARSELt's 2:4 peer takes fp16 or bf16")
        if layout not in ("fm", "tm"):
            raise ValueError(f"unknown layout {layout!r}; expected fm or tm")
        m, k, n = (_as_int(v, name) for v, name in ((m, "m"), (k, "k"), (n, "n")))
        _find_sparselt()
        d = sf_sparselt_desc(_DTYPES[dtype], m, n, k, _LAYOUTS[layout])
        o = _timing_options(warmup, min_reps, max_reps, min_total_ms, flush_l2, graph_batch,
                            rotate_bytes)
        t = sf_sparselt_timing()
        _check(_clib().sf_time_sparselt(h, byref(d), byref(o), byref(t)), h)
        return {**_timing_dict(t.timing), "layout": layout, "alg_id": t.alg_id}

    def synchronize(self) -> None:
        """Waits for the GPU; a kernel fault surfaces here as CudaError."""
        h = self._live_handle()
        _check(_clib().sf_synchronize(h), h)

    # ---- memory ------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        """nbytes of device memory (not initialized)."""
        h = self._live_handle()
        nbytes = _as_int(nbytes, "nbytes")
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        p = c_uint64()
        _check(_clib().sf_mem_alloc(h, nbytes, byref(p)), h)
        return DeviceBuffer(self, p.value, nbytes)

    def upload(self, data) -> DeviceBuffer:
        """A new device buffer holding `data` (bytes or a numpy array,
        copied as its contiguous bytes)."""
        addr, nbytes, keep = _host_buffer(data)
        if nbytes == 0:
            raise ValueError("cannot upload 0 bytes")
        buf = self.alloc(nbytes)
        h = self._h
        try:
            _check(_clib().sf_memcpy_htod(h, buf.ptr, addr, nbytes), h)
        except BaseException:
            buf.free()
            raise
        del keep
        return buf

    def copy_to(self, buf, data) -> None:
        """Copies host `data` into the start of device buffer `buf`."""
        h = self._live_handle()
        addr, nbytes, keep = _host_buffer(data)
        if isinstance(buf, DeviceBuffer) and nbytes > buf.nbytes:
            raise ValueError(f"{nbytes} bytes do not fit in a {buf.nbytes}-byte buffer")
        _check(_clib().sf_memcpy_htod(h, _device_ptr(buf, "buf"), addr, nbytes), h)
        del keep

    def download(self, buf, nbytes: Optional[int] = None) -> bytes:
        """The first nbytes (default: all) of a device buffer, as bytes.  A
        raw device address needs nbytes."""
        h = self._live_handle()
        if nbytes is None:
            if not isinstance(buf, DeviceBuffer):
                raise ValueError("download() of a raw device pointer needs nbytes")
            nbytes = buf.nbytes
        nbytes = _as_int(nbytes, "nbytes")
        if nbytes < 0:
            raise ValueError(f"nbytes must not be negative, got {nbytes}")
        if isinstance(buf, DeviceBuffer) and nbytes > buf.nbytes:
            raise ValueError(f"cannot download {nbytes} bytes from a {buf.nbytes}-byte buffer")
        out = ctypes.create_string_buffer(nbytes)
        _check(_clib().sf_memcpy_dtoh(h, out, _device_ptr(buf, "buf"), nbytes), h)
        return out.raw

    def memset(self, buf, byte_value: int, nbytes: Optional[int] = None) -> None:
        """Sets nbytes (default: all) of a device buffer to byte_value."""
        h = self._live_handle()
        byte_value = _as_int(byte_value, "byte_value")
        if not 0 <= byte_value <= 255:
            raise ValueError(f"byte_value must be in 0..255, got {byte_value}")
        if nbytes is None:
            if not isinstance(buf, DeviceBuffer):
                raise ValueError("memset() of a raw device pointer needs nbytes")
            nbytes = buf.nbytes
        nbytes = _as_int(nbytes, "nbytes")
        if isinstance(buf, DeviceBuffer) and not 0 <= nbytes <= buf.nbytes:
            raise ValueError(f"cannot set {nbytes} bytes of a {buf.nbytes}-byte buffer")
        _check(_clib().sf_memset_d8(h, _device_ptr(buf, "buf"), byte_value, nbytes), h)

    # ---- layers --------------------------------------------------------------
    def open_layer(self, cache, name: str) -> Layer:
        """Opens tuned layer `name` from a cache (a Cache object of the
        cache binding, or a raw sf_cache pointer) for this GPU."""
        h = self._live_handle()
        handle = _cache_handle(cache)
        out = c_void_p()
        _check(_clib().sf_layer_open(h, handle, _bytes(name, "layer name"), byref(out)), h)
        return Layer(self, out, name)

    def load_layer(self, name: str, rows: int, cols: int, x_elem_size: int, y_elem_size: int,
                   variants: Sequence[dict]) -> Layer:
        """Loads a layer held in memory on this GPU (sf_layer_load); nothing
        is compiled.  Each variant is a dict with n_bucket, kernel_name,
        launch (the launch record as a dict), binary (a Binary, or cubin
        bytes) and packed: bytes, uploaded once per distinct blob, or None
        when the caller keeps the packed weights on the GPU itself and
        passes them to Layer.run(packed=...)."""
        h = self._live_handle()
        if isinstance(variants, dict) or not isinstance(variants, Sequence):
            raise TypeError("variants must be a list of dicts")
        codes = (_abi.sf_layer_code * max(1, len(variants)))()
        keep: list = []
        for i, v in enumerate(variants):
            missing = [f for f in ("n_bucket", "kernel_name", "launch", "binary", "packed")
                       if f not in v]
            if missing:
                raise ValueError(f"layer {name!r} variant {i} lacks {', '.join(missing)}")
            binary = v["binary"] if isinstance(v["binary"], Binary) else Binary(v["binary"])
            kname = _bytes(v["kernel_name"], f"variant {i} kernel_name")
            c = codes[i]
            c.n_bucket = _as_int(v["n_bucket"], f"variant {i} n_bucket")
            c.kernel_name = kname
            c.launch = launch_record(v["launch"], f"layer {name!r} variant {i} launch")
            c.binary = ctypes.cast(c_char_p(binary.data), c_void_p)
            c.binary_size = len(binary.data)
            c.binary_kind = binary.kind
            keep += [binary, kname]
            if v["packed"] is not None:
                addr, nbytes, k = _host_buffer(v["packed"])
                c.packed, c.packed_size = (addr if nbytes else None), nbytes
                keep.append(k)
        desc = _abi.sf_layer_desc(_bytes(name, "layer name"), _as_int(rows, "rows"),
                                  _as_int(cols, "cols"), _as_int(x_elem_size, "x_elem_size"),
                                  _as_int(y_elem_size, "y_elem_size"), len(variants), codes)
        out = c_void_p()
        _check(_clib().sf_layer_load(h, byref(desc), byref(out)), h)
        del keep
        return Layer(self, out, name)

    def __repr__(self) -> str:
        state = "closed" if self._h is None else "open"
        return f"Context(device={self.device}, {state})"


def _cache_handle(cache) -> Optional[int]:
    """The sf_cache pointer behind a cache object or a raw pointer."""
    if cache is None:
        return None
    if isinstance(cache, int):
        return cache
    if isinstance(cache, c_void_p):
        return cache.value
    for attr in ("_as_parameter_", "handle", "_handle", "_h", "ptr", "_ptr"):
        if not hasattr(cache, attr):
            continue
        v = getattr(cache, attr)
        if v is None:
            raise ValueError(f"the {type(cache).__name__} is closed")
        if callable(v):
            v = v()
        if isinstance(v, c_void_p):
            return v.value
        if isinstance(v, int):
            return v
    raise TypeError(f"{type(cache).__name__} is not a cache: pass a Cache object or an "
                    "sf_cache pointer")
