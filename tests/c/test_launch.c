/* test_launch.c -- the launch record and the one grid rule: every way a
 * record is malformed, the grid for N along each axis (and none), N out of
 * range, CUDA's per-axis limits with their message, a NULL context, and
 * the same configurations as the rule sf_layer_run used before it moved to
 * sf_launch_config_for.  No GPU or driver is touched: the test points
 * SF_CUDA_DRIVER at a missing file, and nothing says SF_ERR_NO_DRIVER. */
#include <limits.h>
#include <stdlib.h>

#include "check.h"
#include "sparseforge_runtime.h"

#define MISSING "/nonexistent/sparseforge-test/libcuda.so.1"

/* grid, n_axis, n_tile, block, shared_bytes, zero_output */
static sf_launch_record record(unsigned g0, unsigned g1, unsigned g2,
                               int n_axis, int n_tile) {
  sf_launch_record r = {{g0, g1, g2}, n_axis, n_tile, {128, 2, 1}, 4096, 0};
  return r;
}

#define EXPECT_PROBLEM(rec, text) \
  CHECK_STREQ((text), sf_launch_record_problem(rec))

static void test_problem(void) {
  EXPECT_PROBLEM(NULL, "no launch record");
  sf_launch_record r = record(96, 1, 1, 1, 16);
  CHECK(sf_launch_record_problem(&r) == NULL);
  for (int a = 0; a < 3; a++) {
    r = record(96, 1, 1, 1, 16);
    r.grid[a] = 0;
    EXPECT_PROBLEM(&r, "a grid or block dimension is 0");
    r = record(96, 1, 1, 1, 16);
    r.block[a] = 0;
    EXPECT_PROBLEM(&r, "a grid or block dimension is 0");
  }
  r = record(96, 1, 1, -2, 16);
  EXPECT_PROBLEM(&r, "n_axis is outside -1..2");
  r = record(96, 1, 1, 3, 16);
  EXPECT_PROBLEM(&r, "n_axis is outside -1..2");
  for (int a = 0; a < 3; a++) {
    r = record(96, 1, 1, a, 0);
    EXPECT_PROBLEM(&r, "n_tile is below 1 while n_axis names an axis");
    r = record(96, 1, 1, a, -64);
    EXPECT_PROBLEM(&r, "n_tile is below 1 while n_axis names an axis");
  }
  /* n_tile means nothing without an axis */
  r = record(96, 1, 1, -1, 0);
  CHECK(sf_launch_record_problem(&r) == NULL);
  /* the first problem is named */
  r = record(0, 1, 1, 7, 0);
  EXPECT_PROBLEM(&r, "a grid or block dimension is 0");
  r = record(1, 1, 1, 7, 0);
  EXPECT_PROBLEM(&r, "n_axis is outside -1..2");
}

/* The grid of `r` for n, or {0, 0, 0} when refused. */
static void grid_for(sf_context *ctx, sf_launch_record r, int64_t n,
                     unsigned out[3]) {
  sf_launch_config cfg;
  memset(&cfg, 0xab, sizeof cfg);
  sf_status st = sf_launch_config_for(ctx, &r, n, NULL, &cfg);
  memcpy(out, cfg.grid, sizeof cfg.grid);
  if (st != SF_OK) CHECK(out[0] == 0 && out[1] == 0 && out[2] == 0);
}

#define EXPECT_GRID(rec, n, g0, g1, g2)                                     \
  do {                                                                      \
    unsigned g_[3];                                                         \
    grid_for(ctx, (rec), (n), g_);                                          \
    CHECK_EQ_INT((g0), g_[0]);                                              \
    CHECK_EQ_INT((g1), g_[1]);                                              \
    CHECK_EQ_INT((g2), g_[2]);                                              \
  } while (0)

