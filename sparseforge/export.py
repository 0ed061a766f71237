"""Deployment bundles: tuned layers exported from a database as C sources
that need the CUDA driver alone.

    sparseforge export DB -o DIR [--layers NAME ...] [--arch sm_80,sm_90a]
                       [--weights embed|file] [--bundle NAME] [--vectors WEIGHTS]

writes

    DIR/include/NAME.h        the API: open, run a layer, close; layer names
    DIR/include/sparseforge_bundle.h   the same API under fixed names (sfb_*),
                              for a program that links one bundle
    DIR/src/NAME.c            per architecture, every layer's cubins (one per
                              N bucket), their launch records and sha256s;
                              the packed weights (embedded, or their offsets
                              and sha256s in NAME.weights)
    DIR/runtime/              the driver-only runtime's sources (the CUDA
                              driver is loaded at run time)
    DIR/CMakeLists.txt        static and shared libraries NAME and NAME_static
                              (alias sparseforge_bundle), for add_subdirectory
                              or find_package(NAME)
    DIR/NAME.weights          the packed weights (--weights file)
    DIR/vectors/layer<i>.sfv  test vectors (--vectors WEIGHTS) of layer i: its W
                              (coordinates and values), its epilogue and an X
    DIR/BUNDLE.md             what the bundle holds

The records come from the database: for each architecture, each layer's
record tuned on a GPU of that architecture, else its untuned record for it
(`tune` without a GPU); every cubin comes from the database, or is compiled
here with NVRTC (never at run time).  The launch records are written from
the header's table (SF_LAUNCH_RECORD_FIELDS), so the bundle launches exactly
what was measured.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from . import _abi

DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}     # sf_dtype
VECTOR_COLUMNS = 256                                 # columns (tokens) of each layer's test X


class ExportError(ValueError):
    """What the database does not hold for the export asked."""


@dataclass
class Variant:
    n_bucket: int
    kernel: str
    launch: dict
    cubin: int          # index into Bundle.cubins
    packed: int         # index into Bundle.packed


@dataclass
class Layer:
    name: str
    ident: str          # a C identifier
    rows: int
    cols: int
    x_elem: int
    y_elem: int
    op: str
    per_arch: dict = field(default_factory=dict)   # arch -> (gpu_name, [Variant])


@dataclass
class Bundle:
    name: str
    archs: list
    layers: list
    cubins: list = field(default_factory=list)      # bytes, deduplicated
    packed: list = field(default_factory=list)      # bytes, deduplicated
    skipped: list = field(default_factory=list)     # messages

    def _index(self, table: list, data: bytes) -> int:
        for i, d in enumerate(table):
            if d == data:
                return i
        table.append(data)
        return len(table) - 1


def runtime_sources() -> Path:
    """The driver-only runtime's sources: the checkout's runtime/ folder,
    or the copy installed with the package."""
    here = Path(__file__).resolve().parent
    for d in (here.parent / "runtime", here / "runtime_src"):
        if (d / "rt_sources.txt").exists():
            return d
    raise ExportError("the runtime's sources are missing from this installation "
                      "(sparseforge/runtime_src); reinstall sparseforge")


def _rt_files(rt: Path) -> list[str]:
    lines = (rt / "rt_sources.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def _ident(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]", "_", name).strip("_") or "layer"
    return ("L_" + s) if s[0].isdigit() else s


def collect(cache, layer_names: Optional[Sequence[str]], archs: Optional[Sequence[str]],
            bundle_name: str) -> Bundle:
    """The bundle's contents from `cache`: for each architecture, each
    layer's record (tuned on a GPU of that architecture, else untuned for
    it) with the cubin of every N bucket."""
    from . import native
    from .tuner.compiler import binary_key
    from .tuner.resolve import arch_of_record, env_archs, record_for_arch
    env_arch = env_archs(cache)
    records = cache.layers()
    by_name: dict[str, list] = {}
    skipped = []
    for rec in records:
        if rec["problem"]:
            skipped.append(f"layer {rec['name']!r} ({rec['gpu_name']}) skipped: {rec['problem']}")
            continue
        by_name.setdefault(rec["name"], []).append(rec)
    names = list(layer_names) if layer_names else sorted(by_name)
    missing = [n for n in names if n not in by_name]
    if missing:
        known = ", ".join(sorted(by_name)[:10]) or "none"
        raise ExportError(f"no usable layer named {', '.join(map(repr, missing))} in the "
                          f"database (layers: {known})")
    if not names:
        raise ExportError("the database holds no usable layer to export")
    if not archs:
        archs = sorted({a for n in names for r in by_name[n]
                        if (a := arch_of_record(r, env_arch)) is not None})
    bundle = Bundle(bundle_name, list(archs), [], skipped=skipped)
    ctx = native.Context(0)
    nvrtc = "%d.%d" % native.nvrtc_version()
    idents = set()
    for name in names:
        first = by_name[name][0]
        ident = _ident(name)
        while ident in idents:
            ident += "_"
        idents.add(ident)
        layer = Layer(name, ident, first["rows"], first["cols"], first["x_elem_size"],
                      first["y_elem_size"], first["op"])
        for arch in archs:
            rec = record_for_arch(by_name[name], arch, env_arch)
            if rec is None:
                have = ", ".join(f"{r['gpu_name']} ({arch_of_record(r, env_arch) or '?'})"
                                 for r in by_name[name])
                raise ExportError(f"layer {name!r} has no record for {arch}: it was tuned on "
                                  f"{have}; tune it on a GPU of that architecture (or "
                                  f"without a GPU, with --arch {arch}), or export other "
                                  f"architectures")
            if (rec["rows"], rec["cols"], rec["op"]) != (layer.rows, layer.cols, layer.op):
                raise ExportError(f"layer {name!r}: its records disagree on the shape or "
                                  "operation; export one architecture at a time")
            variants = []
            for v in rec["variants"]:
                extra = [o for o in v["options"].split("\n") if o.strip()]
                key = binary_key(v["source"], ctx.canonical_options(arch, options=extra), arch,
                                  nvrtc)
                key["generator_version"] = v["generator_version"]
                cubin = cache.get_binary(key)
                if cubin is None:    # not compiled for this arch yet: compile here, never there
                    cubin = ctx.compile(v["source"], name=v["kernel_name"] + ".cu", arch=arch,
                                        options=extra).data
                variants.append(Variant(v["n_bucket"], v["kernel_name"], v["launch"],
                                        bundle._index(bundle.cubins, cubin),
                                        bundle._index(bundle.packed, v["packed"])))
            layer.per_arch[arch] = (rec["gpu_name"], variants)
        bundle.layers.append(layer)
    ctx.close()
    return bundle


# ---- writing -----------------------------------------------------------------

def _bytes_c(data: bytes, per_line: int = 24) -> str:
    if not data:
        return "0"
    rows = []
    for i in range(0, len(data), per_line):
        rows.append(",".join(str(b) for b in data[i:i + per_line]))
    return "\n  " + ",\n  ".join(rows) + "\n"


def _launch_c(launch: dict) -> str:
    """A designated initializer of sf_launch_record, field by field from the
    header's table."""
    parts = []
    for name, _, count, _ in _abi.LAUNCH_RECORD_FIELDS:
        v = launch[name]
        parts.append(f".{name} = " + ("{" + ", ".join(str(int(x)) for x in v) + "}"
                                      if count else str(int(v))))
    return "{" + ", ".join(parts) + "}"


