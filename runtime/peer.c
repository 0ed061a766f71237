/*
 * peer.c -- the dense peer: cuBLAS timed with the same protocol as our
 * kernels (sf__time_launches), so that a speedup is a ratio measured in one
 * run on one GPU.  cuBLAS is loaded with dlopen like the driver, so the
 * library needs it only where a peer is timed.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS constants (cublas_api.h, library_types.h). */
enum { CUBLAS_OP_N_ = 0, CUBLAS_OP_T_ = 1 };
enum { CUDA_R_32F_ = 0, CUDA_R_16F_ = 2, CUDA_R_16BF_ = 14 };
enum { CUBLAS_COMPUTE_32F_ = 68 };
enum { CUBLAS_GEMM_DEFAULT_ = -1 };

typedef int (*cublas_create_t)(void **);
typedef int (*cublas_destroy_t)(void *);
typedef int (*cublas_set_stream_t)(void *, void *);
typedef int (*cublas_gemm_ex_t)(void *, int, int, int, int, int, const void *,
                                const void *, int, int, const void *, int, int,
                                const void *, void *, int, int, int, int);

typedef struct gemm_call {
  cublas_gemm_ex_t gemm;
  cublas_set_stream_t set_stream;
  void *handle;
  int transa, transb, m, n, k, lda, ldb, ldc, type;
  const void *a, *b;
  void *c;
  float alpha, beta;
} gemm_call;

