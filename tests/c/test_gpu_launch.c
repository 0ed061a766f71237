/* test_gpu_launch.c -- on a GPU: device description, compile for the
 * native arch, load, launch, check results, kernel attributes, large
 * dynamic shared memory, launch failures, PTX, timing (plain, L2 flush,
 * CUDA graph) and device memory bookkeeping.  Skipped without a GPU. */
#include <stdint.h>

#include "check.h"
#include "sparseforge.h"

static const char *kSource =
    "#include <cuda_fp16.h>\n"
    "extern \"C\" __global__ void axpb(const float *x, float *y, float a,\n"
    "                                  float b, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = __half2float(__float2half(a * x[i] + b));\n"
    "}\n"
    "// Copies x into dynamic shared memory, then one thread sums it.\n"
    "extern \"C\" __global__ void smem_sum(const float *x, float *out, int n) {\n"
    "  extern __shared__ float s[];\n"
    "  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[i];\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    float acc = 0.0f;\n"
    "    for (int i = 0; i < n; i++) acc += s[i];\n"
    "    *out = acc;\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void count(int *c) { atomicAdd(c, 1); }\n";

#define N (1 << 20)

/* y = a x + b on the GPU, checked against the host. */
static void run_axpb(sf_context *ctx, sf_kernel *k, const char *what) {
  static float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = (float)(i % 64) * 0.5f;
  sf_devptr dx = 0, dy = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, sizeof x, &dx));
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, sizeof y, &dy));
  CHECK_EQ_INT(SF_OK, sf_memcpy_htod(ctx, dx, x, sizeof x));
  CHECK_EQ_INT(SF_OK, sf_memset_d8(ctx, dy, 0xff, sizeof y)); /* poison */
  float a = 2.0f, b = 1.0f;
  int n = N;
  void *args[] = {&dx, &dy, &a, &b, &n};
  sf_launch_config cfg = {{(N + 255) / 256, 1, 1}, {256, 1, 1}, 0, NULL};
  CHECK_EQ_INT(SF_OK, sf_launch(ctx, k, &cfg, args));
  CHECK_EQ_INT(SF_OK, sf_synchronize(ctx));
  CHECK_EQ_INT(SF_OK, sf_memcpy_dtoh(ctx, y, dy, sizeof y));
  int bad = 0;
  for (int i = 0; i < N; i++)
    if (y[i] != (float)(i % 64) + 1.0f) bad++;
  if (bad) fprintf(stderr, "%s: %d wrong values\n", what, bad);
  CHECK_EQ_INT(0, bad);
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, dx));
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, dy));
}

static void test_timing(sf_context *ctx, sf_kernel *k) {
  sf_devptr dx = 0, dy = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, N * sizeof(float), &dx));
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, N * sizeof(float), &dy));
  CHECK_EQ_INT(SF_OK, sf_memset_d8(ctx, dx, 0, N * sizeof(float)));
  float a = 2.0f, b = 1.0f;
  int n = N;
  void *args[] = {&dx, &dy, &a, &b, &n};
  sf_launch_config cfg = {{(N + 255) / 256, 1, 1}, {256, 1, 1}, 0, NULL};

  sf_timing t;
  CHECK_EQ_INT(SF_OK, sf_time_kernel(ctx, k, &cfg, args, NULL, &t));
  CHECK(t.reps >= 30 && t.reps <= 1000);
  CHECK(t.min_ms > 0.0 && t.min_ms <= t.p20_ms && t.p20_ms <= t.median_ms &&
        t.median_ms <= t.p80_ms && t.median_ms < 10.0);
  CHECK(t.mean_ms >= t.min_ms);
  /* defaults: >= 100 ms total unless 1000 reps came first */
  CHECK(t.reps == 1000 || t.mean_ms * t.reps >= 100.0 * 0.99);
  printf("axpb n=%d: median %.4f ms, p20 %.4f, p80 %.4f, min %.4f, %d reps\n",
         N, t.median_ms, t.p20_ms, t.p80_ms, t.min_ms, t.reps);

  sf_timing_options o = {0};
  o.flush_l2 = 1;
  o.min_reps = 40;
  o.max_reps = 50;
  o.min_total_ms = 1.0;
  CHECK_EQ_INT(SF_OK, sf_time_kernel(ctx, k, &cfg, args, &o, &t));
  CHECK(t.reps >= 40 && t.reps <= 50);
  CHECK(t.min_ms > 0.0 && t.median_ms <= t.p80_ms);
  printf("axpb flushed L2: median %.4f ms, %d reps\n", t.median_ms, t.reps);

  o.flush_l2 = 0;
  o.graph_batch = 20;
  o.min_reps = 10;
  o.max_reps = 20;
  CHECK_EQ_INT(SF_OK, sf_time_kernel(ctx, k, &cfg, args, &o, &t));
  CHECK(t.reps >= 10 && t.reps <= 20 && t.min_ms > 0.0);
  printf("axpb graph of 20: median %.4f ms per launch, %d reps\n", t.median_ms,
         t.reps);

  /* bad options */
  o.graph_batch = 0;
  o.min_reps = 10;
  o.max_reps = 5;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_time_kernel(ctx, k, &cfg, args, &o, &t));
  CHECK_CONTAINS(sf_errmsg(ctx), "max_reps (5) is below min_reps (10)");
  /* a refused launch surfaces from the timer too */
  sf_launch_config bad = cfg;
  bad.block[0] = 4096;
  CHECK_EQ_INT(SF_ERR_LAUNCH, sf_time_kernel(ctx, k, &bad, args, NULL, &t));
  CHECK_CONTAINS(sf_errmsg(ctx), "CUDA_ERROR_INVALID_VALUE");
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, dx));
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, dy));
}

