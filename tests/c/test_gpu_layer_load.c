/* test_gpu_layer_load.c -- a layer held in memory, as a deployment bundle
 * holds it: the dense test layer's kernels compiled with NVRTC here (one
 * cubin, one PTX), loaded with sf_layer_load from a descriptor that is
 * freed right after, and run for each N bucket (split-K with zeroed
 * output included), on its own packed weights and on the caller's
 * (sf_layer_run_packed).  Also: a kernel missing from its binary, a cubin for
 * another GPU, a grid that N makes too large, and layers left open for
 * sf_context_destroy.  Skipped without a GPU. */
#include <stdint.h>

#include "check.h"
#include "dense_layer.h"
#include "sparseforge.h"

/* Compiles `source` for this GPU as `kind`; NULL on failure. */
static sf_binary *compile(sf_context *ctx, const char *source,
                          const char *arch, sf_binary_kind kind,
                          const char *const *extra) {
  sf_compile_options o;
  memset(&o, 0, sizeof o);
  o.arch = arch;
  o.kind = kind;
  o.extra_options = extra;
  sf_binary *bin = NULL;
  sf_status st = sf_compile(ctx, source, "layer_load.cu", &o, &bin);
  CHECK_EQ_INT(SF_OK, st);
  if (st != SF_OK) fprintf(stderr, "compile: %s\n", sf_errmsg(ctx));
  return bin;
}

/* A copy of `bytes` on the heap, so that the test can free it after the
 * load (the descriptor's bytes need not outlive sf_layer_load). */
static void *copy_of(const void *bytes, size_t size) {
  void *p = malloc(size);
  if (p) memcpy(p, bytes, size);
  return p;
}

static sf_layer_code code_of(int64_t n_bucket, const char *kernel,
                             sf_launch_record launch, const sf_binary *bin) {
  sf_layer_code c;
  memset(&c, 0, sizeof c);
  c.n_bucket = n_bucket;
  c.kernel_name = kernel;
  c.launch = launch;
  c.binary = sf_binary_data(bin, &c.binary_size);
  c.binary_kind = sf_binary_get_kind(bin);
  c.packed = W;
  c.packed_size = sizeof W;
  return c;
}