static sf_status gemm_cb(sf_context *ctx, void *user, CUstream stream) {
  gemm_call *g = user;
  int r = g->set_stream(g->handle, stream);
  if (r == 0)
    r = g->gemm(g->handle, g->transa, g->transb, g->m, g->n, g->k, &g->alpha,
                g->a, g->type, g->lda, g->b, g->type, g->ldb, &g->beta, g->c,
                g->type, g->ldc, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
  if (r != 0)
    return sf__fail(ctx, SF_ERR_LAUNCH, "cublasGemmEx failed with status %d", r);
  return SF_OK;
}

static void *open_cublas(char *why, size_t size) {
  const char *env = getenv("SF_CUBLAS");
  const char *names[] = {env, "libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  why[0] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    if (!names[i]) continue;
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    snprintf(why, size, "%s", dlerror());
  }
  return NULL;
}

/* Values in [-1, 1) as `elem`-byte floats, from a fixed generator. */
static void fill_random(unsigned char *buf, size_t count, sf_dtype dtype) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < count; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    float v = (float)((s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if (dtype == SF_DTYPE_FP32) {
      memcpy(buf + 4 * i, &bits, 4);
    } else if (dtype == SF_DTYPE_BF16) {
      uint16_t h = (uint16_t)(bits >> 16);
      memcpy(buf + 2 * i, &h, 2);
    } else { /* fp16: |v| < 1, normal range; truncate the mantissa */
      uint32_t sign = (bits >> 16) & 0x8000;
      int exp = (int)((bits >> 23) & 0xff) - 127 + 15;
      uint16_t h = exp <= 0 ? (uint16_t)sign
                            : (uint16_t)(sign | (uint32_t)exp << 10 |
                                         ((bits >> 13) & 0x3ff));
      memcpy(buf + 2 * i, &h, 2);
    }
  }
}

sf_status sf_time_dense_gemm(sf_context *ctx, const sf_gemm_desc *desc,
                             const sf_timing_options *opts,
                             sf_gemm_timing *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!desc || !out)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "desc or out is NULL");
  if (desc->m < 1 || desc->n < 1 || desc->k < 1 || desc->m > INT32_MAX ||
      desc->n > INT32_MAX || desc->k > INT32_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "gemm sizes must be in [1, 2^31): m %lld, n %lld, k %lld",
                    (long long)desc->m, (long long)desc->n, (long long)desc->k);
  if (desc->dtype != SF_DTYPE_FP32 && desc->dtype != SF_DTYPE_FP16 &&
      desc->dtype != SF_DTYPE_BF16)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "unknown dtype %d", (int)desc->dtype);
  memset(out, 0, sizeof *out);
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  char why[512];
  void *lib = open_cublas(why, sizeof why);
  if (!lib) return sf__fail(ctx, SF_ERR_NOT_FOUND, "cuBLAS not found: %s", why);
  gemm_call g;
  memset(&g, 0, sizeof g);
  cublas_create_t create = (cublas_create_t)dlsym(lib, "cublasCreate_v2");
  cublas_destroy_t destroy = (cublas_destroy_t)dlsym(lib, "cublasDestroy_v2");
  g.set_stream = (cublas_set_stream_t)dlsym(lib, "cublasSetStream_v2");
  g.gemm = (cublas_gemm_ex_t)dlsym(lib, "cublasGemmEx");
  if (!create || !destroy || !g.set_stream || !g.gemm) {
    dlclose(lib);
    return sf__fail(ctx, SF_ERR_NOT_FOUND, "cuBLAS lacks cublasGemmEx or cublasCreate_v2");
  }
  size_t elem = desc->dtype == SF_DTYPE_FP32 ? 4 : 2;
  size_t na = (size_t)desc->m * desc->k, nb = (size_t)desc->k * desc->n,
         nc = (size_t)desc->m * desc->n;
  sf_devptr a = 0, b = 0, c = 0;
  unsigned char *host = malloc((na > nb ? na : nb) * elem);
  if (!host) {
    dlclose(lib);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  if ((st = sf_mem_alloc(ctx, na * elem, &a)) != SF_OK) goto done;
  if ((st = sf_mem_alloc(ctx, nb * elem, &b)) != SF_OK) goto done;
  if ((st = sf_mem_alloc(ctx, nc * elem, &c)) != SF_OK) goto done;
  fill_random(host, na, desc->dtype);
  if ((st = sf_memcpy_htod(ctx, a, host, na * elem)) != SF_OK) goto done;
  fill_random(host, nb, desc->dtype);
  if ((st = sf_memcpy_htod(ctx, b, host, nb * elem)) != SF_OK) goto done;
  int r = create(&g.handle);
  if (r != 0) {
    st = sf__fail(ctx, SF_ERR_CUDA, "cublasCreate failed with status %d", r);
    goto done;
  }
  g.type = desc->dtype == SF_DTYPE_FP32 ? CUDA_R_32F_
           : desc->dtype == SF_DTYPE_BF16 ? CUDA_R_16BF_ : CUDA_R_16F_;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  g.m = (int)desc->m; g.n = (int)desc->n; g.k = (int)desc->k;
  /* Row-major W (M x K).  Feature-major: Y (M x N) = W X, i.e. column-major
   * Y^T = X^T W^T: gemm(N, N, n, m, k, X, ld n, W, ld k, Y, ld n).
   * Token-major: Y (N x M) = X W^T, i.e. column-major Y^T (M x N) =
   * W X^T: gemm(T, N, m, n, k, W, ld k, X, ld k, Y, ld m). */
  sf_timing best;
  memset(&best, 0, sizeof best);
  int layouts[2] = {0, 1}, n_layouts = desc->layout < 0 ? 2 : 1;
  if (desc->layout >= 0) layouts[0] = desc->layout;
  for (int li = 0; li < n_layouts; li++) {
    if (layouts[li] == 0) {
      g.transa = CUBLAS_OP_N_; g.transb = CUBLAS_OP_N_;
      g.m = (int)desc->n; g.n = (int)desc->m; g.k = (int)desc->k;
      g.a = (const void *)(uintptr_t)b; g.lda = (int)desc->n;
      g.b = (const void *)(uintptr_t)a; g.ldb = (int)desc->k;
      g.c = (void *)(uintptr_t)c; g.ldc = (int)desc->n;
    } else {
      g.transa = CUBLAS_OP_T_; g.transb = CUBLAS_OP_N_;
      g.m = (int)desc->m; g.n = (int)desc->n; g.k = (int)desc->k;
      g.a = (const void *)(uintptr_t)a; g.lda = (int)desc->k;
      g.b = (const void *)(uintptr_t)b; g.ldb = (int)desc->k;
      g.c = (void *)(uintptr_t)c; g.ldc = (int)desc->m;
    }
    sf_timing t;
    st = sf__time_launches(ctx, gemm_cb, &g, NULL, opts, &t);
    if (st != SF_OK) break;
    if (li == 0 || t.median_ms < best.median_ms) {
      best = t;
      out->layout_used = layouts[li];
    }
  }
  destroy(g.handle);
  if (st == SF_OK) {
    out->timing = best;
  }
done:
  free(host);
  sf_mem_free(ctx, a);
  sf_mem_free(ctx, b);
  sf_mem_free(ctx, c);
  dlclose(lib);
  return st;
}