/* Rotating argument sets: each launch takes the next set; a graph holds
 * whole rounds (graph_batch 4 with 3 sets becomes 6).  One plain launch
 * (set 0), a captured graph of sets 1, 2, 0, 1, 2, 0, then 1 warm-up and
 * 5 timed replays: set 0 counts 13, sets 1 and 2 count 12. */
static void test_rotation(sf_context *ctx, sf_kernel *k) {
  sf_devptr c[3] = {0, 0, 0};
  void *a0[] = {&c[0]}, *a1[] = {&c[1]}, *a2[] = {&c[2]};
  void **sets[] = {a0, a1, a2};
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, sizeof(int), &c[i]));
    CHECK_EQ_INT(SF_OK, sf_memset_d8(ctx, c[i], 0, sizeof(int)));
  }
  sf_launch_config cfg = {{1, 1, 1}, {1, 1, 1}, 0, NULL};
  sf_timing_options o = {0};
  o.warmup = 1;
  o.min_reps = 5;
  o.max_reps = 5;
  o.min_total_ms = 1e-6;
  o.graph_batch = 4;
  sf_timing t;
  CHECK_EQ_INT(SF_OK, sf_time_kernel_sets(ctx, k, &cfg, sets, 3, &o, &t));
  CHECK_EQ_INT(5, t.reps);
  int got[3];
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(SF_OK, sf_memcpy_dtoh(ctx, &got[i], c[i], sizeof(int)));
    CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, c[i]));
  }
  CHECK_EQ_INT(13, got[0]);
  CHECK_EQ_INT(12, got[1]);
  CHECK_EQ_INT(12, got[2]);
}

static void test_shared_memory(sf_context *ctx, sf_kernel *k,
                               const sf_device_info *info) {
  enum { M = 20000 }; /* 80,000 bytes: past the 48 KB default */
  static float x[M];
  for (int i = 0; i < M; i++) x[i] = (float)(i % 7);
  float want = 0.0f;
  for (int i = 0; i < M; i++) want += x[i];
  sf_devptr dx = 0, dout = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, sizeof x, &dx));
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, sizeof(float), &dout));
  CHECK_EQ_INT(SF_OK, sf_memcpy_htod(ctx, dx, x, sizeof x));
  int m = M;
  void *args[] = {&dx, &dout, &m};
  sf_launch_config cfg = {{1, 1, 1}, {256, 1, 1}, M * sizeof(float), NULL};
  CHECK_EQ_INT(SF_OK, sf_launch(ctx, k, &cfg, args));
  float got = -1.0f;
  CHECK_EQ_INT(SF_OK, sf_memcpy_dtoh(ctx, &got, dout, sizeof got));
  CHECK(got == want);
  /* more than the GPU allows */
  cfg.shared_bytes = (unsigned)info->smem_per_block_optin + 1024;
  CHECK_EQ_INT(SF_ERR_LAUNCH, sf_launch(ctx, k, &cfg, args));
  CHECK_CONTAINS(sf_errmsg(ctx), "raising smem_sum's dynamic shared memory to");
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, dx));
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, dout));
}

