/*
 * module.c -- modules, kernels, launches, event timing and device memory.
 * A module is owned by its context (sf__own) until it is unloaded.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Dynamic shared memory a kernel may use without opting in. */
#define SF_DEFAULT_DYN_SMEM (48 * 1024)

/* ---- modules ------------------------------------------------------------ */

/* The optional symbols a module may declare (read_map, read_pdl). */
static const char *const optional_symbols[] = {"sf_x_map", "sf_y_map", "sf_pdl"};
#define SF_N_OPTIONAL (sizeof optional_symbols / sizeof *optional_symbols)

static uint64_t le_read(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

int sf__cubin_symbols(const void *data, size_t size, const char *const *names, size_t n,
                      unsigned *found) {
  const unsigned char *d = data;
  *found = 0;
  if (!d || size < 64 || memcmp(d, "\177ELF", 4) != 0 || d[4] != 2 || d[5] != 1) return 0;
  const uint64_t shoff = le_read(d + 0x28, 8);
  const uint64_t shentsize = le_read(d + 0x3A, 2), shnum = le_read(d + 0x3C, 2);
  if (shentsize < 64 || shoff > size || shnum > (size - shoff) / shentsize) return 0;
  unsigned seen = 0;
  for (uint64_t i = 0; i < shnum; ++i) {
    const unsigned char *sh = d + shoff + i * shentsize;
    if (le_read(sh + 4, 4) != 2) continue; /* SHT_SYMTAB */
    const uint64_t off = le_read(sh + 0x18, 8), bytes = le_read(sh + 0x20, 8);
    const uint64_t link = le_read(sh + 0x28, 4), entsize = le_read(sh + 0x38, 8);
    if (link >= shnum || entsize < 24 || off > size || bytes > size - off) return 0;
    const unsigned char *strs = d + shoff + link * shentsize;
    const uint64_t str_off = le_read(strs + 0x18, 8), str_bytes = le_read(strs + 0x20, 8);
    if (str_off > size || str_bytes > size - str_off) return 0;
    for (uint64_t j = 0; j < bytes / entsize; ++j) {
      const uint64_t name = le_read(d + off + j * entsize, 4); /* st_name */
      if (name >= str_bytes) return 0;
      const char *s = (const char *)d + str_off + name;
      const size_t left = (size_t)(str_bytes - name);
      for (size_t b = 0; b < n && b < 32; ++b) {
        const size_t len = strlen(names[b]);
        if (len < left && memcmp(s, names[b], len + 1) == 0) seen |= 1u << b;
      }
    }
  }
  *found = seen;
  return 1;
}

/* Frees a module's host and device side; it is no longer owned. */
static void module_release(sf__owned *o) {
  struct sf_module *m = SF__OWNER(o, struct sf_module, owned);
  m->ctx->drv->CtxSetCurrent(m->ctx->cu);
  while (m->kernels) {
    struct sf_kernel *k = m->kernels;
    m->kernels = k->next;
    free(k->name);
    free(k);
  }
  if (m->mod) m->ctx->drv->ModuleUnload(m->mod);
  free(m);
}

sf_status sf_module_load(sf_context *ctx, const sf_binary *bin,
                         sf_module **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!bin) return sf__fail(ctx, SF_ERR_INVALID_ARG, "binary is NULL");
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  size_t size = 0;
  const void *data = sf_binary_data(bin, &size);
  sf_binary_kind kind = sf_binary_get_kind(bin);
  struct sf_module *m = calloc(1, sizeof *m);
  if (!m) return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  CUresult r = ctx->drv->ModuleLoadData(&m->mod, data);
  if (r != CUDA_SUCCESS) {
    free(m);
    char what[128];
    snprintf(what, sizeof what, "cuModuleLoadData(%s, %zu bytes)",
             kind == SF_BINARY_PTX ? "PTX" : "cubin", size);
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, what);
  }
  m->ctx = ctx;
  if (kind == SF_BINARY_CUBIN)
    m->symbols_known =
        sf__cubin_symbols(data, size, optional_symbols, SF_N_OPTIONAL, &m->symbols);
  sf__own(ctx, &m->owned, module_release);
  *out = m;
  return SF_OK;
}

