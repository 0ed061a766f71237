/*
 * merge.c -- copying records between cache files (merge, export) and the
 * per-table counts.
 *
 * Both merge and export attach the source file read-only to the connection
 * of the cache being written and copy with INSERT OR IGNORE: what the
 * destination already holds wins, so copying twice adds nothing.  Layers
 * are copied whole: a layer (name, GPU) already in the destination keeps
 * all of its own variants.  Damage stays in its record: a binary whose
 * bytes fail their sha256, or a layer any of whose variants' packed
 * weights fail theirs (or are missing), is skipped and reported, and every
 * other record is copied.  An export to a new file writes a temporary file
 * beside it and renames it into place once it is complete.
 */
#include "cache_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
/* Binaries of the source to copy: all, or those of the picked layers. */
#define BINARY_PICK(alias)                                                 \
  " (NOT ?1 OR " alias ".source_sha256 IN (SELECT v.source_sha256 FROM "   \
  SRC ".layer_variants v WHERE" VARIANT_PICK("v") "))"
/* A layer (name, GPU) not skipped for damage. */
#define NOT_SKIPPED(name, gpu)                                             \
  " NOT EXISTS (SELECT 1 FROM temp.sf_skip_layers s WHERE s.name = " name  \
  " AND s.gpu_name = " gpu ")"
/* A source variant whose layer is not yet in the destination, and not
 * skipped. */
#define VARIANT_NEW(alias)                                                 \
  " NOT EXISTS (SELECT 1 FROM main.layers l WHERE l.name = " alias         \
  ".layer_name AND l.gpu_name = " alias ".gpu_name)"                       \
  " AND EXISTS (SELECT 1 FROM " SRC ".layers sl WHERE sl.name = " alias    \
  ".layer_name AND sl.gpu_name = " alias ".gpu_name)"                      \
  " AND" NOT_SKIPPED(alias ".layer_name", alias ".gpu_name")

/* ---- the records skipped -------------------------------------------- */

/* Messages of the records a copy skipped, handed to the caller's callback
 * once the copy has committed. */
typedef struct {
  char **v;
  int n, cap;
} skip_list;

