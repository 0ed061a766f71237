"""ctypes binding of the sparseforge cache (the sf_cache_* calls of
runtime/sparseforge.h).

The cache is one SQLite file written and read by the C library only; this
module converts arguments and records and turns status codes into
exceptions:

    from sparseforge.cache import Cache, default_path
    with Cache(default_path()) as cache:
        env = cache.put_env(device_info_dict)
        cache.put_trial(env, fp, "csr.fp32.fm.none", 256, '{"tile": 64}', "ok",
                        median_ms=0.12)
        best = cache.trials(env, fp, "csr.fp32.fm.none", 256)[0]

Errors raise SFError subclasses: NotADatabaseError (a file that is not a
sparseforge cache: left untouched), NewerDatabaseError (written by a newer
sparseforge), CorruptError (a stored blob failed its sha256), NotFoundError,
InvalidArgumentError (also a ValueError), BusyError, DatabaseError.
Arguments that are wrong before they reach the library raise ValueError or
TypeError with a precise message.

A Cache may be shared between threads: every call into the library holds
the object's lock.  Several processes may open one file at once.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import threading
from ctypes import byref, c_char, c_char_p, c_int64, c_size_t, c_void_p
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from . import _abi
from ._abi import (sf_binary_key, sf_cache_counts, sf_device_info, sf_layer_record,
                   sf_layer_variant, sf_matrix_record, sf_trial, sf_trial_filter)
from ._lib import STATUS, SFError, error_for, load, raises
from .native import (CorruptError, InvalidArgumentError, NotFoundError, launch_dict,
                     launch_record)

__all__ = [
    "Cache", "default_path", "binary_key_hex", "SFError", "NotADatabaseError",
    "NewerDatabaseError", "CorruptError", "NotFoundError", "InvalidArgumentError", "BusyError",
    "DatabaseError", "TRIAL_STATUSES", "SCHEMA_VERSION",
]

SCHEMA_VERSION = _abi.CONSTANTS["SF_CACHE_SCHEMA_VERSION"]
_SF_ERR_NOT_FOUND = STATUS["SF_ERR_NOT_FOUND"]
_SF_CACHE_READONLY = _abi.CONSTANTS["SF_CACHE_READONLY"]
_SF_CACHE_CREATE = _abi.CONSTANTS["SF_CACHE_CREATE"]

# sf_trial_status, by value: "ok", "compile_fail", ...
TRIAL_STATUSES = tuple(name.removeprefix("SF_TRIAL_").lower() for name, _ in sorted(
    ((n, v) for n, v in _abi.CONSTANTS.items() if n.startswith("SF_TRIAL_")), key=lambda t: t[1]))


@raises("SF_ERR_NOT_A_DB")
class NotADatabaseError(SFError):
    """SF_ERR_NOT_A_DB: the file is not a sparseforge cache (not SQLite, or
    another program's SQLite database).  It was not modified."""


@raises("SF_ERR_DB_VERSION")
class NewerDatabaseError(SFError):
    """SF_ERR_DB_VERSION: the cache was written by a newer sparseforge."""


@raises("SF_ERR_BUSY")
class BusyError(SFError):
    """SF_ERR_BUSY: another process kept the database locked too long."""


@raises("SF_ERR_DB")
class DatabaseError(SFError):
    """SF_ERR_DB: SQLite failed (or a write on a read-only cache)."""


_clib = load   # every prototype is declared by the loader
_error = error_for


# ---------------------------------------------------------------------------
# Argument conversion
# ---------------------------------------------------------------------------
def _text(value, what: str, optional: bool = False) -> Optional[bytes]:
    if value is None:
        if optional:
            return None
        raise ValueError(f"{what} is required (got None)")
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} contains a NUL character")
    return value.encode("utf-8")


def _int(value, what: str, minimum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    v = value.__index__()
    if minimum is not None and v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return v


def _float(value, what: str) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}") from None