void sf_module_unload(sf_module *m) {
  if (!m) return;
  sf__disown(m->ctx, &m->owned);
  module_release(&m->owned);
}

/* ---- kernels ----------------------------------------------------------- */

/* The module's global int array `name` of `count` ints, into v; *found
 * is 0 (and v untouched) where the module declares none. */
static sf_status read_module_ints(sf_context *ctx, sf_module *mod, const char *name, int *v,
                                  size_t count, int *found) {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  char what[96];
  *found = 0;
  /* (the cubin's own symbol table says whether it is there) */
  for (size_t b = 0; b < SF_N_OPTIONAL && mod->symbols_known; ++b)
    if (strcmp(name, optional_symbols[b]) == 0 && !(mod->symbols >> b & 1u)) return SF_OK;
  CUresult r = ctx->drv->ModuleGetGlobal(&ptr, &bytes, mod->mod, name);
  if (r == CUDA_ERROR_NOT_FOUND) return SF_OK;
  if (r != CUDA_SUCCESS) {
    snprintf(what, sizeof what, "cuModuleGetGlobal(\"%s\")", name);
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, what);
  }
  if (bytes != count * sizeof *v)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "the module's %s has %zu bytes, not %zu (int[%zu])",
                    name, bytes, count * sizeof *v, count);
  r = ctx->drv->MemcpyDtoH(v, ptr, count * sizeof *v);
  if (r != CUDA_SUCCESS) {
    snprintf(what, sizeof what, "reading %s", name);
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, what);
  }
  *found = 1;
  return SF_OK;
}

/* The module's tensor map declaration `sym` (sf_x_map or sf_y_map, see
 * sf_kernel_args_set) into `out`: zeros where the module declares none.
 * `dim` names the declared length (K for X, M for Y) in the message. */
static sf_status read_map(sf_context *ctx, sf_module *mod, const char *sym, const char *dim,
                          int out[4]) {
  int v[4] = {0, 0, 0, 0}, found = 0;
  memset(out, 0, 4 * sizeof *out);
  sf_status st = read_module_ints(ctx, mod, sym, v, 4, &found);
  if (st != SF_OK || !found) return st;
  if ((v[0] != 1 && v[0] != 2) || v[1] < 1 || (v[2] != 16 && v[2] != 32 && v[2] != 64) ||
      v[3] < 1 || v[3] > 256)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "the module's %s {%d, %d, %d, %d} is malformed (layout 1 or 2, "
                    "%s >= 1, box of 16, 32 or 64 by 1..256)",
                    sym, v[0], v[1], v[2], v[3], dim);
  memcpy(out, v, sizeof v);
  return SF_OK;
}

/* Whether the module declares sf_pdl (an int, 1): its kernels call
 * griddepcontrol.wait before they read anything the stream's previous
 * work may write, and may be launched before that work has finished
 * (programmatic dependent launch).  SF_PDL=0 in the environment launches
 * them in plain stream order. */
static sf_status read_pdl(sf_context *ctx, sf_module *mod, struct sf_kernel *k) {
  int v = 0, found = 0;
  k->pdl = 0;
  sf_status st = read_module_ints(ctx, mod, "sf_pdl", &v, 1, &found);
  if (st != SF_OK || !found) return st;
  const char *env = getenv("SF_PDL");
  k->pdl = v == 1 && !(env && strcmp(env, "0") == 0);
  return SF_OK;
}

/* The tensor map a module declares (`decl`: {layout, the declared length
 * D, box width, box rows}) of the 16-bit matrix at `base` (layout 1: D
 * rows of n, row-major; 2: n rows of D), encoded into `map_out` and
 * appended to the launch's arguments `out`; nothing where the module declares none, and
 * a zero map where layout 1's rows are not 16-byte aligned (n % 8 != 0):
 * the kernel, which knows n, then does without it.  `what` names the
 * map in the driver's error. */
