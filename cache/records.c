/*
 * records.c -- binaries, GPU environments, matrices and trials in the
 * cache.  Every stored binary carries its sha256, checked when fetched.
 */
#include "cache_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A NULL cache: only the code (there is no handle for a message). */
#define CHECK_CACHE(c)                    \
  do {                                    \
    if (!(c)) return SF_ERR_INVALID_ARG;  \
  } while (0)

/* ---- binary keys ---------------------------------------------------- */

static void hash_field(sf__sha256 *h, const char *s) {
  char len[32];
  size_t n = strlen(s);
  int k = snprintf(len, sizeof len, "%zu:", n);
  sf__sha256_update(h, len, (size_t)k);
  sf__sha256_update(h, s, n);
  sf__sha256_update(h, "\n", 1);
}

/* Which field of the key is missing, or NULL when the key is complete. */
static const char *key_problem(const sf_binary_key *key) {
  if (!key->source) return "key->source is NULL";
  if (!key->options) return "key->options is NULL";
  if (!key->arch) return "key->arch is NULL";
  if (!key->arch[0]) return "key->arch is empty";
  if (!key->nvrtc_version) return "key->nvrtc_version is NULL";
  if (!key->generator_version) return "key->generator_version is NULL";
  if (key->kind != SF_BINARY_CUBIN && key->kind != SF_BINARY_PTX)
    return "key->kind is neither SF_BINARY_CUBIN nor SF_BINARY_PTX";
  return NULL;
}

sf_status sf_binary_key_hex(const sf_binary_key *key, char out[65]) {
  if (!key || !out || key_problem(key)) return SF_ERR_INVALID_ARG;
  sf__sha256 h;
  sf__sha256_init(&h);
  static const char tag[] = "sparseforge-binary-key-v1\n";
  sf__sha256_update(&h, tag, sizeof tag - 1);
  hash_field(&h, key->source);
  hash_field(&h, key->options);
  hash_field(&h, key->arch);
  hash_field(&h, key->nvrtc_version);
  hash_field(&h, key->generator_version);
  hash_field(&h, key->kind == SF_BINARY_PTX ? "ptx" : "cubin");
  sf__sha256_final_hex(&h, out);
  return SF_OK;
}

/* Validates a key for a cache call and computes its hex. */
static sf_status cache_key(sf_cache *c, const char *fn,
                           const sf_binary_key *key, char hex[65]) {
  if (!key) return sfc_fail(c, SF_ERR_INVALID_ARG, "%s: key is NULL", fn);
  const char *why = key_problem(key);
  if (why) return sfc_fail(c, SF_ERR_INVALID_ARG, "%s: %s", fn, why);
  sf_binary_key_hex(key, hex);
  return SF_OK;
}

/* ---- binaries ------------------------------------------------------- */

typedef struct {
  const sf_binary_key *key;
  const char *hex;
  const void *data;
  size_t size;
} put_binary_args;

static sf_status put_binary_body(sf_cache *c, void *arg) {
  put_binary_args *a = arg;
  char sha[65], src_sha[65];
  sf_sha256_hex(a->data, a->size, sha);
  sf_sha256_hex(a->key->source, strlen(a->key->source), src_sha);
  /* The same key again changes nothing, unless the stored bytes no longer
   * match their hash: then the new bytes repair the record. */
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(
      c,
      "INSERT INTO binaries(key, source, source_sha256, options, arch,"
      " nvrtc_version, generator_version, kind, blob, sha256, created)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
      " ON CONFLICT(key) DO UPDATE SET blob = excluded.blob,"
      " sha256 = excluded.sha256, kind = excluded.kind,"
      " created = excluded.created"
      " WHERE sf_sha256(binaries.blob) IS NOT binaries.sha256",
      &st);
  if (s) return s;
  sqlite3_bind_text(st, 1, a->hex, 64, SQLITE_STATIC);
  sfc_bind_text(st, 2, a->key->source);
  sqlite3_bind_text(st, 3, src_sha, 64, SQLITE_STATIC);
  sfc_bind_text(st, 4, a->key->options);
  sfc_bind_text(st, 5, a->key->arch);
  sfc_bind_text(st, 6, a->key->nvrtc_version);
  sfc_bind_text(st, 7, a->key->generator_version);
  sqlite3_bind_int(st, 8, (int)a->key->kind);
  sfc_bind_blob(st, 9, a->data, a->size);
  sqlite3_bind_text(st, 10, sha, 64, SQLITE_STATIC);
  sqlite3_bind_double(st, 11, sfc_now());
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "storing a binary");
  return SF_OK;
}