def _c_string(s: str) -> str:
    return json.dumps(s)   # a valid C string literal for printable text


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _layout_code(op: str) -> int:
    parts = op.split(".")
    return 1 if len(parts) > 2 and parts[2] == "tm" else 0


def write(bundle: Bundle, out: Path, weights: str = "embed") -> list[Path]:
    """Writes the bundle's files under `out`; returns them."""
    if weights not in ("embed", "file"):
        raise ExportError(f"--weights is embed or file, got {weights!r}")
    name = bundle.name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ExportError(f"a bundle's name is a C identifier, got {name!r}")
    rt = runtime_sources()
    (out / "include").mkdir(parents=True, exist_ok=True)
    (out / "src").mkdir(exist_ok=True)
    (out / "runtime").mkdir(exist_ok=True)
    written = []
    for f in ["rt_sources.txt", "sparseforge_runtime.h", "internal.h"] + _rt_files(rt):
        shutil.copy2(rt / f, out / "runtime" / f)
        written.append(out / "runtime" / f)
    files = {out / "include" / f"{name}.h": _header(bundle),
             out / "include" / "sparseforge_bundle.h": _generic_header(bundle),
             out / "src" / f"{name}.c": _source(bundle, weights),
             out / "CMakeLists.txt": _cmake(bundle),
             out / f"{name}Config.cmake.in": _cmake_config(bundle),
             out / "BUNDLE.md": _readme(bundle, weights)}
    for path, text in files.items():
        path.write_text(text)
        written.append(path)
    if weights == "file":
        path = out / f"{name}.weights"
        path.write_bytes(b"".join(bundle.packed))
        written.append(path)
    return written


