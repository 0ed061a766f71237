/* test_nodriver.c -- with no CUDA driver (SF_CUDA_DRIVER names a file that
 * does not exist) every GPU call says so, and compiling still works.  Runs
 * the same on a GPU machine. */
#include <stdlib.h>

#include "check.h"
#include "sparseforge.h"

#define MISSING "/nonexistent/sparseforge-test/libcuda.so.1"
#define EXPECT_NO_DRIVER(call)                                       \
  do {                                                               \
    CHECK_EQ_INT(SF_ERR_NO_DRIVER, (call));                          \
    CHECK_EQ_INT(SF_ERR_NO_DRIVER, sf_errcode(ctx));                 \
    CHECK_CONTAINS(sf_errmsg(ctx), "no CUDA driver found: " MISSING); \
  } while (0)

int main(void) {
  setenv("SF_CUDA_DRIVER", MISSING, 1);
  sf_context *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  if (!ctx) CHECK_DONE();

  sf_device_info info;
  EXPECT_NO_DRIVER(sf_device_info_get(ctx, &info));
  CHECK(strstr(sf_errmsg(ctx), "cannot open shared object file") != NULL);
  int count = 5;
  EXPECT_NO_DRIVER(sf_device_count(ctx, &count));
  CHECK_EQ_INT(0, count);

  sf_devptr p = 7;
  unsigned char host[16] = {0};
  EXPECT_NO_DRIVER(sf_mem_alloc(ctx, 1024, &p));
  CHECK_EQ_INT(0, p);
  EXPECT_NO_DRIVER(sf_mem_free(ctx, 0x1000));
  EXPECT_NO_DRIVER(sf_memcpy_htod(ctx, 0x1000, host, sizeof host));
  EXPECT_NO_DRIVER(sf_memcpy_dtoh(ctx, host, 0x1000, sizeof host));
  EXPECT_NO_DRIVER(sf_memset_d8(ctx, 0x1000, 0, sizeof host));
  EXPECT_NO_DRIVER(sf_synchronize(ctx));

  /* Compiling for a named arch needs no driver... */
  const char *src =
      "#include <cuda_fp16.h>\n"
      "extern \"C\" __global__ void k(__half *y) { y[0] = __float2half(2.0f); }\n";
  sf_compile_options o = {0};
  o.arch = "sm_90a";
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, src, "nodriver.cu", &o, &bin));
  CHECK(bin != NULL);
  /* ...but loading it does. */
  sf_module *mod = (sf_module *)1;
  EXPECT_NO_DRIVER(sf_module_load(ctx, bin, &mod));
  CHECK(mod == NULL);
  sf_binary_free(bin);

  /* The native arch (NULL or "native") needs the GPU. */
  bin = (sf_binary *)1;
  EXPECT_NO_DRIVER(sf_compile(ctx, src, NULL, NULL, &bin));
  CHECK(bin == NULL);
  o.arch = "native";
  EXPECT_NO_DRIVER(sf_compile(ctx, src, NULL, &o, &bin));
  char *canon = NULL;
  EXPECT_NO_DRIVER(sf_compile_canonical_options(ctx, NULL, &canon));
  CHECK(canon == NULL);
  o.arch = "sm_80";
  CHECK_EQ_INT(SF_OK, sf_compile_canonical_options(ctx, &o, &canon));
  CHECK(canon && strcmp(canon, "--gpu-architecture=sm_80 -std=c++17 -default-device") == 0);
  sf_free_buffer(canon);

  /* Opening a layer needs the GPU before it reads the cache. */
  const char *tmp = getenv("SF_TEST_TMPDIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/test_nodriver.db", tmp ? tmp : "/tmp");
  sf_cache *cache = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(path, SF_CACHE_CREATE, &cache));
  sf_layer *layer = (sf_layer *)1;
  if (cache) EXPECT_NO_DRIVER(sf_layer_open(ctx, cache, "any.layer", &layer));
  CHECK(layer == NULL);
  sf_cache_close(cache);

  sf_context_destroy(ctx);
  CHECK_DONE();
}