sf_status sf_cache_put_binary(sf_cache *cache, const sf_binary_key *key,
                              const sf_binary *bin) {
  CHECK_CACHE(cache);
  char hex[65];
  sf_status s = cache_key(cache, "sf_cache_put_binary", key, hex);
  if (s) return s;
  if (!bin)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_put_binary: bin is NULL");
  size_t size = 0;
  const void *data = sf_binary_data(bin, &size);
  if (!data || size == 0)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "sf_cache_put_binary: the binary is empty");
  sf_binary_kind kind = sf_binary_get_kind(bin);
  if (kind != key->kind)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "sf_cache_put_binary: the key says %s but the binary is %s",
                    key->kind == SF_BINARY_PTX ? "PTX" : "a cubin",
                    kind == SF_BINARY_PTX ? "PTX" : "a cubin");
  put_binary_args a = {key, hex, data, size};
  return sfc_write_tx(cache, "store a binary", put_binary_body, &a);
}

sf_status sf_cache_get_binary(sf_cache *cache, const sf_binary_key *key,
                              sf_binary **out) {
  CHECK_CACHE(cache);
  if (!out)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_get_binary: out is NULL");
  *out = NULL;
  char hex[65];
  sf_status s = cache_key(cache, "sf_cache_get_binary", key, hex);
  if (s) return s;
  sqlite3_stmt *st;
  s = sfc_prepare(cache, "SELECT kind, blob, sha256 FROM binaries WHERE key = ?1",
                  &st);
  if (s) return s;
  sqlite3_bind_text(st, 1, hex, 64, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) {
    sqlite3_finalize(st);
    return sfc_fail(cache, SF_ERR_NOT_FOUND,
                    "cache %s: no binary with key %s (arch %s)", cache->path,
                    hex, key->arch);
  }
  if (rc != SQLITE_ROW) {
    sfc_db_fail(cache, rc, "reading a binary");
    sqlite3_finalize(st);
    return cache->code;
  }
  int kind = sqlite3_column_int(st, 0);
  const void *blob = sqlite3_column_blob(st, 1);
  size_t size = (size_t)sqlite3_column_bytes(st, 1);
  const char *stored = (const char *)sqlite3_column_text(st, 2);
  char sha[65];
  sf_sha256_hex(size ? blob : NULL, size, sha);
  if (!stored || strcmp(sha, stored) != 0) {
    sfc_fail(cache, SF_ERR_CORRUPT,
             "cache %s: binary %s is corrupt: its %zu bytes hash to %s, not "
             "the stored %s; not used",
             cache->path, hex, size, sha, stored ? stored : "(none)");
    sqlite3_finalize(st);
    return SF_ERR_CORRUPT;
  }
  if (kind != SF_BINARY_CUBIN && kind != SF_BINARY_PTX) {
    sfc_fail(cache, SF_ERR_CORRUPT, "cache %s: binary %s has unknown kind %d",
             cache->path, hex, kind);
    sqlite3_finalize(st);
    return SF_ERR_CORRUPT;
  }
  s = sf_binary_from_memory(blob, size, (sf_binary_kind)kind, out);
  sqlite3_finalize(st);
  if (s)
    return sfc_fail(cache, s, "cache %s: cannot wrap binary %s: %s",
                    cache->path, hex, sf_errstr(s));
  return SF_OK;
}

/* ---- environments --------------------------------------------------- */

typedef struct {
  const sf_device_info *dev;
  const char *key;
  size_t name_len;
} put_env_args;

