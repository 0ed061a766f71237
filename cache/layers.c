/*
 * layers.c -- tuned layers in the cache: one row per (name, GPU) in
 * `layers`, one per N bucket in `layer_variants` (its launch record in the
 * columns columns.c names), and the packed weights in `blobs`, stored once
 * per sha256 and checked when read.
 *
 * A layer is written in one transaction (old variants out, new in, blobs
 * no longer referenced removed), so a failure leaves the previous layer
 * whole.  A layer whose blobs no longer match is read back as a record
 * with a `problem` and no variants, so it never hides the other layers.
 */
#include "cache_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- put ------------------------------------------------------------ */

/* The checks sf_layer_load makes of a descriptor (but for its binaries:
 * the cache keeps sources), then that every variant has a source. */
static sf_status check_layer(sf_cache *c, const sf_layer_record *rec) {
  const char *fn = "sf_cache_put_layer";
  int n = rec->n_variants > 0 && rec->variants ? rec->n_variants : 0;
  sf_layer_code *codes = calloc(n ? (size_t)n : 1, sizeof *codes);
  if (!codes) return sfc_fail(c, SF_ERR_NOMEM, "%s: out of memory", fn);
  for (int i = 0; i < n; i++) {
    const sf_layer_variant *v = &rec->variants[i];
    codes[i].n_bucket = v->n_bucket;
    codes[i].kernel_name = v->kernel_name;
    codes[i].launch = v->launch;
    codes[i].packed = v->packed;
    codes[i].packed_size = v->packed_size;
  }
  sf_layer_desc desc = {rec->name,        rec->rows,        rec->cols,
                        rec->x_elem_size, rec->y_elem_size, rec->n_variants,
                        rec->variants ? codes : NULL};
  char msg[1024];
  const char *why = sf__layer_desc_problem(&desc, 0, msg, sizeof msg);
  free(codes);
  if (why) return sfc_fail(c, SF_ERR_INVALID_ARG, "%s: %s", fn, why);
  for (int i = 0; i < n; i++) {
    const sf_layer_variant *v = &rec->variants[i];
    if (!v->source || !v->source[0])
      return sfc_fail(c, SF_ERR_INVALID_ARG,
                      "%s: layer \"%s\" variant %d (n_bucket %lld): NULL or "
                      "empty source",
                      fn, rec->name, i, (long long)v->n_bucket);
  }
  return SF_OK;
}

/* Deletes packed blobs that no variant refers to any more. */
static sf_status collect_blobs(sf_cache *c) {
  int rc = sqlite3_exec(
      c->db,
      "DELETE FROM blobs WHERE NOT EXISTS (SELECT 1 FROM layer_variants v"
      " WHERE v.packed_sha256 = blobs.sha256)",
      NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "removing unused blobs");
  return SF_OK;
}

static sf_status step_done(sf_cache *c, sqlite3_stmt *st, const char *what) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, what);
  return SF_OK;
}

