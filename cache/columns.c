/*
 * columns.c -- the launch record's columns in the cache, made from
 * SF_LAUNCH_RECORD_FIELDS (sparseforge_runtime.h): an array field grid[3]
 * is the columns grid0, grid1, grid2, a scalar keeps its name.  The
 * schema, the statements that store and read layer variants, and merge
 * and export all take their launch columns from here, so the table is the
 * only hand-written list.
 */
#include "cache_internal.h"

#include <stdio.h>

/* The fields of the table: a scalar has count 0. */
typedef struct launch_field {
  const char *name;
  int count;
} launch_field;

static const launch_field kFields[] = {
#define SFC_SCALAR_(type, name, text) {#name, 0},
#define SFC_ARRAY_(type, name, count, text) {#name, count},
    SF_LAUNCH_RECORD_FIELDS(SFC_SCALAR_, SFC_ARRAY_)
#undef SFC_SCALAR_
#undef SFC_ARRAY_
};

/* Writes every column joined by ", ": as before + name + after, or, with
 * first > 0, as the parameter ?<first + i>. */
static int write_columns(char *buf, size_t size, const char *before,
                         const char *after, int first) {
  size_t used = 0;
  int n = 0;
  if (size == 0) return -1;
  buf[0] = '\0';
  for (size_t f = 0; f < sizeof kFields / sizeof kFields[0]; f++) {
    int count = kFields[f].count ? kFields[f].count : 1;
    for (int k = 0; k < count; k++, n++) {
      char name[64];
      if (kFields[f].count)
        snprintf(name, sizeof name, "%s%d", kFields[f].name, k);
      else
        snprintf(name, sizeof name, "%s", kFields[f].name);
      int w = first > 0 ? snprintf(buf + used, size - used, "%s?%d",
                                   n ? ", " : "", first + n)
                        : snprintf(buf + used, size - used, "%s%s%s%s",
                                   n ? ", " : "", before, name, after);
      if (w < 0 || (size_t)w >= size - used) return -1;
      used += (size_t)w;
    }
  }
  return n;
}

int sfc_launch_columns(char *buf, size_t size, const char *before,
                       const char *after) {
  return write_columns(buf, size, before, after, 0);
}

int sfc_launch_params(char *buf, size_t size, int first) {
  return write_columns(buf, size, "", "", first);
}

void sfc_bind_launch(sqlite3_stmt *st, int first, const sf_launch_record *l) {
  int i = first;
#define SFC_SCALAR_(type, name, text) \
  sqlite3_bind_int64(st, i++, (sqlite3_int64)l->name);
#define SFC_ARRAY_(type, name, count, text) \
  for (int k = 0; k < (count); k++)         \
    sqlite3_bind_int64(st, i++, (sqlite3_int64)l->name[k]);
  SF_LAUNCH_RECORD_FIELDS(SFC_SCALAR_, SFC_ARRAY_)
#undef SFC_SCALAR_
#undef SFC_ARRAY_
}

void sfc_column_launch(sqlite3_stmt *st, int first, sf_launch_record *l) {
  int i = first;
#define SFC_SCALAR_(type, name, text) \
  l->name = (type)sqlite3_column_int64(st, i++);
#define SFC_ARRAY_(type, name, count, text) \
  for (int k = 0; k < (count); k++)         \
    l->name[k] = (type)sqlite3_column_int64(st, i++);
  SF_LAUNCH_RECORD_FIELDS(SFC_SCALAR_, SFC_ARRAY_)
#undef SFC_SCALAR_
#undef SFC_ARRAY_
}
