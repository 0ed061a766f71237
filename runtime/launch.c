/*
 * launch.c -- the launch record of a generated kernel and the one grid
 * rule: how many blocks a launch for N columns takes.  Pure arithmetic: no
 * driver, no GPU, so the tuner, the runtime and a machine without a driver
 * all compute the same configuration.
 */
#include "internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* CUDA's largest grid, per axis. */
static const uint64_t kGridLimit[3] = {2147483647u, 65535u, 65535u};

const char *sf_launch_record_problem(const sf_launch_record *launch) {
  if (!launch) return "no launch record";
  for (int a = 0; a < 3; a++)
    if (launch->grid[a] == 0 || launch->block[a] == 0)
      return "a grid or block dimension is 0";
  if (launch->n_axis < -1 || launch->n_axis > 2)
    return "n_axis is outside -1..2";
  if (launch->n_axis >= 0 && launch->n_tile < 1)
    return "n_tile is below 1 while n_axis names an axis";
  return NULL;
}

void sf__launch_describe(const sf_launch_record *launch, char *buf,
                         size_t size) {
  snprintf(buf, size,
           "grid %u x %u x %u, block %u x %u x %u, n_axis %d, n_tile %d, "
           "%u bytes shared memory",
           launch->grid[0], launch->grid[1], launch->grid[2],
           launch->block[0], launch->block[1], launch->block[2],
           launch->n_axis, launch->n_tile, launch->shared_bytes);
}

sf_status sf_launch_config_for(sf_context *ctx,
                               const sf_launch_record *launch, int64_t n,
                               void *stream, sf_launch_config *out) {
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  memset(out, 0, sizeof *out);
  if (!launch)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "launch record is NULL");
  const char *why = sf_launch_record_problem(launch);
  if (why) {
    char what[256];
    sf__launch_describe(launch, what, sizeof what);
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "malformed launch record: %s (%s)",
                    why, what);
  }
  if (n < 1 || n > INT_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "N = %lld is outside 1..%d",
                    (long long)n, INT_MAX);
  /* Both factors fit 32 bits, so the product fits 64. */
  uint64_t steps = launch->n_axis >= 0
                       ? (uint64_t)((n + launch->n_tile - 1) / launch->n_tile)
                       : 1;
  sf_launch_config cfg;
  memset(&cfg, 0, sizeof cfg);
  for (int a = 0; a < 3; a++) {
    uint64_t g = launch->grid[a];
    if (a == launch->n_axis) g *= steps;
    if (g > kGridLimit[a])
      return sf__fail(ctx, SF_ERR_INVALID_ARG,
                      "N = %lld needs %llu blocks along grid axis %d, past "
                      "CUDA's %llu",
                      (long long)n, (unsigned long long)g, a,
                      (unsigned long long)kGridLimit[a]);
    cfg.grid[a] = (unsigned)g;
    cfg.block[a] = launch->block[a];
  }
  cfg.shared_bytes = launch->shared_bytes;
  cfg.stream = stream;
  *out = cfg;
  return SF_OK;
}