def _bytes(value, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return memoryview(value).tobytes()
    except TypeError:
        raise TypeError(f"{what} must be bytes-like, got {type(value).__name__}") from None


def _str_out(b: Optional[bytes]) -> Optional[str]:
    return None if b is None else b.decode("utf-8", "replace")


def _info_text(info) -> Optional[str]:
    if info is None or isinstance(info, str):
        return info
    if isinstance(info, (dict, list)):
        return json.dumps(info, sort_keys=True)
    raise TypeError(f"info must be a str (JSON), a dict, a list or None, got {type(info).__name__}")


_KEY_FIELDS = ("source", "options", "arch", "nvrtc_version", "generator_version")


def _key_struct(key: dict) -> tuple[sf_binary_key, list]:
    if not isinstance(key, dict):
        raise TypeError(f"a binary key is a dict with {', '.join(_KEY_FIELDS)} and ptx; "
                        f"got {type(key).__name__}")
    missing = [f for f in _KEY_FIELDS if f not in key]
    if missing:
        raise ValueError(f"binary key lacks {', '.join(missing)} (needs {', '.join(_KEY_FIELDS)}"
                         ", optional ptx)")
    unknown = sorted(set(key) - set(_KEY_FIELDS) - {"ptx"})
    if unknown:
        raise ValueError(f"binary key has unknown field(s) {', '.join(unknown)}")
    vals = [_text(key[f], f"key[{f!r}]") for f in _KEY_FIELDS]
    if not vals[2]:
        raise ValueError("key['arch'] is empty")
    k = sf_binary_key(*vals, 1 if key.get("ptx", False) else 0)
    return k, vals


# a variant dict's keys: the C record's fields (packed_size is len(packed))
_VARIANT_FIELDS = tuple(n for n, _ in sf_layer_variant._fields_ if n != "packed_size")
_VARIANT_REQUIRED = ("n_bucket", "source", "kernel_name", "launch", "packed")


def _trial_dict(t: sf_trial) -> dict:
    status = t.status
    return {
        "env_key": _str_out(t.env_key), "matrix_fp": _str_out(t.matrix_fp), "op": _str_out(t.op),
        "n": t.n, "config": _str_out(t.config),
        "status": TRIAL_STATUSES[status] if 0 <= status < len(TRIAL_STATUSES) else status,
        "median_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "min_ms": t.min_ms,
        "reps": t.reps, "max_error": t.max_error, "binary_key": _str_out(t.binary_key),
        "message": _str_out(t.message), "created": t.created,
    }


def _layer_dict(r: sf_layer_record) -> dict:
    variants = []
    for i in range(r.n_variants):
        v = r.variants[i]
        variants.append({
            "n_bucket": v.n_bucket, "source": _str_out(v.source),
            "kernel_name": _str_out(v.kernel_name), "options": _str_out(v.options) or "",
            "generator_version": _str_out(v.generator_version) or "",
            "launch": launch_dict(v.launch),
            "packed": ctypes.string_at(v.packed, v.packed_size) if v.packed_size else b"",
            "config": _str_out(v.config),
        })
    return {"name": _str_out(r.name), "gpu_name": _str_out(r.gpu_name),
            "matrix_fp": _str_out(r.matrix_fp), "op": _str_out(r.op), "rows": r.rows,
            "cols": r.cols, "x_elem_size": r.x_elem_size, "y_elem_size": r.y_elem_size,
            "variants": variants, "problem": _str_out(r.problem)}


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------
def default_path() -> Path:
    """The default database: $XDG_CACHE_HOME/sparseforge/sparseforge.db
    when XDG_CACHE_HOME is an absolute path, else
    ~/.cache/sparseforge/sparseforge.db.  Never the working directory."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "sparseforge" / "sparseforge.db"


def binary_key_hex(key: dict) -> str:
    """The hex key of a binary (sf_binary_key_hex): `key` has source,
    options, arch, nvrtc_version, generator_version (str) and optionally
    ptx (bool, default False)."""
    k, _keep = _key_struct(key)
    out = (c_char * 65)()
    st = _clib().sf_binary_key_hex(byref(k), out)
    if st:
        raise _error(st, "invalid binary key")
    return out.value.decode()


def _skip_collector(out: list) -> Any:
    """An sf_skip_cb appending each message (decoded) to `out`; keep it
    alive for the call."""
    def cb(message, user):
        out.append(message.decode("utf-8", "replace"))
    return _abi.sf_skip_cb(cb)


class Cache:
    """An open cache file.  `create`: create the file (and its folder) when
    missing; `readonly`: never write (writes raise DatabaseError).  Use as a
    context manager or call close()."""

    def __init__(self, path, create: bool = True, readonly: bool = False):
        self.path = Path(os.fspath(path))
        self._lock = threading.RLock()
        self._handle: Optional[c_void_p] = None
        if not str(self.path):
            raise ValueError("cache path is empty")
        flags = (_SF_CACHE_READONLY if readonly else 0) | (
            _SF_CACHE_CREATE if create and not readonly else 0)
        if flags & _SF_CACHE_CREATE and not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        lib = _clib()
        h = c_void_p()
        st = lib.sf_cache_open(os.fsencode(self.path), flags, byref(h))
        if st:
            msg = lib.sf_cache_errmsg(h).decode("utf-8", "replace") if h else "out of memory"
            lib.sf_cache_close(h)
            raise _error(st, msg)
        self._handle = h
        self.readonly = bool(readonly)

    # ---- lifetime ---------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                _clib().sf_cache_close(self._handle)
                self._handle = None

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else ("read-only" if self.readonly else "open")
        return f"Cache({str(self.path)!r}, {state})"

    def _h(self) -> c_void_p:
        if self._handle is None:
            raise ValueError(f"cache {self.path} is closed")
        return self._handle

    def _check(self, st: int) -> None:
        if st:
            msg = _clib().sf_cache_errmsg(self._handle).decode("utf-8", "replace")
            raise _error(st, msg)

    # ---- binaries ---------------------------------------------------------
    def put_binary(self, key: dict, data) -> None:
        """Stores a compiled binary (cubin, or PTX when key['ptx']) under its
        key; storing the same key again changes nothing."""
        k, _keep = _key_struct(key)
        data = _bytes(data, "data")
        if not data:
            raise ValueError("data is empty")
        lib = _clib()
        bin_ = c_void_p()
        st = lib.sf_binary_from_memory(data, len(data), k.kind, byref(bin_))
        if st:
            raise _error(st, "cannot wrap the binary's bytes")
        try:
            with self._lock:
                self._check(lib.sf_cache_put_binary(self._h(), byref(k), bin_))
        finally:
            lib.sf_binary_free(bin_)

    def get_binary(self, key: dict) -> Optional[bytes]:
        """The binary stored under `key` (PTX comes back NUL-terminated), or
        None.  Raises CorruptError when its bytes fail their sha256."""
        k, _keep = _key_struct(key)
        lib = _clib()
        bin_ = c_void_p()
        with self._lock:
            st = lib.sf_cache_get_binary(self._h(), byref(k), byref(bin_))
            if st == _SF_ERR_NOT_FOUND:
                return None
            self._check(st)
        try:
            size = c_size_t()
            ptr = lib.sf_binary_data(bin_, byref(size))
            return ctypes.string_at(ptr, size.value)
        finally:
            lib.sf_binary_free(bin_)

    # ---- environments and matrices ----------------------------------------
    def put_env(self, info: dict) -> str:
        """Records a GPU environment from a device-info dict (name, cc_major,
        cc_minor, sm_count, driver_version required; arch, l2_bytes,
        smem_per_block_optin, smem_per_sm, regs_per_block,
        max_threads_per_block, clock_khz, total_mem_bytes optional).
        Returns its env_key."""
        if not isinstance(info, dict):
            raise TypeError(f"info must be a dict, got {type(info).__name__}")
        required = ("name", "cc_major", "cc_minor", "sm_count", "driver_version")
        missing = [f for f in required if f not in info]
        if missing:
            raise ValueError(f"device info lacks {', '.join(missing)}")
        d = sf_device_info()
        for fname, ftype in sf_device_info._fields_:
            if fname not in info or info[fname] is None:
                continue
            v = info[fname]
            if fname in ("name", "arch"):
                raw = _text(v, f"info[{fname!r}]")
                size = ctypes.sizeof(ftype)
                if len(raw) >= size:
                    raise ValueError(f"info[{fname!r}] is longer than {size - 1} bytes")
                setattr(d, fname, raw)
            else:
                setattr(d, fname, _int(v, f"info[{fname!r}]"))
        out = (c_char * 65)()
        with self._lock:
            self._check(_clib().sf_cache_put_env(self._h(), byref(d), out))
        return out.value.decode()

    def envs(self) -> list[dict]:
        """Every stored environment: env_key plus the device-info fields."""
        out: list[dict] = []

        def cb(key, dev, user):
            d = {"env_key": key.decode()}
            for fname, _ in sf_device_info._fields_:
                v = getattr(dev.contents, fname)
                d[fname] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            out.append(d)
            return 0

        self._walk("sf_cache_envs", _abi.sf_env_cb, cb)
        return out

    def put_matrix(self, fingerprint: str, rows: int, cols: int, nnz: int, dtype: str,
                   info=None) -> None:
        """Records a matrix by fingerprint (`info`: free text, normally JSON;
        a dict or list is written as JSON)."""
        keep = [_text(fingerprint, "fingerprint"), _text(dtype, "dtype"),
                _text(_info_text(info), "info", optional=True)]
        m = sf_matrix_record(keep[0], _int(rows, "rows"), _int(cols, "cols"), _int(nnz, "nnz"),
                             keep[1], keep[2])
        with self._lock:
            self._check(_clib().sf_cache_put_matrix(self._h(), byref(m)))

    def matrices(self, fingerprint: Optional[str] = None) -> list[dict]:
        """Stored matrices (all, or the one with `fingerprint`): dicts with
        fingerprint, rows, cols, nnz, dtype, info."""
        out: list[dict] = []

        def cb(m, user):
            r = m.contents
            out.append({"fingerprint": _str_out(r.fingerprint), "rows": r.rows, "cols": r.cols,
                        "nnz": r.nnz, "dtype": _str_out(r.dtype), "info": _str_out(r.info)})
            return 0

        self._walk("sf_cache_matrices", _abi.sf_matrix_cb, cb,
                   _text(fingerprint, "fingerprint", optional=True))
        return out

    # ---- trials -----------------------------------------------------------
    def put_trial(self, env_key: str, matrix_fp: str, op: str, n: int, config: str,
                  status: str, median_ms: float = math.nan, p20_ms: float = math.nan,
                  p80_ms: float = math.nan, min_ms: float = math.nan, reps: int = 0,
                  max_error: float = math.nan, binary_key: Optional[str] = None,
                  message: Optional[str] = None) -> None:
        """Records one trial; the same (env_key, matrix_fp, op, n, config)
        replaces the earlier record.  `status` is one of TRIAL_STATUSES."""
        if isinstance(status, str):
            if status not in TRIAL_STATUSES:
                raise ValueError(f"status must be one of {', '.join(TRIAL_STATUSES)}; "
                                 f"got {status!r}")
            code = TRIAL_STATUSES.index(status)
        else:
            raise TypeError(f"status must be a str ({', '.join(TRIAL_STATUSES)}), "
                            f"got {type(status).__name__}")
        keep = [_text(env_key, "env_key"), _text(matrix_fp, "matrix_fp"), _text(op, "op"),
                _text(config, "config"), _text(binary_key, "binary_key", optional=True),
                _text(message, "message", optional=True)]
        t = sf_trial(keep[0], keep[1], keep[2], _int(n, "n", 0), keep[3], code,
                     _float(median_ms, "median_ms"), _float(p20_ms, "p20_ms"),
                     _float(p80_ms, "p80_ms"), _float(min_ms, "min_ms"),
                     _int(reps, "reps", 0), _float(max_error, "max_error"), keep[4], keep[5],
                     0.0)
        with self._lock:
            self._check(_clib().sf_cache_put_trial(self._h(), byref(t)))

    def trials(self, env_key: Optional[str] = None, matrix_fp: Optional[str] = None,
               op: Optional[str] = None, n: Optional[int] = -1) -> list[dict]:
        """Trials matching the filter (None / n < 0: any), best first within
        each (env_key, matrix_fp, op, n): ok trials by median, then
        failures.  Each is a dict with the put_trial fields, status as its
        name, and created (unix time)."""
        keep = [_text(env_key, "env_key", optional=True),
                _text(matrix_fp, "matrix_fp", optional=True), _text(op, "op", optional=True)]
        f = sf_trial_filter(keep[0], keep[1], keep[2], -1 if n is None else _int(n, "n"))
        out: list[dict] = []

        def cb(t, user):
            out.append(_trial_dict(t.contents))
            return 0

        self._walk("sf_cache_trials", _abi.sf_trial_cb, cb, byref(f))
        return out

    # ---- layers -----------------------------------------------------------
    def put_layer(self, name: str, gpu_name: str, matrix_fp: str, op: str, rows: int,
                  cols: int, x_elem_size: int, y_elem_size: int,
                  variants: Sequence[dict]) -> None:
        """Stores (replaces) layer `name` tuned on `gpu_name`, atomically.
        Each variant is a dict with n_bucket, source, kernel_name, options
        (str, one per line), generator_version, launch (the launch record as
        a dict: native.launch_record), packed (bytes) and config (str)."""
        if isinstance(variants, dict) or not isinstance(variants, Iterable):
            raise TypeError("variants must be a list of dicts")
        variants = list(variants)
        if not variants:
            raise ValueError(f"layer {name!r}: no variants")
        keep: list[Any] = []
        arr = (sf_layer_variant * len(variants))()
        for i, v in enumerate(variants):
            if not isinstance(v, dict):
                raise TypeError(f"variant {i} must be a dict, got {type(v).__name__}")
            missing = [f for f in _VARIANT_REQUIRED if f not in v]
            if missing:
                raise ValueError(f"layer {name!r} variant {i} lacks {', '.join(missing)}")
            unknown = sorted(set(v) - set(_VARIANT_FIELDS))
            if unknown:
                raise ValueError(f"layer {name!r} variant {i} has unknown field(s) "
                                 f"{', '.join(unknown)}")
            w = f"variant {i}"
            packed = _bytes(v["packed"], f"{w} packed")
            buf = ctypes.create_string_buffer(packed, len(packed)) if packed else None
            strs = [_text(v["source"], f"{w} source"), _text(v["kernel_name"], f"{w} kernel_name"),
                    _text(v.get("options") or "", f"{w} options"),
                    _text(v.get("generator_version") or "", f"{w} generator_version"),
                    _text(_info_text(v.get("config")), f"{w} config", optional=True)]
            keep += [buf, strs]
            a = arr[i]
            a.n_bucket = _int(v["n_bucket"], f"{w} n_bucket", 1)
            a.source, a.kernel_name, a.options, a.generator_version, a.config = strs
            a.launch = launch_record(v["launch"], f"layer {name!r} {w} launch")
            a.packed = ctypes.cast(buf, c_void_p) if buf is not None else None
            a.packed_size = len(packed)
        strs = [_text(name, "name"), _text(gpu_name, "gpu_name"), _text(matrix_fp, "matrix_fp"),
                _text(op, "op")]
        rec = sf_layer_record(strs[0], strs[1], strs[2], strs[3], _int(rows, "rows", 1),
                              _int(cols, "cols", 1), _int(x_elem_size, "x_elem_size", 1),
                              _int(y_elem_size, "y_elem_size", 1), len(variants), arr, None)
        with self._lock:
            self._check(_clib().sf_cache_put_layer(self._h(), byref(rec)))

    def layers(self, name: Optional[str] = None) -> list[dict]:
        """Stored layers (all, or those named `name`, one per GPU), ordered by
        name and GPU, each a dict with the put_layer fields, "variants"
        (ordered by n_bucket) and "problem": None, or why the record cannot
        be used (packed bytes that failed their sha256; its variants are
        then empty)."""
        out: list[dict] = []

        def cb(r, user):
            out.append(_layer_dict(r.contents))
            return 0

        self._walk("sf_cache_layers", _abi.sf_layer_cb, cb, _text(name, "name", optional=True))
        return out

    def delete_layer(self, name: str) -> None:
        """Deletes layer `name` on every GPU; NotFoundError if there is none."""
        with self._lock:
            self._check(_clib().sf_cache_delete_layer(self._h(), _text(name, "name")))

    # ---- whole files ------------------------------------------------------
    def merge(self, path) -> int:
        """Copies the records of the cache file `path` that this one lacks
        (the other file is only read); returns how many rows were added.
        Damaged records (a binary or a layer whose stored bytes fail their
        sha256) are skipped and the rest copied: merge_report() also
        returns what was skipped."""
        return self.merge_report(path)[0]

    def merge_report(self, path) -> tuple[int, list[str]]:
        """merge(), returning (rows added, [one message per damaged record
        skipped, naming the other file and the record])."""
        skipped: list[str] = []
        cb = _skip_collector(skipped)
        added = c_int64(0)
        with self._lock:
            self._check(_clib().sf_cache_merge(self._h(), os.fsencode(os.fspath(path)),
                                               byref(added), cb, None))
        return added.value, skipped

    def export_to(self, path, layer_names: Optional[Sequence[str]] = None) -> int:
        """Writes the named layers (None: all) with their packed weights,
        matrices and binaries into the cache file `path` (created when
        missing, as one self-contained file that opens read-only anywhere);
        returns the number of rows written.  Damaged records are skipped:
        export_report() also returns what was skipped."""
        return self.export_report(path, layer_names)[0]

    def export_report(self, path, layer_names: Optional[Sequence[str]] = None
                      ) -> tuple[int, list[str]]:
        """export_to(), returning (rows written, [one message per damaged
        record skipped, naming this cache's file and the record])."""
        names_arr = None
        keep: list = []
        if layer_names is not None:
            if isinstance(layer_names, str):
                layer_names = [layer_names]
            keep = [_text(n, "layer name") for n in layer_names]
            names_arr = (c_char_p * (len(keep) + 1))(*keep, None)
        dest = Path(os.fspath(path))
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
        skipped: list[str] = []
        cb = _skip_collector(skipped)
        added = c_int64(0)
        with self._lock:
            self._check(_clib().sf_cache_export(self._h(), os.fsencode(dest), names_arr,
                                                byref(added), cb, None))
        return added.value, skipped

    def summary(self) -> dict:
        """Rows per table: binaries, envs, matrices, trials, winners, layers,
        layer_variants, blobs, and blob_bytes (bytes of binaries and packed
        weights)."""
        c = sf_cache_counts()
        with self._lock:
            self._check(_clib().sf_cache_count(self._h(), byref(c)))
        return {name: getattr(c, name) for name, _ in sf_cache_counts._fields_}

    # ---- callbacks --------------------------------------------------------
    def _walk(self, fn_name: str, cb_type, fn, *args) -> None:
        """Calls a walking function (handle, *args, cb, user) with `fn` as
        the callback.  An exception in `fn` stops the walk and is re-raised
        here once the C call has returned."""
        caught: list[BaseException] = []

        def wrapped(*a):
            try:
                return fn(*a)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                caught.append(e)
                return 1

        cb = cb_type(wrapped)
        with self._lock:
            st = getattr(_clib(), fn_name)(self._h(), *args, cb, None)
            if caught:
                raise caught[0]
            self._check(st)