def _header(b: Bundle) -> str:
    n, N = b.name, b.name.upper()
    enum = "\n".join(f"  {N}_{layer.ident} = {i},  /* {layer.name} */"
                     for i, layer in enumerate(b.layers))
    return f'''/*
 * {n}.h -- a deployment bundle of {len(b.layers)} tuned sparse layer(s) for
 * {", ".join(b.archs)}.  GENERATED by `sparseforge export`; do not edit.
 *
 * It needs the CUDA driver alone (loaded at run time): no NVRTC, no SQLite,
 * no Python.  Every call returns an sf_status and keeps its message on the
 * context (sf_errmsg); nothing exits or prints.
 *
 *   sf_context *ctx; {n} *model;
 *   sf_context_create(0, &ctx);
 *   if ({n}_open(ctx, NULL, &model) != SF_OK) fprintf(stderr, "%s\\n", sf_errmsg(ctx));
 *   {n}_run(model, {N}_{b.layers[0].ident}, x_dev, y_dev, n_tokens, stream);
 *   {n}_close(model); sf_context_destroy(ctx);
 */
#ifndef {N}_H
#define {N}_H

#include "sparseforge_runtime.h"

#ifdef __cplusplus
extern "C" {{
#endif

/* The layers, by index. */
enum {{
{enum}
  {N}_LAYERS = {len(b.layers)}
}};

typedef struct {n} {n};

/* Opens the bundle on the context's GPU: picks the cubins for its compute
 * capability (the exact architecture, else an earlier one of the same
 * major version), checks every cubin's and packed blob's sha256, and loads
 * every layer (sf_layer_load: nothing is compiled).  `weights_path` is the
 * side file of a bundle exported with --weights file ({n}.weights), NULL
 * when the weights are embedded.  SF_ERR_NO_BINARY when the bundle holds
 * no cubins for the GPU (the message names what it holds),
 * SF_ERR_CORRUPT for a blob that fails its sha256, SF_ERR_IO for an
 * unreadable or short weights file, SF_ERR_INVALID_ARG for a missing one,
 * the runtime's errors otherwise (SF_ERR_NO_DRIVER without a driver). */
sf_status {n}_open(sf_context *ctx, const char *weights_path, {n} **out);

/* Closes the bundle's layers; accepts NULL. */
void {n}_close({n} *bundle);

/* Y = layer(X) for N columns on `stream` (NULL: the default stream), X and
 * Y device pointers in the layer's layout; the variant tuned for the
 * nearest N bucket runs.  As sf_layer_run. */
sf_status {n}_run({n} *bundle, int layer, sf_devptr x, sf_devptr y, int64_t n,
                  void *stream);

/* The layer's runtime handle (for sf_layer_shape and the like); NULL for a
 * NULL bundle or an index out of range. */
sf_layer *{n}_layer({n} *bundle, int layer);

/* The layer's name as tuned (NULL out of range), and its index by name
 * (-1 if none). */
const char *{n}_layer_name(int layer);
int {n}_layer_index(const char *name);

/* The layer's shape and operation: rows (M), cols (K), bytes per element of
 * X and Y, layout (0 feature-major: X is K x N; 1 token-major: X is N x K)
 * and its op tag (e.g. "shflbw64.fp16.fm.plain").  Any output may be NULL.
 * SF_ERR_INVALID_ARG for an index out of range. */
sf_status {n}_layer_info(int layer, int64_t *rows, int64_t *cols, int *x_elem_size,
                         int *y_elem_size, int *layout, const char **op);

/* The architectures the bundle holds cubins for, e.g. "sm_80,sm_90a". */
const char *{n}_archs(void);

#ifdef __cplusplus
}}
#endif
#endif /* {N}_H */
'''