static sf_status add_map(sf_context *ctx, const int decl[4], sf_devptr base, int n,
                         sf_kernel_args *out, unsigned char map_out[128], const char *what) {
  if (!decl[0]) return SF_OK;
  out->ptrs[out->n_args++] = map_out;
  const int fm = decl[0] == 1;
  const uint64_t d = (uint64_t)decl[1];
  if (fm && n % 8 != 0) return SF_OK; /* rows not 16-byte aligned: no map */
  cuuint64_t dims[2] = {fm ? (cuuint64_t)n : d, fm ? d : (cuuint64_t)n};
  cuuint64_t strides[1] = {2 * dims[0]};
  cuuint32_t box[2] = {(cuuint32_t)decl[2], (cuuint32_t)decl[3]};
  cuuint32_t elem[2] = {1, 1};
  /* swizzled to the box's row: 128, 64 or 32 bytes (read_map) */
  const CUtensorMapSwizzle swizzle = box[0] == 64   ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : box[0] == 32 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                    : CU_TENSOR_MAP_SWIZZLE_32B;
  CUtensorMap map;
  CUresult r = ctx->drv->TensorMapEncodeTiled(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)(uintptr_t)base, dims, strides, box,
      elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    char msg[96];
    snprintf(msg, sizeof msg, "mapping %s (cuTensorMapEncodeTiled)", what);
    return sf__cu_fail(ctx, SF_ERR_INVALID_ARG, r, msg);
  }
  memcpy(map_out, &map, sizeof map);
  return SF_OK;
}

sf_status sf_kernel_args_set(sf_context *ctx, sf_kernel *k, sf_devptr packed,
                             sf_devptr x, sf_devptr y, int64_t n,
                             sf_kernel_args *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  memset(out, 0, sizeof *out);
  if (!k) return sf__fail(ctx, SF_ERR_INVALID_ARG, "kernel is NULL");
  if (n < 1 || n > INT_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "N = %lld is outside 1..%d",
                    (long long)n, INT_MAX);
  out->packed = packed;
  out->x = x;
  out->y = y;
  out->n = (int)n;
  out->ptrs[0] = &out->packed;
  out->ptrs[1] = &out->x;
  out->ptrs[2] = &out->y;
  out->ptrs[3] = &out->n;
  out->n_args = 4;
  sf_status st = add_map(ctx, k->x_map, x, out->n, out, out->x_map,
                         "X for the kernel's tensor loads");
  if (st == SF_OK) st = add_map(ctx, k->y_map, y, out->n, out, out->y_map,
                            "Y for the kernel's tensor stores");
  return st;
}

sf_status sf_kernel_get(sf_context *ctx, sf_module *mod, const char *name,
                        sf_kernel **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!mod) return sf__fail(ctx, SF_ERR_INVALID_ARG, "module is NULL");
  if (!name || !*name)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "kernel name is NULL or empty");
  if (mod->ctx != ctx)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "the module belongs to another context");
  for (struct sf_kernel *k = mod->kernels; k; k = k->next)
    if (strcmp(k->name, name) == 0) {
      *out = k;
      return SF_OK;
    }
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  CUfunction fn = NULL;
  CUresult r = ctx->drv->ModuleGetFunction(&fn, mod->mod, name);
  if (r == CUDA_ERROR_NOT_FOUND)
    return sf__fail(ctx, SF_ERR_NOT_FOUND,
                    "no kernel named \"%s\" in the module (a C++ kernel "
                    "needs extern \"C\" or its mangled name)",
                    name);
  if (r != CUDA_SUCCESS) {
    char what[320];
    snprintf(what, sizeof what, "cuModuleGetFunction(\"%.256s\")", name);
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, what);
  }
  struct sf_kernel *k = calloc(1, sizeof *k);
  char *copy = sf__strdup(name);
  if (!k || !copy) {
    free(k);
    free(copy);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  k->mod = mod;
  k->fn = fn;
  k->name = copy;
  k->dyn_smem_limit = SF_DEFAULT_DYN_SMEM;
  if ((st = read_map(ctx, mod, "sf_x_map", "K", k->x_map)) != SF_OK ||
      (st = read_map(ctx, mod, "sf_y_map", "M", k->y_map)) != SF_OK ||
      (st = read_pdl(ctx, mod, k)) != SF_OK) {
    free(k);
    free(copy);
    return st;
  }
  k->next = mod->kernels;
  mod->kernels = k;
  *out = k;
  return SF_OK;
}

