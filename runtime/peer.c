/*
 * peer.c -- the peers: cuBLAS (dense) and cuSPARSE Blocked-ELL SpMM, timed
 * with the same protocol as our kernels (sf__time_launches), so that a
 * speedup is a ratio measured in one run on one GPU.  Both libraries are
 * loaded with dlopen like the driver, so the library needs them only where
 * a peer is timed.  In libsparseforge only.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"
#include "sparseforge.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Data types (library_types.h). */
enum { CUDA_R_32F_ = 0, CUDA_R_16F_ = 2, CUDA_R_16BF_ = 14 };
/* cuBLAS constants (cublas_api.h). */
enum { CUBLAS_OP_N_ = 0, CUBLAS_OP_T_ = 1 };
enum { CUBLAS_COMPUTE_32F_ = 68 };
enum { CUBLAS_GEMM_DEFAULT_ = -1 };

typedef int (*cublas_create_t)(void **);
typedef int (*cublas_destroy_t)(void *);
typedef int (*cublas_set_stream_t)(void *, void *);
typedef int (*cublas_gemm_ex_t)(void *, int, int, int, int, int, const void *,
                                const void *, int, int, const void *, int, int,
                                const void *, void *, int, int, int, int);

/* Operand copies a rotating peer takes in turn (sf_timing_options.
 * rotate_bytes): copy i of operand j at ptr[j][i]. */
typedef struct operand_sets {
  int n, next;
  sf_devptr ptr[3][SF_MAX_ROTATION_SETS];
} operand_sets;

/* The copy index of the next launch, advancing the rotation. */
static int next_set(operand_sets *s) {
  int i = s->next;
  s->next = (s->next + 1) % s->n;
  return i;
}

typedef struct gemm_call {
  cublas_gemm_ex_t gemm;
  cublas_set_stream_t set_stream;
  void *handle;
  int transa, transb, m, n, k, lda, ldb, ldc, type;
  int swap;          /* feature-major: cuBLAS's A is X and its B is W */
  operand_sets ops;  /* W, X, Y */
  float alpha, beta;
} gemm_call;

static sf_status gemm_cb(sf_context *ctx, void *user, CUstream stream) {
  gemm_call *g = user;
  int i = next_set(&g->ops);
  const void *w = (const void *)(uintptr_t)g->ops.ptr[0][i];
  const void *x = (const void *)(uintptr_t)g->ops.ptr[1][i];
  void *y = (void *)(uintptr_t)g->ops.ptr[2][i];
  int r = g->set_stream(g->handle, stream);
  if (r == 0)
    r = g->gemm(g->handle, g->transa, g->transb, g->m, g->n, g->k, &g->alpha,
                g->swap ? x : w, g->type, g->lda, g->swap ? w : x, g->type,
                g->ldb, &g->beta, y, g->type, g->ldc, CUBLAS_COMPUTE_32F_,
                CUBLAS_GEMM_DEFAULT_);
  if (r != 0)
    return sf__fail(ctx, SF_ERR_LAUNCH, "cublasGemmEx failed with status %d", r);
  return SF_OK;
}

/* dlopen of the file named by $env_var, else of the first of `names` that
 * loads; NULL with the last dlerror() in `why` when none does. */
static void *open_peer_library(const char *env_var, const char *const *names,
                               size_t n_names, char *why, size_t size) {
  const char *env = getenv(env_var);
  snprintf(why, size, "no library named");
  for (size_t i = 0; i <= n_names; i++) {
    const char *name = i == 0 ? env : names[i - 1];
    if (!name) continue;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    snprintf(why, size, "%s", dlerror());
  }
  return NULL;
}

/* open_peer_library, failing with SF_ERR_NOT_FOUND "<label> not found:
 * <why>" when no name loads. */
static sf_status load_peer_library(sf_context *ctx, const char *env_var,
                                   const char *const *names, size_t n_names,
                                   const char *label, void **out) {
  char why[512];
  *out = open_peer_library(env_var, names, n_names, why, sizeof why);
  if (!*out) return sf__fail(ctx, SF_ERR_NOT_FOUND, "%s not found: %s", label, why);
  return SF_OK;
}

/* The library_types.h type of an sf_dtype. */
static int cuda_type(sf_dtype dtype) {
  return dtype == SF_DTYPE_FP32 ? CUDA_R_32F_
         : dtype == SF_DTYPE_BF16 ? CUDA_R_16BF_ : CUDA_R_16F_;
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

/* Allocates `count` elements of `dtype` (`elem` bytes each) on the device
 * and fills them with fill_random's values, staged through `host` (room for
 * `count` elements). */
static sf_status upload_random(sf_context *ctx, size_t count, sf_dtype dtype,
                               size_t elem, unsigned char *host,
                               sf_devptr *out) {
  sf_status st = sf_mem_alloc(ctx, count * elem, out);
  if (st != SF_OK) return st;
  fill_random(host, count, dtype);
  return sf_memcpy_htod(ctx, *out, host, count * elem);
}

/* Allocates the rotation's copies of operands of `bytes[j]` bytes (as many
 * as sf__rotation_sets asks for `opts`): the first `n_random` operands
 * filled with fill_random's values of `dtype` (staged through `host`, room
 * for the largest), the rest left as allocated. */
static sf_status alloc_operand_sets(sf_context *ctx, operand_sets *s,
                                    const sf_timing_options *opts,
                                    const size_t bytes[3], int n_random,
                                    sf_dtype dtype, size_t elem,
                                    unsigned char *host) {
  memset(s, 0, sizeof *s);
  s->n = sf__rotation_sets(opts, (uint64_t)bytes[0] + bytes[1] + bytes[2]);
  for (int j = 0; j < 3; j++) {
    if (j < n_random) fill_random(host, bytes[j] / elem, dtype);
    for (int i = 0; i < s->n; i++) {
      sf_status st = sf_mem_alloc(ctx, bytes[j] ? bytes[j] : 16, &s->ptr[j][i]);
      if (st == SF_OK && j < n_random)
        st = sf_memcpy_htod(ctx, s->ptr[j][i], host, bytes[j]);
      if (st != SF_OK) return st;
    }
  }
  return SF_OK;
}

static void free_operand_sets(sf_context *ctx, operand_sets *s) {
  for (int j = 0; j < 3; j++)
    for (int i = 0; i < SF_MAX_ROTATION_SETS; i++)
      if (s->ptr[j][i]) sf_mem_free(ctx, s->ptr[j][i]);
  memset(s, 0, sizeof *s);
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
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12",
                                      "libcublas.so"};
  void *lib = NULL;
  if ((st = load_peer_library(ctx, "SF_CUBLAS", names, sizeof names / sizeof *names,
                              "cuBLAS", &lib)) != SF_OK)
    return st;
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
  size_t bytes[3] = {na * elem, nb * elem, nc * elem};
  unsigned char *host = malloc((na > nb ? na : nb) * elem);
  if (!host) {
    dlclose(lib);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  if ((st = alloc_operand_sets(ctx, &g.ops, opts, bytes, 2, desc->dtype, elem,
                               host)) != SF_OK)
    goto done;
  int r = create(&g.handle);
  if (r != 0) {
    st = sf__fail(ctx, SF_ERR_CUDA, "cublasCreate failed with status %d", r);
    goto done;
  }
  g.type = cuda_type(desc->dtype);
  g.alpha = 1.0f;
  g.beta = 0.0f;
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
      g.transa = CUBLAS_OP_N_; g.transb = CUBLAS_OP_N_; g.swap = 1;
      g.m = (int)desc->n; g.n = (int)desc->m; g.k = (int)desc->k;
      g.lda = (int)desc->n; g.ldb = (int)desc->k; g.ldc = (int)desc->n;
    } else {
      g.transa = CUBLAS_OP_T_; g.transb = CUBLAS_OP_N_; g.swap = 0;
      g.m = (int)desc->m; g.n = (int)desc->n; g.k = (int)desc->k;
      g.lda = (int)desc->k; g.ldb = (int)desc->k; g.ldc = (int)desc->m;
    }
    sf_timing t;
    st = sf__time_rotating(ctx, gemm_cb, &g, NULL, g.ops.n, opts, &t);
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
  free_operand_sets(ctx, &g.ops);
  dlclose(lib);
  return st;
}