def _generic_header(b: Bundle) -> str:
    n = b.name
    names = ("open", "close", "run", "layer", "layer_name", "layer_index", "layer_info", "archs")
    defs = "\n".join(f"#define sfb_{x} {n}_{x}" for x in names)
    return f'''/* sparseforge_bundle.h -- the bundle {n}'s API under fixed names (sfb_*),
 * for a program that links one bundle.  GENERATED by `sparseforge export`. */
#ifndef SPARSEFORGE_BUNDLE_H
#define SPARSEFORGE_BUNDLE_H
#include "{n}.h"
typedef {n} sfb_bundle;
#define SFB_LAYERS {n.upper()}_LAYERS
{defs}
#endif
'''


def _source(b: Bundle, weights: str) -> str:
    n = b.name
    out = [f"/* {n}.c -- the bundle's cubins, launch records and weights.  GENERATED by",
           " * `sparseforge export`; do not edit. */",
           f'#include "{n}.h"', "",
           "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", ""]
    for i, c in enumerate(b.cubins):
        out.append(f"static const unsigned char cubin_{i}[{len(c)}] = {{{_bytes_c(c)}}};")
    out.append("static const struct { const unsigned char *data; size_t size; const char *sha256; }"
               " cubins[] = {")
    out += [f"  {{cubin_{i}, {len(c)}, \"{_sha(c)}\"}}," for i, c in enumerate(b.cubins)]
    out.append("};")
    out.append("")
    offsets, pos = [], 0
    for p in b.packed:
        offsets.append(pos)
        pos += len(p)
    if weights == "embed":
        for i, p in enumerate(b.packed):
            out.append(f"static const unsigned char packed_{i}[{max(1, len(p))}] = "
                       f"{{{_bytes_c(p)}}};")
        refs = [f"packed_{i}" for i in range(len(b.packed))]
    else:
        refs = ["NULL"] * len(b.packed)
    out.append("/* packed weights: embedded data (or NULL: at `offset` in the weights file) */")
    out.append("static const struct { const unsigned char *data; size_t offset, size; "
               "const char *sha256; } packed[] = {")
    out += [f"  {{{r}, {o}, {len(p)}, \"{_sha(p)}\"}},"
            for r, o, p in zip(refs, offsets, b.packed)]
    out.append("};")
    out.append(f"#define WEIGHTS_FILE_BYTES {pos}")
    out.append("")
    out.append("typedef struct { int64_t n_bucket; const char *kernel; sf_launch_record launch; "
               "int cubin, packed; } variant;")
    for a, arch in enumerate(b.archs):
        for li, layer in enumerate(b.layers):
            gpu, variants = layer.per_arch[arch]
            out.append(f"/* {layer.name} for {arch}: tuned on {gpu} */")
            out.append(f"static const variant v_{a}_{li}[] = {{")
            for v in variants:
                out.append(f"  {{{v.n_bucket}, {_c_string(v.kernel)}, {_launch_c(v.launch)}, "
                           f"{v.cubin}, {v.packed}}},")
            out.append("};")
    out.append("")
    out.append("static const struct { const char *name, *op; int64_t rows, cols; "
               "int x_elem, y_elem, layout; } layers[] = {")
    for layer in b.layers:
        out.append(f"  {{{_c_string(layer.name)}, {_c_string(layer.op)}, {layer.rows}, "
                   f"{layer.cols}, {layer.x_elem}, {layer.y_elem}, {_layout_code(layer.op)}}},")
    out.append("};")
    out.append(f"#define NLAYERS {len(b.layers)}")
    out.append("static const struct { const char *arch; int major, minor; "
               f"const variant *v[NLAYERS]; int count[NLAYERS]; }} archs[] = {{")
    for a, arch in enumerate(b.archs):
        m = re.fullmatch(r"sm_(\d+?)(\d)[af]?", arch)
        major, minor = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        vs = ", ".join(f"v_{a}_{li}" for li in range(len(b.layers)))
        counts = ", ".join(str(len(layer.per_arch[arch][1])) for layer in b.layers)
        out.append(f"  {{\"{arch}\", {major}, {minor}, {{{vs}}}, {{{counts}}}}},")
    out.append("};")
    out.append(f"#define NARCHS {len(b.archs)}")
    out.append(f'static const char ARCH_LIST[] = "{",".join(b.archs)}";')
    out.append(_SOURCE_BODY.replace("NAME_", f"{n}_").replace("STRUCT", n))
    return "\n".join(out)