static sf_status check_kernel(sf_context *ctx, const sf_kernel *k) {
  if (!k) return sf__fail(ctx, SF_ERR_INVALID_ARG, "kernel is NULL");
  if (k->mod->ctx != ctx)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "the kernel belongs to another context");
  return SF_OK;
}

sf_status sf_kernel_attributes(sf_context *ctx, sf_kernel *k,
                               sf_kernel_attrs *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_kernel(ctx, k);
  if (st != SF_OK) return st;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  if ((st = sf__ctx_enter(ctx)) != SF_OK) return st;
  static const struct {
    CUfunction_attribute attr;
    size_t offset;
    const char *what;
  } attrs[] = {
      {CU_FUNC_ATTRIBUTE_NUM_REGS, offsetof(sf_kernel_attrs, num_regs),
       "cuFuncGetAttribute(NUM_REGS)"},
      {CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
       offsetof(sf_kernel_attrs, shared_bytes),
       "cuFuncGetAttribute(SHARED_SIZE_BYTES)"},
      {CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
       offsetof(sf_kernel_attrs, local_bytes),
       "cuFuncGetAttribute(LOCAL_SIZE_BYTES)"},
      {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
       offsetof(sf_kernel_attrs, max_threads),
       "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)"},
  };
  sf_kernel_attrs a;
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    int v = 0;
    CUresult r = ctx->drv->FuncGetAttribute(&v, attrs[i].attr, k->fn);
    if (r != CUDA_SUCCESS)
      return sf__cu_fail(ctx, SF_ERR_CUDA, r, attrs[i].what);
    memcpy((char *)&a + attrs[i].offset, &v, sizeof v);
  }
  *out = a;
  return SF_OK;
}

/* ---- launches ---------------------------------------------------------- */

static sf_status check_config(sf_context *ctx, const sf_launch_config *cfg) {
  if (!cfg) return sf__fail(ctx, SF_ERR_INVALID_ARG, "launch config is NULL");
  for (int i = 0; i < 3; i++)
    if (cfg->grid[i] == 0 || cfg->block[i] == 0)
      return sf__fail(ctx, SF_ERR_INVALID_ARG,
                      "grid (%u, %u, %u) and block (%u, %u, %u) must be at "
                      "least 1 in every dimension",
                      cfg->grid[0], cfg->grid[1], cfg->grid[2], cfg->block[0],
                      cfg->block[1], cfg->block[2]);
  return SF_OK;
}

/* The launch itself; the context is current and the arguments checked. */
static sf_status launch_on(sf_context *ctx, sf_kernel *k,
                           const sf_launch_config *cfg, void **args,
                           CUstream stream) {
  const sf__driver *d = ctx->drv;
  CUresult r;
  if (cfg->shared_bytes > (unsigned)k->dyn_smem_limit) {
    r = d->FuncSetAttribute(k->fn,
                            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            (int)cfg->shared_bytes);
    if (r != CUDA_SUCCESS) {
      char what[384];
      snprintf(what, sizeof what,
               "raising %.256s's dynamic shared memory to %u bytes", k->name,
               cfg->shared_bytes);
      return sf__cu_fail(ctx, SF_ERR_LAUNCH, r, what);
    }
    k->dyn_smem_limit = (int)cfg->shared_bytes;
  }
  if (k->pdl) {
    /* a programmatic dependent of the stream's previous work: the kernel
     * may start (and read its constant operands) while that work drains,
     * and waits for it before anything else (read_pdl) */
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig lc;
    memset(&lc, 0, sizeof lc);
    lc.gridDimX = cfg->grid[0];
    lc.gridDimY = cfg->grid[1];
    lc.gridDimZ = cfg->grid[2];
    lc.blockDimX = cfg->block[0];
    lc.blockDimY = cfg->block[1];
    lc.blockDimZ = cfg->block[2];
    lc.sharedMemBytes = cfg->shared_bytes;
    lc.hStream = stream;
    lc.attrs = &attr;
    lc.numAttrs = 1;
    r = d->LaunchKernelEx(&lc, k->fn, args, NULL);
  } else {
    r = d->LaunchKernel(k->fn, cfg->grid[0], cfg->grid[1], cfg->grid[2],
                        cfg->block[0], cfg->block[1], cfg->block[2],
                        cfg->shared_bytes, stream, args, NULL);
  }
  if (r != CUDA_SUCCESS) {
    char what[512];
    snprintf(what, sizeof what,
             "launching %.256s (grid %u x %u x %u, block %u x %u x %u, "
             "%u bytes dynamic shared memory)",
             k->name, cfg->grid[0], cfg->grid[1], cfg->grid[2], cfg->block[0],
             cfg->block[1], cfg->block[2], cfg->shared_bytes);
    return sf__cu_fail(ctx, SF_ERR_LAUNCH, r, what);
  }
  return SF_OK;
}

