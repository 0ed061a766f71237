/*
 * context.c -- the context: one device, its lazily opened primary CUDA
 * context, the last error (and a fault that spoiled it), the device
 * description, the device memory it tracks and the objects it owns (a
 * list of release functions: the owners register themselves).
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------ */

static char g_nomem_msg[] = "out of host memory (while recording an error)";

sf_status sf__fail(sf_context *ctx, sf_status code, const char *fmt, ...) {
  if (!ctx) return code;
  ctx->code = code;
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  size_t need = (size_t)n + 1;
  if (need > ctx->msg_cap || ctx->msg == g_nomem_msg) {
    char *m = malloc(need < 256 ? 256 : need);
    if (!m) {
      if (ctx->msg != g_nomem_msg) free(ctx->msg);
      ctx->msg = g_nomem_msg;
      ctx->msg_cap = 0;
      va_end(ap2);
      return code;
    }
    if (ctx->msg != g_nomem_msg) free(ctx->msg);
    ctx->msg = m;
    ctx->msg_cap = need < 256 ? 256 : need;
  }
  vsnprintf(ctx->msg, need, fmt, ap2);
  va_end(ap2);
  return code;
}

sf_status sf__cu_fail(sf_context *ctx, sf_status code, CUresult r,
                      const char *what) {
  char desc[512];
  sf__cu_describe(ctx ? ctx->drv : NULL, r, desc, sizeof desc);
  if (sf__cu_is_sticky(r)) {
    code = SF_ERR_FAULT;
    if (ctx && !ctx->faulted) {
      ctx->faulted = 1;
      snprintf(ctx->fault, sizeof ctx->fault, "%s", desc);
    }
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY && code == SF_ERR_CUDA)
    return sf__fail(ctx, code, "%s failed: %s (device memory exhausted)",
                    what, desc);
  return sf__fail(ctx, code, "%s failed: %s", what, desc);
}

const char *sf_errmsg(const sf_context *ctx) {
  if (!ctx) return "NULL context";
  return ctx->msg ? ctx->msg : "";
}

sf_status sf_errcode(const sf_context *ctx) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  return ctx->code;
}

sf_status sf_context_fail(sf_context *ctx, sf_status code, const char *message) {
  if (!ctx) return code;
  return sf__fail(ctx, code, "%s", message ? message : "");
}

/* ---- create / destroy -------------------------------------------------- */

sf_status sf_context_create(int device_ordinal, sf_context **out) {
  if (!out) return SF_ERR_INVALID_ARG;
  *out = NULL;
  if (device_ordinal < 0) return SF_ERR_INVALID_ARG;
  sf_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return SF_ERR_NOMEM;
  ctx->ordinal = device_ordinal;
  ctx->code = SF_OK;
  *out = ctx;
  return SF_OK;
}

void sf_context_destroy(sf_context *ctx) {
  if (!ctx) return;
  if (ctx->ready) {
    const sf__driver *d = ctx->drv;
    d->CtxSetCurrent(ctx->cu);
    /* Wait for work still queued; errors (a faulted context) are moot. */
    d->CtxSynchronize();
    /* Newest first: a layer goes before the modules it loaded, and a
     * release may disown other objects (a layer its modules). */
    while (ctx->owned) {
      sf__owned *o = ctx->owned;
      sf__disown(ctx, o);
      o->release(o);
    }
    for (size_t i = 0; i < ctx->n_allocs; i++)
      d->MemFree((CUdeviceptr)ctx->allocs[i]);
    if (ctx->flush_buf) d->MemFree(ctx->flush_buf);
    d->DevicePrimaryCtxRelease(ctx->dev);
  }
  free(ctx->allocs);
  if (ctx->msg != g_nomem_msg) free(ctx->msg);
  free(ctx);
}

/* ---- the device -------------------------------------------------------- */

sf_status sf__ctx_enter(sf_context *ctx) {
  if (ctx->faulted)
    return sf__fail(ctx, SF_ERR_FAULT,
                    "the context faulted earlier (%s): it is unusable; "
                    "destroy it",
                    ctx->fault);
  if (ctx->ready) {
    CUresult r = ctx->drv->CtxSetCurrent(ctx->cu);
    if (r != CUDA_SUCCESS)
      return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuCtxSetCurrent");
    return SF_OK;
  }
  char *msg = malloc(SF_MSG_MAX);
  if (!msg) return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  const sf__driver *d = NULL;
  sf_status st = sf__driver_get(&d, msg, NULL);
  if (st != SF_OK) {
    sf__fail(ctx, st, "%s", msg);
    free(msg);
    return st;
  }
  free(msg);
  ctx->drv = d;
  int count = 0;
  CUresult r = d->DeviceGetCount(&count);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDeviceGetCount");
  if (count == 0)
    return sf__fail(ctx, SF_ERR_NO_DEVICE,
                    "no CUDA device: the driver reports 0 devices");
  if (ctx->ordinal >= count)
    return sf__fail(ctx, SF_ERR_NO_DEVICE,
                    "no CUDA device with ordinal %d (%d device%s present)",
                    ctx->ordinal, count, count == 1 ? "" : "s");
  CUdevice dev;
  r = d->DeviceGet(&dev, ctx->ordinal);
  if (r != CUDA_SUCCESS) return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDeviceGet");
  CUcontext cu = NULL;
  r = d->DevicePrimaryCtxRetain(&cu, dev);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDevicePrimaryCtxRetain");
  r = d->CtxSetCurrent(cu);
  if (r != CUDA_SUCCESS) {
    d->DevicePrimaryCtxRelease(dev);
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuCtxSetCurrent");
  }
  ctx->dev = dev;
  ctx->cu = cu;
  ctx->ready = 1;
  return SF_OK;
}

