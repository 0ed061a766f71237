/* test_rt_link.c -- a deployment program: linked with libsparseforge_rt
 * alone (tests/c/CMakeLists.txt links test_rt_*.c so), it uses the
 * driver-only runtime without NVRTC or SQLite.  ctest's rt_link_needed
 * then reads its dynamic section and the library's (check_needed.cmake).
 * Without a driver (SF_CUDA_DRIVER names a missing file) the GPU calls say
 * SF_ERR_NO_DRIVER. */
#include <stdlib.h>

#include "check.h"
#include "sparseforge_runtime.h"

#define MISSING "/nonexistent/sparseforge-test/libcuda.so.1"

int main(void) {
  setenv("SF_CUDA_DRIVER", MISSING, 1);
  printf("sparseforge_rt %s\n", sf_version());
  CHECK(strcmp(sf_version(), SF_VERSION_STRING) == 0);
  CHECK(strcmp(sf_errstr(SF_ERR_FAULT), "a kernel faulted: the context is unusable") == 0);
  CHECK(strcmp(sf_status_name(SF_ERR_NO_DRIVER), "SF_ERR_NO_DRIVER") == 0);
  CHECK(strcmp(sf_activation_name(SF_ACT_GELU), "gelu") == 0);

  sf_context *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  if (!ctx) CHECK_DONE();
  sf_launch_record rec = {{96, 1, 1}, 1, 16, {128, 1, 1}, 4096, 0};
  sf_launch_config cfg;
  CHECK_EQ_INT(SF_OK, sf_launch_config_for(ctx, &rec, 4096, NULL, &cfg));
  CHECK(cfg.grid[0] == 96 && cfg.grid[1] == 256 && cfg.grid[2] == 1);

  int count = 3;
  CHECK_EQ_INT(SF_ERR_NO_DRIVER, sf_device_count(ctx, &count));
  CHECK_EQ_INT(0, count);
  CHECK_CONTAINS(sf_errmsg(ctx), "no CUDA driver found: " MISSING);

  /* binaries from bytes, and a layer held in memory */
  static const char ptx[] = ".version 8.0\n.target sm_90\n";
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_binary_from_memory(ptx, sizeof ptx - 1, SF_BINARY_PTX, &bin));
  size_t size = 0;
  CHECK(sf_binary_data(bin, &size) != NULL && size == sizeof ptx);
  sf_layer_code code = {16, "k", rec, ptx, sizeof ptx, SF_BINARY_PTX, NULL, 0};
  sf_layer_desc desc = {"deployed", 64, 32, 2, 2, 1, &code};
  sf_layer *layer = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_NO_DRIVER, sf_layer_load(ctx, &desc, &layer));
  CHECK(layer == NULL);
  sf_module *mod = (sf_module *)1;
  CHECK_EQ_INT(SF_ERR_NO_DRIVER, sf_module_load(ctx, bin, &mod));
  sf_binary_free(bin);

  sf_context_destroy(ctx);
  CHECK_DONE();
}