static void test_grid(sf_context *ctx) {
  /* no axis: the grid whatever N */
  EXPECT_GRID(record(3, 4, 5, -1, 0), 1, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, -1, 64), 4096, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, -1, 0), INT_MAX, 3, 4, 5);
  /* each axis: N = 1, n_tile, n_tile + 1, a few tiles */
  EXPECT_GRID(record(3, 4, 5, 0, 64), 1, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 0, 64), 64, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 0, 64), 65, 6, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 0, 64), 1000, 48, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 1, 64), 1, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 1, 64), 64, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 1, 64), 65, 3, 8, 5);
  EXPECT_GRID(record(3, 4, 5, 1, 64), 1000, 3, 64, 5);
  EXPECT_GRID(record(3, 4, 5, 2, 64), 1, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 2, 64), 64, 3, 4, 5);
  EXPECT_GRID(record(3, 4, 5, 2, 64), 65, 3, 4, 10);
  EXPECT_GRID(record(3, 4, 5, 2, 64), 1000, 3, 4, 80);
  /* n_tile 1: one step per column; N = INT_MAX along axis 0 */
  EXPECT_GRID(record(1, 2, 3, 0, 1), INT_MAX, INT_MAX, 2, 3);
  EXPECT_GRID(record(3, 4, 5, 0, 64), INT_MAX, 3u * 33554432u, 4, 5);

  /* the rest of the configuration is the record's, and the stream */
  sf_launch_record r = {{7, 1, 1}, 0, 16, {256, 4, 2}, 98304, 1};
  sf_launch_config cfg;
  int stream_marker;
  CHECK_EQ_INT(SF_OK, sf_launch_config_for(ctx, &r, 33, &stream_marker, &cfg));
  CHECK(cfg.grid[0] == 21 && cfg.grid[1] == 1 && cfg.grid[2] == 1);
  CHECK(cfg.block[0] == 256 && cfg.block[1] == 4 && cfg.block[2] == 2);
  CHECK_EQ_INT(98304, cfg.shared_bytes);
  CHECK(cfg.stream == &stream_marker);
}

#define EXPECT_INVALID(call, text)                     \
  do {                                                 \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, (call));          \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_errcode(ctx)); \
    CHECK_STREQ((text), sf_errmsg(ctx));               \
  } while (0)

static void test_refused(sf_context *ctx) {
  sf_launch_record r = record(3, 4, 5, 1, 64);
  sf_launch_config cfg;
  EXPECT_INVALID(sf_launch_config_for(ctx, &r, 0, NULL, &cfg),
                 "N = 0 is outside 1..2147483647");
  EXPECT_INVALID(sf_launch_config_for(ctx, &r, -5, NULL, &cfg),
                 "N = -5 is outside 1..2147483647");
  EXPECT_INVALID(sf_launch_config_for(ctx, &r, (int64_t)INT_MAX + 1, NULL, &cfg),
                 "N = 2147483648 is outside 1..2147483647");
  EXPECT_INVALID(sf_launch_config_for(ctx, &r, 1, NULL, NULL), "out is NULL");
  EXPECT_INVALID(sf_launch_config_for(ctx, NULL, 1, NULL, &cfg),
                 "launch record is NULL");
  r = record(1, 1, 1, 7, 16);
  EXPECT_INVALID(sf_launch_config_for(ctx, &r, 1, NULL, &cfg),
                 "malformed launch record: n_axis is outside -1..2 (grid 1 x 1 "
                 "x 1, block 128 x 2 x 1, n_axis 7, n_tile 16, 4096 bytes "
                 "shared memory)");
  r = record(1, 0, 1, 0, 16);
  EXPECT_INVALID(sf_launch_config_for(ctx, &r, 1, NULL, &cfg),
                 "malformed launch record: a grid or block dimension is 0 "
                 "(grid 1 x 0 x 1, block 128 x 2 x 1, n_axis 0, n_tile 16, "
                 "4096 bytes shared memory)");

  /* CUDA's limits, axis by axis: exactly at the limit, then one step past */
  EXPECT_GRID(record(1, 65535, 1, 1, 4), 4, 1, 65535, 1);
  EXPECT_INVALID(sf_launch_config_for(ctx, &(sf_launch_record){{1, 65535, 1}, 1, 4, {32, 1, 1}, 0, 0}, 5, NULL, &cfg),
                 "N = 5 needs 131070 blocks along grid axis 1, past CUDA's 65535");
  EXPECT_INVALID(sf_launch_config_for(ctx, &(sf_launch_record){{1, 70, 1}, 1, 4, {32, 1, 1}, 0, 0}, 4000, NULL, &cfg),
                 "N = 4000 needs 70000 blocks along grid axis 1, past CUDA's 65535");
  EXPECT_GRID(record(1, 1, 65535, 2, 8), 8, 1, 1, 65535);
  EXPECT_INVALID(sf_launch_config_for(ctx, &(sf_launch_record){{1, 1, 65535}, 2, 8, {32, 1, 1}, 0, 0}, 9, NULL, &cfg),
                 "N = 9 needs 131070 blocks along grid axis 2, past CUDA's 65535");
  EXPECT_GRID(record(2147483647u, 1, 1, 0, 1), 1, 2147483647u, 1, 1);
  EXPECT_INVALID(sf_launch_config_for(ctx, &(sf_launch_record){{2147483647u, 1, 1}, 0, 1, {32, 1, 1}, 0, 0}, 2, NULL, &cfg),
                 "N = 2 needs 4294967294 blocks along grid axis 0, past CUDA's 2147483647");
  /* the largest product there is: 2^32 - 1 blocks times 2^31 - 1 steps */
  EXPECT_INVALID(sf_launch_config_for(ctx, &(sf_launch_record){{4294967295u, 1, 1}, 0, 1, {32, 1, 1}, 0, 0}, INT_MAX, NULL, &cfg),
                 "N = 2147483647 needs 9223372030412324865 blocks along grid axis 0, past CUDA's 2147483647");
  /* an axis N does not scale is held to the limit too */
  EXPECT_INVALID(sf_launch_config_for(ctx, &(sf_launch_record){{1, 70000, 1}, -1, 0, {32, 1, 1}, 0, 0}, 1, NULL, &cfg),
                 "N = 1 needs 70000 blocks along grid axis 1, past CUDA's 65535");
  CHECK(cfg.grid[0] == 0 && cfg.block[0] == 0 && cfg.stream == NULL);
}

