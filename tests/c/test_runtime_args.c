/* test_runtime_args.c -- NULL and invalid arguments to every runtime
 * function give SF_ERR_INVALID_ARG (or the documented value) and the
 * documented message, before any GPU is touched: the same on machines with
 * and without a GPU. */
#include "check.h"
#include "sparseforge.h"

#define EXPECT_INVALID(call, text)                     \
  do {                                                 \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, (call));          \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_errcode(ctx)); \
    CHECK_CONTAINS(sf_errmsg(ctx), (text));            \
  } while (0)

int main(void) {
  /* context */
  sf_context *ctx = (sf_context *)1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_context_create(0, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_context_create(-1, &ctx));
  CHECK(ctx == NULL);
  sf_context_destroy(NULL);
  CHECK(strcmp(sf_errmsg(NULL), "NULL context") == 0);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_errcode(NULL));
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  CHECK(strcmp(sf_errmsg(ctx), "") == 0);
  CHECK_EQ_INT(SF_OK, sf_errcode(ctx));

  /* device */
  sf_device_info info;
  int count = -1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_device_info_get(NULL, &info));
  EXPECT_INVALID(sf_device_info_get(ctx, NULL), "out is NULL");
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_device_count(NULL, &count));
  CHECK_EQ_INT(0, count);
  EXPECT_INVALID(sf_device_count(ctx, NULL), "count is NULL");

  /* compile */
  sf_binary *bin = (sf_binary *)1;
  sf_compile_options o = {0};
  o.arch = "sm_80";
  const char *src = "extern \"C\" __global__ void k() {}\n";
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_compile(NULL, src, NULL, &o, &bin));
  EXPECT_INVALID(sf_compile(ctx, src, NULL, &o, NULL), "out is NULL");
  EXPECT_INVALID(sf_compile(ctx, NULL, NULL, &o, &bin), "source is NULL");
  CHECK(bin == NULL);
  o.arch = "ampere";
  EXPECT_INVALID(sf_compile(ctx, src, NULL, &o, &bin),
                 "malformed arch \"ampere\": expected sm_<number> with an "
                 "optional 'a' or 'f' suffix (e.g. sm_80, sm_90a), or "
                 "\"native\"");
  char *canon = (char *)1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_compile_canonical_options(NULL, &o, &canon));
  EXPECT_INVALID(sf_compile_canonical_options(ctx, &o, NULL), "out is NULL");
  EXPECT_INVALID(sf_compile_canonical_options(ctx, &o, &canon),
                 "malformed arch \"ampere\"");
  CHECK(canon == NULL);
  sf_free_buffer(NULL);

  /* binaries (no context: codes only) */
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_from_memory("x", 1, SF_BINARY_CUBIN, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_from_memory(NULL, 1, SF_BINARY_CUBIN, &bin));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_from_memory("x", 0, SF_BINARY_CUBIN, &bin));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_from_memory("x", 1, (sf_binary_kind)9, &bin));
  CHECK(bin == NULL);
  size_t size = 7;
  CHECK(sf_binary_data(NULL, &size) == NULL);
  CHECK_EQ_INT(0, size);
  CHECK(strcmp(sf_binary_log(NULL), "") == 0);
  sf_binary_free(NULL);
  int major = 0;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_nvrtc_version(NULL, &major));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_nvrtc_version(&major, NULL));

  /* modules and kernels */
  sf_module *mod = (sf_module *)1;
  sf_kernel *k = (sf_kernel *)1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_module_load(NULL, NULL, &mod));
  EXPECT_INVALID(sf_module_load(ctx, NULL, NULL), "out is NULL");
  EXPECT_INVALID(sf_module_load(ctx, NULL, &mod), "binary is NULL");
  CHECK(mod == NULL);
  sf_module_unload(NULL);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_kernel_get(NULL, NULL, "k", &k));
  EXPECT_INVALID(sf_kernel_get(ctx, NULL, "k", NULL), "out is NULL");
  EXPECT_INVALID(sf_kernel_get(ctx, NULL, "k", &k), "module is NULL");
  CHECK(k == NULL);
  sf_kernel_attrs attrs;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_kernel_attributes(NULL, NULL, &attrs));
  EXPECT_INVALID(sf_kernel_attributes(ctx, NULL, &attrs), "kernel is NULL");

  /* launches and timing */
  sf_launch_config cfg = {{1, 1, 1}, {32, 1, 1}, 0, NULL};
  sf_timing timing;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_launch(NULL, NULL, &cfg, NULL));
  EXPECT_INVALID(sf_launch(ctx, NULL, &cfg, NULL), "kernel is NULL");
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_synchronize(NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_time_kernel(NULL, NULL, &cfg, NULL, NULL, &timing));
  EXPECT_INVALID(sf_time_kernel(ctx, NULL, &cfg, NULL, NULL, &timing),
                 "kernel is NULL");
  void *one_set[1] = {NULL};
  void **sets[2] = {one_set, NULL};
  CHECK_EQ_INT(SF_ERR_INVALID_ARG,
               sf_time_kernel_sets(NULL, NULL, &cfg, sets, 1, NULL, &timing));
  EXPECT_INVALID(sf_time_kernel_sets(ctx, NULL, &cfg, sets, 0, NULL, &timing),
                 "n_sets must be at least 1 with arg_sets given (n_sets 0)");
  EXPECT_INVALID(sf_time_kernel_sets(ctx, NULL, &cfg, NULL, 1, NULL, &timing),
                 "n_sets must be at least 1");
  EXPECT_INVALID(sf_time_kernel_sets(ctx, NULL, &cfg, sets, 2, NULL, &timing),
                 "argument set 1 is NULL");
  EXPECT_INVALID(sf_time_kernel_sets(ctx, NULL, &cfg, sets, 1, NULL, &timing),
                 "kernel is NULL");

  sf_kernel_args kargs;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_kernel_args_set(NULL, NULL, 0, 0, 0, 1, &kargs));
  EXPECT_INVALID(sf_kernel_args_set(ctx, NULL, 0, 0, 0, 1, NULL), "out is NULL");
  EXPECT_INVALID(sf_kernel_args_set(ctx, NULL, 0, 0, 0, 1, &kargs), "kernel is NULL");

  /* memory */
  sf_devptr p = 99;
  unsigned char buf[4] = {0};
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_mem_alloc(NULL, 16, &p));
  EXPECT_INVALID(sf_mem_alloc(ctx, 16, NULL), "out is NULL");
  EXPECT_INVALID(sf_mem_alloc(ctx, 0, &p), "size is 0");
  CHECK_EQ_INT(0, p);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_mem_free(NULL, 0));
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, 0));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_memcpy_htod(NULL, 0x1000, buf, 4));
  EXPECT_INVALID(sf_memcpy_htod(ctx, 0, buf, 4), "device pointer is 0");
  EXPECT_INVALID(sf_memcpy_htod(ctx, 0x1000, NULL, 4), "host pointer is NULL");
  CHECK_EQ_INT(SF_OK, sf_memcpy_htod(ctx, 0x1000, buf, 0)); /* nothing to do */
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_memcpy_dtoh(NULL, buf, 0x1000, 4));
  EXPECT_INVALID(sf_memcpy_dtoh(ctx, buf, 0, 4), "device pointer is 0");
  EXPECT_INVALID(sf_memcpy_dtoh(ctx, NULL, 0x1000, 4), "host pointer is NULL");
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_memset_d8(NULL, 0x1000, 0, 4));
  EXPECT_INVALID(sf_memset_d8(ctx, 0, 0, 4), "device pointer is 0");

  /* layers */
  sf_layer *layer = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_open(NULL, NULL, "l", &layer));
  EXPECT_INVALID(sf_layer_open(ctx, NULL, "l", NULL), "out is NULL");
  EXPECT_INVALID(sf_layer_open(ctx, NULL, "l", &layer), "cache is NULL");
  CHECK(layer == NULL);
  sf_layer_close(NULL);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(NULL, NULL, 1, 1, 1, NULL));
  EXPECT_INVALID(sf_layer_run(ctx, NULL, 1, 1, 1, NULL), "layer is NULL");
  const sf_devptr packed[1] = {1};
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run_packed(NULL, NULL, packed, 1, 1, 1, 1, NULL));
  EXPECT_INVALID(sf_layer_run_packed(ctx, NULL, packed, 1, 1, 1, 1, NULL), "layer is NULL");
  int64_t rows = 0;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_shape(NULL, &rows, NULL, NULL));
  CHECK_EQ_INT(-1, sf_layer_compiled_count(NULL));

  /* A failure's message stays until the next failure. */
  CHECK_EQ_INT(SF_OK, sf_mem_free(ctx, 0));
  CHECK_CONTAINS(sf_errmsg(ctx), "layer is NULL");

  sf_context_destroy(ctx);
  CHECK_DONE();
}