static sf_status put_layer_body(sf_cache *c, void *arg) {
  const sf_layer_record *r = arg;
  sqlite3_stmt *del = NULL, *lay = NULL, *blob = NULL, *var = NULL;
  /* The launch record's columns go last, from parameter ?12 on. */
  char cols[SFC_LAUNCH_SQL_MAX], params[SFC_LAUNCH_SQL_MAX];
  char var_sql[3 * SFC_LAUNCH_SQL_MAX];
  if (sfc_launch_columns(cols, sizeof cols, "", "") < 0 ||
      sfc_launch_params(params, sizeof params, 12) < 0)
    return sfc_fail(c, SF_ERR_NOMEM, "cache %s: launch columns too long",
                    c->path);
  snprintf(var_sql, sizeof var_sql,
           "INSERT INTO layer_variants(layer_name, gpu_name, n_bucket, source,"
           " source_sha256, kernel_name, options, generator_version,"
           " packed_sha256, packed_size, config, %s)"
           " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, %s)",
           cols, params);
  sf_status s;
  if ((s = sfc_prepare(c, "DELETE FROM layer_variants WHERE layer_name = ?1"
                          " AND gpu_name = ?2", &del)) ||
      (s = sfc_prepare(c,
                       "INSERT OR REPLACE INTO layers(name, gpu_name, matrix_fp,"
                       " op, rows, cols, x_elem_size, y_elem_size, created)"
                       " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)", &lay)) ||
      /* A blob already there is kept unless it is damaged. */
      (s = sfc_prepare(c,
                       "INSERT INTO blobs(sha256, size, data) VALUES(?1, ?2, ?3)"
                       " ON CONFLICT(sha256) DO UPDATE SET size = excluded.size,"
                       " data = excluded.data"
                       " WHERE sf_sha256(blobs.data) IS NOT blobs.sha256",
                       &blob)) ||
      (s = sfc_prepare(c, var_sql, &var)))
    goto done;

  sfc_bind_text(del, 1, r->name);
  sfc_bind_text(del, 2, r->gpu_name);
  if ((s = step_done(c, del, "replacing a layer's variants"))) goto done;

  sfc_bind_text(lay, 1, r->name);
  sfc_bind_text(lay, 2, r->gpu_name);
  sfc_bind_text(lay, 3, r->matrix_fp);
  sfc_bind_text(lay, 4, r->op);
  sqlite3_bind_int64(lay, 5, r->rows);
  sqlite3_bind_int64(lay, 6, r->cols);
  sqlite3_bind_int(lay, 7, r->x_elem_size);
  sqlite3_bind_int(lay, 8, r->y_elem_size);
  sqlite3_bind_double(lay, 9, sfc_now());
  if ((s = step_done(c, lay, "storing a layer"))) goto done;

  for (int i = 0; i < r->n_variants; i++) {
    const sf_layer_variant *v = &r->variants[i];
    char packed_sha[65], src_sha[65];
    sf_sha256_hex(v->packed_size ? v->packed : NULL, v->packed_size, packed_sha);
    sf_sha256_hex(v->source, strlen(v->source), src_sha);

    sqlite3_bind_text(blob, 1, packed_sha, 64, SQLITE_STATIC);
    sqlite3_bind_int64(blob, 2, (sqlite3_int64)v->packed_size);
    sfc_bind_blob(blob, 3, v->packed, v->packed_size);
    if ((s = step_done(c, blob, "storing packed weights"))) goto done;

    sfc_bind_text(var, 1, r->name);
    sfc_bind_text(var, 2, r->gpu_name);
    sqlite3_bind_int64(var, 3, v->n_bucket);
    sfc_bind_text(var, 4, v->source);
    sqlite3_bind_text(var, 5, src_sha, 64, SQLITE_STATIC);
    sfc_bind_text(var, 6, v->kernel_name);
    sfc_bind_text(var, 7, v->options ? v->options : "");
    sfc_bind_text(var, 8, v->generator_version ? v->generator_version : "");
    sqlite3_bind_text(var, 9, packed_sha, 64, SQLITE_STATIC);
    sqlite3_bind_int64(var, 10, (sqlite3_int64)v->packed_size);
    sfc_bind_text(var, 11, v->config);
    sfc_bind_launch(var, 12, &v->launch);
    if ((s = step_done(c, var, "storing a layer variant"))) goto done;
    sqlite3_clear_bindings(blob);
    sqlite3_clear_bindings(var);
  }
  s = collect_blobs(c);
done:
  sqlite3_finalize(del);
  sqlite3_finalize(lay);
  sqlite3_finalize(blob);
  sqlite3_finalize(var);
  return s;
}

sf_status sf_cache_put_layer(sf_cache *cache, const sf_layer_record *rec) {
  if (!cache) return SF_ERR_INVALID_ARG;
  const char *fn = "sf_cache_put_layer";
  if (!rec) return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: rec is NULL", fn);
  const char *missing = !rec->name        ? "name"
                        : !rec->gpu_name  ? "gpu_name"
                        : !rec->matrix_fp ? "matrix_fp"
                        : !rec->op        ? "op"
                                          : NULL;
  if (missing)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: rec->%s is NULL", fn, missing);
  if (!rec->name[0])
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: empty name", fn);
  sf_status s = check_layer(cache, rec);
  if (s) return s;
  return sfc_write_tx(cache, "store a layer", put_layer_body, (void *)rec);
}