int main(void) {
  sf_context *ctx = NULL;
  sf_device_info info;
  static char reason[1024];
  if (!open_gpu(&ctx, &info, reason, sizeof reason)) SKIP(reason);
  printf("GPU: %s (cc %d.%d, %s, %d SMs, L2 %d bytes, driver %d)\n", info.name,
         info.cc_major, info.cc_minor, info.arch, info.sm_count, info.l2_bytes,
         info.driver_version);
  CHECK(info.name[0] != '\0');
  CHECK(info.cc_major >= 7 && info.sm_count > 0 && info.l2_bytes > 0);
  CHECK(info.smem_per_block_optin >= 48 * 1024 && info.regs_per_block > 0);
  CHECK(info.max_threads_per_block >= 512 && info.clock_khz > 0);
  CHECK(info.driver_version >= 12000 && info.total_mem_bytes > (1ull << 30));
  char arch[16];
  if (info.cc_major == 9 && info.cc_minor == 0)
    snprintf(arch, sizeof arch, "sm_90a");
  else
    snprintf(arch, sizeof arch, "sm_%d%d", info.cc_major, info.cc_minor);
  CHECK(strcmp(info.arch, arch) == 0);
  int count = 0;
  CHECK_EQ_INT(SF_OK, sf_device_count(ctx, &count));
  CHECK(count >= 1);

  /* native arch: NULL options */
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kSource, "launch.cu", NULL, &bin));
  char *canon = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile_canonical_options(ctx, NULL, &canon));
  char want[128];
  snprintf(want, sizeof want, "--gpu-architecture=%s -std=c++17 -default-device", arch);
  CHECK(canon && strcmp(canon, want) == 0);
  sf_free_buffer(canon);
  sf_module *mod = NULL;
  CHECK_EQ_INT(SF_OK, sf_module_load(ctx, bin, &mod));
  sf_binary_free(bin);
  sf_kernel *axpb = NULL, *again = NULL, *smem = NULL, *none = (sf_kernel *)1;
  CHECK_EQ_INT(SF_OK, sf_kernel_get(ctx, mod, "axpb", &axpb));
  CHECK_EQ_INT(SF_OK, sf_kernel_get(ctx, mod, "axpb", &again));
  CHECK(axpb == again);
  CHECK_EQ_INT(SF_OK, sf_kernel_get(ctx, mod, "smem_sum", &smem));
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_kernel_get(ctx, mod, "no_such_kernel", &none));
  CHECK(none == NULL);
  CHECK_CONTAINS(sf_errmsg(ctx), "no kernel named \"no_such_kernel\" in the module");
  if (!axpb || !smem) CHECK_DONE();

  sf_kernel_attrs attrs;
  CHECK_EQ_INT(SF_OK, sf_kernel_attributes(ctx, axpb, &attrs));
  CHECK(attrs.num_regs > 0 && attrs.max_threads >= 256);
  CHECK_EQ_INT(0, attrs.shared_bytes);
  CHECK_EQ_INT(0, attrs.local_bytes);
  printf("axpb: %d registers, max %d threads\n", attrs.num_regs, attrs.max_threads);

  run_axpb(ctx, axpb, "cubin");

  /* a refused launch is SF_ERR_LAUNCH and leaves the context usable */
  sf_launch_config bad = {{1, 1, 1}, {4096, 1, 1}, 0, NULL};
  void *noargs[] = {NULL, NULL, NULL, NULL, NULL};
  sf_devptr zero = 0;
  float f = 0;
  int n0 = 0;
  noargs[0] = &zero; noargs[1] = &zero; noargs[2] = &f; noargs[3] = &f; noargs[4] = &n0;
  CHECK_EQ_INT(SF_ERR_LAUNCH, sf_launch(ctx, axpb, &bad, noargs));
  CHECK_CONTAINS(sf_errmsg(ctx), "launching axpb (grid 1 x 1 x 1, block 4096 x 1 x 1, 0 bytes dynamic shared memory) failed: CUDA_ERROR_INVALID_VALUE");
  bad.block[0] = 0;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_launch(ctx, axpb, &bad, noargs));
  CHECK_CONTAINS(sf_errmsg(ctx), "must be at least 1 in every dimension");

  test_shared_memory(ctx, smem, &info);
  test_timing(ctx, axpb);
  run_axpb(ctx, axpb, "after timing");
  sf_kernel *count_k = NULL;
  CHECK_EQ_INT(SF_OK, sf_kernel_get(ctx, mod, "count", &count_k));
  if (count_k) test_rotation(ctx, count_k);

  /* PTX: the driver compiles it at load */
  sf_compile_options o = {0};
  o.kind = SF_BINARY_PTX;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kSource, "launch.cu", &o, &bin));
  sf_module *ptx_mod = NULL;
  CHECK_EQ_INT(SF_OK, sf_module_load(ctx, bin, &ptx_mod));
  sf_binary_free(bin);
  sf_kernel *ptx_axpb = NULL;
  CHECK_EQ_INT(SF_OK, sf_kernel_get(ctx, ptx_mod, "axpb", &ptx_axpb));
  if (ptx_axpb) run_axpb(ctx, ptx_axpb, "PTX");
  sf_module_unload(ptx_mod);

  /* a cubin for another GPU family, and bytes that are no image */
  if (info.cc_major != 8) {
    o.kind = SF_BINARY_CUBIN;
    o.arch = "sm_80";
    CHECK_EQ_INT(SF_OK, sf_compile(ctx, kSource, "launch.cu", &o, &bin));
    sf_module *other = (sf_module *)1;
    CHECK_EQ_INT(SF_ERR_CUDA, sf_module_load(ctx, bin, &other));
    CHECK(other == NULL);
    CHECK_CONTAINS(sf_errmsg(ctx), "CUDA_ERROR_NO_BINARY_FOR_GPU");
    sf_binary_free(bin);
  }
  static unsigned char junk[256] = {0x7f, 'E', 'L', 'F'};
  CHECK_EQ_INT(SF_OK, sf_binary_from_memory(junk, sizeof junk, SF_BINARY_CUBIN, &bin));
  sf_module *junk_mod = NULL;
  CHECK_EQ_INT(SF_ERR_CUDA, sf_module_load(ctx, bin, &junk_mod));
  CHECK_CONTAINS(sf_errmsg(ctx), "cuModuleLoadData(cubin, 256 bytes) failed: CUDA_ERROR_");
  sf_binary_free(bin);

  /* memory bookkeeping */
  sf_devptr p = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, 4096, &p));
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, p));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_mem_free(ctx, p));
  CHECK_CONTAINS(sf_errmsg(ctx), "was not allocated by this context (or was freed already)");
  sf_devptr huge = 0;
  CHECK_EQ_INT(SF_ERR_CUDA, sf_mem_alloc(ctx, (size_t)1 << 50, &huge));
  CHECK_CONTAINS(sf_errmsg(ctx), "CUDA_ERROR_OUT_OF_MEMORY");

  /* objects belong to their context */
  sf_context *ctx2 = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx2));
  sf_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, NULL};
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_launch(ctx2, axpb, &cfg, noargs));
  CHECK_CONTAINS(sf_errmsg(ctx2), "the kernel belongs to another context");
  sf_context_destroy(ctx2);
  /* a device that is not there */
  sf_context *ctx3 = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(count, &ctx3));
  CHECK_EQ_INT(SF_ERR_NO_DEVICE, sf_device_info_get(ctx3, &info));
  snprintf(want, sizeof want, "no CUDA device with ordinal %d (%d device", count, count);
  CHECK_CONTAINS(sf_errmsg(ctx3), want);
  sf_context_destroy(ctx3);

  /* left for sf_context_destroy to free: a buffer and a module */
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, 1 << 20, &p));
  sf_context_destroy(ctx);
  CHECK_DONE();
}