/* ------------------------------------------------------------------------
 * cuSPARSE Blocked-ELL SpMM
 * ---------------------------------------------------------------------- */

/* cuSPARSE constants (cusparse.h). */
enum { CUSPARSE_OPERATION_NON_TRANSPOSE_ = 0 };
enum { CUSPARSE_ORDER_COL_ = 1, CUSPARSE_ORDER_ROW_ = 2 };
enum { CUSPARSE_INDEX_32I_ = 2 };
enum { CUSPARSE_INDEX_BASE_ZERO_ = 0 };
enum {
  CUSPARSE_SPMM_ALG_DEFAULT_ = 0,
  CUSPARSE_SPMM_CSR_ALG1_ = 4,
  CUSPARSE_SPMM_CSR_ALG2_ = 6,
  CUSPARSE_SPMM_CSR_ALG3_ = 12,
  CUSPARSE_SPMM_BLOCKED_ELL_ALG1_ = 13
};
enum {
  CUSPARSE_STATUS_INVALID_VALUE_ = 3,
  CUSPARSE_STATUS_ARCH_MISMATCH_ = 4,
  CUSPARSE_STATUS_MATRIX_TYPE_NOT_SUPPORTED_ = 8,
  CUSPARSE_STATUS_NOT_SUPPORTED_ = 10
};

typedef int (*cusparse_create_t)(void **);
typedef int (*cusparse_destroy_t)(void *);
typedef int (*cusparse_set_stream_t)(void *, void *);
typedef int (*cusparse_create_bell_t)(void **, int64_t, int64_t, int64_t,
                                      int64_t, void *, void *, int, int, int);
typedef int (*cusparse_create_csr_t)(void **, int64_t, int64_t, int64_t, void *,
                                     void *, void *, int, int, int, int);
typedef int (*cusparse_create_dnmat_t)(void **, int64_t, int64_t, int64_t,
                                       void *, int, int);
typedef int (*cusparse_destroy_descr_t)(const void *);
/* cusparseSpMM_bufferSize: ..., alg, size_t *bufferSize. */
typedef int (*cusparse_spmm_size_t)(void *, int, int, const void *,
                                    const void *, const void *, const void *,
                                    void *, int, int, size_t *);
/* cusparseSpMM and cusparseSpMM_preprocess: ..., alg, void *buffer. */
typedef int (*cusparse_spmm_t)(void *, int, int, const void *, const void *,
                               const void *, const void *, void *, int, int,
                               void *);
typedef const char *(*cusparse_error_name_t)(int);

/* The entry points, resolved from one dlopen. */
typedef struct cusparse_api {
  void *lib;
  cusparse_create_t create;
  cusparse_destroy_t destroy;
  cusparse_set_stream_t set_stream;
  cusparse_create_bell_t create_blocked_ell;
  cusparse_create_csr_t create_csr;
  cusparse_create_dnmat_t create_dn_mat;
  cusparse_destroy_descr_t destroy_sp_mat, destroy_dn_mat;
  cusparse_spmm_size_t spmm_buffer_size;
  cusparse_spmm_t spmm_preprocess; /* NULL where the library lacks it */
  cusparse_spmm_t spmm;
  cusparse_error_name_t error_name; /* NULL where the library lacks it */
} cusparse_api;

/* One SpMM, as the timing callback replays it: launch after launch it takes
 * the next of its n_sets operand sets (descriptors a, b, c over their own
 * copies of W, X and Y, and their own workspace, which may be NULL). */
typedef struct spmm_call {
  const cusparse_api *api;
  void *handle;
  int n_sets, next;
  void *a[SF_MAX_ROTATION_SETS], *b[SF_MAX_ROTATION_SETS], *c[SF_MAX_ROTATION_SETS];
  void *buffer[SF_MAX_ROTATION_SETS];
  int compute_type, alg;
  float alpha, beta;
} spmm_call;

/* Records a failed cuSPARSE call: "<what> failed: CUSPARSE_STATUS_X (r)".
 * Statuses that say cuSPARSE refuses the problem (invalid value, not
 * supported, arch mismatch) become SF_ERR_INVALID_ARG whatever `code` is. */
