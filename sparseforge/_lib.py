"""Finds and loads libsparseforge for the ctypes bindings, with every
function's signature set from the generated interface (_abi.py), and turns
status codes into exceptions.

Search order: $SPARSEFORGE_LIB (a path to the .so); the copy installed in
the package (sparseforge/lib/); a CMake build in the checkout
(build/libsparseforge.so, build/*/libsparseforge.so); the system's loader.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

from . import _abi

_HERE = Path(__file__).resolve().parent
_lib = None
_lock = threading.Lock()

# status name -> value, from the header's SF_STATUS_TABLE
STATUS = {name: value for name, value, _ in _abi.STATUS}
_STATUS_NAMES = {value: name for name, value, _ in _abi.STATUS}


class SFError(RuntimeError):
    """A libsparseforge call failed: `status` is the sf_status code, `name`
    its symbolic name, and the message (str(e), `.message`) is the
    library's own sentence."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(message)
        self.status = status
        self.name = name
        self.message = message


_CLASSES: dict[str, type] = {}


def raises(status_name: str):
    """Class decorator: the exception raised for status `status_name`."""
    if status_name not in STATUS:
        raise KeyError(f"{status_name} is not in the header's SF_STATUS_TABLE")

    def register(cls):
        _CLASSES[status_name] = cls
        return cls
    return register


def error_for(status: int, message: str) -> SFError:
    """The exception for a status code and its message."""
    name = _STATUS_NAMES.get(status, "SF_UNKNOWN")
    return _CLASSES.get(name, SFError)(status, name, message)


def _candidates():
    env = os.environ.get("SPARSEFORGE_LIB")
    if env:
        yield Path(env)
        return
    yield _HERE / "lib" / "libsparseforge.so"
    checkout = _HERE.parent
    yield checkout / "build" / "libsparseforge.so"
    for p in sorted(checkout.glob("build/*/libsparseforge.so")):
        yield p
    found = ctypes.util.find_library("sparseforge")
    if found:
        yield Path(found)


def load() -> ctypes.CDLL:
    """The loaded library (once), every prototype declared.  Raises OSError
    naming every place looked in when none holds it, or one that lacks a
    function the headers declare (a stale build)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for cand in _candidates():
            tried.append(str(cand))
            if cand.exists() or not cand.is_absolute():
                try:
                    lib = ctypes.CDLL(str(cand))
                except OSError as e:
                    tried[-1] += f" ({e})"
                    continue
                missing = [n for n in _abi.PROTOTYPES if not hasattr(lib, n)]
                if missing:
                    raise OSError(f"{cand} is older than this package's headers: it lacks "
                                  f"{', '.join(missing[:5])}; rebuild it (pip install .)")
                for name, (restype, argtypes) in _abi.PROTOTYPES.items():
                    fn = getattr(lib, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
                _lib = lib
                return _lib
        raise OSError("libsparseforge not found; looked in: " + ", ".join(tried)
                      + ". Build it (cmake -B build && cmake --build build) or pip install .")