int main(void) {
  sf_context *ctx = NULL;
  sf_device_info info;
  static char reason[1024];
  if (!open_gpu(&ctx, &info, reason, sizeof reason)) SKIP(reason);
  fill_weights();
  const char *const splits[] = {"-DSPLITS=2", NULL};
  sf_binary *rowcol = compile(ctx, kRowCol, info.arch, SF_BINARY_CUBIN, NULL);
  sf_binary *splitk = compile(ctx, kSplitK, info.arch, SF_BINARY_PTX, splits);
  if (!rowcol || !splitk) {
    sf_binary_free(rowcol);
    sf_binary_free(splitk);
    sf_context_destroy(ctx);
    CHECK_DONE();
  }

  /* Two variants whose bytes live on the heap, freed once loaded. */
  sf_layer_code *codes = malloc(2 * sizeof *codes);
  codes[0] = code_of(16, "dense_rowcol", kRowColLaunch, rowcol);
  codes[1] = code_of(1024, "dense_splitk", kSplitKLaunch, splitk);
  for (int i = 0; i < 2; i++) {
    codes[i].binary = copy_of(codes[i].binary, codes[i].binary_size);
    codes[i].packed = copy_of(W, sizeof W);
  }
  sf_layer_desc *desc = malloc(sizeof *desc);
  *desc = (sf_layer_desc){"test.held", M, K, 4, 4, 2, codes};
  sf_layer *layer = NULL;
  sf_status st = sf_layer_load(ctx, desc, &layer);
  CHECK_EQ_INT(SF_OK, st);
  if (st != SF_OK) fprintf(stderr, "load: %s\n", sf_errmsg(ctx));
  for (int i = 0; i < 2; i++) {
    free((void *)codes[i].binary);
    free((void *)codes[i].packed);
  }
  free(codes);
  free(desc);
  if (layer) {
    CHECK_EQ_INT(0, sf_layer_compiled_count(layer));
    int64_t rows = 0, cols = 0;
    int nv = 0;
    CHECK_EQ_INT(SF_OK, sf_layer_shape(layer, &rows, &cols, &nv));
    CHECK(rows == M && cols == K && nv == 2);
    check_run(ctx, layer, 10);   /* the n_bucket 16 variant (cubin) */
    check_run(ctx, layer, 1000); /* split-K (PTX), zeroed first */
    check_run(ctx, layer, 1);
    check_run(ctx, layer, 128);  /* as near to 16 as to 1024, in ratio */
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx, layer, 0x1000, 0x2000, 0, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx), "N = 0 is outside 1..2147483647");
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx, layer, 0, 0x2000, 4, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx), "X or Y is a null pointer");
    sf_layer_close(layer);
  }

  /* A grid that N makes too large: the one grid rule's message. */
  sf_layer_code wide = code_of(16, "dense_rowcol", kRowColLaunch, rowcol);
  wide.launch.n_axis = 1;
  wide.launch.n_tile = 1;
  sf_layer_desc d = {"test.wide", M, K, 4, 4, 1, &wide};
  layer = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_load(ctx, &d, &layer));
  if (layer) {
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx, layer, 0x1000, 0x2000, 2000, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx), "N = 2000 needs 128000 blocks along grid axis 1, past CUDA's 65535");
  }
  /* (left open: sf_context_destroy closes it) */

  /* A kernel missing from its binary; nothing stays loaded. */
  sf_layer_code two[2] = {code_of(16, "dense_rowcol", kRowColLaunch, rowcol),
                          code_of(64, "not_in_the_binary", kRowColLaunch, rowcol)};
  d = (sf_layer_desc){"test.missing", M, K, 4, 4, 2, two};
  sf_layer *none = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_layer_load(ctx, &d, &none));
  CHECK(none == NULL);
  CHECK_CONTAINS(sf_errmsg(ctx), "layer \"test.missing\" variant 1 (n_bucket 64): no kernel named \"not_in_the_binary\"");

  /* A cubin for another GPU family. */
  if (info.cc_major != 8) {
    sf_binary *other = compile(ctx, kRowCol, "sm_80", SF_BINARY_CUBIN, NULL);
    if (other) {
      sf_layer_code c = code_of(16, "dense_rowcol", kRowColLaunch, other);
      d = (sf_layer_desc){"test.other_gpu", M, K, 4, 4, 1, &c};
      CHECK_EQ_INT(SF_ERR_CUDA, sf_layer_load(ctx, &d, &none));
      CHECK_CONTAINS(sf_errmsg(ctx), "layer \"test.other_gpu\" variant 0 (n_bucket 16): cuModuleLoadData(cubin, ");
      CHECK_CONTAINS(sf_errmsg(ctx), "CUDA_ERROR_NO_BINARY_FOR_GPU");
      sf_binary_free(other);
    }
  }

  /* Another context's layer is refused. */
  sf_context *ctx2 = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx2));
  if (layer) {
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx2, layer, 0x1000, 0x2000, 4, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx2), "the layer belongs to another context");
  }
  sf_context_destroy(ctx2);

  /* Packed weights the caller holds: loaded without them (nothing is
   * uploaded), run on the caller's buffer for each variant. */
  sf_layer_code held[2] = {code_of(16, "dense_rowcol", kRowColLaunch, rowcol),
                           code_of(1024, "dense_splitk", kSplitKLaunch, splitk)};
  for (int i = 0; i < 2; i++) {
    held[i].packed = NULL;
    held[i].packed_size = 0;
  }
  d = (sf_layer_desc){"test.caller_weights", M, K, 4, 4, 2, held};
  layer = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_load(ctx, &d, &layer));
  sf_devptr w = 0;
  CHECK_EQ_INT(SF_OK, sf_mem_alloc(ctx, sizeof W, &w));
  CHECK_EQ_INT(SF_OK, sf_memcpy_htod(ctx, w, W, sizeof W));
  if (layer && w) {
    const sf_devptr both[2] = {w, w};
    check_run_packed(ctx, layer, 10, both, 2);   /* the cubin variant */
    check_run_packed(ctx, layer, 1000, both, 2); /* split-K, zeroed first */
    CHECK_EQ_INT(SF_ERR_INVALID_ARG,
                 sf_layer_run_packed(ctx, layer, NULL, 2, 0x1000, 0x2000, 4, NULL));
    CHECK_STREQ("packed is NULL", sf_errmsg(ctx));
    CHECK_EQ_INT(SF_ERR_INVALID_ARG,
                 sf_layer_run_packed(ctx, layer, both, 1, 0x1000, 0x2000, 4, NULL));
    CHECK_STREQ("1 packed pointers for a layer of 2 variants", sf_errmsg(ctx));
    CHECK_EQ_INT(SF_ERR_INVALID_ARG,
                 sf_layer_run_packed(ctx, layer, both, 2, 0x1000, 0x2000, 0, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx), "N = 0 is outside 1..2147483647");
    sf_layer_close(layer);
  }
  sf_mem_free(ctx, w);

  /* One more layer left open, sharing one packed buffer between variants. */
  sf_layer_code shared[2] = {code_of(16, "dense_rowcol", kRowColLaunch, rowcol),
                             code_of(1024, "dense_splitk", kSplitKLaunch, splitk)};
  d = (sf_layer_desc){"test.open_at_exit", M, K, 4, 4, 2, shared};
  layer = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_load(ctx, &d, &layer));
  if (layer) check_run(ctx, layer, 300);
  sf_binary_free(rowcol);
  sf_binary_free(splitk);
  sf_context_destroy(ctx); /* closes the layers still open */
  CHECK_DONE();
}
