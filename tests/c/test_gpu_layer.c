/* test_gpu_layer.c -- a layer stored in the cache with sources but no
 * cubins: opening it compiles every variant and stores the cubins, runs
 * give the right answer for each N bucket (split-K with zeroed output
 * included), and opening it again compiles nothing.  Also: missing layers,
 * sources that do not compile, and the preference for records tuned on
 * this GPU.  Skipped without a GPU. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "sparseforge.h"

#define M 64
#define K 32

/* Y (M x N) = W (M x K) X (K x N), fp32, feature-major X. */
static const char *kRowCol =
    "#define M 64\n#define K 32\n"
    "extern \"C\" __global__ void dense_rowcol(const void *packed,\n"
    "    const void *X, void *Y, int N) {\n"
    "  const float *w = (const float *)packed, *x = (const float *)X;\n"
    "  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;\n"
    "  if (n >= N) return;\n"
    "  float acc = 0.0f;\n"
    "  for (int k = 0; k < K; k++) acc += w[m * K + k] * x[k * N + n];\n"
    "  ((float *)Y)[m * N + n] = acc;\n"
    "}\n";

/* Split along K over gridDim.z; partial sums are added into Y, which the
 * runtime zeroes first (zero_output). */
static const char *kSplitK =
    "#define M 64\n#define K 32\n"
    "#ifndef SPLITS\n#error SPLITS comes from the variant's options\n#endif\n"
    "extern \"C\" __global__ void dense_splitk(const void *packed,\n"
    "    const void *X, void *Y, int N) {\n"
    "  const float *w = (const float *)packed, *x = (const float *)X;\n"
    "  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;\n"
    "  if (n >= N) return;\n"
    "  int k0 = blockIdx.z * (K / SPLITS);\n"
    "  float acc = 0.0f;\n"
    "  for (int k = k0; k < k0 + K / SPLITS; k++) acc += w[m * K + k] * x[k * N + n];\n"
    "  atomicAdd(&((float *)Y)[m * N + n], acc);\n"
    "}\n";

static float W[M * K];

static sf_layer_variant variant_rowcol(void) {
  sf_layer_variant v;
  memset(&v, 0, sizeof v);
  v.n_bucket = 16;
  v.source = kRowCol;
  v.kernel_name = "dense_rowcol";
  v.options = "";
  v.generator_version = "test-1";
  /* grid, n_axis, n_tile, block, shared_bytes, zero_output */
  v.launch = (sf_launch_record){{1, M, 1}, 0, 32, {32, 1, 1}, 0, 0};
  v.packed = W;
  v.packed_size = sizeof W;
  v.config = "{\"kind\": \"rowcol\"}";
  return v;
}

static sf_layer_variant variant_splitk(void) {
  sf_layer_variant v = variant_rowcol();
  v.n_bucket = 1024;
  v.source = kSplitK;
  v.kernel_name = "dense_splitk";
  v.options = "-DSPLITS=2\n\n-lineinfo\n";
  v.launch.grid[2] = 2;
  v.launch.n_tile = 64;
  v.launch.block[0] = 64;
  v.launch.zero_output = 1;
  v.config = "{\"kind\": \"splitk\"}";
  return v;
}

static sf_layer_record record(const char *name, const char *gpu,
                              const sf_layer_variant *v, int n) {
  sf_layer_record r;
  memset(&r, 0, sizeof r);
  r.name = name;
  r.gpu_name = gpu;
  r.matrix_fp = "test-dense-64x32";
  r.op = "dense.fp32.fm";
  r.rows = M;
  r.cols = K;
  r.x_elem_size = 4;
  r.y_elem_size = 4;
  r.n_variants = n;
  r.variants = v;
  return r;
}

/* Runs the layer for n columns into a poisoned Y and checks it exactly
 * (the values are small multiples of 1/8, so fp32 sums are exact). */
static void check_run(sf_context *ctx, sf_layer *layer, int n) {
  size_t xs = (size_t)K * n, ys = (size_t)M * n;
  float *x = malloc(xs * sizeof *x), *y = malloc(ys * sizeof *y);
  for (int k = 0; k < K; k++)
    for (int j = 0; j < n; j++) x[k * n + j] = (float)((k + 2 * j) % 5 - 2) * 0.5f;
  sf_devptr dx = 0, dy = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, xs * sizeof *x, &dx));
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, ys * sizeof *y, &dy));
  CHECK_EQ_INT(SF_OK, sf_memcpy_htod(ctx, dx, x, xs * sizeof *x));
  CHECK_EQ_INT(SF_OK, sf_memset_d8(ctx, dy, 0xff, ys * sizeof *y)); /* NaN */
  CHECK_EQ_INT(SF_OK, sf_layer_run(ctx, layer, dx, dy, n, NULL));
  CHECK_EQ_INT(SF_OK, sf_synchronize(ctx));
  CHECK_EQ_INT(SF_OK, sf_memcpy_dtoh(ctx, y, dy, ys * sizeof *y));
  int bad = 0;
  for (int m = 0; m < M; m++)
    for (int j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int k = 0; k < K; k++) acc += W[m * K + k] * x[k * n + j];
      if (y[m * n + j] != acc) bad++;
    }
  if (bad) fprintf(stderr, "N=%d: %d wrong values\n", n, bad);
  CHECK_EQ_INT(0, bad);
  sf_mem_free(ctx, dx);
  sf_mem_free(ctx, dy);
  free(x);
  free(y);
}