_SOURCE_BODY = r'''
struct STRUCT {
  sf_context *ctx;
  sf_layer *layers[NLAYERS];
};

static sf_status fail(sf_context *ctx, sf_status code, const char *fmt, const char *a,
                      const char *b) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
  return sf_context_fail(ctx, code, msg);
}

/* Whether the bytes hash to `sha256`. */
static int checks(const void *data, size_t size, const char *sha256) {
  char hex[65];
  return sf_sha256_hex(data, size, hex) == SF_OK && strcmp(hex, sha256) == 0;
}

/* The architecture whose cubins run on this GPU: the exact one, else the
 * newest of the same major version not newer than the GPU (sm_80 cubins run
 * on sm_86 and sm_89); -1 if none. */
static int pick_arch(const sf_device_info *dev) {
  int best = -1;
  for (int a = 0; a < NARCHS; a++) {
    if (strcmp(archs[a].arch, dev->arch) == 0) return a;
    size_t len = strlen(archs[a].arch);
    int family_specific = archs[a].arch[len - 1] == 'a';   /* sm_90a runs on 9.0 only */
    if (!family_specific && archs[a].major == dev->cc_major && archs[a].minor <= dev->cc_minor &&
        (best < 0 || archs[a].minor > archs[best].minor))
      best = a;
  }
  return best;
}

/* The packed weights of every blob, read from the side file when they are
 * not embedded, each checked against its sha256. */
static sf_status load_weights(sf_context *ctx, const char *path, unsigned char **file_data) {
  *file_data = NULL;
  int embedded = sizeof packed / sizeof packed[0] == 0 || packed[0].data != NULL;
  if (!embedded) {
    if (!path)
      return fail(ctx, SF_ERR_INVALID_ARG, "this bundle's weights are in a side file "
                  "(NAME_.weights): pass its path to NAME_open%s%s", NULL, NULL);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(ctx, SF_ERR_IO, "cannot open the weights file %s%s", path, NULL);
    unsigned char *buf = malloc(WEIGHTS_FILE_BYTES ? WEIGHTS_FILE_BYTES : 1);
    size_t got = buf ? fread(buf, 1, WEIGHTS_FILE_BYTES, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (!buf) return fail(ctx, SF_ERR_NOMEM, "out of host memory%s%s", NULL, NULL);
    if (got != WEIGHTS_FILE_BYTES || extra) {
      free(buf);
      return fail(ctx, SF_ERR_IO, "the weights file %s is not this bundle's (wrong size)%s",
                  path, NULL);
    }
    *file_data = buf;
  }
  for (size_t i = 0; i < sizeof packed / sizeof packed[0]; i++) {
    const unsigned char *p = embedded ? packed[i].data : *file_data + packed[i].offset;
    if (!checks(p, packed[i].size, packed[i].sha256))
      return fail(ctx, SF_ERR_CORRUPT, "packed weights %s failed their sha256%s",
                  packed[i].sha256, embedded ? " (embedded)" : " (in the weights file)");
  }
  return SF_OK;
}

sf_status NAME_open(sf_context *ctx, const char *weights_path, STRUCT **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return fail(ctx, SF_ERR_INVALID_ARG, "out is NULL%s%s", NULL, NULL);
  *out = NULL;
  sf_device_info dev;
  sf_status st = sf_device_info_get(ctx, &dev);
  if (st != SF_OK) return st;
  int a = pick_arch(&dev);
  if (a < 0)
    return fail(ctx, SF_ERR_NO_BINARY, "this bundle holds cubins for %s; the GPU is %s: "
                "export the layers for it", ARCH_LIST, dev.arch);
  unsigned char *file_data = NULL;
  st = load_weights(ctx, weights_path, &file_data);
  if (st != SF_OK) return st;
  STRUCT *b = calloc(1, sizeof *b);
  if (!b) {
    free(file_data);
    return fail(ctx, SF_ERR_NOMEM, "out of host memory%s%s", NULL, NULL);
  }
  b->ctx = ctx;
  unsigned char cubin_ok[sizeof cubins / sizeof *cubins];
  memset(cubin_ok, 0, sizeof cubin_ok);
  for (int l = 0; l < NLAYERS && st == SF_OK; l++) {
    sf_layer_code codes[64];
    int count = archs[a].count[l];
    if (count > 64) count = 64;
    for (int i = 0; i < count && st == SF_OK; i++) {
      const variant *v = &archs[a].v[l][i];
      /* each cubin once, however many variants share it */
      if (!cubin_ok[v->cubin] &&
          !(cubin_ok[v->cubin] = checks(cubins[v->cubin].data, cubins[v->cubin].size,
                                        cubins[v->cubin].sha256))) {
        st = fail(ctx, SF_ERR_CORRUPT, "layer %s: a cubin failed its sha256 (%s)",
                  layers[l].name, cubins[v->cubin].sha256);
        break;
      }
      memset(&codes[i], 0, sizeof codes[i]);
      codes[i].n_bucket = v->n_bucket;
      codes[i].kernel_name = v->kernel;
      codes[i].launch = v->launch;
      codes[i].binary = cubins[v->cubin].data;
      codes[i].binary_size = cubins[v->cubin].size;
      codes[i].binary_kind = SF_BINARY_CUBIN;
      codes[i].packed = packed[v->packed].data ? packed[v->packed].data
                                               : file_data + packed[v->packed].offset;
      codes[i].packed_size = packed[v->packed].size;
    }
    if (st != SF_OK) break;
    sf_layer_desc d;
    memset(&d, 0, sizeof d);
    d.name = layers[l].name;
    d.rows = layers[l].rows;
    d.cols = layers[l].cols;
    d.x_elem_size = layers[l].x_elem;
    d.y_elem_size = layers[l].y_elem;
    d.n_variants = count;
    d.variants = codes;
    st = sf_layer_load(ctx, &d, &b->layers[l]);
  }
  free(file_data);
  if (st != SF_OK) {
    NAME_close(b);
    return st;
  }
  *out = b;
  return SF_OK;
}

void NAME_close(STRUCT *b) {
  if (!b) return;
  for (int l = 0; l < NLAYERS; l++) sf_layer_close(b->layers[l]);
  free(b);
}

sf_layer *NAME_layer(STRUCT *b, int layer) {
  return b && layer >= 0 && layer < NLAYERS ? b->layers[layer] : NULL;
}

sf_status NAME_run(STRUCT *b, int layer, sf_devptr x, sf_devptr y, int64_t n, void *stream) {
  if (!b) return SF_ERR_INVALID_ARG;
  if (layer < 0 || layer >= NLAYERS)
    return fail(b->ctx, SF_ERR_INVALID_ARG, "no layer %s%s in this bundle", "", "");
  return sf_layer_run(b->ctx, b->layers[layer], x, y, n, stream);
}

const char *NAME_layer_name(int layer) {
  return layer >= 0 && layer < NLAYERS ? layers[layer].name : NULL;
}

int NAME_layer_index(const char *name) {
  for (int l = 0; name && l < NLAYERS; l++)
    if (strcmp(layers[l].name, name) == 0) return l;
  return -1;
}

sf_status NAME_layer_info(int layer, int64_t *rows, int64_t *cols, int *x_elem_size,
                          int *y_elem_size, int *layout, const char **op) {
  if (layer < 0 || layer >= NLAYERS) return SF_ERR_INVALID_ARG;
  if (rows) *rows = layers[layer].rows;
  if (cols) *cols = layers[layer].cols;
  if (x_elem_size) *x_elem_size = layers[layer].x_elem;
  if (y_elem_size) *y_elem_size = layers[layer].y_elem;
  if (layout) *layout = layers[layer].layout;
  if (op) *op = layers[layer].op;
  return SF_OK;
}

const char *NAME_archs(void) { return ARCH_LIST; }
'''