/* ---- read ----------------------------------------------------------- */

/* The variants of one layer, copied out of the statements so that all of
 * them are valid together during the callback. */
typedef struct {
  sf_layer_variant *v;
  int n, cap;
} variant_list;

static void free_variants(variant_list *l) {
  for (int i = 0; i < l->n; i++) {
    free((void *)l->v[i].source);
    free((void *)l->v[i].kernel_name);
    free((void *)l->v[i].options);
    free((void *)l->v[i].generator_version);
    free((void *)l->v[i].packed);
    free((void *)l->v[i].config);
  }
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

static char *dup_col(sqlite3_stmt *st, int i, int *oom) {
  const char *s = (const char *)sqlite3_column_text(st, i);
  if (!s) return NULL;
  char *d = sf__strdup(s);
  if (!d) *oom = 1;
  return d;
}

const char *sfc_packed_problem(char *buf, size_t size, int index,
                               int64_t n_bucket, const char *want,
                               int64_t want_size, int present,
                               int64_t got_size, const char *got) {
  if (!present) {
    snprintf(buf, size,
             "the packed weights of variant %d (n_bucket %lld) are missing "
             "(sha256 %s)",
             index, (long long)n_bucket, want ? want : "?");
    return buf;
  }
  if (want && got && strcmp(got, want) == 0 && got_size == want_size)
    return NULL;
  snprintf(buf, size,
           "the packed weights of variant %d (n_bucket %lld) failed their "
           "sha256: %lld bytes hash to %s, not the stored %s",
           index, (long long)n_bucket, (long long)got_size, got ? got : "?",
           want ? want : "(none)");
  return buf;
}

/* Why variant `index` cannot be handed out, into buf (sfc_packed_problem
 * of the current row: n_bucket, packed_sha256 and packed_size in columns
 * 0, 6 and 7, the blob in 8, NULL when missing); NULL when it can. */
static const char *blob_problem(sqlite3_stmt *q, int index, char *buf,
                                size_t size) {
  int present = sqlite3_column_type(q, 8) != SQLITE_NULL;
  const void *data = present ? sqlite3_column_blob(q, 8) : NULL;
  size_t got_size = present ? (size_t)sqlite3_column_bytes(q, 8) : 0;
  char got[65];
  sf_sha256_hex(got_size ? data : NULL, got_size, got);
  return sfc_packed_problem(buf, size, index, sqlite3_column_int64(q, 0),
                            (const char *)sqlite3_column_text(q, 6),
                            sqlite3_column_int64(q, 7), present,
                            (int64_t)got_size, got);
}

/* Reads the variants of one layer into l.  A variant whose packed bytes
 * are missing or damaged ends the read with no variants and *problem set
 * (malloc'd), and SF_OK: the layer is handed out as unusable. */
static sf_status load_variants(sf_cache *c, sqlite3_stmt *q, const char *name,
                               const char *gpu, variant_list *l,
                               char **problem) {
  sqlite3_reset(q);
  sfc_bind_text(q, 1, name);
  sfc_bind_text(q, 2, gpu);
  int rc;
  /* blobs are stored once by sha256: one that passed for an earlier
   * variant of this layer is the same bytes and is not hashed again */
  char verified[16][65];
  int n_verified = 0;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    char why[512];
    const char *want = (const char *)sqlite3_column_text(q, 6);
    int seen = 0;
    for (int i = 0; want && i < n_verified && !seen; i++)
      seen = strcmp(verified[i], want) == 0;
    if (!seen && blob_problem(q, l->n, why, sizeof why)) {
      free_variants(l);
      sqlite3_reset(q);
      *problem = sf__strdup(why);
      if (!*problem)
        return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
      return SF_OK;
    }
    if (l->n == l->cap) {
      int cap = l->cap ? 2 * l->cap : 8;
      sf_layer_variant *nv = realloc(l->v, (size_t)cap * sizeof *nv);
      if (!nv) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
      l->v = nv;
      l->cap = cap;
    }
    if (!seen && want && n_verified < 16 && strlen(want) == 64)
      memcpy(verified[n_verified++], want, 65);
    sf_layer_variant *v = &l->v[l->n];
    memset(v, 0, sizeof *v);
    l->n++;
    int oom = 0;
    v->n_bucket = sqlite3_column_int64(q, 0);
    v->source = dup_col(q, 1, &oom);
    v->kernel_name = dup_col(q, 2, &oom);
    v->options = dup_col(q, 3, &oom);
    v->generator_version = dup_col(q, 4, &oom);
    v->config = dup_col(q, 5, &oom);
    sfc_column_launch(q, 9, &v->launch);
    size_t size = (size_t)sqlite3_column_bytes(q, 8);
    if (size && !oom) {
      void *p = malloc(size);
      if (p) memcpy(p, sqlite3_column_blob(q, 8), size);
      oom = !p;
      v->packed = p;
    }
    v->packed_size = size;
    if (oom) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "reading layer variants");
  return SF_OK;
}

