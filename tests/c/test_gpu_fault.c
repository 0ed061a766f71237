/* test_gpu_fault.c -- a kernel that faults: the launch succeeds, the fault
 * surfaces at sf_synchronize as SF_ERR_FAULT with the driver's error name,
 * and every GPU call after it gives SF_ERR_FAULT naming the same fault.
 * Kept apart from the other GPU tests because a fault spoils the process's
 * CUDA context.  Skipped without a GPU. */
#include "check.h"
#include "sparseforge.h"

static const char *kSource =
    "extern \"C\" __global__ void write_wild(float *p) {\n"
    "  p[threadIdx.x * 1048576u] = 1.0f;\n"
    "}\n";

int main(void) {
  sf_context *ctx = NULL;
  sf_device_info info;
  static char reason[1024];
  if (!open_gpu(&ctx, &info, reason, sizeof reason)) SKIP(reason);
  sf_binary *bin = NULL;
  sf_module *mod = NULL;
  sf_kernel *k = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kSource, "fault.cu", NULL, &bin));
  CHECK_EQ_INT(SF_OK, sf_module_load(ctx, bin, &mod));
  sf_binary_free(bin);
  CHECK_EQ_INT(SF_OK, sf_kernel_get(ctx, mod, "write_wild", &k));
  if (!k) CHECK_DONE();
  sf_devptr wild = 0x10;
  void *args[] = {&wild};
  sf_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, NULL};
  CHECK_EQ_INT(SF_OK, sf_launch(ctx, k, &cfg, args));
  CHECK_EQ_INT(SF_ERR_FAULT, sf_synchronize(ctx));
  CHECK_EQ_INT(SF_ERR_FAULT, sf_errcode(ctx));
  CHECK_CONTAINS(sf_errmsg(ctx), "cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS");
  /* the context is spoiled: later GPU calls say so instead of hanging */
  const char *spoiled = "the context faulted earlier (CUDA_ERROR_ILLEGAL_ADDRESS";
  sf_devptr p = 0;
  CHECK_EQ_INT(SF_ERR_FAULT, sf_mem_alloc(ctx, 1024, &p));
  CHECK_CONTAINS(sf_errmsg(ctx), spoiled);
  CHECK_CONTAINS(sf_errmsg(ctx), "it is unusable; destroy it");
  CHECK_EQ_INT(SF_ERR_FAULT, sf_launch(ctx, k, &cfg, args));
  CHECK_CONTAINS(sf_errmsg(ctx), spoiled);
  CHECK_EQ_INT(SF_ERR_FAULT, sf_synchronize(ctx));
  CHECK_EQ_INT(SF_ERR_FAULT, sf_device_info_get(ctx, &info));
  sf_timing t;
  CHECK_EQ_INT(SF_ERR_FAULT, sf_time_kernel(ctx, k, &cfg, args, NULL, &t));
  /* what needs no GPU still works */
  sf_launch_record rec = {{2, 1, 1}, 0, 64, {64, 1, 1}, 0, 0};
  sf_launch_config got;
  CHECK_EQ_INT(SF_OK, sf_launch_config_for(ctx, &rec, 1000, NULL, &got));
  CHECK_EQ_INT(32, got.grid[0]);
  /* (the module is released by sf_context_destroy, fault or not) */
  sf_context_destroy(ctx);
  CHECK_DONE();
}