sf_status sf_launch(sf_context *ctx, sf_kernel *k, const sf_launch_config *cfg,
                    void **args) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_kernel(ctx, k);
  if (st == SF_OK) st = check_config(ctx, cfg);
  if (st == SF_OK) st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  return launch_on(ctx, k, cfg, args, (CUstream)cfg->stream);
}

sf_status sf_synchronize(sf_context *ctx) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  CUresult r = ctx->drv->CtxSynchronize();
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuCtxSynchronize");
  return SF_OK;
}

/* ---- timing ------------------------------------------------------------ */

/* Events recorded per round trip to the host. */
#define SF_EVENT_POOL 64

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Quantile q of sorted v[0..n) with linear interpolation. */
static double quantile(const double *v, int n, double q) {
  double pos = q * (n - 1);
  int lo = (int)floor(pos);
  int hi = lo + 1 < n ? lo + 1 : lo;
  double f = pos - lo;
  return v[lo] * (1.0 - f) + v[hi] * f;
}

typedef struct timing_state {
  CUstream stream, own_stream;
  CUgraphExec exec;
  CUevent ev[2 * SF_EVENT_POOL];
  int n_events;
  double *samples;
} timing_state;

static void timing_cleanup(sf_context *ctx, timing_state *t) {
  const sf__driver *d = ctx->drv;
  for (int i = 0; i < t->n_events; i++) d->EventDestroy(t->ev[i]);
  if (t->exec) d->GraphExecDestroy(t->exec);
  if (t->own_stream) {
    d->StreamSynchronize(t->own_stream);
    d->StreamDestroy(t->own_stream);
  }
  free(t->samples);
}

/* One launch of what is timed, on `stream`. */
typedef struct kernel_launch {
  sf_kernel *k;
  const sf_launch_config *cfg;
  void **const *sets; /* n_sets argument arrays, taken in turn */
  int n_sets, next;
} kernel_launch;

static sf_status launch_kernel_cb(sf_context *ctx, void *user, CUstream stream) {
  kernel_launch *kl = user;
  void **args = kl->sets[kl->next];
  kl->next = (kl->next + 1) % kl->n_sets;
  return launch_on(ctx, kl->k, kl->cfg, args, stream);
}

/* Captures `batch` launches on t->stream into t->exec. */
static sf_status capture_graph(sf_context *ctx, sf__launch_fn fn, void *user,
                               int batch, timing_state *t) {
  const sf__driver *d = ctx->drv;
  CUresult r = d->StreamBeginCapture(t->stream, CU_STREAM_CAPTURE_MODE_RELAXED);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuStreamBeginCapture");
  sf_status st = SF_OK;
  for (int i = 0; i < batch && st == SF_OK; i++)
    st = fn(ctx, user, t->stream);
  CUgraph graph = NULL;
  r = d->StreamEndCapture(t->stream, &graph);
  if (st != SF_OK) {
    if (graph) d->GraphDestroy(graph);
    return st;
  }
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuStreamEndCapture");
  r = d->GraphInstantiate(&t->exec, graph, 0);
  d->GraphDestroy(graph);
  if (r != CUDA_SUCCESS) {
    t->exec = NULL;
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuGraphInstantiate");
  }
  return SF_OK;
}