static sf_status put_env_body(sf_cache *c, void *arg) {
  put_env_args *a = arg;
  const sf_device_info *d = a->dev;
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(
      c,
      "INSERT INTO envs(env_key, name, cc_major, cc_minor, sm_count,"
      " driver_version, arch, l2_bytes, smem_per_block_optin, smem_per_sm,"
      " regs_per_block, max_threads_per_block, clock_khz, total_mem_bytes,"
      " created) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)"
      " ON CONFLICT(env_key) DO UPDATE SET arch = excluded.arch,"
      " l2_bytes = excluded.l2_bytes,"
      " smem_per_block_optin = excluded.smem_per_block_optin,"
      " smem_per_sm = excluded.smem_per_sm,"
      " regs_per_block = excluded.regs_per_block,"
      " max_threads_per_block = excluded.max_threads_per_block,"
      " clock_khz = excluded.clock_khz,"
      " total_mem_bytes = excluded.total_mem_bytes",
      &st);
  if (s) return s;
  sqlite3_bind_text(st, 1, a->key, 64, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, d->name, (int)a->name_len, SQLITE_STATIC);
  sqlite3_bind_int(st, 3, d->cc_major);
  sqlite3_bind_int(st, 4, d->cc_minor);
  sqlite3_bind_int(st, 5, d->sm_count);
  sqlite3_bind_int(st, 6, d->driver_version);
  sqlite3_bind_text(st, 7, d->arch, (int)strnlen(d->arch, sizeof d->arch),
                    SQLITE_STATIC);
  sqlite3_bind_int(st, 8, d->l2_bytes);
  sqlite3_bind_int(st, 9, d->smem_per_block_optin);
  sqlite3_bind_int(st, 10, d->smem_per_sm);
  sqlite3_bind_int(st, 11, d->regs_per_block);
  sqlite3_bind_int(st, 12, d->max_threads_per_block);
  sqlite3_bind_int(st, 13, d->clock_khz);
  sqlite3_bind_int64(st, 14, (sqlite3_int64)d->total_mem_bytes);
  sqlite3_bind_double(st, 15, sfc_now());
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "storing an environment");
  return SF_OK;
}

sf_status sf_cache_put_env(sf_cache *cache, const sf_device_info *dev,
                           char env_key[65]) {
  CHECK_CACHE(cache);
  if (!dev || !env_key)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_put_env: %s is NULL",
                    !dev ? "dev" : "env_key");
  size_t name_len = strnlen(dev->name, sizeof dev->name);
  if (name_len == 0 || name_len == sizeof dev->name)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "sf_cache_put_env: dev->name is %s",
                    name_len ? "not NUL-terminated" : "empty");
  char text[sizeof dev->name + 64];
  int n = snprintf(text, sizeof text, "%.*s|%d.%d|%d|%d", (int)name_len,
                   dev->name, dev->cc_major, dev->cc_minor, dev->sm_count,
                   dev->driver_version);
  char key[65];
  sf_sha256_hex(text, (size_t)n, key);
  put_env_args a = {dev, key, name_len};
  sf_status s = sfc_write_tx(cache, "store an environment", put_env_body, &a);
  if (s == SF_OK) memcpy(env_key, key, 65);
  return s;
}

/* ---- matrices ------------------------------------------------------- */

static sf_status put_matrix_body(sf_cache *c, void *arg) {
  const sf_matrix_record *m = arg;
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(
      c,
      "INSERT INTO matrices(fingerprint, rows, cols, nnz, dtype, info, created)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"
      " ON CONFLICT(fingerprint) DO UPDATE SET rows = excluded.rows,"
      " cols = excluded.cols, nnz = excluded.nnz, dtype = excluded.dtype,"
      " info = excluded.info",
      &st);
  if (s) return s;
  sfc_bind_text(st, 1, m->fingerprint);
  sqlite3_bind_int64(st, 2, m->rows);
  sqlite3_bind_int64(st, 3, m->cols);
  sqlite3_bind_int64(st, 4, m->nnz);
  sfc_bind_text(st, 5, m->dtype);
  sfc_bind_text(st, 6, m->info);
  sqlite3_bind_double(st, 7, sfc_now());
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "storing a matrix");
  return SF_OK;
}

sf_status sf_cache_put_matrix(sf_cache *cache, const sf_matrix_record *m) {
  CHECK_CACHE(cache);
  const char *fn = "sf_cache_put_matrix";
  if (!m) return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: m is NULL", fn);
  if (!m->fingerprint || !m->fingerprint[0])
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: m->fingerprint is NULL or empty",
                    fn);
  if (!m->dtype || !m->dtype[0])
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: m->dtype is NULL or empty", fn);
  if (m->rows <= 0 || m->cols <= 0 || m->nnz < 0 ||
      (double)m->nnz > (double)m->rows * (double)m->cols)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "%s: bad shape %lld x %lld with %lld nonzeros", fn,
                    (long long)m->rows, (long long)m->cols, (long long)m->nnz);
  return sfc_write_tx(cache, "store a matrix", put_matrix_body, (void *)m);
}