def _cmake(b: Bundle) -> str:
    n = b.name
    return f'''# A sparseforge deployment bundle: GENERATED by `sparseforge export`.
# Builds {n} (shared) and {n}_static from the bundle's source and the
# driver-only runtime; the CUDA driver is loaded at run time (the toolkit's
# cuda.h is needed to build, for its types only).  Use it with
#   add_subdirectory(path/to/bundle)   and link {n}::{n} (or sparseforge_bundle)
# or install it and find_package({n}).
cmake_minimum_required(VERSION 3.20)
project({n} LANGUAGES C)
set(CMAKE_C_STANDARD 11)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
include(GNUInstallDirs)
find_package(CUDAToolkit REQUIRED)

file(STRINGS runtime/rt_sources.txt {n}_RT REGEX "^[^#]")
list(TRANSFORM {n}_RT PREPEND ${{CMAKE_CURRENT_SOURCE_DIR}}/runtime/)
add_library({n}_objects OBJECT src/{n}.c ${{{n}_RT}})
target_include_directories({n}_objects PUBLIC
  $<BUILD_INTERFACE:${{CMAKE_CURRENT_SOURCE_DIR}}/include>
  $<BUILD_INTERFACE:${{CMAKE_CURRENT_SOURCE_DIR}}/runtime>
  PRIVATE ${{CUDAToolkit_INCLUDE_DIRS}})
target_compile_definitions({n}_objects PRIVATE _GNU_SOURCE)

foreach(kind SHARED STATIC)
  if(kind STREQUAL "SHARED")
    set(tgt {n})
  else()
    set(tgt {n}_static)
  endif()
  add_library(${{tgt}} ${{kind}} $<TARGET_OBJECTS:{n}_objects>)
  target_include_directories(${{tgt}} PUBLIC
    $<BUILD_INTERFACE:${{CMAKE_CURRENT_SOURCE_DIR}}/include>
    $<BUILD_INTERFACE:${{CMAKE_CURRENT_SOURCE_DIR}}/runtime>
    $<INSTALL_INTERFACE:${{CMAKE_INSTALL_INCLUDEDIR}}/{n}>)
  target_link_libraries(${{tgt}} PRIVATE ${{CMAKE_DL_LIBS}} m Threads::Threads)
  set_target_properties(${{tgt}} PROPERTIES OUTPUT_NAME {n})
  add_library({n}::${{tgt}} ALIAS ${{tgt}})
endforeach()
find_package(Threads REQUIRED)
add_library(sparseforge_bundle ALIAS {n})

install(TARGETS {n} {n}_static EXPORT {n}Targets
  LIBRARY DESTINATION ${{CMAKE_INSTALL_LIBDIR}} ARCHIVE DESTINATION ${{CMAKE_INSTALL_LIBDIR}})
install(FILES include/{n}.h include/sparseforge_bundle.h runtime/sparseforge_runtime.h
  DESTINATION ${{CMAKE_INSTALL_INCLUDEDIR}}/{n})
install(EXPORT {n}Targets NAMESPACE {n}:: DESTINATION ${{CMAKE_INSTALL_LIBDIR}}/cmake/{n})
include(CMakePackageConfigHelpers)
configure_package_config_file({n}Config.cmake.in ${{CMAKE_CURRENT_BINARY_DIR}}/{n}Config.cmake
  INSTALL_DESTINATION ${{CMAKE_INSTALL_LIBDIR}}/cmake/{n})
install(FILES ${{CMAKE_CURRENT_BINARY_DIR}}/{n}Config.cmake
  DESTINATION ${{CMAKE_INSTALL_LIBDIR}}/cmake/{n})
'''