int main(void) {
  sf_context *ctx = NULL;
  sf_device_info info;
  static char reason[1024];
  if (!open_gpu(&ctx, &info, reason, sizeof reason)) SKIP(reason);
  for (int m = 0; m < M; m++)
    for (int k = 0; k < K; k++) W[m * K + k] = (float)((m * 3 + k * 5) % 7 - 3) * 0.25f;

  const char *tmp = getenv("SF_TEST_TMPDIR");
  char path[1024], side[1100];
  snprintf(path, sizeof path, "%s/test_gpu_layer.db", tmp ? tmp : "/tmp");
  unlink(path);
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
  sf_cache *cache = NULL;
  sf_status st = sf_cache_open(path, SF_CACHE_CREATE, &cache);
  CHECK_EQ_INT(SF_OK, st);
  if (st != SF_OK) {
    fprintf(stderr, "cache: %s\n", sf_cache_errmsg(cache));
    sf_cache_close(cache);
    CHECK_DONE();
  }
  sf_matrix_record mat = {"test-dense-64x32", M, K, M * K, "fp32", "{}"};
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(cache, &mat));

  sf_layer_variant vs[2] = {variant_rowcol(), variant_splitk()};
  sf_layer_record rec = record("test.dense", info.name, vs, 2);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));

  /* First open: no cubins yet, both variants compile. */
  sf_layer *layer = NULL;
  st = sf_layer_open(ctx, cache, "test.dense", &layer);
  CHECK_EQ_INT(SF_OK, st);
  if (st != SF_OK) fprintf(stderr, "open: %s\n", sf_errmsg(ctx));
  if (layer) {
    CHECK_EQ_INT(2, sf_layer_compiled_count(layer));
    int64_t rows = 0, cols = 0;
    int nv = 0;
    CHECK_EQ_INT(SF_OK, sf_layer_shape(layer, &rows, &cols, &nv));
    CHECK_EQ_INT(M, rows);
    CHECK_EQ_INT(K, cols);
    CHECK_EQ_INT(2, nv);
    check_run(ctx, layer, 10);   /* the n_bucket 16 variant */
    check_run(ctx, layer, 1000); /* split-K, zeroed first */
    check_run(ctx, layer, 1);
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx, layer, 0x1000, 0x2000, 0, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx), "N = 0 is outside 1..");
    sf_layer_close(layer);
  }

  /* Second open: every cubin comes from the cache. */
  layer = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.dense", &layer));
  if (layer) {
    CHECK_EQ_INT(0, sf_layer_compiled_count(layer));
    check_run(ctx, layer, 300);
    check_run(ctx, layer, 77);
  }
  /* (left open: sf_context_destroy closes it) */

  /* Missing layer, and a source that does not compile. */
  sf_layer *none = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_layer_open(ctx, cache, "no.such.layer", &none));
  CHECK(none == NULL);
  CHECK_CONTAINS(sf_errmsg(ctx), "no layer named \"no.such.layer\" in the cache");
  sf_layer_variant broken = variant_rowcol();
  broken.source = "extern \"C\" __global__ void dense_rowcol(const void *p) { oops }\n";
  rec = record("test.broken", info.name, &broken, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  CHECK_EQ_INT(SF_ERR_NO_BINARY, sf_layer_open(ctx, cache, "test.broken", &none));
  CHECK_CONTAINS(sf_errmsg(ctx), "layer \"test.broken\" variant 0 (n_bucket 16): no ");
  CHECK_CONTAINS(sf_errmsg(ctx), "compiling its source failed: NVRTC could not compile");
  CHECK_CONTAINS(sf_errmsg(ctx), "error: identifier \"oops\" is undefined");

  /* Records tuned on this GPU win over others (listed first: the cache
   * orders by GPU name); others serve otherwise. */
  sf_layer_variant wrong = variant_rowcol();
  wrong.kernel_name = "not_in_the_source";
  rec = record("test.pref", "AAA Other GPU", &wrong, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  sf_layer_variant good = variant_rowcol();
  rec = record("test.pref", info.name, &good, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  sf_layer *pref = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.pref", &pref));
  if (pref) {
    CHECK_EQ_INT(0, sf_layer_compiled_count(pref)); /* same key as test.dense's */
    check_run(ctx, pref, 33);
    sf_layer_close(pref);
  }
  rec = record("test.elsewhere", "AAA Other GPU", &good, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  pref = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.elsewhere", &pref));
  if (pref) check_run(ctx, pref, 5);
  rec = record("test.wrong_kernel", "AAA Other GPU", &wrong, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_layer_open(ctx, cache, "test.wrong_kernel", &none));
  CHECK_CONTAINS(sf_errmsg(ctx), "no kernel named \"not_in_the_source\"");

  sf_context_destroy(ctx); /* closes the layers still open */
  sf_cache_close(cache);
  CHECK_DONE();
}