static sf_status cusparse_fail(sf_context *ctx, const cusparse_api *api,
                               sf_status code, int r, const char *what) {
  const char *name = api->error_name ? api->error_name(r) : NULL;
  if (r == CUSPARSE_STATUS_INVALID_VALUE_ ||
      r == CUSPARSE_STATUS_ARCH_MISMATCH_ ||
      r == CUSPARSE_STATUS_MATRIX_TYPE_NOT_SUPPORTED_ ||
      r == CUSPARSE_STATUS_NOT_SUPPORTED_)
    code = SF_ERR_INVALID_ARG;
  return sf__fail(ctx, code, "%s failed: %s (%d)", what,
                  name ? name : "cuSPARSE status", r);
}

static sf_status spmm_cb(sf_context *ctx, void *user, CUstream stream) {
  spmm_call *s = user;
  int i = s->next;
  s->next = (s->next + 1) % s->n_sets;
  int r = s->api->set_stream(s->handle, stream);
  if (r != 0)
    return cusparse_fail(ctx, s->api, SF_ERR_LAUNCH, r, "cusparseSetStream");
  r = s->api->spmm(s->handle, CUSPARSE_OPERATION_NON_TRANSPOSE_,
                   CUSPARSE_OPERATION_NON_TRANSPOSE_, &s->alpha, s->a[i], s->b[i],
                   &s->beta, s->c[i], s->compute_type, s->alg, s->buffer[i]);
  if (r != 0) return cusparse_fail(ctx, s->api, SF_ERR_LAUNCH, r, "cusparseSpMM");
  return SF_OK;
}

/* The dense descriptors of set i: X (K x N) and Y (M x N) of `type`, over
 * x and y.  Feature-major: row-major X and Y.  Token-major: X (N x K) and
 * Y (N x M) row-major are column-major K x N (ld K) and M x N (ld M). */
static sf_status spmm_dense(sf_context *ctx, spmm_call *s, int i, int64_t m,
                            int64_t n, int64_t k, sf_devptr x, sf_devptr y,
                            int type, int fm) {
  const cusparse_api *api = s->api;
  int order = fm ? CUSPARSE_ORDER_ROW_ : CUSPARSE_ORDER_COL_;
  int r = api->create_dn_mat(&s->b[i], k, n, fm ? n : k, (void *)(uintptr_t)x, type,
                             order);
  if (r != 0) {
    s->b[i] = NULL;
    return cusparse_fail(ctx, api, SF_ERR_CUDA, r, "cusparseCreateDnMat(X)");
  }
  r = api->create_dn_mat(&s->c[i], m, n, fm ? n : m, (void *)(uintptr_t)y, type,
                         order);
  if (r != 0) {
    s->c[i] = NULL;
    return cusparse_fail(ctx, api, SF_ERR_CUDA, r, "cusparseCreateDnMat(Y)");
  }
  return SF_OK;
}

/* Every set's workspace for s->alg (allocated into work[i]) and, where the
 * library has it, its preprocessing: what precedes the timed launches. */
static sf_status spmm_prepare(sf_context *ctx, spmm_call *s, sf_devptr *work) {
  const cusparse_api *api = s->api;
  /* The handle may still name the private stream of an earlier timing,
   * destroyed since (sf__time_launches captures graphs on a stream of its
   * own): preprocessing on it crashed cuSPARSE.  The default stream. */
  int r0 = api->set_stream(s->handle, NULL);
  if (r0 != 0) return cusparse_fail(ctx, api, SF_ERR_CUDA, r0, "cusparseSetStream");
  for (int i = 0; i < s->n_sets; i++) {
    size_t size = 0;
    int r = api->spmm_buffer_size(s->handle, CUSPARSE_OPERATION_NON_TRANSPOSE_,
                                  CUSPARSE_OPERATION_NON_TRANSPOSE_, &s->alpha,
                                  s->a[i], s->b[i], &s->beta, s->c[i],
                                  s->compute_type, s->alg, &size);
    if (r != 0) return cusparse_fail(ctx, api, SF_ERR_CUDA, r, "cusparseSpMM_bufferSize");
    s->buffer[i] = NULL;
    if (size > 0) {
      sf_status st = sf_mem_alloc(ctx, size, &work[i]);
      if (st != SF_OK) return st;
      s->buffer[i] = (void *)(uintptr_t)work[i];
    }
    if (api->spmm_preprocess &&
        (r = api->spmm_preprocess(s->handle, CUSPARSE_OPERATION_NON_TRANSPOSE_,
                                  CUSPARSE_OPERATION_NON_TRANSPOSE_, &s->alpha,
                                  s->a[i], s->b[i], &s->beta, s->c[i],
                                  s->compute_type, s->alg, s->buffer[i])) != 0)
      return cusparse_fail(ctx, api, SF_ERR_CUDA, r, "cusparseSpMM_preprocess");
  }
  return SF_OK;
}

/* Destroys the descriptors of every set. */
static void spmm_destroy_descriptors(spmm_call *s) {
  for (int i = 0; i < SF_MAX_ROTATION_SETS; i++) {
    if (s->a[i]) s->api->destroy_sp_mat(s->a[i]);
    if (s->b[i]) s->api->destroy_dn_mat(s->b[i]);
    if (s->c[i]) s->api->destroy_dn_mat(s->c[i]);
    s->a[i] = s->b[i] = s->c[i] = NULL;
  }
}

/* Destroys the descriptors of every set and the handle. */
static void spmm_release(spmm_call *s) {
  spmm_destroy_descriptors(s);
  if (s->handle) s->api->destroy(s->handle);
}