/* ---- trials --------------------------------------------------------- */

static sf_status put_trial_body(sf_cache *c, void *arg) {
  const sf_trial *t = arg;
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(
      c,
      "INSERT INTO trials(env_key, matrix_fp, op, n, config, status,"
      " median_ms, p20_ms, p80_ms, min_ms, reps, max_error, binary_key,"
      " message, created)"
      " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)"
      " ON CONFLICT(env_key, matrix_fp, op, n, config) DO UPDATE SET"
      " status = excluded.status, median_ms = excluded.median_ms,"
      " p20_ms = excluded.p20_ms, p80_ms = excluded.p80_ms,"
      " min_ms = excluded.min_ms, reps = excluded.reps,"
      " max_error = excluded.max_error, binary_key = excluded.binary_key,"
      " message = excluded.message, created = excluded.created",
      &st);
  if (s) return s;
  sfc_bind_text(st, 1, t->env_key);
  sfc_bind_text(st, 2, t->matrix_fp);
  sfc_bind_text(st, 3, t->op);
  sqlite3_bind_int64(st, 4, t->n);
  sfc_bind_text(st, 5, t->config);
  sqlite3_bind_int(st, 6, t->status);
  sfc_bind_real(st, 7, t->median_ms);
  sfc_bind_real(st, 8, t->p20_ms);
  sfc_bind_real(st, 9, t->p80_ms);
  sfc_bind_real(st, 10, t->min_ms);
  sqlite3_bind_int(st, 11, t->reps);
  sfc_bind_real(st, 12, t->max_error);
  sfc_bind_text(st, 13, t->binary_key);
  sfc_bind_text(st, 14, t->message);
  sqlite3_bind_double(st, 15, sfc_now());
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "storing a trial");
  return SF_OK;
}

sf_status sf_cache_put_trial(sf_cache *cache, const sf_trial *t) {
  CHECK_CACHE(cache);
  const char *fn = "sf_cache_put_trial";
  if (!t) return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: t is NULL", fn);
  const char *missing = !t->env_key     ? "env_key"
                        : !t->matrix_fp ? "matrix_fp"
                        : !t->op        ? "op"
                        : !t->config    ? "config"
                                        : NULL;
  if (missing)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: t->%s is NULL", fn, missing);
  if (t->status < SF_TRIAL_OK || t->status > SF_TRIAL_TIMEOUT)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "%s: status %d is not an sf_trial_status (0..4)", fn,
                    t->status);
  if (t->n < 0 || t->reps < 0)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: negative %s (%lld)", fn,
                    t->n < 0 ? "n" : "reps",
                    t->n < 0 ? (long long)t->n : (long long)t->reps);
  return sfc_write_tx(cache, "store a trial", put_trial_body, (void *)t);
}

