/* dense_layer.h -- the small dense layer the GPU layer tests run, Y (M x
 * N) = W (M x K) X (K x N) in fp32: its two kernels (one output column per
 * thread; split along K with zeroed output), their launch records, the
 * weights, and a run checked exactly against the host.  Included by
 * test_gpu_layer.c (through the cache) and test_gpu_layer_load.c (held in
 * memory). */
#ifndef SF_TEST_DENSE_LAYER_H
#define SF_TEST_DENSE_LAYER_H

#include "check.h"

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

/* W: small multiples of 1/4 (see check_run). */
static void fill_weights(void) {
  for (int m = 0; m < M; m++)
    for (int k = 0; k < K; k++) W[m * K + k] = (float)((m * 3 + k * 5) % 7 - 3) * 0.25f;
}

/* dense_rowcol: a block of 32 columns per step of grid axis 0, one row of W
 * per block along axis 1.  grid, n_axis, n_tile, block, shared_bytes,
 * zero_output. */
static const sf_launch_record kRowColLaunch = {{1, M, 1}, 0, 32, {32, 1, 1}, 0, 0};
/* dense_splitk with -DSPLITS=2: two halves of K along axis 2, into a Y the
 * runtime zeroes first. */
static const sf_launch_record kSplitKLaunch = {{1, M, 2}, 0, 64, {64, 1, 1}, 0, 1};

/* Runs the layer for n columns into a poisoned Y and checks it exactly
 * (the values are small multiples of 1/8, so fp32 sums are exact): with
 * the layer's own packed weights (packed NULL), else with packed[i] for
 * variant i (sf_layer_run_packed). */
static void check_run_packed(sf_context *ctx, sf_layer *layer, int n,
                             const sf_devptr *packed, int n_packed) {
  size_t xs = (size_t)K * n, ys = (size_t)M * n;
  float *x = malloc(xs * sizeof *x), *y = malloc(ys * sizeof *y);
  for (int k = 0; k < K; k++)
    for (int j = 0; j < n; j++) x[k * n + j] = (float)((k + 2 * j) % 5 - 2) * 0.5f;
  sf_devptr dx = 0, dy = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, xs * sizeof *x, &dx));
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, ys * sizeof *y, &dy));
  CHECK_EQ_INT(SF_OK, sf_memcpy_htod(ctx, dx, x, xs * sizeof *x));
  CHECK_EQ_INT(SF_OK, sf_memset_d8(ctx, dy, 0xff, ys * sizeof *y)); /* NaN */
  if (packed)
    CHECK_EQ_INT(SF_OK, sf_layer_run_packed(ctx, layer, packed, n_packed, dx, dy, n, NULL));
  else
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

static void check_run(sf_context *ctx, sf_layer *layer, int n) {
  check_run_packed(ctx, layer, n, NULL, 0);
}

#endif