/* The (name, gpu_name) pairs to walk. */
typedef struct {
  char **names, **gpus;
  int n, cap;
} key_list;

static void free_keys(key_list *k) {
  for (int i = 0; i < k->n; i++) {
    free(k->names[i]);
    free(k->gpus[i]);
  }
  free(k->names);
  free(k->gpus);
}

static sf_status list_layers(sf_cache *c, const char *name, key_list *k) {
  sqlite3_stmt *q;
  sf_status s = sfc_prepare(c,
                            "SELECT name, gpu_name FROM layers"
                            " WHERE ?1 IS NULL OR name = ?1"
                            " ORDER BY name, gpu_name",
                            &q);
  if (s) return s;
  sfc_bind_text(q, 1, name);
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (k->n == k->cap) {
      int cap = k->cap ? 2 * k->cap : 16;
      char **nn = realloc(k->names, (size_t)cap * sizeof *nn);
      if (nn) k->names = nn;
      char **ng = realloc(k->gpus, (size_t)cap * sizeof *ng);
      if (ng) k->gpus = ng;
      if (!nn || !ng) {
        sqlite3_finalize(q);
        return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
      }
      k->cap = cap;
    }
    k->names[k->n] = sf__strdup((const char *)sqlite3_column_text(q, 0));
    k->gpus[k->n] = sf__strdup((const char *)sqlite3_column_text(q, 1));
    k->n++;
    if (!k->names[k->n - 1] || !k->gpus[k->n - 1]) {
      sqlite3_finalize(q);
      return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
    }
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "listing layers");
  return SF_OK;
}

/* One layer, copied out: its strings and variants stay valid after the
 * read transaction ends, so the callback may write to the cache. */
typedef struct {
  sf_layer_record r;
  char *matrix_fp, *op, *problem;
  variant_list l;
  int found;
} loaded_layer;

static sf_status load_layer(sf_cache *c, sqlite3_stmt *lq, sqlite3_stmt *vq,
                            const char *name, const char *gpu,
                            loaded_layer *out) {
  /* One read transaction: a writer in another process cannot change the
   * layer between its row and its variants. */
  int rc = sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "starting a read");
  sf_status s = SF_OK;
  sqlite3_reset(lq);
  sfc_bind_text(lq, 1, name);
  sfc_bind_text(lq, 2, gpu);
  rc = sqlite3_step(lq);
  if (rc == SQLITE_ROW) {
    out->found = 1;
    sf_layer_record *r = &out->r;
    r->name = name;
    r->gpu_name = gpu;
    int oom = 0;
    out->matrix_fp = dup_col(lq, 0, &oom);
    out->op = dup_col(lq, 1, &oom);
    r->matrix_fp = out->matrix_fp;
    r->op = out->op;
    r->rows = sqlite3_column_int64(lq, 2);
    r->cols = sqlite3_column_int64(lq, 3);
    r->x_elem_size = sqlite3_column_int(lq, 4);
    r->y_elem_size = sqlite3_column_int(lq, 5);
    if (oom) s = sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
    if (!s) s = load_variants(c, vq, name, gpu, &out->l, &out->problem);
    if (!s && !out->problem && out->l.n == 0 &&
        !(out->problem = sf__strdup("it has no variants")))
      s = sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
    r->n_variants = out->l.n;
    r->variants = out->l.n ? out->l.v : NULL;
    r->problem = out->problem;
  } else if (rc != SQLITE_DONE) {
    s = sfc_db_fail(c, rc, "reading a layer");
  }
  sqlite3_reset(lq);
  sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
  return s;
}