static void skips_free(skip_list *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static sf_status skips_add(sf_cache *c, skip_list *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sf_status skips_add(sf_cache *c, skip_list *l, const char *fmt, ...) {
  char msg[SF_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  sf__vformat(msg, fmt, ap);
  va_end(ap);
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 8;
    char **nv = realloc(l->v, (size_t)cap * sizeof *nv);
    if (!nv) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
    l->v = nv;
    l->cap = cap;
  }
  if (!(l->v[l->n] = sf__strdup(msg)))
    return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  l->n++;
  return SF_OK;
}

static void skips_deliver(const skip_list *l, sf_skip_cb cb, void *user) {
  for (int i = 0; cb && i < l->n; i++) cb(l->v[i], user);
}

/* ---- merge ---------------------------------------------------------- */

typedef struct {
  int exporting;   /* 1: only the named layers, their binaries, matrices */
  int64_t added;
  const char *src_path;  /* the source's name in messages */
  skip_list skipped;
} merge_args;

/* A failure reading the source: the message names the source. */
static sf_status src_fail(sf_cache *c, const merge_args *a, int rc,
                          const char *what) {
  sf_status st = sfc_status_of(rc);
  return sfc_fail(c, st ? st : SF_ERR_DB, "cache %s: %s: %s", a->src_path,
                  what, sqlite3_errmsg(c->db));
}

/* Prepares `sql` with ?1 bound to a->exporting. */
static sf_status prepare_picked(sf_cache *c, const merge_args *a,
                                const char *sql, sqlite3_stmt **st) {
  sf_status s = sfc_prepare(c, sql, st);
  if (!s) sqlite3_bind_int(*st, 1, a->exporting);
  return s;
}

/* Runs one statement of the copy (?1: a->exporting); counts its rows. */
static sf_status run_picked(sf_cache *c, merge_args *a, const char *sql,
                            const char *what, int64_t *changes) {
  sqlite3_stmt *st;
  sf_status s = prepare_picked(c, a, sql, &st);
  if (s) return s;
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return sfc_db_fail(c, rc, what);
  if (changes) *changes += sqlite3_changes(c->db);
  return SF_OK;
}

/* Binaries of the source whose bytes fail their sha256: listed in
 * temp.sf_skip_binaries, and reported unless the destination already
 * holds the same key intact (then nothing is lost). */
static sf_status skip_bad_binaries(sf_cache *c, merge_args *a) {
  sqlite3_stmt *q = NULL, *ins = NULL, *have = NULL;
  sf_status s;
  if ((s = prepare_picked(c, a,
                          "SELECT b.key, b.arch, length(b.blob),"
                          " sf_sha256(b.blob), b.sha256 FROM " SRC
                          ".binaries b WHERE" BINARY_PICK("b")
                          " AND sf_sha256(b.blob) IS NOT b.sha256"
                          " ORDER BY b.key",
                          &q)) ||
      (s = sfc_prepare(c,
                       "INSERT OR IGNORE INTO temp.sf_skip_binaries(key)"
                       " VALUES(?1)",
                       &ins)) ||
      (s = sfc_prepare(c,
                       "SELECT 1 FROM main.binaries WHERE key = ?1"
                       " AND sf_sha256(blob) IS sha256",
                       &have)))
    goto done;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *key = (const char *)sqlite3_column_text(q, 0);
    sqlite3_bind_text(ins, 1, key, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    if (rc != SQLITE_DONE) {
      s = sfc_db_fail(c, rc, "listing damaged binaries");
      goto done;
    }
    sqlite3_bind_text(have, 1, key, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(have);
    sqlite3_reset(have);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      s = sfc_db_fail(c, rc, "looking up a binary");
      goto done;
    }
    if (rc == SQLITE_ROW) continue;
    const char *got = (const char *)sqlite3_column_text(q, 3);
    const char *want = (const char *)sqlite3_column_text(q, 4);
    if ((s = skips_add(c, &a->skipped,
                       "%s: binary %s (%s) skipped: its bytes failed their "
                       "sha256: %lld bytes hash to %s, not the stored %s",
                       a->src_path, key,
                       (const char *)sqlite3_column_text(q, 1),
                       (long long)sqlite3_column_int64(q, 2),
                       got ? got : "?", want ? want : "(none)")))
      goto done;
  }
  if (rc != SQLITE_DONE) s = src_fail(c, a, rc, "reading its binaries");
done:
  sqlite3_finalize(q);
  sqlite3_finalize(ins);
  sqlite3_finalize(have);
  return s;
}

/* Layers of the source that the destination lacks and any of whose
 * variants' packed weights are missing or fail their sha256 (or that have
 * no variants): listed in temp.sf_skip_layers and reported with the
 * problem sf_cache_layers gives them.  Each blob is hashed once. */
static sf_status skip_bad_layers(sf_cache *c, merge_args *a) {
  sf_status s = run_picked(
      c, a,
      "INSERT INTO temp.sf_bad_blobs(sha256, size, got)"
      " SELECT b.sha256, length(b.data), sf_sha256(b.data) FROM " SRC
      ".blobs b WHERE b.sha256 IN (SELECT v.packed_sha256 FROM " SRC
      ".layer_variants v WHERE" VARIANT_NEW("v") " AND" VARIANT_PICK("v") ")"
      " AND sf_sha256(b.data) IS NOT b.sha256",
      "checking packed weights", NULL);
  if (s) return s;
  sqlite3_stmt *q = NULL, *ins = NULL;
  if ((s = prepare_picked(
           c, a,
           "SELECT l.name, l.gpu_name, v.n_bucket IS NOT NULL, v.n_bucket,"
           " v.packed_sha256, v.packed_size, b.sha256 IS NOT NULL,"
           " coalesce(x.size, length(b.data)), coalesce(x.got, b.sha256)"
           " FROM " SRC ".layers l"
           " LEFT JOIN " SRC ".layer_variants v"
           "  ON v.layer_name = l.name AND v.gpu_name = l.gpu_name"
           " LEFT JOIN " SRC ".blobs b ON b.sha256 = v.packed_sha256"
           " LEFT JOIN temp.sf_bad_blobs x ON x.sha256 = v.packed_sha256"
           " WHERE" LAYER_PICK("l") " AND NOT EXISTS (SELECT 1 FROM"
           " main.layers d WHERE d.name = l.name AND d.gpu_name = l.gpu_name)"
           " ORDER BY l.name, l.gpu_name, v.n_bucket",
           &q)) ||
      (s = sfc_prepare(c,
                       "INSERT OR IGNORE INTO temp.sf_skip_layers(name,"
                       " gpu_name) VALUES(?1, ?2)",
                       &ins)))
    goto done;
  /* The rows come layer by layer: `index` counts a layer's variants, and
   * `decided` is set once its first problem is reported. */
  char *name = NULL, *gpu = NULL;
  int index = 0, decided = 0, rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *n = (const char *)sqlite3_column_text(q, 0);
    const char *g = (const char *)sqlite3_column_text(q, 1);
    if (!name || strcmp(name, n) != 0 || strcmp(gpu, g) != 0) {
      free(name);
      free(gpu);
      name = sf__strdup(n);
      gpu = sf__strdup(g);
      if (!name || !gpu) {
        s = sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
        break;
      }
      index = 0;
      decided = 0;
    }
    if (decided) continue;
    char buf[512];
    const char *why =
        !sqlite3_column_int(q, 2)
            ? "it has no variants"
            : sfc_packed_problem(buf, sizeof buf, index,
                                 sqlite3_column_int64(q, 3),
                                 (const char *)sqlite3_column_text(q, 4),
                                 sqlite3_column_int64(q, 5),
                                 sqlite3_column_int(q, 6),
                                 sqlite3_column_int64(q, 7),
                                 (const char *)sqlite3_column_text(q, 8));
    index++;
    if (!why) continue;
    decided = 1;
    sqlite3_bind_text(ins, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins, 2, gpu, -1, SQLITE_STATIC);
    int irc = sqlite3_step(ins);
    sqlite3_reset(ins);
    if (irc != SQLITE_DONE) {
      s = sfc_db_fail(c, irc, "listing damaged layers");
      break;
    }
    if ((s = skips_add(c, &a->skipped, "%s: layer \"%s\" (%s) skipped: %s",
                       a->src_path, name, gpu, why)))
      break;
  }
  if (!s && rc != SQLITE_DONE) s = src_fail(c, a, rc, "reading its layers");
  free(name);
  free(gpu);
done:
  sqlite3_finalize(q);
  sqlite3_finalize(ins);
  return s;
}

static sf_status merge_body(sf_cache *c, void *arg) {
  merge_args *a = arg;
  sf_status s = sfc_check_schema(c, SRC, a->src_path);
  if (s) return s;
  int rc = sqlite3_exec(c->db,
                        "DELETE FROM temp.sf_skip_layers;"
                        "DELETE FROM temp.sf_skip_binaries;"
                        "DELETE FROM temp.sf_bad_blobs",
                        NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "preparing the copy");
  /* What is damaged stays behind, each record on its own. */
  if ((s = skip_bad_binaries(c, a)) || (s = skip_bad_layers(c, a))) return s;

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
      " FROM " SRC ".binaries b WHERE" BINARY_PICK("b")
      " AND b.key NOT IN (SELECT key FROM temp.sf_skip_binaries)"
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
      /* only the blobs of layers copied whole: every one of them is good */
      "INSERT INTO main.blobs(sha256, size, data)"
      " SELECT b.sha256, b.size, b.data FROM " SRC ".blobs b"
      " WHERE b.sha256 IN (SELECT v.packed_sha256 FROM " SRC
      ".layer_variants v WHERE" VARIANT_NEW("v") " AND" VARIANT_PICK("v") ")"
      " ON CONFLICT(sha256) DO UPDATE SET size = excluded.size,"
      " data = excluded.data WHERE sf_sha256(blobs.data) IS NOT blobs.sha256",
      variant_sql,
      "INSERT OR IGNORE INTO main.layers(" LAYER_COLS ") SELECT " LAYER_COLS
      " FROM " SRC ".layers l WHERE" LAYER_PICK("l")
      " AND" NOT_SKIPPED("l.name", "l.gpu_name")
      " AND EXISTS (SELECT 1 FROM main.layer_variants v"
      " WHERE v.layer_name = l.name AND v.gpu_name = l.gpu_name)",
  };
  for (size_t i = 0; i < sizeof all_sql / sizeof all_sql[0]; i++)
    if ((s = run_picked(c, a, all_sql[i], "copying records", &a->added)))
      return s;
  return SF_OK;
}

