/*
 * layers.c -- tuned layers in the cache: one row per (name, GPU) in
 * `layers`, one per N bucket in `layer_variants`, and the packed weights in
 * `blobs`, stored once per sha256 and checked when read.
 *
 * A layer is written in one transaction (old variants out, new in, blobs
 * no longer referenced removed), so a failure leaves the previous layer
 * whole.
 */
#include "cache_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- put ------------------------------------------------------------ */

static sf_status check_variant(sf_cache *c, const sf_layer_record *rec, int i) {
  const sf_layer_variant *v = &rec->variants[i];
  const char *fn = "sf_cache_put_layer";
  if (!v->source || !v->source[0])
    return sfc_fail(c, SF_ERR_INVALID_ARG, "%s: layer %s variant %d: NULL or "
                    "empty source", fn, rec->name, i);
  if (!v->kernel_name || !v->kernel_name[0])
    return sfc_fail(c, SF_ERR_INVALID_ARG, "%s: layer %s variant %d: NULL or "
                    "empty kernel_name", fn, rec->name, i);
  if (v->n_bucket <= 0)
    return sfc_fail(c, SF_ERR_INVALID_ARG,
                    "%s: layer %s variant %d: n_bucket %lld is not positive",
                    fn, rec->name, i, (long long)v->n_bucket);
  if (v->n_axis < -1 || v->n_axis > 2 || (v->n_axis >= 0 && v->n_tile <= 0))
    return sfc_fail(c, SF_ERR_INVALID_ARG,
                    "%s: layer %s variant %d: n_axis %d with n_tile %d (n_axis "
                    "is -1, 0, 1 or 2; n_tile > 0 when n_axis >= 0)",
                    fn, rec->name, i, v->n_axis, v->n_tile);
  for (int d = 0; d < 3; d++)
    if (v->grid[d] == 0 || v->block[d] == 0)
      return sfc_fail(c, SF_ERR_INVALID_ARG,
                      "%s: layer %s variant %d: grid (%u,%u,%u) and block "
                      "(%u,%u,%u) need every dimension >= 1",
                      fn, rec->name, i, v->grid[0], v->grid[1], v->grid[2],
                      v->block[0], v->block[1], v->block[2]);
  if (!v->packed && v->packed_size > 0)
    return sfc_fail(c, SF_ERR_INVALID_ARG,
                    "%s: layer %s variant %d: NULL packed with packed_size %zu",
                    fn, rec->name, i, v->packed_size);
  for (int j = 0; j < i; j++)
    if (rec->variants[j].n_bucket == v->n_bucket)
      return sfc_fail(c, SF_ERR_INVALID_ARG,
                      "%s: layer %s: variants %d and %d both have n_bucket "
                      "%lld",
                      fn, rec->name, j, i, (long long)v->n_bucket);
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
      (s = sfc_prepare(c,
                       "INSERT INTO layer_variants(layer_name, gpu_name,"
                       " n_bucket, source, source_sha256, kernel_name, options,"
                       " generator_version, grid0, grid1, grid2, n_axis,"
                       " n_tile, block0, block1, block2, shared_bytes,"
                       " zero_output, packed_sha256, packed_size, config)"
                       " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,"
                       "?14,?15,?16,?17,?18,?19,?20,?21)", &var)))
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
    for (int d = 0; d < 3; d++) {
      sqlite3_bind_int64(var, 9 + d, v->grid[d]);
      sqlite3_bind_int64(var, 14 + d, v->block[d]);
    }
    sqlite3_bind_int(var, 12, v->n_axis);
    sqlite3_bind_int(var, 13, v->n_tile);
    sqlite3_bind_int64(var, 17, v->shared_bytes);
    sqlite3_bind_int(var, 18, v->zero_output ? 1 : 0);
    sqlite3_bind_text(var, 19, packed_sha, 64, SQLITE_STATIC);
    sqlite3_bind_int64(var, 20, (sqlite3_int64)v->packed_size);
    sfc_bind_text(var, 21, v->config);
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
  if (rec->rows <= 0 || rec->cols <= 0 || rec->x_elem_size <= 0 ||
      rec->y_elem_size <= 0)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "%s: layer %s: rows %lld, cols %lld, x_elem_size %d, "
                    "y_elem_size %d must all be positive",
                    fn, rec->name, (long long)rec->rows, (long long)rec->cols,
                    rec->x_elem_size, rec->y_elem_size);
  if (rec->n_variants <= 0 || !rec->variants)
    return sfc_fail(cache, SF_ERR_INVALID_ARG,
                    "%s: layer %s: no variants (n_variants %d)", fn, rec->name,
                    rec->n_variants);
  for (int i = 0; i < rec->n_variants; i++) {
    sf_status s = check_variant(cache, rec, i);
    if (s) return s;
  }
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