/* The rule sf_layer_run applied before sf_launch_config_for, as it was
 * written there: the configurations must not change. */
static int old_rule(const sf_launch_record *v, int64_t n, sf_launch_config *cfg) {
  static const uint64_t grid_limit[3] = {2147483647u, 65535u, 65535u};
  memset(cfg, 0, sizeof *cfg);
  for (int a = 0; a < 3; a++) {
    uint64_t g = v->grid[a];
    if (a == v->n_axis) g *= (uint64_t)((n + v->n_tile - 1) / v->n_tile);
    if (g == 0 || g > grid_limit[a]) return 0;
    cfg->grid[a] = (unsigned)g;
    cfg->block[a] = v->block[a];
  }
  cfg->shared_bytes = v->shared_bytes;
  return 1;
}

static void test_regression(sf_context *ctx) {
  /* records the cache tests, the layer tests and the families store */
  const sf_launch_record recs[] = {
      {{96, 1, 1}, 1, 16, {128, 1, 1}, 4096, 0},
      {{48, 2, 3}, -1, 0, {256, 2, 1}, 98304, 1},
      {{1, 64, 1}, 0, 32, {32, 1, 1}, 0, 0},
      {{1, 64, 2}, 0, 64, {64, 1, 1}, 0, 1},
      {{132, 1, 1}, 1, 128, {384, 1, 1}, 197632, 0},
      {{24, 1, 4}, 0, 256, {128, 1, 1}, 65536, 1},
      {{1, 1, 1}, 2, 7, {32, 4, 1}, 0, 0},
  };
  const int64_t ns[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127,
                        128, 129, 255, 256, 257, 1000, 1024, 4096, 4097,
                        8192, 65536, 100000, 1 << 20};
  int compared = 0;
  for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++)
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
      sf_launch_config want, got;
      int ok = old_rule(&recs[i], ns[j], &want);
      sf_status st = sf_launch_config_for(ctx, &recs[i], ns[j], NULL, &got);
      CHECK_EQ_INT(ok ? SF_OK : SF_ERR_INVALID_ARG, st);
      if (ok && st == SF_OK) {
        CHECK(memcmp(want.grid, got.grid, sizeof want.grid) == 0);
        CHECK(memcmp(want.block, got.block, sizeof want.block) == 0);
        CHECK_EQ_INT(want.shared_bytes, got.shared_bytes);
        compared++;
      }
    }
  CHECK(compared > 150);
  /* and a few written out */
  EXPECT_GRID(recs[0], 4096, 96, 256, 1);
  EXPECT_GRID(recs[2], 1000, 32, 64, 1);
  EXPECT_GRID(recs[3], 1000, 16, 64, 2);
  EXPECT_GRID(recs[4], 3072, 132, 24, 1);
}

int main(void) {
  setenv("SF_CUDA_DRIVER", MISSING, 1);
  test_problem();
  /* without a context: the status alone */
  sf_launch_record r = record(3, 4, 5, 0, 64);
  sf_launch_config cfg;
  CHECK_EQ_INT(SF_OK, sf_launch_config_for(NULL, &r, 100, NULL, &cfg));
  CHECK(cfg.grid[0] == 6 && cfg.grid[1] == 4 && cfg.grid[2] == 5);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_launch_config_for(NULL, &r, 0, NULL, &cfg));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_launch_config_for(NULL, NULL, 1, NULL, &cfg));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_launch_config_for(NULL, &r, 1, NULL, NULL));

  sf_context *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  if (!ctx) CHECK_DONE();
  test_grid(ctx);
  test_refused(ctx);
  test_regression(ctx);
  /* a success leaves the last failure's status and message */
  CHECK_EQ_INT(SF_OK, sf_launch_config_for(ctx, &r, 1, NULL, &cfg));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_errcode(ctx));
  /* nothing above loaded the driver */
  CHECK(strstr(sf_errmsg(ctx), "no CUDA driver") == NULL);
  sf_context_destroy(ctx);
  CHECK_DONE();
}