/* The temporary tables of a copy: the layers an export picks, and what
 * merge_body finds damaged. */
static sf_status create_temp_tables(sf_cache *c) {
  int rc = sqlite3_exec(
      c->db,
      "CREATE TEMP TABLE IF NOT EXISTS sf_export_names(name TEXT PRIMARY KEY);"
      "CREATE TEMP TABLE IF NOT EXISTS sf_skip_layers(name TEXT NOT NULL,"
      " gpu_name TEXT NOT NULL, PRIMARY KEY(name, gpu_name));"
      "CREATE TEMP TABLE IF NOT EXISTS sf_skip_binaries(key TEXT PRIMARY KEY);"
      "CREATE TEMP TABLE IF NOT EXISTS sf_bad_blobs(sha256 TEXT PRIMARY KEY,"
      " size INTEGER, got TEXT)",
      NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "preparing the copy");
  return SF_OK;
}

/* Checks the file `src_file` (named `src_path` in messages) like a
 * read-only open would, attaches it read-only as SRC the same way, copies,
 * detaches.  On success *added and *skipped (which the caller frees) tell
 * what was copied and what was not. */
static sf_status merge_from(sf_cache *c, const char *src_file,
                            const char *src_path, int exporting,
                            int64_t *added, skip_list *skipped) {
  sf_cache *probe = NULL;
  sf_status s = sfc_open(src_file, src_path, SF_CACHE_READONLY, &probe);
  if (s) {
    sfc_fail(c, s, "%s", probe ? probe->msg : "out of memory");
    sf_cache_close(probe);
    return s;
  }
  char *uri = sfc_path_uri(src_file, probe->ro_query);
  sf_cache_close(probe);
  if (!uri) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  if ((s = create_temp_tables(c))) {
    free(uri);
    return s;
  }
  merge_args a = {exporting, 0, src_path, {0}};
  sqlite3_stmt *st;
  s = sfc_prepare(c, "ATTACH DATABASE ?1 AS " SRC, &st);
  if (s) {
    free(uri);
    return s;
  }
  sqlite3_bind_text(st, 1, uri, -1, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  free(uri);
  if (rc != SQLITE_DONE) return src_fail(c, &a, rc, "cannot attach it to read it");
  s = sfc_write_tx(c, exporting ? "export" : "merge", merge_body, &a);
  sqlite3_exec(c->db, "DETACH DATABASE " SRC, NULL, NULL, NULL);
  if (s == SF_OK) {
    *added = a.added;
    *skipped = a.skipped;
  } else {
    skips_free(&a.skipped);
  }
  return s;
}

sf_status sf_cache_merge(sf_cache *cache, const char *other_path,
                         int64_t *added, sf_skip_cb skipped, void *user) {
  if (!cache) return SF_ERR_INVALID_ARG;
  if (added) *added = 0;
  if (!other_path || !other_path[0])
    return sfc_fail(cache, SF_ERR_INVALID_ARG, "sf_cache_merge: other_path is %s",
                    other_path ? "empty" : "NULL");
  sf_status s = sfc_require_writable(cache, "merge");
  if (s) return s;
  int64_t n = 0;
  skip_list sk = {0};
  s = merge_from(cache, other_path, other_path, 0, &n, &sk);
  if (s == SF_OK) {
    if (added) *added = n;
    skips_deliver(&sk, skipped, user);
  }
  skips_free(&sk);
  return s;
}

/* ---- export --------------------------------------------------------- */

static sf_status fill_names(sf_cache *src, sf_cache *dst,
                            const char *const *names) {
  sf_status s = create_temp_tables(dst);
  if (s) return s;
  int rc = sqlite3_exec(dst->db, "DELETE FROM temp.sf_export_names", NULL,
                        NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(dst, rc, "listing layers to export");
  sqlite3_stmt *ins, *all = NULL;
  s = sfc_prepare(
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

/* Switches the written file to journal_mode DELETE and closes its
 * connection, so that it is one self-contained file (no -wal, no -shm)
 * that opens read-only anywhere.  While another process holds the file
 * open it stays in WAL mode; that is a failure only for a file the export
 * created (`required`), which nobody else knows of. */
static sf_status close_as_one_file(sf_cache *c, int required) {
  if (!required) sqlite3_busy_timeout(c->db, 0); /* never wait for others */
  sqlite3_stmt *q;
  sf_status s = sfc_prepare(c, "PRAGMA journal_mode = DELETE", &q);
  if (s) return s;
  int rc = sqlite3_step(q);
  int switched = rc == SQLITE_ROW && sqlite3_column_text(q, 0) &&
                 strcmp((const char *)sqlite3_column_text(q, 0), "delete") == 0;
  sqlite3_finalize(q);
  if (!switched && required)
    return sfc_db_fail(c, rc == SQLITE_ROW ? SQLITE_ERROR : rc,
                       "switching the exported file to journal_mode DELETE");
  rc = sqlite3_close(c->db);
  if (rc != SQLITE_OK) {
    s = sfc_db_fail(c, rc, "closing the exported file");
    sqlite3_close_v2(c->db);
  }
  c->db = NULL;
  return required ? s : SF_OK;
}

/* Whether a database file or any of its side files exists; with
 * `remove`, removes those that do. */
static int db_files(const char *file, int remove) {
  static const char *const suffixes[] = {"", "-wal", "-shm", "-journal"};
  size_t size = strlen(file) + sizeof "-journal";
  char *p = malloc(size);
  if (!p) return remove ? (unlink(file), 0) : 1;
  int found = 0;
  for (int i = 0; i < 4; i++) {
    struct stat sb;
    snprintf(p, size, "%s%s", file, suffixes[i]);
    if (lstat(p, &sb) == 0) {
      found = 1;
      if (remove) unlink(p);
    }
  }
  free(p);
  return found;
}

/* A name for the temporary file an export to `dest` writes: beside it (so
 * that the rename stays on one file system), unused, with no side files.
 * NULL on NOMEM or when no name is free after many tries. */
static char *temp_name(const char *dest) {
  static atomic_uint counter;
  size_t size = strlen(dest) + 64;
  char *name = malloc(size);
  if (!name) return NULL;
  for (int attempt = 0; attempt < 100; attempt++) {
    snprintf(name, size, "%s.%ld-%u.export-tmp", dest, (long)getpid(),
             atomic_fetch_add(&counter, 1));
    if (!db_files(name, 0)) return name;
  }
  free(name);
  return NULL;
}

/* Gives the complete temporary file its name.  A file that appeared at
 * `dest` meanwhile is left alone (link refuses to replace it), except on
 * file systems without hard links, where rename does the move. */
static sf_status put_in_place(sf_cache *c, const char *tmp, const char *dest) {
  if (link(tmp, dest) == 0) {
    unlink(tmp);
    return SF_OK;
  }
  int err = errno;
  if (err == EEXIST)
    return sfc_fail(c, SF_ERR_IO,
                    "cache %s: the file appeared while the export was being "
                    "written; it was left as it is and nothing was exported",
                    dest);
  if (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS ||
      err == EMLINK) {
    if (rename(tmp, dest) == 0) return SF_OK;
    err = errno;
  }
  return sfc_fail(c, SF_ERR_IO, "cache %s: cannot put the exported file in "
                                "place (from %s): %s",
                  dest, tmp, strerror(err));
}

sf_status sf_cache_export(sf_cache *cache, const char *dest_path,
                          const char *const *layer_names, int64_t *added,
                          sf_skip_cb skipped, void *user) {
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
  /* A new destination is written under a temporary name beside it and
   * renamed into place once complete: a failure leaves no file behind. */
  struct stat sb;
  char *tmp = NULL;
  if (lstat(dest_path, &sb) != 0 && errno == ENOENT &&
      !(tmp = temp_name(dest_path)))
    return sfc_fail(cache, SF_ERR_IO,
                    "cache %s: no temporary name beside it is free (or out "
                    "of memory)",
                    dest_path);
  sf_cache *dst = NULL;
  int64_t n = 0;
  skip_list sk = {0};
  sf_status s = sfc_open(tmp ? tmp : dest_path, dest_path, SF_CACHE_CREATE, &dst);
  if (!s) s = fill_names(cache, dst, layer_names);
  if (!s) s = merge_from(dst, cache->file, cache->path, 1, &n, &sk);
  if (!s) s = close_as_one_file(dst, tmp != NULL);
  if (!s && tmp) s = put_in_place(dst, tmp, dest_path);
  if (s) sfc_fail(cache, s, "%s", dst ? dst->msg : "out of memory");
  sf_cache_close(dst);
  if (tmp && s) db_files(tmp, 1);
  free(tmp);
  if (s == SF_OK) {
    if (added) *added = n;
    skips_deliver(&sk, skipped, user);
  }
  skips_free(&sk);
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
