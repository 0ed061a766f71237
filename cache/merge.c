/*
 * merge.c -- copying records between cache files (merge, export) and the
 * per-table counts.
 *
 * Both merge and export attach the source file read-only to the connection
 * of the cache being written and copy with INSERT OR IGNORE: what the
 * destination already holds wins, so copying twice adds nothing.  Layers
 * are copied whole: a layer (name, GPU) already in the destination keeps
 * all of its own variants.  Every blob of the source is checked against
 * its sha256 before anything is copied.
 */
#include "cache_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRC "sf_src"

#define BINARY_COLS                                                        \
  "key, source, source_sha256, options, arch, nvrtc_version,"              \
  " generator_version, kind, blob, sha256, created"
#define ENV_COLS                                                           \
  "env_key, name, cc_major, cc_minor, sm_count, driver_version, arch,"     \
  " l2_bytes, smem_per_block_optin, smem_per_sm, regs_per_block,"          \
  " max_threads_per_block, clock_khz, total_mem_bytes, created"
#define MATRIX_COLS "fingerprint, rows, cols, nnz, dtype, info, created"
#define TRIAL_COLS                                                         \
  "env_key, matrix_fp, op, n, config, status, median_ms, p20_ms, p80_ms,"  \
  " min_ms, reps, max_error, binary_key, message, created"
#define LAYER_COLS                                                         \
  "name, gpu_name, matrix_fp, op, rows, cols, x_elem_size, y_elem_size,"   \
  " created"
/* A variant's own columns; its launch record's come from columns.c. */
#define VARIANT_OWN_COLS                                                   \
  "layer_name, gpu_name, n_bucket, source, source_sha256, kernel_name,"    \
  " options, generator_version, packed_sha256, packed_size, config"

/* Layers of the source to copy: all, or those named in the temp table. */
#define LAYER_PICK(alias)                                                  \
  " (NOT ?1 OR " alias ".name IN (SELECT name FROM temp.sf_export_names))"
#define VARIANT_PICK(alias)                                                \
  " (NOT ?1 OR " alias                                                     \
  ".layer_name IN (SELECT name FROM temp.sf_export_names))"
/* A source variant whose layer is not yet in the destination. */
#define VARIANT_NEW(alias)                                                 \
  " NOT EXISTS (SELECT 1 FROM main.layers l WHERE l.name = " alias         \
  ".layer_name AND l.gpu_name = " alias ".gpu_name)"                       \
  " AND EXISTS (SELECT 1 FROM " SRC ".layers sl WHERE sl.name = " alias    \
  ".layer_name AND sl.gpu_name = " alias ".gpu_name)"

typedef struct {
  int exporting;   /* 1: only the named layers, their binaries, matrices */
  int64_t added;
  const char *src_path;
} merge_args;

/* First value of a one-column query, copied into buf ("" if none). */
static sf_status first_text(sf_cache *c, const char *sql, char *buf,
                            size_t size) {
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(c, sql, &st);
  if (s) return s;
  buf[0] = '\0';
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(st, 0);
    snprintf(buf, size, "%s", t ? t : "(null)");
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return sfc_db_fail(c, rc, "checking the source cache");
  return SF_OK;
}

