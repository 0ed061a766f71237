/* test_layer_load.c -- sf_layer_load refuses every malformed descriptor
 * with SF_ERR_INVALID_ARG and a message naming the layer and the variant,
 * before it touches the driver: with SF_CUDA_DRIVER pointing at a missing
 * file, a well-formed descriptor gets SF_ERR_NO_DRIVER and a malformed one
 * never does.  Runs the same on machines with and without a GPU. */
#include <stdlib.h>

#include "check.h"
#include "sparseforge_runtime.h"

#define MISSING "/nonexistent/sparseforge-test/libcuda.so.1"

static const unsigned char BINARY[] = "not really a cubin, never loaded";
static const unsigned char PACKED[8] = {1, 2, 3, 4, 5, 6, 7, 8};

/* Two variants (N buckets 16 and 1024) of a 64 x 32 layer. */
static sf_layer_desc descriptor(sf_layer_code v[2]) {
  memset(v, 0, 2 * sizeof *v);
  v[0].n_bucket = 16;
  v[0].kernel_name = "dense_rowcol";
  /* grid, n_axis, n_tile, block, shared_bytes, zero_output */
  v[0].launch = (sf_launch_record){{1, 64, 1}, 0, 32, {32, 1, 1}, 0, 0};
  v[0].binary = BINARY;
  v[0].binary_size = sizeof BINARY;
  v[0].binary_kind = SF_BINARY_CUBIN;
  v[0].packed = PACKED;
  v[0].packed_size = sizeof PACKED;
  v[1] = v[0];
  v[1].n_bucket = 1024;
  v[1].kernel_name = "dense_splitk";
  v[1].launch = (sf_launch_record){{1, 64, 2}, 0, 64, {64, 1, 1}, 1024, 1};
  v[1].binary_kind = SF_BINARY_PTX;
  sf_layer_desc d = {"test.layer", 64, 32, 4, 4, 2, v};
  return d;
}

#define EXPECT_REFUSED(desc, text)                                     \
  do {                                                                 \
    sf_layer *l_ = (sf_layer *)1;                                      \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_load(ctx, (desc), &l_)); \
    CHECK(l_ == NULL);                                                 \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_errcode(ctx));                 \
    CHECK_STREQ((text), sf_errmsg(ctx));                               \
  } while (0)

int main(void) {
  setenv("SF_CUDA_DRIVER", MISSING, 1);
  sf_layer_code v[2];
  sf_layer_desc d = descriptor(v);
  sf_layer *layer = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_load(NULL, &d, &layer));
  sf_context *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  if (!ctx) CHECK_DONE();
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_load(ctx, &d, NULL));
  CHECK_STREQ("out is NULL", sf_errmsg(ctx));
  EXPECT_REFUSED(NULL, "layer descriptor is NULL");

  /* the layer */
  d.rows = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\": rows 0, cols 32, x_elem_size 4, "
                     "y_elem_size 4 must all be positive");
  d = descriptor(v);
  d.cols = -3;
  EXPECT_REFUSED(&d, "layer \"test.layer\": rows 64, cols -3, x_elem_size 4, "
                     "y_elem_size 4 must all be positive");
  d = descriptor(v);
  d.x_elem_size = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\": rows 64, cols 32, x_elem_size 0, "
                     "y_elem_size 4 must all be positive");
  d = descriptor(v);
  d.y_elem_size = -2;
  EXPECT_REFUSED(&d, "layer \"test.layer\": rows 64, cols 32, x_elem_size 4, "
                     "y_elem_size -2 must all be positive");
  d = descriptor(v);
  d.n_variants = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\": no variants (n_variants 0)");
  d = descriptor(v);
  d.variants = NULL;
  EXPECT_REFUSED(&d, "layer \"test.layer\": no variants (n_variants 2, "
                     "variants NULL)");
  d = descriptor(v);
  d.name = NULL;
  d.n_variants = -1;
  EXPECT_REFUSED(&d, "layer \"(unnamed)\": no variants (n_variants -1)");

  /* each variant */
  d = descriptor(v);
  v[1].n_bucket = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 0): n_bucket "
                     "is below 1");
  d = descriptor(v);
  v[1].n_bucket = 16;
  EXPECT_REFUSED(&d, "layer \"test.layer\": variants 0 and 1 both have "
                     "n_bucket 16");
  d = descriptor(v);
  v[0].kernel_name = NULL;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 0 (n_bucket 16): no kernel "
                     "name");
  d = descriptor(v);
  v[1].kernel_name = "";
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 1024): no "
                     "kernel name");
  d = descriptor(v);
  v[0].binary = NULL;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 0 (n_bucket 16): no binary");
  d = descriptor(v);
  v[1].binary_size = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 1024): no "
                     "binary");
  d = descriptor(v);
  v[1].binary_kind = (sf_binary_kind)5;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 1024): binary "
                     "kind 5 is neither SF_BINARY_CUBIN nor SF_BINARY_PTX");
  d = descriptor(v);
  v[1].packed = NULL;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 1024): NULL "
                     "packed with packed_size 8");
  /* the launch record, as sf_launch_record_problem words it */
  d = descriptor(v);
  v[0].launch.grid[2] = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 0 (n_bucket 16): a grid or "
                     "block dimension is 0 (grid 1 x 64 x 0, block 32 x 1 x 1, "
                     "n_axis 0, n_tile 32, 0 bytes shared memory)");
  d = descriptor(v);
  v[1].launch.block[0] = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 1024): a grid "
                     "or block dimension is 0 (grid 1 x 64 x 2, block 0 x 1 x "
                     "1, n_axis 0, n_tile 64, 1024 bytes shared memory)");
  d = descriptor(v);
  v[1].launch.n_axis = 3;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 1 (n_bucket 1024): n_axis "
                     "is outside -1..2 (grid 1 x 64 x 2, block 64 x 1 x 1, "
                     "n_axis 3, n_tile 64, 1024 bytes shared memory)");
  d = descriptor(v);
  v[0].launch.n_tile = 0;
  EXPECT_REFUSED(&d, "layer \"test.layer\" variant 0 (n_bucket 16): n_tile is "
                     "below 1 while n_axis names an axis (grid 1 x 64 x 1, "
                     "block 32 x 1 x 1, n_axis 0, n_tile 0, 0 bytes shared "
                     "memory)");

  /* what is well formed: no packed bytes at all, no n_tile without an
   * axis; then the driver is needed, and there is none */
  d = descriptor(v);
  v[0].packed = NULL;
  v[0].packed_size = 0;
  v[1].launch.n_axis = -1;
  v[1].launch.n_tile = 0;
  layer = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_NO_DRIVER, sf_layer_load(ctx, &d, &layer));
  CHECK(layer == NULL);
  CHECK_CONTAINS(sf_errmsg(ctx), "no CUDA driver found: " MISSING);
  d = descriptor(v);
  CHECK_EQ_INT(SF_ERR_NO_DRIVER, sf_layer_load(ctx, &d, &layer));
  CHECK(layer == NULL);

  /* the other layer calls with NULLs */
  sf_layer_close(NULL);
  int64_t rows = 7;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_shape(NULL, &rows, NULL, NULL));
  CHECK_EQ_INT(7, rows);
  CHECK_EQ_INT(-1, sf_layer_compiled_count(NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx, NULL, 1, 1, 1, NULL));
  CHECK_STREQ("layer is NULL", sf_errmsg(ctx));

  sf_context_destroy(ctx);
  CHECK_DONE();
}