/* Loads cuSPARSE and resolves every entry point the peer uses. */
static sf_status load_cusparse(sf_context *ctx, cusparse_api *api) {
  static const char *const names[] = {"libcusparse.so.12", "libcusparse.so"};
  memset(api, 0, sizeof *api);
  sf_status st = load_peer_library(ctx, "SF_CUSPARSE", names,
                                   sizeof names / sizeof *names, "cuSPARSE", &api->lib);
  if (st != SF_OK) return st;
  void *lib = api->lib;
  api->create = (cusparse_create_t)dlsym(lib, "cusparseCreate");
  api->destroy = (cusparse_destroy_t)dlsym(lib, "cusparseDestroy");
  api->set_stream = (cusparse_set_stream_t)dlsym(lib, "cusparseSetStream");
  api->create_blocked_ell =
      (cusparse_create_bell_t)dlsym(lib, "cusparseCreateBlockedEll");
  api->create_csr = (cusparse_create_csr_t)dlsym(lib, "cusparseCreateCsr");
  api->create_dn_mat = (cusparse_create_dnmat_t)dlsym(lib, "cusparseCreateDnMat");
  api->destroy_sp_mat = (cusparse_destroy_descr_t)dlsym(lib, "cusparseDestroySpMat");
  api->destroy_dn_mat = (cusparse_destroy_descr_t)dlsym(lib, "cusparseDestroyDnMat");
  api->spmm_buffer_size =
      (cusparse_spmm_size_t)dlsym(lib, "cusparseSpMM_bufferSize");
  api->spmm_preprocess = (cusparse_spmm_t)dlsym(lib, "cusparseSpMM_preprocess");
  api->spmm = (cusparse_spmm_t)dlsym(lib, "cusparseSpMM");
  api->error_name = (cusparse_error_name_t)dlsym(lib, "cusparseGetErrorName");
  if (!api->create || !api->destroy || !api->set_stream ||
      !api->create_blocked_ell || !api->create_csr || !api->create_dn_mat ||
      !api->destroy_sp_mat ||
      !api->destroy_dn_mat || !api->spmm_buffer_size || !api->spmm) {
    dlclose(lib);
    api->lib = NULL;
    return sf__fail(ctx, SF_ERR_NOT_FOUND,
                    "cuSPARSE lacks the generic SpMM API (cusparseCreateBlockedEll, "
                    "cusparseSpMM, ...)");
  }
  return SF_OK;
}

static sf_status check_blocked_ell_desc(sf_context *ctx,
                                        const sf_blocked_ell_desc *d) {
  if (d->m < 1 || d->n < 1 || d->k < 1 || d->m > INT32_MAX ||
      d->n > INT32_MAX || d->k > INT32_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "blocked-ELL sizes must be in [1, 2^31): m %lld, n %lld, k %lld",
                    (long long)d->m, (long long)d->n, (long long)d->k);
  if (d->dtype != SF_DTYPE_FP16 && d->dtype != SF_DTYPE_BF16)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "blocked-ELL SpMM takes fp16 or bf16 values, not dtype %d",
                    (int)d->dtype);
  if (d->layout != 0 && d->layout != 1)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "unknown layout %d (0 feature-major, 1 token-major)", d->layout);
  int64_t bs = d->block;
  if (bs < 1 || d->m % bs || d->k % bs)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "the block size (%lld) must divide M (%lld) and K (%lld)",
                    (long long)bs, (long long)d->m, (long long)d->k);
  if (d->ell_cols < bs || d->ell_cols % bs || d->ell_cols > d->k)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "ell_cols (%lld) must be a multiple of the block size (%lld) "
                    "in [%lld, K = %lld]",
                    (long long)d->ell_cols, (long long)bs, (long long)bs,
                    (long long)d->k);
  if (!d->col_ind) return sf__fail(ctx, SF_ERR_INVALID_ARG, "col_ind is NULL");
  int64_t slots = d->ell_cols / bs, block_cols = d->k / bs;
  for (int64_t i = 0; i < d->m / bs * slots; i++) {
    int32_t c = d->col_ind[i];
    if (c < -1 || c >= block_cols)
      return sf__fail(ctx, SF_ERR_INVALID_ARG,
                      "col_ind[%lld][%lld] = %d: block-column indices must be in "
                      "[0, K / block = %lld) or -1",
                      (long long)(i / slots), (long long)(i % slots), (int)c,
                      (long long)block_cols);
  }
  return SF_OK;
}

sf_status sf_time_blocked_ell(sf_context *ctx, const sf_blocked_ell_desc *desc,
                              const sf_timing_options *opts, sf_timing *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!desc || !out)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "desc or out is NULL");
  sf_status st = check_blocked_ell_desc(ctx, desc);
  if (st != SF_OK) return st;
  memset(out, 0, sizeof *out);
  if ((st = sf__ctx_enter(ctx)) != SF_OK) return st;
  cusparse_api api;
  if ((st = load_cusparse(ctx, &api)) != SF_OK) return st;

  const int64_t m = desc->m, n = desc->n, k = desc->k;
  const size_t elem = 2;
  size_t nv = (size_t)m * desc->ell_cols, nx = (size_t)k * n,
         nidx = (size_t)(m / desc->block) * (desc->ell_cols / desc->block);
  spmm_call s;
  memset(&s, 0, sizeof s);
  s.api = &api;
  s.n_sets = 1;
  s.compute_type = CUDA_R_32F_;
  s.alg = CUSPARSE_SPMM_BLOCKED_ELL_ALG1_;
  s.alpha = 1.0f;
  s.beta = 0.0f;
  sf_devptr values = 0, idx = 0, x = 0, y = 0, work = 0;
  unsigned char *host = malloc((nv > nx ? nv : nx) * elem);
  if (!host) {
    st = sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
    goto done;
  }
  if ((st = upload_random(ctx, nv, desc->dtype, elem, host, &values)) != SF_OK ||
      (st = upload_random(ctx, nx, desc->dtype, elem, host, &x)) != SF_OK ||
      (st = sf_mem_alloc(ctx, nidx * sizeof(int32_t), &idx)) != SF_OK ||
      (st = sf_memcpy_htod(ctx, idx, desc->col_ind, nidx * sizeof(int32_t))) != SF_OK ||
      (st = sf_mem_alloc(ctx, (size_t)m * n * elem, &y)) != SF_OK)
    goto done;
  int r = api.create(&s.handle);
  if (r != 0) {
    s.handle = NULL;
    st = cusparse_fail(ctx, &api, SF_ERR_CUDA, r, "cusparseCreate");
    goto done;
  }
  /* W (M x K) is A; X and Y as spmm_dense says. */
  int type = cuda_type(desc->dtype);
  if ((r = api.create_blocked_ell(&s.a[0], m, k, desc->block, desc->ell_cols,
                                  (void *)(uintptr_t)idx,
                                  (void *)(uintptr_t)values, CUSPARSE_INDEX_32I_,
                                  CUSPARSE_INDEX_BASE_ZERO_, type)) != 0) {
    s.a[0] = NULL;
    st = cusparse_fail(ctx, &api, SF_ERR_CUDA, r, "cusparseCreateBlockedEll");
    goto done;
  }
  if ((st = spmm_dense(ctx, &s, 0, m, n, k, x, y, type, desc->layout == 0)) != SF_OK ||
      (st = spmm_prepare(ctx, &s, &work)) != SF_OK)
    goto done;
  st = sf__time_launches(ctx, spmm_cb, &s, NULL, opts, out);