static sf_status merge_body(sf_cache *c, void *arg) {
  merge_args *a = arg;
  sf_status s = sfc_check_schema(c, SRC, a->src_path);
  if (s) return s;

  /* Nothing damaged crosses over. */
  char bad[160];
  if ((s = first_text(c, "SELECT key FROM " SRC ".binaries"
                         " WHERE sf_sha256(blob) IS NOT sha256 LIMIT 1",
                      bad, sizeof bad)))
    return s;
  if (bad[0])
    return sfc_fail(c, SF_ERR_CORRUPT,
                    "cache %s: binary %s of %s fails its sha256; nothing "
                    "copied",
                    c->path, bad, a->src_path);
  if ((s = first_text(c, "SELECT sha256 FROM " SRC ".blobs"
                         " WHERE sf_sha256(data) IS NOT sha256 LIMIT 1",
                      bad, sizeof bad)))
    return s;
  if (bad[0])
    return sfc_fail(c, SF_ERR_CORRUPT,
                    "cache %s: packed blob %s of %s fails its sha256; nothing "
                    "copied",
                    c->path, bad, a->src_path);
  if ((s = first_text(c, "SELECT v.layer_name FROM " SRC ".layer_variants v"
                         " WHERE NOT EXISTS (SELECT 1 FROM " SRC ".blobs b"
                         " WHERE b.sha256 = v.packed_sha256) LIMIT 1",
                      bad, sizeof bad)))
    return s;
  if (bad[0])
    return sfc_fail(c, SF_ERR_CORRUPT,
                    "cache %s: layer %s of %s lacks its packed weights; "
                    "nothing copied",
                    c->path, bad, a->src_path);

  /* The variants' columns: their own and their launch record's. */
  char launch[SFC_LAUNCH_SQL_MAX], variant_sql[4 * SFC_LAUNCH_SQL_MAX];
  if (sfc_launch_columns(launch, sizeof launch, "", "") < 0)
    return sfc_fail(c, SF_ERR_NOMEM, "cache %s: launch columns too long",
                    c->path);
  snprintf(variant_sql, sizeof variant_sql,
           "INSERT OR IGNORE INTO main.layer_variants(" VARIANT_OWN_COLS
           ", %s) SELECT " VARIANT_OWN_COLS ", %s FROM " SRC
           ".layer_variants v WHERE" VARIANT_NEW("v") " AND" VARIANT_PICK("v"),
           launch, launch);

  /* Order matters for layers: blobs and variants of layers new to the
   * destination first, then the layer rows themselves. */
  const char *const all_sql[] = {
      /* binaries: a damaged copy here is repaired from the source */
      "INSERT INTO main.binaries(" BINARY_COLS ") SELECT " BINARY_COLS
      " FROM " SRC ".binaries b WHERE NOT ?1 OR b.source_sha256 IN"
      " (SELECT v.source_sha256 FROM " SRC ".layer_variants v WHERE"
      VARIANT_PICK("v") ")"
      " ON CONFLICT(key) DO UPDATE SET blob = excluded.blob,"
      " sha256 = excluded.sha256, kind = excluded.kind"
      " WHERE sf_sha256(binaries.blob) IS NOT binaries.sha256",
      "INSERT OR IGNORE INTO main.envs(" ENV_COLS ") SELECT " ENV_COLS
      " FROM " SRC ".envs WHERE NOT ?1",
      "INSERT OR IGNORE INTO main.matrices(" MATRIX_COLS ") SELECT "
      MATRIX_COLS " FROM " SRC ".matrices m WHERE NOT ?1 OR m.fingerprint IN"
      " (SELECT l.matrix_fp FROM " SRC ".layers l WHERE" LAYER_PICK("l") ")",
      "INSERT OR IGNORE INTO main.trials(" TRIAL_COLS ") SELECT " TRIAL_COLS
      " FROM " SRC ".trials WHERE NOT ?1",
      "INSERT INTO main.blobs(sha256, size, data)"
      " SELECT b.sha256, b.size, b.data FROM " SRC ".blobs b"
      " WHERE b.sha256 IN (SELECT v.packed_sha256 FROM " SRC
      ".layer_variants v WHERE" VARIANT_NEW("v") " AND" VARIANT_PICK("v") ")"
      " ON CONFLICT(sha256) DO UPDATE SET size = excluded.size,"
      " data = excluded.data WHERE sf_sha256(blobs.data) IS NOT blobs.sha256",
      variant_sql,
      "INSERT OR IGNORE INTO main.layers(" LAYER_COLS ") SELECT " LAYER_COLS
      " FROM " SRC ".layers l WHERE" LAYER_PICK("l")
      " AND EXISTS (SELECT 1 FROM main.layer_variants v"
      " WHERE v.layer_name = l.name AND v.gpu_name = l.gpu_name)",
  };
  for (size_t i = 0; i < sizeof all_sql / sizeof all_sql[0]; i++) {
    sqlite3_stmt *st;
    if ((s = sfc_prepare(c, all_sql[i], &st))) return s;
    sqlite3_bind_int(st, 1, a->exporting);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "copying records");
    a->added += sqlite3_changes(c->db);
  }
  return SF_OK;
}