def _cmake_config(b: Bundle) -> str:
    return f'''@PACKAGE_INIT@
include(CMakeFindDependencyMacro)
find_dependency(Threads)
include("${{CMAKE_CURRENT_LIST_DIR}}/{b.name}Targets.cmake")
'''


def _readme(b: Bundle, weights: str) -> str:
    lines = [f"# Deployment bundle `{b.name}`", "",
             "GENERATED by `sparseforge export`. It needs the CUDA driver alone at run time; "
             "build it with CMake (`add_subdirectory` or `find_package`).", "",
             f"- architectures: {', '.join(b.archs)}",
             f"- weights: {'embedded in src/' + b.name + '.c' if weights == 'embed' else b.name + '.weights (pass its path to ' + b.name + '_open)'}",
             f"- {len(b.cubins)} distinct cubins, {len(b.packed)} distinct packed blobs", "",
             "| layer | shape (M x K) | op | architecture: tuned on, N buckets |",
             "| --- | --- | --- | --- |"]
    for layer in b.layers:
        per = "; ".join(f"{a}: {gpu}, N = {', '.join(str(v.n_bucket) for v in vs)}"
                        for a, (gpu, vs) in layer.per_arch.items())
        lines.append(f"| {layer.name} | {layer.rows} x {layer.cols} | {layer.op} | {per} |")
    return "\n".join(lines) + "\n"