done:
  spmm_release(&s);
  free(host);
  sf_mem_free(ctx, values);
  sf_mem_free(ctx, idx);
  sf_mem_free(ctx, x);
  sf_mem_free(ctx, y);
  sf_mem_free(ctx, work);
  dlclose(api.lib);
  return st;
}

/* ------------------------------------------------------------------------
 * cuSPARSE CSR SpMM
 * ---------------------------------------------------------------------- */

static sf_status check_csr_desc(sf_context *ctx, const sf_csr_desc *d) {
  if (d->m < 1 || d->n < 1 || d->k < 1 || d->m > INT32_MAX || d->n > INT32_MAX ||
      d->k > INT32_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "CSR sizes must be in [1, 2^31): m %lld, n %lld, k %lld",
                    (long long)d->m, (long long)d->n, (long long)d->k);
  if (d->dtype != SF_DTYPE_FP32 && d->dtype != SF_DTYPE_FP16 &&
      d->dtype != SF_DTYPE_BF16)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "unknown dtype %d", (int)d->dtype);
  if (d->layout != 0 && d->layout != 1)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "unknown layout %d (0 feature-major, 1 token-major)", d->layout);
  if (d->nnz < 0 || d->nnz > INT32_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "nnz (%lld) must be in [0, 2^31)",
                    (long long)d->nnz);
  if (!d->row_ptr || (d->nnz > 0 && !d->col_ind))
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "row_ptr or col_ind is NULL");
  if (d->row_ptr[0] != 0 || d->row_ptr[d->m] != d->nnz)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "row_ptr must run from 0 to nnz = %lld, got %d .. %d",
                    (long long)d->nnz, (int)d->row_ptr[0], (int)d->row_ptr[d->m]);
  for (int64_t i = 0; i < d->m; i++)
    if (d->row_ptr[i + 1] < d->row_ptr[i])
      return sf__fail(ctx, SF_ERR_INVALID_ARG,
                      "row_ptr decreases at row %lld (%d -> %d)", (long long)i,
                      (int)d->row_ptr[i], (int)d->row_ptr[i + 1]);
  for (int64_t j = 0; j < d->nnz; j++)
    if (d->col_ind[j] < 0 || d->col_ind[j] >= d->k)
      return sf__fail(ctx, SF_ERR_INVALID_ARG,
                      "col_ind[%lld] = %d: column indices must be in [0, K = %lld)",
                      (long long)j, (int)d->col_ind[j], (long long)d->k);
  if (d->alg != -1 && d->alg != CUSPARSE_SPMM_ALG_DEFAULT_ &&
      d->alg != CUSPARSE_SPMM_CSR_ALG1_ && d->alg != CUSPARSE_SPMM_CSR_ALG2_ &&
      d->alg != CUSPARSE_SPMM_CSR_ALG3_)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "alg %d is not a CSR SpMM algorithm (0 default, 4 CSR_ALG1, "
                    "6 CSR_ALG2, 12 CSR_ALG3; -1: the fastest of them)", d->alg);
  return SF_OK;
}

sf_status sf_time_csr(sf_context *ctx, const sf_csr_desc *desc,
                      const sf_timing_options *opts, sf_csr_timing *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!desc || !out)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "desc or out is NULL");
  sf_status st = check_csr_desc(ctx, desc);
  if (st != SF_OK) return st;
  memset(out, 0, sizeof *out);
  out->alg_used = -1;
  if ((st = sf__ctx_enter(ctx)) != SF_OK) return st;
  cusparse_api api;
  if ((st = load_cusparse(ctx, &api)) != SF_OK) return st;

  const int64_t m = desc->m, n = desc->n, k = desc->k, nnz = desc->nnz;
  const size_t elem = desc->dtype == SF_DTYPE_FP32 ? 4 : 2;
  const size_t nx = (size_t)k * n, nv = (size_t)(nnz > 0 ? nnz : 1);
  /* one set: row offsets, column indices, values, X, Y */
  const size_t b_ptr = (size_t)(m + 1) * 4, b_col = nv * 4, b_val = nv * elem,
               b_x = nx * elem, b_y = (size_t)m * n * elem;
  spmm_call s;
  memset(&s, 0, sizeof s);
  s.api = &api;
  s.n_sets = sf__rotation_sets(opts, (uint64_t)b_ptr + b_col + b_val + b_x + b_y);
  s.compute_type = CUDA_R_32F_;
  s.alpha = 1.0f;
  s.beta = 0.0f;
  sf_devptr buf[5][SF_MAX_ROTATION_SETS], work[SF_MAX_ROTATION_SETS];
  memset(buf, 0, sizeof buf);
  memset(work, 0, sizeof work);
  unsigned char *vals = malloc(b_val), *xs = malloc(b_x);
  int type = cuda_type(desc->dtype), r;
  if (!vals || !xs) {
    st = sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
    goto done;
  }
  fill_random(vals, nv, desc->dtype);
  fill_random(xs, nx, desc->dtype);
  if ((r = api.create(&s.handle)) != 0) {
    s.handle = NULL;
    st = cusparse_fail(ctx, &api, SF_ERR_CUDA, r, "cusparseCreate");
    goto done;
  }
  for (int i = 0; i < s.n_sets; i++) {
    const size_t bytes[5] = {b_ptr, b_col, b_val, b_x, b_y};
    const void *host[5] = {desc->row_ptr, desc->col_ind, vals, xs, NULL};
    for (int j = 0; j < 5; j++) {
      if ((st = sf_mem_alloc(ctx, bytes[j], &buf[j][i])) != SF_OK) goto done;
      if (host[j] && (j != 1 || nnz > 0) &&
          (st = sf_memcpy_htod(ctx, buf[j][i], host[j], bytes[j])) != SF_OK)
        goto done;
    }
  }
  /* the algorithm asked for, or each CSR algorithm in turn (one that
   * cuSPARSE refuses for this problem is passed over): the fastest counts.
   * Each algorithm gets descriptors of its own (preprocessing leaves state
   * in them, over workspaces freed after each algorithm). */
  static const int algs[] = {CUSPARSE_SPMM_CSR_ALG1_, CUSPARSE_SPMM_CSR_ALG2_,
                             CUSPARSE_SPMM_CSR_ALG3_, CUSPARSE_SPMM_ALG_DEFAULT_};
  const int n_algs = desc->alg >= 0 ? 1 : (int)(sizeof algs / sizeof *algs);
  sf_status refused = SF_OK;
  for (int ai = 0; ai < n_algs; ai++) {
    s.alg = desc->alg >= 0 ? desc->alg : algs[ai];
    s.next = 0;
    spmm_destroy_descriptors(&s);
    for (int i = 0; i < s.n_sets; i++) {
      if ((r = api.create_csr(&s.a[i], m, k, nnz, (void *)(uintptr_t)buf[0][i],
                              (void *)(uintptr_t)buf[1][i], (void *)(uintptr_t)buf[2][i],
                              CUSPARSE_INDEX_32I_, CUSPARSE_INDEX_32I_,
                              CUSPARSE_INDEX_BASE_ZERO_, type)) != 0) {
        s.a[i] = NULL;
        st = cusparse_fail(ctx, &api, SF_ERR_CUDA, r, "cusparseCreateCsr");
        goto done;
      }
      if ((st = spmm_dense(ctx, &s, i, m, n, k, buf[3][i], buf[4][i], type,
                           desc->layout == 0)) != SF_OK)
        goto done;
    }
    sf_timing t;
    st = spmm_prepare(ctx, &s, work);
    if (st == SF_OK) st = sf__time_rotating(ctx, spmm_cb, &s, NULL, s.n_sets, opts, &t);
    for (int i = 0; i < s.n_sets; i++) {
      sf_mem_free(ctx, work[i]);
      work[i] = 0;
    }
    if (st == SF_ERR_INVALID_ARG) {  /* cuSPARSE refused this algorithm */
      refused = st;
      continue;
    }
    if (st != SF_OK) goto done;
    if (out->alg_used < 0 || t.median_ms < out->timing.median_ms) {
      out->timing = t;
      out->alg_used = s.alg;
    }
  }
  st = out->alg_used >= 0 ? SF_OK : refused;  /* every one refused: the last reason */