static sf_status run_sample(sf_context *ctx, sf__launch_fn fn, void *user,
                            timing_state *t) {
  if (!t->exec) return fn(ctx, user, t->stream);
  CUresult r = ctx->drv->GraphLaunch(t->exec, t->stream);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_LAUNCH, r, "cuGraphLaunch");
  return SF_OK;
}

static sf_status ensure_flush_buffer(sf_context *ctx, size_t *size) {
  sf_device_info info;
  sf_status st = sf_device_info_get(ctx, &info);
  if (st != SF_OK) return st;
  size_t want = 2 * (size_t)(info.l2_bytes > 0 ? info.l2_bytes : 1 << 20);
  if (ctx->flush_buf && ctx->flush_size >= want) {
    *size = ctx->flush_size;
    return SF_OK;
  }
  if (ctx->flush_buf) ctx->drv->MemFree(ctx->flush_buf);
  ctx->flush_buf = 0;
  ctx->flush_size = 0;
  CUresult r = ctx->drv->MemAlloc(&ctx->flush_buf, want);
  if (r != CUDA_SUCCESS) {
    ctx->flush_buf = 0;
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "allocating the L2 flush buffer");
  }
  ctx->flush_size = want;
  *size = want;
  return SF_OK;
}

sf_status sf_time_kernel(sf_context *ctx, sf_kernel *k,
                         const sf_launch_config *cfg, void **args,
                         const sf_timing_options *opts, sf_timing *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_kernel(ctx, k);
  if (st == SF_OK) st = check_config(ctx, cfg);
  if (st != SF_OK) return st;
  void **sets[1] = {args};
  kernel_launch kl = {k, cfg, sets, 1, 0};
  return sf__time_launches(ctx, launch_kernel_cb, &kl, (CUstream)cfg->stream,
                           opts, out);
}

sf_status sf_time_kernel_sets(sf_context *ctx, sf_kernel *k,
                              const sf_launch_config *cfg,
                              void **const *arg_sets, int n_sets,
                              const sf_timing_options *opts, sf_timing *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (n_sets < 1 || !arg_sets)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "n_sets must be at least 1 with arg_sets given (n_sets %d)",
                    n_sets);
  for (int i = 0; i < n_sets; i++)
    if (!arg_sets[i])
      return sf__fail(ctx, SF_ERR_INVALID_ARG, "argument set %d is NULL", i);
  sf_status st = check_kernel(ctx, k);
  if (st == SF_OK) st = check_config(ctx, cfg);
  if (st != SF_OK) return st;
  kernel_launch kl = {k, cfg, arg_sets, n_sets, 0};
  return sf__time_rotating(ctx, launch_kernel_cb, &kl, (CUstream)cfg->stream,
                           n_sets, opts, out);
}

sf_status sf__time_rotating(sf_context *ctx, sf__launch_fn fn, void *user,
                            CUstream stream, int n_sets,
                            const sf_timing_options *opts, sf_timing *out) {
  sf_timing_options o;
  memset(&o, 0, sizeof o);
  if (opts) o = *opts;
  o.rotate_bytes = 0;
  if (n_sets > 1 && o.graph_batch > 1) {
    int rounds = (o.graph_batch + n_sets - 1) / n_sets;
    o.graph_batch = rounds * n_sets;
  }
  return sf__time_launches(ctx, fn, user, stream, &o, out);
}

int sf__rotation_sets(const sf_timing_options *opts, uint64_t set_bytes) {
  if (!opts || opts->rotate_bytes == 0 || set_bytes == 0) return 1;
  uint64_t n = (opts->rotate_bytes + set_bytes - 1) / set_bytes;
  return n < 1 ? 1 : n > SF_MAX_ROTATION_SETS ? SF_MAX_ROTATION_SETS : (int)n;
}