# ---- test vectors ------------------------------------------------------------

def write_vectors(bundle: Bundle, weights_file: str, out: Path, seed: int = 0) -> list[Path]:
    """vectors/layer<i>.sfv for every exported layer (i its index in the
    bundle), found by name in the
    weights file the layers were tuned from: the matrix (coordinates and
    values rounded to the layer's dtype), its epilogue and an X of
    VECTOR_COLUMNS columns (values exact in the dtype).  Layout (little
    endian): "SFV1", int64 rows, cols, nnz, columns of X; int32 dtype
    (sf_dtype), layout (0 fm, 1 tm), activation (sf_activation); float
    scale; then nnz x (int32 row, int32 col, float value); then X as floats
    (K x columns feature-major, columns x K token-major)."""
    from .generator import io
    from .generator.kernel import ACT_CODES
    from .generator.matrix import round_to_dtype
    mats = dict(io.load(weights_file))
    (out / "vectors").mkdir(parents=True, exist_ok=True)
    written = []
    rng = np.random.default_rng(seed)
    for index, layer in enumerate(bundle.layers):
        if layer.name not in mats:
            raise ExportError(f"{weights_file} holds no matrix named {layer.name!r} "
                              f"(it holds {', '.join(sorted(mats)[:8])})")
        m = mats[layer.name]
        # the op tag is "<family tag>.<dtype>.<layout>.<epilogue tag>" (only
        # the epilogue's scale may hold a dot)
        _, dtype, layout, epi = (layer.op.split(".", 3) + [None] * 4)[:4]
        if dtype not in DTYPE_CODES:
            raise ExportError(f"layer {layer.name!r}: cannot read its operation {layer.op!r}")
        if "bias" in epi.split("_") or epi.startswith("s"):
            raise ExportError(f"layer {layer.name!r}: test vectors cover no bias or scale "
                              f"(its epilogue is {epi!r})")
        act = epi if epi in ACT_CODES else "none"
        if (m.rows, m.cols) != (layer.rows, layer.cols):
            raise ExportError(f"layer {layer.name!r}: {weights_file} holds a "
                              f"{m.rows} x {m.cols} matrix, the database a "
                              f"{layer.rows} x {layer.cols} one")
        rows = m.row_ids().astype(np.int32)
        cols = m.indices.astype(np.int32)
        vals = round_to_dtype(m.values, dtype).astype(np.float32)
        k, ncol = m.cols, VECTOR_COLUMNS
        x = round_to_dtype(rng.standard_normal((k, ncol) if layout == "fm" else (ncol, k))
                           .astype(np.float32), dtype).astype(np.float32)
        coo = np.empty(m.nnz, dtype=[("r", "<i4"), ("c", "<i4"), ("v", "<f4")])
        coo["r"], coo["c"], coo["v"] = rows, cols, vals
        head = b"SFV1" + struct.pack("<qqqqiiif", m.rows, m.cols, m.nnz, ncol, DTYPE_CODES[dtype],
                                     1 if layout == "tm" else 0, ACT_CODES[act], 1.0)
        path = out / "vectors" / f"layer{index}.sfv"
        path.write_bytes(head + coo.tobytes() + x.astype("<f4").tobytes())
        written.append(path)
    return written


def export(cache, out, layer_names=None, archs=None, weights="embed", bundle_name="sfmodel",
           vectors: Optional[str] = None) -> tuple[Bundle, list[Path]]:
    """collect + write (+ write_vectors): the bundle and the files written.
    Nothing is left under `out` when it fails before writing."""
    bundle = collect(cache, layer_names, archs, bundle_name)
    out = Path(out)
    files = write(bundle, out, weights)
    if vectors:
        files += write_vectors(bundle, vectors, out)
    return bundle, files