done:
  spmm_release(&s);
  for (int j = 0; j < 5; j++)
    for (int i = 0; i < SF_MAX_ROTATION_SETS; i++) sf_mem_free(ctx, buf[j][i]);
  for (int i = 0; i < SF_MAX_ROTATION_SETS; i++) sf_mem_free(ctx, work[i]);
  free(vals);
  free(xs);
  dlclose(api.lib);
  return st;
}

/* ------------------------------------------------------------------------
 * cuSPARSELt 2:4 matmul
 * ---------------------------------------------------------------------- */

/* The library's handles and descriptors are opaque structs of 512 bytes
 * (cusparseLt.h); room for more keeps older and newer versions safe. */
typedef struct { _Alignas(16) unsigned char data[4096]; } sparselt_opaque;

enum { CUSPARSE_OPERATION_TRANSPOSE_ = 1 };
enum { CUSPARSELT_SPARSITY_50_PERCENT_ = 0 };
enum { CUSPARSE_COMPUTE_32F_ = 2 };
enum { CUSPARSELT_MATMUL_ALG_DEFAULT_ = 0 };
enum { CUSPARSELT_MATMUL_ALG_CONFIG_ID_ = 0 };
enum { CUSPARSELT_PRUNE_SPMMA_TILE_ = 0 };

typedef int (*slt_init_t)(void *);
typedef int (*slt_destroy_t)(const void *);
typedef int (*slt_dense_init_t)(const void *, void *, int64_t, int64_t, int64_t,
                                uint32_t, int, int);
typedef int (*slt_structured_init_t)(const void *, void *, int64_t, int64_t,
                                     int64_t, uint32_t, int, int, int);
typedef int (*slt_matmul_desc_init_t)(const void *, void *, int, int,
                                      const void *, const void *, const void *,
                                      const void *, int);
typedef int (*slt_alg_init_t)(const void *, void *, const void *, int);
typedef int (*slt_alg_get_t)(const void *, const void *, int, void *, size_t);
typedef int (*slt_plan_init_t)(const void *, void *, const void *, const void *);
typedef int (*slt_workspace_t)(const void *, const void *, size_t *);
typedef int (*slt_matmul_t)(const void *, const void *, const void *,
                            const void *, const void *, const void *,
                            const void *, void *, void *, CUstream *, int32_t);
typedef int (*slt_prune_t)(const void *, const void *, const void *, void *, int,
                           CUstream);
typedef int (*slt_compressed_size_t)(const void *, const void *, size_t *,
                                     size_t *);
typedef int (*slt_compress_t)(const void *, const void *, const void *, void *,
                              void *, CUstream);
typedef const char *(*slt_error_name_t)(int);

typedef struct sparselt_api {
  void *lib;
  slt_init_t init;
  slt_destroy_t destroy, mat_destroy, alg_destroy, plan_destroy;
  slt_dense_init_t dense_init;
  slt_structured_init_t structured_init;
  slt_matmul_desc_init_t matmul_desc_init;
  slt_alg_init_t alg_init;
  slt_alg_get_t alg_get; /* NULL where the library lacks it */
  slt_plan_init_t plan_init;
  slt_workspace_t workspace;
  slt_matmul_t matmul, search;
  slt_prune_t prune;
  slt_compressed_size_t compressed_size;
  slt_compress_t compress;
  slt_error_name_t error_name; /* NULL where the library lacks it */
} sparselt_api;

