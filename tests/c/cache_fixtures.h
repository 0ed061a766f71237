/* cache_fixtures.h -- what the cache tests share: a scratch directory per
 * test program, database files removed with their side files, snapshots
 * that show a file untouched, and fixture records (binaries, a layer of two
 * variants, trials, a device) with the callback that checks listed layers
 * against them.  Call fixture_start() first (the scratch directory, and
 * SQLite for raw_sql.h's sql()) and fixture_dir_remove() at the end. */
#ifndef SF_TEST_CACHE_FIXTURES_H
#define SF_TEST_CACHE_FIXTURES_H

#include "check.h"
#include "raw_sql.h"
#include "sparseforge.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- scratch files ---------------------------------------------------- */

static char g_dir[4096] __attribute__((unused));

static inline const char *tmp_path(const char *name) {
  static char bufs[8][4352];
  static int next = 0;
  char *b = bufs[next++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", g_dir, name);
  return b;
}

/* Removes a database file and its side files. */
static inline void remove_db(const char *path) {
  static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
  for (int i = 0; i < 4; i++) {
    char p[4400];
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
}

static inline void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* A file's bytes and mtime, to show it was not touched. */
typedef struct {
  char *bytes;
  long size;
  struct timespec mtime;
} snapshot;

static inline snapshot take(const char *path) {
  snapshot s = {0};
  struct stat sb;
  if (stat(path, &sb) == 0) s.mtime = sb.st_mtim;
  FILE *f = fopen(path, "rb");
  if (!f) return s;
  fseek(f, 0, SEEK_END);
  s.size = ftell(f);
  fseek(f, 0, SEEK_SET);
  s.bytes = malloc((size_t)s.size + 1);
  if (fread(s.bytes, 1, (size_t)s.size, f) != (size_t)s.size) s.size = -1;
  fclose(f);
  return s;
}

static inline int same_as(const snapshot *a, const char *path) {
  snapshot b = take(path);
  int same = a->size == b.size && a->size >= 0 && b.bytes && a->bytes &&
             memcmp(a->bytes, b.bytes, (size_t)a->size) == 0 &&
             a->mtime.tv_sec == b.mtime.tv_sec &&
             a->mtime.tv_nsec == b.mtime.tv_nsec;
  free(b.bytes);
  return same;
}

static inline int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The directory's entries (but . and ..), sorted, each followed by a
 * space: two listings of one directory compare equal when no file came or
 * went. */
static inline void dir_list(const char *dir, char *out, size_t size) {
  out[0] = '\0';
  char *names[256];
  int n = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while (n < 256 && (e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
      names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], compare_names);
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    int w = snprintf(out + used, size - used, "%s ", names[i]);
    if (w > 0 && (size_t)w < size - used) used += (size_t)w;
    free(names[i]);
  }
}

/* ---- fixtures ---------------------------------------------------------- */

static inline sf_cache *open_new(const char *name) {
  const char *p = tmp_path(name);
  remove_db(p);
  sf_cache *c = NULL;
  sf_status st = sf_cache_open(p, SF_CACHE_CREATE, &c);
  if (st) fprintf(stderr, "open %s: %s\n", p, sf_cache_errmsg(c));
  CHECK_EQ_INT(SF_OK, st);
  return c;
}

static inline sf_binary *make_binary(const char *text, sf_binary_kind kind) {
  sf_binary *b = NULL;
  size_t n = strlen(text) + (kind == SF_BINARY_PTX ? 1 : 0);
  CHECK_EQ_INT(SF_OK, sf_binary_from_memory(text, n, kind, &b));
  return b;
}

static inline sf_binary_key key_for(const char *source, const char *arch) {
  sf_binary_key k = {source, "--gpu-architecture=sm_90a -std=c++17 -default-device",
                     arch, "13.0", "0.1.0", SF_BINARY_CUBIN};
  return k;
}

static const unsigned char PACKED_A[] = "packed-marker-AAAA\x00\x01\x02\xff";
static const unsigned char PACKED_B[] = "packed-marker-BBBB\x10\x11\x12\xfe";

/* A layer of two variants (N buckets 16 and 256). */
static inline sf_layer_record layer_fixture(sf_layer_variant v[2], const char *name,
                                     const char *gpu, const char *tag) {
  memset(v, 0, 2 * sizeof *v);
  v[0].n_bucket = 16;
  v[0].source = "extern \"C\" __global__ void k16(const void*, const void*, void*, int) {}";
  v[0].kernel_name = "k16";
  v[0].options = "";
  v[0].generator_version = "0.1.0";
  /* grid, n_axis, n_tile, block, shared_bytes, zero_output */
  v[0].launch = (sf_launch_record){{96, 1, 1}, 1, 16, {128, 1, 1}, 4096, 0};
  v[0].packed = PACKED_A;
  v[0].packed_size = sizeof PACKED_A;
  v[0].config = tag;
  v[1] = v[0];
  v[1].n_bucket = 256;
  v[1].source = "extern \"C\" __global__ void k256(const void*, const void*, void*, int) {}";
  v[1].kernel_name = "k256";
  v[1].options = "-DSPLIT_K=2\n-DSTAGES=3";
  v[1].launch = (sf_launch_record){{48, 2, 3}, -1, 0, {256, 2, 1}, 98304, 1};
  v[1].packed = PACKED_B;
  v[1].packed_size = sizeof PACKED_B;
  sf_layer_record r = {name, gpu, "fp-matrix-1", "shflbw64.fp16.fm.bias_gelu",
                       3072, 768, 2, 2, 2, v, NULL};
  return r;
}

/* Collects what sf_cache_layers hands out. */
typedef struct {
  int calls;
  char names[8][64];
  char gpus[8][64];
  int n_variants[8];
  int ok[8];          /* every field matched the fixture */
  char problem[8][256]; /* "" when none */
  int unusable[8];    /* a problem, no variants and NULL variants */
  int stop_after;
  const sf_layer_variant *want; /* NULL: the fixture's variants */
} layer_seen;

static inline int variant_matches(const sf_layer_variant *a, const sf_layer_variant *b) {
  return a->n_bucket == b->n_bucket && strcmp(a->source, b->source) == 0 &&
         strcmp(a->kernel_name, b->kernel_name) == 0 &&
         strcmp(a->options, b->options) == 0 &&
         strcmp(a->generator_version, b->generator_version) == 0 &&
         memcmp(&a->launch, &b->launch, sizeof a->launch) == 0 &&
         a->packed_size == b->packed_size &&
         memcmp(a->packed, b->packed, a->packed_size) == 0 &&
         ((!a->config && !b->config) ||
          (a->config && b->config && strcmp(a->config, b->config) == 0));
}

static inline int layer_cb(const sf_layer_record *r, void *user) {
  layer_seen *s = user;
  int i = s->calls++;
  if (i >= 8) return 1;
  snprintf(s->names[i], sizeof s->names[i], "%s", r->name);
  snprintf(s->gpus[i], sizeof s->gpus[i], "%s", r->gpu_name);
  s->n_variants[i] = r->n_variants;
  snprintf(s->problem[i], sizeof s->problem[i], "%s", r->problem ? r->problem : "");
  s->unusable[i] = r->problem && r->n_variants == 0 && r->variants == NULL;
  sf_layer_variant fixture[2];
  sf_layer_record want = layer_fixture(fixture, r->name, r->gpu_name,
                                       r->n_variants ? r->variants[0].config : NULL);
  const sf_layer_variant *v = s->want ? s->want : fixture;
  s->ok[i] = !r->problem && r->n_variants == 2 &&
             strcmp(r->matrix_fp, want.matrix_fp) == 0 &&
             strcmp(r->op, want.op) == 0 && r->rows == want.rows &&
             r->cols == want.cols && r->x_elem_size == 2 &&
             r->y_elem_size == 2 && variant_matches(&r->variants[0], &v[0]) &&
             variant_matches(&r->variants[1], &v[1]);
  return s->stop_after && s->calls >= s->stop_after;
}

static inline sf_trial trial(const char *env, const char *config, int64_t n,
                      int status, double median) {
  sf_trial t;
  memset(&t, 0, sizeof t);
  t.env_key = env;
  t.matrix_fp = "fp-matrix-1";
  t.op = "shflbw64.fp16.fm.bias_gelu";
  t.n = n;
  t.config = config;
  t.status = status;
  t.median_ms = median;
  t.p20_ms = status == SF_TRIAL_OK ? median * 0.9 : NAN;
  t.p80_ms = status == SF_TRIAL_OK ? median * 1.1 : NAN;
  t.min_ms = status == SF_TRIAL_OK ? median * 0.8 : NAN;
  t.reps = status == SF_TRIAL_OK ? 30 : 0;
  t.max_error = status == SF_TRIAL_OK ? 1e-3 : NAN;
  t.message = status == SF_TRIAL_OK ? NULL : "it failed";
  t.binary_key = status == SF_TRIAL_OK ? "bkey" : NULL;
  return t;
}

static inline sf_device_info device_fixture(void) {
  sf_device_info d;
  memset(&d, 0, sizeof d);
  snprintf(d.name, sizeof d.name, "NVIDIA Test GPU");
  d.cc_major = 9;
  d.cc_minor = 0;
  snprintf(d.arch, sizeof d.arch, "sm_90a");
  d.sm_count = 132;
  d.driver_version = 13000;
  d.l2_bytes = 50 << 20;
  d.total_mem_bytes = 80ull << 30;
  return d;
}

static inline sf_cache_counts counts(sf_cache *c) {
  sf_cache_counts k;
  memset(&k, 0xff, sizeof k);
  CHECK_EQ_INT(SF_OK, sf_cache_count(c, &k));
  return k;
}

/* The counts as one line of text, "binaries 1 envs 0 matrices 1 trials 3
 * layers 1 variants 2 blobs 2", so that one check compares them all. */
static inline const char *counts_text(sf_cache *c, char *buf, size_t size) {
  sf_cache_counts k = counts(c);
  snprintf(buf, size,
           "binaries %lld envs %lld matrices %lld trials %lld layers %lld "
           "variants %lld blobs %lld",
           (long long)k.binaries, (long long)k.envs, (long long)k.matrices,
           (long long)k.trials, (long long)k.layers,
           (long long)k.layer_variants, (long long)k.blobs);
  return buf;
}

#define CHECK_COUNTS(cache, text)                                          \
  do {                                                                     \
    char counts_buf_[256];                                                 \
    CHECK_STREQ((text), counts_text((cache), counts_buf_,                  \
                                    sizeof counts_buf_));                  \
  } while (0)

/* Creates the scratch directory $SF_TEST_TMPDIR/<name>.<pid> (or under
 * /tmp) and finds SQLite's functions for sql(); 0, saying why, when either
 * fails. */
static inline int fixture_start(const char *name) {
  const char *base = getenv("SF_TEST_TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/%s.%d", base && *base ? base : "/tmp",
           name, (int)getpid());
  if (mkdir(g_dir, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "cannot create %s\n", g_dir);
    return 0;
  }
  if (!load_sqlite()) {
    fprintf(stderr, "SQLite functions not found in the process\n");
    return 0;
  }
  return 1;
}

/* Removes the scratch directory when every check passed (it is kept to
 * look at otherwise). */
static inline void fixture_dir_remove(void) {
  if (check_failures_) return;
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", g_dir, g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

#endif