static sf_status query_info(sf_context *ctx) {
  const sf__driver *d = ctx->drv;
  sf_device_info info;
  memset(&info, 0, sizeof info);
  CUresult r = d->DeviceGetName(info.name, (int)sizeof info.name, ctx->dev);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDeviceGetName");
  static const struct {
    CUdevice_attribute attr;
    size_t offset;
    const char *what;
  } attrs[] = {
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
       offsetof(sf_device_info, cc_major), "compute capability major"},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
       offsetof(sf_device_info, cc_minor), "compute capability minor"},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
       offsetof(sf_device_info, sm_count), "multiprocessor count"},
      {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, offsetof(sf_device_info, l2_bytes),
       "L2 cache size"},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
       offsetof(sf_device_info, smem_per_block_optin),
       "shared memory per block (opt-in)"},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
       offsetof(sf_device_info, smem_per_sm), "shared memory per SM"},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
       offsetof(sf_device_info, regs_per_block), "registers per block"},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
       offsetof(sf_device_info, max_threads_per_block), "threads per block"},
      {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, offsetof(sf_device_info, clock_khz),
       "clock rate"},
  };
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    int v = 0;
    r = d->DeviceGetAttribute(&v, attrs[i].attr, ctx->dev);
    if (r != CUDA_SUCCESS) {
      char what[128];
      snprintf(what, sizeof what, "cuDeviceGetAttribute(%s)", attrs[i].what);
      return sf__cu_fail(ctx, SF_ERR_CUDA, r, what);
    }
    memcpy((char *)&info + attrs[i].offset, &v, sizeof v);
  }
  r = d->DriverGetVersion(&info.driver_version);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDriverGetVersion");
  size_t total = 0;
  r = d->DeviceTotalMem(&total, ctx->dev);
  if (r != CUDA_SUCCESS)
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDeviceTotalMem");
  info.total_mem_bytes = (uint64_t)total;
  /* sm_90a unlocks wgmma and setmaxnreg on Hopper; other GPUs take the
   * plain arch (their "a" variants are not forward compatible either). */
  if (info.cc_major == 9 && info.cc_minor == 0)
    snprintf(info.arch, sizeof info.arch, "sm_90a");
  else
    snprintf(info.arch, sizeof info.arch, "sm_%d%d", info.cc_major,
             info.cc_minor);
  ctx->info = info;
  ctx->have_info = 1;
  return SF_OK;
}

sf_status sf_device_info_get(sf_context *ctx, sf_device_info *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  if (!ctx->have_info && (st = query_info(ctx)) != SF_OK) return st;
  *out = ctx->info;
  return SF_OK;
}

sf_status sf_device_count(sf_context *ctx, int *count) {
  if (count) *count = 0;
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!count) return sf__fail(ctx, SF_ERR_INVALID_ARG, "count is NULL");
  char *msg = malloc(SF_MSG_MAX);
  if (!msg) return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  const sf__driver *d = NULL;
  CUresult ir = CUDA_SUCCESS;
  sf_status st = sf__driver_get(&d, msg, &ir);
  if (st == SF_ERR_NO_DEVICE && ir == CUDA_ERROR_NO_DEVICE) {
    free(msg);
    return SF_OK; /* a driver and no GPU */
  }
  if (st != SF_OK) {
    sf__fail(ctx, st, "%s", msg);
    free(msg);
    return st;
  }
  free(msg);
  int n = 0;
  CUresult r = d->DeviceGetCount(&n);
  if (r != CUDA_SUCCESS) {
    ctx->drv = ctx->drv ? ctx->drv : d;
    return sf__cu_fail(ctx, SF_ERR_CUDA, r, "cuDeviceGetCount");
  }
  *count = n;
  return SF_OK;
}

/* ---- allocation tracking ----------------------------------------------- */

sf_status sf__track_alloc(sf_context *ctx, sf_devptr p) {
  if (ctx->n_allocs == ctx->cap_allocs) {
    size_t cap = ctx->cap_allocs ? 2 * ctx->cap_allocs : 16;
    sf_devptr *a = realloc(ctx->allocs, cap * sizeof *a);
    if (!a) return SF_ERR_NOMEM;
    ctx->allocs = a;
    ctx->cap_allocs = cap;
  }
  ctx->allocs[ctx->n_allocs++] = p;
  return SF_OK;
}

int sf__untrack_alloc(sf_context *ctx, sf_devptr p) {
  /* Newest first: buffers tend to be freed in reverse order. */
  for (size_t i = ctx->n_allocs; i-- > 0;) {
    if (ctx->allocs[i] == p) {
      ctx->allocs[i] = ctx->allocs[--ctx->n_allocs];
      return 1;
    }
  }
  return 0;
}

void sf__release_alloc(sf_context *ctx, sf_devptr p) {
  if (!p || !ctx->ready || !sf__untrack_alloc(ctx, p)) return;
  ctx->drv->CtxSetCurrent(ctx->cu);
  ctx->drv->MemFree((CUdeviceptr)p);
}

/* ---- owned objects ----------------------------------------------------- */

void sf__own(sf_context *ctx, sf__owned *o, void (*release)(sf__owned *)) {
  o->release = release;
  o->prev = NULL;
  o->next = ctx->owned;
  if (ctx->owned) ctx->owned->prev = o;
  ctx->owned = o;
}

void sf__disown(sf_context *ctx, sf__owned *o) {
  if (o->prev)
    o->prev->next = o->next;
  else if (ctx->owned == o)
    ctx->owned = o->next;
  if (o->next) o->next->prev = o->prev;
  o->prev = o->next = NULL;
}
