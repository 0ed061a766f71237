"""NVRTC's front end alone (--fdevice-syntax-only), straight from the CUDA
toolkit's libnvrtc, for tests that check what the compiler accepts -- the
templates' static_asserts -- in milliseconds instead of a full compile."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

_nvrtc = None


def _toolkit() -> Path:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path("/usr/local/cuda")


def available() -> Optional[str]:
    """None when libnvrtc loads, else why not."""
    global _nvrtc
    if _nvrtc is None:
        lib = _toolkit() / "lib64" / "libnvrtc.so"
        try:
            _nvrtc = ctypes.CDLL(str(lib))
        except OSError as e:
            return f"libnvrtc not found ({e})"
    return None


def front_end(source: str, arch: str = "sm_90a") -> tuple[bool, str]:
    """(accepted, log) of NVRTC's front end on `source`."""
    why = available()
    if why:
        raise RuntimeError(why)
    nv = _nvrtc
    prog = ctypes.c_void_p()
    rc = nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"check.cu", 0, None, None)
    if rc:
        raise RuntimeError(f"nvrtcCreateProgram: {rc}")
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "-default-device",
            "--fdevice-syntax-only", f"-I{_toolkit() / 'include'}"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    try:
        rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetProgramLog(prog, log)
        return rc == 0, log.value.decode("utf-8", "replace")
    finally:
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