static void free_loaded(loaded_layer *ll) {
  free(ll->matrix_fp);
  free(ll->op);
  free(ll->problem);
  free_variants(&ll->l);
  memset(ll, 0, sizeof *ll);
}

/* The variants of one layer, with their blobs; the launch record's
 * columns come last, from column 9 on (load_variants). */
static sf_status prepare_variant_query(sf_cache *c, sqlite3_stmt **q) {
  char cols[SFC_LAUNCH_SQL_MAX], sql[2 * SFC_LAUNCH_SQL_MAX];
  if (sfc_launch_columns(cols, sizeof cols, "v.", "") < 0)
    return sfc_fail(c, SF_ERR_NOMEM, "cache %s: launch columns too long",
                    c->path);
  snprintf(sql, sizeof sql,
           "SELECT v.n_bucket, v.source, v.kernel_name, v.options,"
           " v.generator_version, v.config, v.packed_sha256, v.packed_size,"
           " b.data, %s"
           " FROM layer_variants v LEFT JOIN blobs b"
           "  ON b.sha256 = v.packed_sha256"
           " WHERE v.layer_name = ?1 AND v.gpu_name = ?2"
           " ORDER BY v.n_bucket",
           cols);
  return sfc_prepare(c, sql, q);
}

sf_status sf_cache_layers(sf_cache *cache, const char *name, sf_layer_cb cb,
                          void *user) {
  if (!cache) return SF_ERR_INVALID_ARG;
  if (!cb)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_layers: cb is NULL");
  key_list keys = {0};
  sqlite3_stmt *lq = NULL, *vq = NULL;
  sf_status s;
  if ((s = list_layers(cache, name, &keys)) ||
      (s = sfc_prepare(cache,
                       "SELECT matrix_fp, op, rows, cols, x_elem_size,"
                       " y_elem_size FROM layers WHERE name = ?1"
                       " AND gpu_name = ?2",
                       &lq)) ||
      (s = prepare_variant_query(cache, &vq)))
    goto done;
  for (int i = 0; i < keys.n; i++) {
    loaded_layer ll;
    memset(&ll, 0, sizeof ll);
    s = load_layer(cache, lq, vq, keys.names[i], keys.gpus[i], &ll);
    if (s) {
      free_loaded(&ll);
      break;
    }
    /* A layer deleted since the listing is skipped. */
    int stop = ll.found ? cb(&ll.r, user) : 0;
    free_loaded(&ll);
    if (stop) break;
  }
done:
  sqlite3_finalize(lq);
  sqlite3_finalize(vq);
  free_keys(&keys);
  return s;
}

/* ---- delete --------------------------------------------------------- */

static sf_status delete_layer_body(sf_cache *c, void *arg) {
  const char *name = arg;
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(c, "DELETE FROM layer_variants WHERE layer_name = ?1",
                            &st);
  if (s) return s;
  sfc_bind_text(st, 1, name);
  s = step_done(c, st, "deleting layer variants");
  sqlite3_finalize(st);
  if (s) return s;
  if ((s = sfc_prepare(c, "DELETE FROM layers WHERE name = ?1", &st))) return s;
  sfc_bind_text(st, 1, name);
  s = step_done(c, st, "deleting a layer");
  sqlite3_finalize(st);
  if (s) return s;
  if (sqlite3_changes(c->db) == 0)
    return sfc_fail(c, SF_ERR_NOT_FOUND, "cache %s: no layer named %s", c->path,
                    name);
  return collect_blobs(c);
}

sf_status sf_cache_delete_layer(sf_cache *cache, const char *name) {
  if (!cache) return SF_ERR_INVALID_ARG;
  if (!name)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_delete_layer: name is NULL");
  return sfc_write_tx(cache, "delete a layer", delete_layer_body, (void *)name);
}