sf_status sf_cache_trials(sf_cache *cache, const sf_trial_filter *filter,
                          sf_trial_cb cb, void *user) {
  CHECK_CACHE(cache);
  if (!cb)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_trials: cb is NULL");
  sqlite3_stmt *st;
  /* Best first within each group: ok trials by median (a missing median
   * last), then failures by status and configuration. */
  sf_status s = sfc_prepare(
      cache,
      "SELECT env_key, matrix_fp, op, n, config, status, median_ms, p20_ms,"
      " p80_ms, min_ms, reps, max_error, binary_key, message, created"
      " FROM trials"
      " WHERE (?1 IS NULL OR env_key = ?1) AND (?2 IS NULL OR matrix_fp = ?2)"
      "   AND (?3 IS NULL OR op = ?3) AND (?4 < 0 OR n = ?4)"
      " ORDER BY env_key, matrix_fp, op, n, status <> 0,"
      "  CASE WHEN status = 0 THEN median_ms IS NULL END,"
      "  CASE WHEN status = 0 THEN median_ms END, status, config",
      &st);
  if (s) return s;
  if (filter) {
    sfc_bind_text(st, 1, filter->env_key);
    sfc_bind_text(st, 2, filter->matrix_fp);
    sfc_bind_text(st, 3, filter->op);
    sqlite3_bind_int64(st, 4, filter->n);
  } else {
    sqlite3_bind_int64(st, 4, -1);
  }
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    sf_trial t;
    t.env_key = (const char *)sqlite3_column_text(st, 0);
    t.matrix_fp = (const char *)sqlite3_column_text(st, 1);
    t.op = (const char *)sqlite3_column_text(st, 2);
    t.n = sqlite3_column_int64(st, 3);
    t.config = (const char *)sqlite3_column_text(st, 4);
    t.status = sqlite3_column_int(st, 5);
    t.median_ms = sfc_column_real(st, 6);
    t.p20_ms = sfc_column_real(st, 7);
    t.p80_ms = sfc_column_real(st, 8);
    t.min_ms = sfc_column_real(st, 9);
    t.reps = sqlite3_column_int(st, 10);
    t.max_error = sfc_column_real(st, 11);
    t.binary_key = (const char *)sqlite3_column_text(st, 12);
    t.message = (const char *)sqlite3_column_text(st, 13);
    t.created = sfc_column_real(st, 14);
    if (cb(&t, user)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(cache, rc, "reading trials");
  return SF_OK;
}

/* ---- listing environments and matrices -------------------------------- */

sf_status sf_cache_envs(sf_cache *cache, sf_env_cb cb, void *user) {
  CHECK_CACHE(cache);
  if (!cb)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_envs: cb is NULL");
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(
      cache,
      "SELECT env_key, name, cc_major, cc_minor, sm_count, driver_version,"
      " arch, l2_bytes, smem_per_block_optin, smem_per_sm, regs_per_block,"
      " max_threads_per_block, clock_khz, total_mem_bytes"
      " FROM envs ORDER BY name, driver_version, env_key",
      &st);
  if (s) return s;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    sf_device_info d;
    memset(&d, 0, sizeof d);
    const char *key = (const char *)sqlite3_column_text(st, 0);
    const char *name = (const char *)sqlite3_column_text(st, 1);
    const char *arch = (const char *)sqlite3_column_text(st, 6);
    snprintf(d.name, sizeof d.name, "%s", name ? name : "");
    snprintf(d.arch, sizeof d.arch, "%s", arch ? arch : "");
    d.cc_major = sqlite3_column_int(st, 2);
    d.cc_minor = sqlite3_column_int(st, 3);
    d.sm_count = sqlite3_column_int(st, 4);
    d.driver_version = sqlite3_column_int(st, 5);
    d.l2_bytes = sqlite3_column_int(st, 7);
    d.smem_per_block_optin = sqlite3_column_int(st, 8);
    d.smem_per_sm = sqlite3_column_int(st, 9);
    d.regs_per_block = sqlite3_column_int(st, 10);
    d.max_threads_per_block = sqlite3_column_int(st, 11);
    d.clock_khz = sqlite3_column_int(st, 12);
    d.total_mem_bytes = (uint64_t)sqlite3_column_int64(st, 13);
    if (cb(key, &d, user)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(cache, rc, "reading environments");
  return SF_OK;
}

sf_status sf_cache_matrices(sf_cache *cache, const char *fingerprint,
                            sf_matrix_cb cb, void *user) {
  CHECK_CACHE(cache);
  if (!cb)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_matrices: cb is NULL");
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(cache,
                            "SELECT fingerprint, rows, cols, nnz, dtype, info"
                            " FROM matrices WHERE ?1 IS NULL OR fingerprint = ?1"
                            " ORDER BY fingerprint",
                            &st);
  if (s) return s;
  sfc_bind_text(st, 1, fingerprint);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    sf_matrix_record m;
    m.fingerprint = (const char *)sqlite3_column_text(st, 0);
    m.rows = sqlite3_column_int64(st, 1);
    m.cols = sqlite3_column_int64(st, 2);
    m.nnz = sqlite3_column_int64(st, 3);
    m.dtype = (const char *)sqlite3_column_text(st, 4);
    m.info = (const char *)sqlite3_column_text(st, 5);
    if (cb(&m, user)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(cache, rc, "reading matrices");
  return SF_OK;
}