static sf_status load_variants(sf_cache *c, sqlite3_stmt *q, const char *name,
                               const char *gpu, variant_list *l) {
  sqlite3_reset(q);
  sfc_bind_text(q, 1, name);
  sfc_bind_text(q, 2, gpu);
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (l->n == l->cap) {
      int cap = l->cap ? 2 * l->cap : 8;
      sf_layer_variant *nv = realloc(l->v, (size_t)cap * sizeof *nv);
      if (!nv) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
      l->v = nv;
      l->cap = cap;
    }
    sf_layer_variant *v = &l->v[l->n];
    memset(v, 0, sizeof *v);
    l->n++;
    int oom = 0;
    v->n_bucket = sqlite3_column_int64(q, 0);
    v->source = dup_col(q, 1, &oom);
    v->kernel_name = dup_col(q, 2, &oom);
    v->options = dup_col(q, 3, &oom);
    v->generator_version = dup_col(q, 4, &oom);
    for (int d = 0; d < 3; d++) {
      v->grid[d] = (unsigned)sqlite3_column_int64(q, 5 + d);
      v->block[d] = (unsigned)sqlite3_column_int64(q, 10 + d);
    }
    v->n_axis = sqlite3_column_int(q, 8);
    v->n_tile = sqlite3_column_int(q, 9);
    v->shared_bytes = (unsigned)sqlite3_column_int64(q, 13);
    v->zero_output = sqlite3_column_int(q, 14);
    v->config = dup_col(q, 15, &oom);
    const char *want = (const char *)sqlite3_column_text(q, 16);
    int64_t want_size = sqlite3_column_int64(q, 17);
    int have_blob = sqlite3_column_type(q, 18) != SQLITE_NULL;
    const void *data = sqlite3_column_blob(q, 18);
    size_t size = (size_t)sqlite3_column_bytes(q, 18);
    if (oom) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
    if (!have_blob)
      return sfc_fail(c, SF_ERR_CORRUPT,
                      "cache %s: layer %s (%s) n_bucket %lld: its packed "
                      "weights (sha256 %s) are missing; layer not used",
                      c->path, name, gpu, (long long)v->n_bucket,
                      want ? want : "?");
    char got[65];
    sf_sha256_hex(size ? data : NULL, size, got);
    if (!want || strcmp(got, want) != 0 || (int64_t)size != want_size)
      return sfc_fail(c, SF_ERR_CORRUPT,
                      "cache %s: layer %s (%s) n_bucket %lld: packed weights "
                      "are corrupt: %zu bytes hash to %s, not the stored %s; "
                      "layer not used",
                      c->path, name, gpu, (long long)v->n_bucket, size, got,
                      want ? want : "(none)");
    if (size) {
      void *p = malloc(size);
      if (!p) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
      memcpy(p, data, size);
      v->packed = p;
    }
    v->packed_size = size;
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
  char *matrix_fp, *op;
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
    if (!s) s = load_variants(c, vq, name, gpu, &out->l);
    if (!s && out->l.n == 0)
      s = sfc_fail(c, SF_ERR_CORRUPT,
                   "cache %s: layer %s (%s) has no variants; layer not used",
                   c->path, name, gpu);
    r->n_variants = out->l.n;
    r->variants = out->l.v;
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
  free_variants(&ll->l);
  memset(ll, 0, sizeof *ll);
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
      (s = sfc_prepare(cache,
                       "SELECT v.n_bucket, v.source, v.kernel_name, v.options,"
                       " v.generator_version, v.grid0, v.grid1, v.grid2,"
                       " v.n_axis, v.n_tile, v.block0, v.block1, v.block2,"
                       " v.shared_bytes, v.zero_output, v.config,"
                       " v.packed_sha256, v.packed_size, b.data"
                       " FROM layer_variants v LEFT JOIN blobs b"
                       "  ON b.sha256 = v.packed_sha256"
                       " WHERE v.layer_name = ?1 AND v.gpu_name = ?2"
                       " ORDER BY v.n_bucket",
                       &vq)))
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