/* Checks `src_path` like a read-only open would, attaches it read-only as
 * SRC, copies, detaches. */
static sf_status merge_from(sf_cache *c, const char *src_path, int exporting,
                            int64_t *added) {
  sf_cache *probe = NULL;
  sf_status s = sf_cache_open(src_path, SF_CACHE_READONLY, &probe);
  if (s) {
    sfc_fail(c, s, "%s", probe ? probe->msg : "out of memory");
    sf_cache_close(probe);
    return s;
  }
  sf_cache_close(probe);

  /* The export filter's table (empty and unused by a merge). */
  int rc = sqlite3_exec(c->db,
                        "CREATE TEMP TABLE IF NOT EXISTS sf_export_names("
                        "name TEXT PRIMARY KEY)",
                        NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "preparing the copy");

  char *uri = sfc_path_uri(src_path, "?mode=ro");
  if (!uri) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  sqlite3_stmt *st;
  s = sfc_prepare(c, "ATTACH DATABASE ?1 AS " SRC, &st);
  if (s) {
    free(uri);
    return s;
  }
  sqlite3_bind_text(st, 1, uri, -1, SQLITE_STATIC);
  rc = sqlite3_step(st);
  sqlite3_finalize(st);
  free(uri);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, "attaching the source cache");
  merge_args a = {exporting, 0, src_path};
  s = sfc_write_tx(c, exporting ? "export" : "merge", merge_body, &a);
  sqlite3_exec(c->db, "DETACH DATABASE " SRC, NULL, NULL, NULL);
  if (s == SF_OK && added) *added = a.added;
  return s;
}

sf_status sf_cache_merge(sf_cache *cache, const char *other_path,
                         int64_t *added) {
  if (!cache) return SF_ERR_INVALID_ARG;
  if (added) *added = 0;
  if (!other_path || !other_path[0])
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_merge: other_path is %s",
                    other_path ? "empty" : "NULL");
  sf_status s = sfc_require_writable(cache, "merge");
  if (s) return s;
  return merge_from(cache, other_path, 0, added);
}

/* ---- export --------------------------------------------------------- */