static sf_status load_sparselt(sf_context *ctx, sparselt_api *a) {
  static const char *const names[] = {"libcusparseLt.so.0", "libcusparseLt.so"};
  memset(a, 0, sizeof *a);
  sf_status st = load_peer_library(ctx, "SF_CUSPARSELT", names,
                                   sizeof names / sizeof *names, "cuSPARSELt", &a->lib);
  if (st != SF_OK) return st;
  void *l = a->lib;
  a->init = (slt_init_t)dlsym(l, "cusparseLtInit");
  a->destroy = (slt_destroy_t)dlsym(l, "cusparseLtDestroy");
  a->mat_destroy = (slt_destroy_t)dlsym(l, "cusparseLtMatDescriptorDestroy");
  a->alg_destroy = (slt_destroy_t)dlsym(l, "cusparseLtMatmulAlgSelectionDestroy");
  a->plan_destroy = (slt_destroy_t)dlsym(l, "cusparseLtMatmulPlanDestroy");
  a->dense_init = (slt_dense_init_t)dlsym(l, "cusparseLtDenseDescriptorInit");
  a->structured_init =
      (slt_structured_init_t)dlsym(l, "cusparseLtStructuredDescriptorInit");
  a->matmul_desc_init =
      (slt_matmul_desc_init_t)dlsym(l, "cusparseLtMatmulDescriptorInit");
  a->alg_init = (slt_alg_init_t)dlsym(l, "cusparseLtMatmulAlgSelectionInit");
  a->alg_get = (slt_alg_get_t)dlsym(l, "cusparseLtMatmulAlgGetAttribute");
  a->plan_init = (slt_plan_init_t)dlsym(l, "cusparseLtMatmulPlanInit");
  a->workspace = (slt_workspace_t)dlsym(l, "cusparseLtMatmulGetWorkspace");
  a->matmul = (slt_matmul_t)dlsym(l, "cusparseLtMatmul");
  a->search = (slt_matmul_t)dlsym(l, "cusparseLtMatmulSearch");
  a->prune = (slt_prune_t)dlsym(l, "cusparseLtSpMMAPrune");
  a->compressed_size =
      (slt_compressed_size_t)dlsym(l, "cusparseLtSpMMACompressedSize");
  a->compress = (slt_compress_t)dlsym(l, "cusparseLtSpMMACompress");
  a->error_name = (slt_error_name_t)dlsym(l, "cusparseLtGetErrorName");
  if (!a->init || !a->destroy || !a->mat_destroy || !a->alg_destroy ||
      !a->plan_destroy || !a->dense_init || !a->structured_init ||
      !a->matmul_desc_init || !a->alg_init || !a->plan_init || !a->workspace ||
      !a->matmul || !a->search || !a->prune || !a->compressed_size ||
      !a->compress) {
    dlclose(l);
    a->lib = NULL;
    return sf__fail(ctx, SF_ERR_NOT_FOUND,
                    "cuSPARSELt lacks the matmul API (cusparseLtMatmulSearch, "
                    "cusparseLtSpMMACompress, ...)");
  }
  return SF_OK;
}

/* "<what> failed: NAME (r)"; statuses that refuse the problem (invalid
 * value, arch mismatch, not supported) become SF_ERR_INVALID_ARG. */
static sf_status sparselt_fail(sf_context *ctx, const sparselt_api *a,
                               sf_status code, int r, const char *what) {
  const char *name = a->error_name ? a->error_name(r) : NULL;
  if (r == CUSPARSE_STATUS_INVALID_VALUE_ || r == CUSPARSE_STATUS_ARCH_MISMATCH_ ||
      r == CUSPARSE_STATUS_NOT_SUPPORTED_)
    code = SF_ERR_INVALID_ARG;
  return sf__fail(ctx, code, "%s failed: %s (%d)", what,
                  name ? name : "cuSPARSELt status", r);
}

typedef struct sparselt_call {
  const sparselt_api *api;
  const sparselt_opaque *handle, *plan;
  operand_sets ops; /* compressed W, X, Y */
  int w_is_a;       /* feature-major: W is A; token-major: W is B */
  void *workspace;
  float alpha, beta;
} sparselt_call;

static sf_status sparselt_cb(sf_context *ctx, void *user, CUstream stream) {
  sparselt_call *c = user;
  int i = next_set(&c->ops);
  const void *w = (const void *)(uintptr_t)c->ops.ptr[0][i];
  const void *x = (const void *)(uintptr_t)c->ops.ptr[1][i];
  void *y = (void *)(uintptr_t)c->ops.ptr[2][i];
  int r = c->api->matmul(c->handle, c->plan, &c->alpha, c->w_is_a ? w : x,
                         c->w_is_a ? x : w, &c->beta, y, y, c->workspace,
                         &stream, 1);
  if (r != 0) return sparselt_fail(ctx, c->api, SF_ERR_LAUNCH, r, "cusparseLtMatmul");
  return SF_OK;
}

sf_status sf_time_sparselt(sf_context *ctx, const sf_sparselt_desc *desc,
                           const sf_timing_options *opts,
                           sf_sparselt_timing *out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!desc || !out)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "desc or out is NULL");
  if (desc->dtype != SF_DTYPE_FP16 && desc->dtype != SF_DTYPE_BF16)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "cuSPARSELt 2:4 peer takes fp16 or bf16, not dtype %d",
                    (int)desc->dtype);
  if (desc->layout != 0 && desc->layout != 1)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "unknown layout %d (0 feature-major, 1 token-major)", desc->layout);
  if (desc->m < 16 || desc->n < 16 || desc->k < 16 || desc->m % 16 ||
      desc->n % 16 || desc->k % 16 || desc->m > INT32_MAX || desc->n > INT32_MAX ||
      desc->k > INT32_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "cuSPARSELt sizes must be multiples of 16 in [16, 2^31): "
                    "m %lld, n %lld, k %lld",
                    (long long)desc->m, (long long)desc->n, (long long)desc->k);
  memset(out, 0, sizeof *out);
  out->alg_id = -1;
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  sparselt_api api;
  if ((st = load_sparselt(ctx, &api)) != SF_OK) return st;

  const int64_t m = desc->m, n = desc->n, k = desc->k;
  const int fm = desc->layout == 0;
  const int type = cuda_type(desc->dtype);
  const size_t elem = 2;
  sparselt_opaque *o = calloc(6, sizeof *o); /* handle, W, X, Y, matmul, alg */
  sparselt_opaque *plan = calloc(1, sizeof *plan);
  unsigned char *host = malloc((size_t)(m * k > k * n ? m * k : k * n) * elem);
  sparselt_call c;
  memset(&c, 0, sizeof c);
  sf_devptr dense_w = 0, work = 0, cbuf = 0;
  int have_handle = 0, have_w = 0, have_x = 0, have_y = 0, have_alg = 0,
      have_plan = 0;
  int r;
  if (!o || !plan || !host) {
    st = sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
    goto done;
  }
  sparselt_opaque *h = &o[0], *dw = &o[1], *dx = &o[2], *dy = &o[3],
                  *mm = &o[4], *alg = &o[5];
  c.api = &api;
  c.handle = h;
  c.plan = plan;
  c.w_is_a = fm;
  c.alpha = 1.0f;
  c.beta = 0.0f;