sf_status sf__time_launches(sf_context *ctx, sf__launch_fn fn, void *user,
                            CUstream stream, const sf_timing_options *opts,
                            sf_timing *out) {
  sf_status st;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  memset(out, 0, sizeof *out);
  sf_timing_options o;
  memset(&o, 0, sizeof o);
  if (opts) o = *opts;
  if (o.warmup == 0) o.warmup = 3;
  if (o.warmup < 0) o.warmup = 0;
  if (o.min_reps < 0 || o.max_reps < 0 || o.graph_batch < 0 ||
      !(o.min_total_ms >= 0.0))
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "timing options must not be negative (min_reps %d, "
                    "max_reps %d, min_total_ms %g, graph_batch %d)",
                    o.min_reps, o.max_reps, o.min_total_ms, o.graph_batch);
  if (o.min_reps == 0) o.min_reps = 30;
  if (o.max_reps == 0) o.max_reps = o.min_reps > 1000 ? o.min_reps : 1000;
  if (o.max_reps < o.min_reps)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "max_reps (%d) is below min_reps (%d)", o.max_reps,
                    o.min_reps);
  if (o.min_total_ms == 0.0) o.min_total_ms = 100.0;
  int batch = o.graph_batch > 1 ? o.graph_batch : 1;
  if ((st = sf__ctx_enter(ctx)) != SF_OK) return st;

  const sf__driver *d = ctx->drv;
  timing_state t;
  memset(&t, 0, sizeof t);
  t.stream = stream;
  CUresult r;
  size_t flush_size = 0;
  if (o.flush_l2 && (st = ensure_flush_buffer(ctx, &flush_size)) != SF_OK)
    return st;
  t.samples = malloc((size_t)o.max_reps * sizeof *t.samples);
  if (!t.samples) return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  if (batch > 1 && !t.stream) {
    /* The legacy default stream cannot be captured: use a private one. */
    r = d->StreamCreate(&t.own_stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
      st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuStreamCreate");
      goto done;
    }
    t.stream = t.own_stream;
  }
  /* One plain launch first: it checks the configuration and raises the
   * shared-memory limit outside any capture. */
  if ((st = fn(ctx, user, t.stream)) != SF_OK) goto done;
  if (batch > 1 && (st = capture_graph(ctx, fn, user, batch, &t)) != SF_OK)
    goto done;
  for (int i = 0; i < o.warmup; i++)
    if ((st = run_sample(ctx, fn, user, &t)) != SF_OK) goto done;
  r = d->StreamSynchronize(t.stream);
  if (r != CUDA_SUCCESS) {
    st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "warm-up launches");
    goto done;
  }
  int pool = o.max_reps < SF_EVENT_POOL ? o.max_reps : SF_EVENT_POOL;
  for (; t.n_events < 2 * pool; t.n_events++) {
    r = d->EventCreate(&t.ev[t.n_events], CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) {
      st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuEventCreate");
      goto done;
    }
  }

  int reps = 0;
  double total_ms = 0.0;
  while (reps < o.max_reps) {
    long want;
    if (reps < o.min_reps) {
      want = o.min_reps - reps;
    } else if (total_ms >= o.min_total_ms) {
      break;
    } else {
      double mean = total_ms / reps;
      want = mean > 0 ? (long)ceil((o.min_total_ms - total_ms) / mean) : pool;
      if (want < 1) want = 1;
    }
    if (want > pool) want = pool;
    if (want > o.max_reps - reps) want = o.max_reps - reps;
    for (long i = 0; i < want; i++) {
      if (o.flush_l2) {
        r = d->MemsetD8Async(ctx->flush_buf, (unsigned char)(reps + i),
                             flush_size, t.stream);
        if (r != CUDA_SUCCESS) {
          st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "flushing L2 (cuMemsetD8Async)");
          goto done;
        }
      }
      r = d->EventRecord(t.ev[2 * i], t.stream);
      if (r == CUDA_SUCCESS) {
        if ((st = run_sample(ctx, fn, user, &t)) != SF_OK) goto done;
        r = d->EventRecord(t.ev[2 * i + 1], t.stream);
      }
      if (r != CUDA_SUCCESS) {
        st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuEventRecord");
        goto done;
      }
    }
    r = d->EventSynchronize(t.ev[2 * (want - 1) + 1]);
    if (r != CUDA_SUCCESS) {
      st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "timed launches");
      goto done;
    }
    for (long i = 0; i < want; i++) {
      float ms = 0.0f;
      r = d->EventElapsedTime(&ms, t.ev[2 * i], t.ev[2 * i + 1]);
      if (r != CUDA_SUCCESS) {
        st = sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuEventElapsedTime");
        goto done;
      }
      t.samples[reps++] = (double)ms / batch;
      total_ms += ms;
    }
  }

  qsort(t.samples, (size_t)reps, sizeof *t.samples, cmp_double);
  double sum = 0.0;
  for (int i = 0; i < reps; i++) sum += t.samples[i];
  out->reps = reps;
  out->min_ms = t.samples[0];
  out->median_ms = quantile(t.samples, reps, 0.5);
  out->p20_ms = quantile(t.samples, reps, 0.2);
  out->p80_ms = quantile(t.samples, reps, 0.8);
  out->mean_ms = sum / reps;
  st = SF_OK;