static sf_status fill_names(sf_cache *src, sf_cache *dst,
                            const char *const *names) {
  int rc = sqlite3_exec(dst->db,
                        "CREATE TEMP TABLE IF NOT EXISTS sf_export_names("
                        "name TEXT PRIMARY KEY);"
                        "DELETE FROM temp.sf_export_names",
                        NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(dst, rc, "listing layers to export");
  sqlite3_stmt *ins, *all = NULL;
  sf_status s = sfc_prepare(
      dst, "INSERT OR IGNORE INTO temp.sf_export_names(name) VALUES(?1)", &ins);
  if (s) return s;
  if (names) {
    for (; *names && !s; names++) {
      sqlite3_bind_text(ins, 1, *names, -1, SQLITE_STATIC);
      if (sqlite3_step(ins) != SQLITE_DONE)
        s = sfc_db_fail(dst, sqlite3_errcode(dst->db), "listing layers");
      sqlite3_reset(ins);
    }
  } else if ((s = sfc_prepare(src, "SELECT DISTINCT name FROM layers", &all))) {
    s = sfc_fail(dst, s, "%s", src->msg);
  } else {
    while (!s && (rc = sqlite3_step(all)) == SQLITE_ROW) {
      sqlite3_bind_text(ins, 1, (const char *)sqlite3_column_text(all, 0), -1,
                        SQLITE_TRANSIENT);
      if (sqlite3_step(ins) != SQLITE_DONE)
        s = sfc_db_fail(dst, sqlite3_errcode(dst->db), "listing layers");
      sqlite3_reset(ins);
    }
    if (!s && rc != SQLITE_DONE) {
      sfc_db_fail(src, rc, "listing layers");
      s = sfc_fail(dst, src->code, "%s", src->msg);
    }
    sqlite3_finalize(all);
  }
  sqlite3_finalize(ins);
  return s;
}

sf_status sf_cache_export(sf_cache *cache, const char *dest_path,
                          const char *const *layer_names, int64_t *added) {
  if (!cache) return SF_ERR_INVALID_ARG;
  if (added) *added = 0;
  const char *fn = "sf_cache_export";
  if (!dest_path || !dest_path[0])
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "%s: dest_path is %s", fn,
                    dest_path ? "empty" : "NULL");
  /* Every named layer must exist before anything is written. */
  if (layer_names) {
    sqlite3_stmt *q;
    sf_status s = sfc_prepare(cache, "SELECT 1 FROM layers WHERE name = ?1", &q);
    if (s) return s;
    for (const char *const *n = layer_names; *n; n++) {
      sqlite3_bind_text(q, 1, *n, -1, SQLITE_STATIC);
      int rc = sqlite3_step(q);
      sqlite3_reset(q);
      if (rc == SQLITE_DONE) {
        sqlite3_finalize(q);
        return sfc_fail(cache, SF_ERR_NOT_FOUND,
                        "cache %s: no layer named %s to export", cache->path,
                        *n);
      }
      if (rc != SQLITE_ROW) {
        sqlite3_finalize(q);
        return sfc_db_fail(cache, rc, "looking up layers to export");
      }
    }
    sqlite3_finalize(q);
  }
  sf_cache *dst = NULL;
  sf_status s = sf_cache_open(dest_path, SF_CACHE_CREATE, &dst);
  if (!s) s = fill_names(cache, dst, layer_names);
  if (!s) s = merge_from(dst, cache->path, 1, added);
  if (s) sfc_fail(cache, s, "%s", dst ? dst->msg : "out of memory");
  sf_cache_close(dst);
  return s;
}

/* ---- counts --------------------------------------------------------- */

sf_status sf_cache_count(sf_cache *cache, sf_cache_counts *out) {
  if (!cache) return SF_ERR_INVALID_ARG;
  if (!out)
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_count: out is NULL");
  memset(out, 0, sizeof *out);
  sqlite3_stmt *st;
  sf_status s = sfc_prepare(
      cache,
      "SELECT (SELECT count(*) FROM binaries), (SELECT count(*) FROM envs),"
      " (SELECT count(*) FROM matrices), (SELECT count(*) FROM trials),"
      " (SELECT count(*) FROM winners), (SELECT count(*) FROM layers),"
      " (SELECT count(*) FROM layer_variants), (SELECT count(*) FROM blobs),"
      " (SELECT coalesce(sum(length(blob)), 0) FROM binaries)"
      "  + (SELECT coalesce(sum(size), 0) FROM blobs)",
      &st);
  if (s) return s;
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    out->binaries = sqlite3_column_int64(st, 0);
    out->envs = sqlite3_column_int64(st, 1);
    out->matrices = sqlite3_column_int64(st, 2);
    out->trials = sqlite3_column_int64(st, 3);
    out->winners = sqlite3_column_int64(st, 4);
    out->layers = sqlite3_column_int64(st, 5);
    out->layer_variants = sqlite3_column_int64(st, 6);
    out->blobs = sqlite3_column_int64(st, 7);
    out->blob_bytes = sqlite3_column_int64(st, 8);
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW) return sfc_db_fail(cache, rc, "counting records");
  return SF_OK;
}
