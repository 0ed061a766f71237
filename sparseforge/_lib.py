"""Finds and loads libsparseforge for the ctypes bindings.

Search order: $SPARSEFORGE_LIB (a path to the .so); the copy installed in
the package (sparseforge/lib/); a CMake build in the checkout
(build/libsparseforge.so, build/*/libsparseforge.so); the system's loader.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_lib = None


class SFError(RuntimeError):
    """A libsparseforge call failed: `status` is the sf_status code, `name`
    its symbolic name, and the message is the library's own."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.status = status
        self.name = name
        self.message = message


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
    """The loaded library (loaded once).  Raises OSError naming every place
    looked in when none holds it."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for cand in _candidates():
        tried.append(str(cand))
        if cand.exists() or not cand.is_absolute():
            try:
                _lib = ctypes.CDLL(str(cand))
                return _lib
            except OSError as e:
                tried[-1] += f" ({e})"
    raise OSError("libsparseforge not found; looked in: " + ", ".join(tried)
                  + ". Build it (cmake -B build && cmake --build build) or pip install .")