done:
  timing_cleanup(ctx, &t);
  return st;
}

/* ---- device memory ----------------------------------------------------- */

sf_status sf_mem_alloc(sf_context *ctx, size_t size, sf_devptr *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = 0;
  if (size == 0) return sf__fail(ctx, SF_ERR_INVALID_ARG, "size is 0");
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  CUdeviceptr p = 0;
  CUresult r = ctx->drv->MemAlloc(&p, size);
  if (r != CUDA_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "cuMemAlloc(%zu bytes)", size);
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, what);
  }
  if (sf__track_alloc(ctx, (sf_devptr)p) != SF_OK) {
    ctx->drv->MemFree(p);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  *out = (sf_devptr)p;
  return SF_OK;
}

sf_status sf_mem_free(sf_context *ctx, sf_devptr ptr) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (ptr == 0) return SF_OK;
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  if (!sf__untrack_alloc(ctx, ptr))
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "0x%llx was not allocated by this context (or was freed "
                    "already)",
                    (unsigned long long)ptr);
  CUresult r = ctx->drv->MemFree((CUdeviceptr)ptr);
  if (r != CUDA_SUCCESS) return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuMemFree");
  return SF_OK;
}

static sf_status check_copy(sf_context *ctx, sf_devptr dev, const void *host,
                            size_t size) {
  if (size > 0 && !host)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "host pointer is NULL");
  if (size > 0 && !dev)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "device pointer is 0");
  return SF_OK;
}

sf_status sf_memcpy_htod(sf_context *ctx, sf_devptr dst, const void *src,
                         size_t size) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_copy(ctx, dst, src, size);
  if (st != SF_OK || size == 0) return st;
  if ((st = sf__ctx_enter(ctx)) != SF_OK) return st;
  CUresult r = ctx->drv->MemcpyHtoD((CUdeviceptr)dst, src, size);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuMemcpyHtoD");
  return SF_OK;
}

sf_status sf_memcpy_dtoh(sf_context *ctx, void *dst, sf_devptr src,
                         size_t size) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_copy(ctx, src, dst, size);
  if (st != SF_OK || size == 0) return st;
  if ((st = sf__ctx_enter(ctx)) != SF_OK) return st;
  CUresult r = ctx->drv->MemcpyDtoH(dst, (CUdeviceptr)src, size);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuMemcpyDtoH");
  return SF_OK;
}

sf_status sf_memset_d8(sf_context *ctx, sf_devptr dst, unsigned char value,
                       size_t size) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (size > 0 && !dst)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "device pointer is 0");
  if (size == 0) return SF_OK;
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  CUresult r = ctx->drv->MemsetD8((CUdeviceptr)dst, value, size);
  if (r != CUDA_SUCCESS) return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuMemsetD8");
  return SF_OK;
}