#define SLT(call, what)                                                  \
  do {                                                                   \
    if ((r = (call)) != 0) {                                             \
      st = sparselt_fail(ctx, &api, SF_ERR_CUDA, r, what);               \
      goto done;                                                         \
    }                                                                    \
  } while (0)
  SLT(api.init(h), "cusparseLtInit");
  have_handle = 1;
  /* W (M x K) row-major, structured; fm: X (K x N), Y (M x N); tm: X (N x K),
   * Y (N x M); all row-major. */
  SLT(api.structured_init(h, dw, m, k, k, 16, type, CUSPARSE_ORDER_ROW_,
                          CUSPARSELT_SPARSITY_50_PERCENT_),
      "cusparseLtStructuredDescriptorInit(W)");
  have_w = 1;
  SLT(api.dense_init(h, dx, fm ? k : n, fm ? n : k, fm ? n : k, 16, type,
                     CUSPARSE_ORDER_ROW_),
      "cusparseLtDenseDescriptorInit(X)");
  have_x = 1;
  SLT(api.dense_init(h, dy, fm ? m : n, fm ? n : m, fm ? n : m, 16, type,
                     CUSPARSE_ORDER_ROW_),
      "cusparseLtDenseDescriptorInit(Y)");
  have_y = 1;
  SLT(api.matmul_desc_init(h, mm, CUSPARSE_OPERATION_NON_TRANSPOSE_,
                           fm ? CUSPARSE_OPERATION_NON_TRANSPOSE_
                              : CUSPARSE_OPERATION_TRANSPOSE_,
                           fm ? (void *)dw : (void *)dx, fm ? (void *)dx : (void *)dw,
                           dy, dy, CUSPARSE_COMPUTE_32F_),
      "cusparseLtMatmulDescriptorInit");
  SLT(api.alg_init(h, alg, mm, CUSPARSELT_MATMUL_ALG_DEFAULT_),
      "cusparseLtMatmulAlgSelectionInit");
  have_alg = 1;
  SLT(api.plan_init(h, plan, mm, alg), "cusparseLtMatmulPlanInit");
  have_plan = 1;

  /* Operand copies: compressed W, X, Y. */
  size_t compressed = 0, compress_buf = 0;
  SLT(api.compressed_size(h, plan, &compressed, &compress_buf),
      "cusparseLtSpMMACompressedSize");
  size_t bytes[3] = {compressed, (size_t)(k * n) * elem, (size_t)(m * n) * elem};
  memset(&c.ops, 0, sizeof c.ops);
  c.ops.n = sf__rotation_sets(opts, (uint64_t)bytes[0] + bytes[1] + bytes[2]);
  fill_random(host, (size_t)(m * k), desc->dtype);
  if ((st = sf_mem_alloc(ctx, (size_t)(m * k) * elem, &dense_w)) != SF_OK ||
      (st = sf_memcpy_htod(ctx, dense_w, host, (size_t)(m * k) * elem)) != SF_OK ||
      (st = sf_mem_alloc(ctx, compress_buf ? compress_buf : 16, &cbuf)) != SF_OK)
    goto done;
  SLT(api.prune(h, mm, (void *)(uintptr_t)dense_w, (void *)(uintptr_t)dense_w,
                CUSPARSELT_PRUNE_SPMMA_TILE_, NULL),
      "cusparseLtSpMMAPrune");
  fill_random(host, (size_t)(k * n), desc->dtype);
  for (int i = 0; i < c.ops.n; i++) {
    if ((st = sf_mem_alloc(ctx, bytes[0], &c.ops.ptr[0][i])) != SF_OK ||
        (st = sf_mem_alloc(ctx, bytes[1], &c.ops.ptr[1][i])) != SF_OK ||
        (st = sf_memcpy_htod(ctx, c.ops.ptr[1][i], host, bytes[1])) != SF_OK ||
        (st = sf_mem_alloc(ctx, bytes[2], &c.ops.ptr[2][i])) != SF_OK)
      goto done;
    SLT(api.compress(h, plan, (void *)(uintptr_t)dense_w,
                     (void *)(uintptr_t)c.ops.ptr[0][i], (void *)(uintptr_t)cbuf,
                     NULL),
        "cusparseLtSpMMACompress");
  }
  size_t ws = 0;
  SLT(api.workspace(h, plan, &ws), "cusparseLtMatmulGetWorkspace");
  if ((st = sf_mem_alloc(ctx, ws ? ws : 16, &work)) != SF_OK) goto done;
  c.workspace = (void *)(uintptr_t)work;
  {
    const void *w0 = (const void *)(uintptr_t)c.ops.ptr[0][0];
    const void *x0 = (const void *)(uintptr_t)c.ops.ptr[1][0];
    void *y0 = (void *)(uintptr_t)c.ops.ptr[2][0];
    CUstream s0 = NULL;
    SLT(api.search(h, plan, &c.alpha, fm ? w0 : x0, fm ? x0 : w0, &c.beta, y0,
                   y0, c.workspace, &s0, 1),
        "cusparseLtMatmulSearch");
  }
  /* the chosen configuration may want more workspace */
  size_t ws2 = 0;
  SLT(api.workspace(h, plan, &ws2), "cusparseLtMatmulGetWorkspace");
  if (ws2 > ws) {
    sf_mem_free(ctx, work);
    work = 0;
    if ((st = sf_mem_alloc(ctx, ws2, &work)) != SF_OK) goto done;
    c.workspace = (void *)(uintptr_t)work;
  }
  if (api.alg_get) {
    int id = -1;
    if (api.alg_get(h, alg, CUSPARSELT_MATMUL_ALG_CONFIG_ID_, &id, sizeof id) == 0)
      out->alg_id = id;
  }
  st = sf__time_rotating(ctx, sparselt_cb, &c, NULL, c.ops.n, opts, &out->timing);
#undef SLT
done:
  if (have_plan) api.plan_destroy(plan);
  if (have_alg) api.alg_destroy(&o[5]);
  if (have_y) api.mat_destroy(&o[3]);
  if (have_x) api.mat_destroy(&o[2]);
  if (have_w) api.mat_destroy(&o[1]);
  if (have_handle) api.destroy(&o[0]);
  free_operand_sets(ctx, &c.ops);
  sf_mem_free(ctx, dense_w);
  sf_mem_free(ctx, cbuf);
  sf_mem_free(ctx, work);
  free(o);
  free(plan);
  free(host);
  dlclose(api.lib);
  return st;
}
