/*
 * cache.c -- the SQLite cache: opening (with every check made before the
 * first write, and read-only connections that work in read-only
 * directories and on read-only media), the schema, error messages and
 * write transactions.
 *
 * The records themselves are in records.c (binaries, environments,
 * matrices, trials), layers.c (layers and packed blobs) and merge.c (merge,
 * export, counts).
 */
#include "cache_internal.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SFC_BUSY_TIMEOUT_MS 30000
/* Extra attempts when SQLite reports busy without waiting (e.g. a journal
 * mode switch racing another process), beyond the 30 s busy handler. */
#define SFC_BUSY_RETRIES 50

/* ---- errors --------------------------------------------------------- */

sf_status sfc_fail(sf_cache *c, sf_status st, const char *fmt, ...) {
  if (!c) return st;
  va_list ap;
  va_start(ap, fmt);
  sf__vformat(c->msg, fmt, ap);
  va_end(ap);
  c->code = st;
  return st;
}

sf_status sfc_status_of(int rc) {
  switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
      return SF_OK;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return SF_ERR_BUSY;
    case SQLITE_NOMEM:
      return SF_ERR_NOMEM;
    case SQLITE_NOTADB:
      return SF_ERR_NOT_A_DB;
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_FULL:
      return SF_ERR_IO;
    default:
      return SF_ERR_DB;
  }
}

sf_status sfc_db_fail(sf_cache *c, int rc, const char *what) {
  const char *m = c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc);
  return sfc_fail(c, sfc_status_of(rc) == SF_OK ? SF_ERR_DB : sfc_status_of(rc),
                  "cache %s: %s: %s", c->path ? c->path : "?", what, m);
}

sf_status sfc_prepare(sf_cache *c, const char *sql, sqlite3_stmt **st) {
  int rc = sqlite3_prepare_v2(c->db, sql, -1, st, NULL);
  if (rc != SQLITE_OK) {
    *st = NULL;
    return sfc_db_fail(c, rc, "preparing a statement");
  }
  return SF_OK;
}

sf_status sfc_require_writable(sf_cache *c, const char *what) {
  if (!c->readonly) return SF_OK;
  return sfc_fail(c, SF_ERR_DB,
                  "cache %s: cannot %s: the cache was opened read-only "
                  "(SF_CACHE_READONLY)",
                  c->path, what);
}

const char *sf_cache_errmsg(const sf_cache *cache) {
  if (!cache) return "NULL cache";
  return cache->msg;
}

sf_status sf_cache_errcode(const sf_cache *cache) {
  if (!cache) return SF_ERR_INVALID_ARG;
  return cache->code;
}

/* ---- small helpers -------------------------------------------------- */

double sfc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int sfc_bind_real(sqlite3_stmt *st, int i, double v) {
  if (v != v) return sqlite3_bind_null(st, i);
  return sqlite3_bind_double(st, i, v);
}

double sfc_column_real(sqlite3_stmt *st, int i) {
  if (sqlite3_column_type(st, i) == SQLITE_NULL) return (double)NAN;
  return sqlite3_column_double(st, i);
}

int sfc_bind_blob(sqlite3_stmt *st, int i, const void *data, size_t size) {
  if (size == 0) return sqlite3_bind_zeroblob(st, i, 0);
  return sqlite3_bind_blob64(st, i, data, (sqlite3_uint64)size, SQLITE_STATIC);
}

int sfc_bind_text(sqlite3_stmt *st, int i, const char *s) {
  if (!s) return sqlite3_bind_null(st, i);
  return sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
}

char *sfc_path_uri(const char *path, const char *query) {
  size_t n = strlen(path), q = strlen(query);
  /* "file://" + up to 3 bytes per character + query + NUL */
  char *out = malloc(8 + 3 * n + q + 1);
  if (!out) return NULL;
  char *o = out;
  /* An absolute path becomes file:///abs (empty authority); a relative one
   * file:rel, which SQLite resolves against the working directory. */
  if (path[0] == '/') {
    memcpy(o, "file://", 7);
    o += 7;
  } else {
    memcpy(o, "file:", 5);
    o += 5;
  }
  static const char hex[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)path[i];
    if (ch <= 0x20 || ch >= 0x7f || ch == '%' || ch == '?' || ch == '#') {
      *o++ = '%';
      *o++ = hex[ch >> 4];
      *o++ = hex[ch & 15];
    } else {
      *o++ = (char)ch;
    }
  }
  memcpy(o, query, q + 1);
  return out;
}

/* sf_sha256(blob) as an SQL function: lets SQL compare a stored blob with
 * its stored hash (put repairs, merge checks). */
static void sql_sha256(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  (void)argc;
  if (sqlite3_value_type(argv[0]) == SQLITE_NULL) {
    sqlite3_result_null(ctx);
    return;
  }
  const void *p = sqlite3_value_blob(argv[0]);
  int n = sqlite3_value_bytes(argv[0]);
  char hex[65];
  sf__sha256 h;
  sf__sha256_init(&h);
  sf__sha256_update(&h, p, (size_t)n);
  sf__sha256_final_hex(&h, hex);
  sqlite3_result_text(ctx, hex, 64, SQLITE_TRANSIENT);
}

/* ---- transactions --------------------------------------------------- */

static int is_busy(int rc) {
  return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED;
}

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

sf_status sfc_write_tx(sf_cache *c, const char *what, sfc_body body,
                       void *arg) {
  sf_status st = sfc_require_writable(c, what);
  if (st) return st;
  int rc;
  for (int attempt = 0;; attempt++) {
    rc = sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK) break;
    if (!is_busy(rc) || attempt >= SFC_BUSY_RETRIES)
      return sfc_db_fail(c, rc, "starting a write transaction");
    nap_ms(20 + 10 * (attempt % 8));
  }
  st = body(c, arg);
  if (st == SF_OK) {
    for (int attempt = 0;; attempt++) {
      rc = sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL);
      if (rc == SQLITE_OK) return SF_OK;
      if (!is_busy(rc) || attempt >= SFC_BUSY_RETRIES) break;
      nap_ms(20 + 10 * (attempt % 8));
    }
    st = sfc_db_fail(c, rc, "committing");
  }
  if (!sqlite3_get_autocommit(c->db))
    sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
  return st;
}

/* ---- schema --------------------------------------------------------- */

/* Version 1.  Every blob is stored beside its sha256 (hex).  NaN timings
 * are stored as NULL.  A format: the %s in layer_variants is the launch
 * record's columns (schema_v1). */
static const char SCHEMA_V1[] =
    "CREATE TABLE IF NOT EXISTS binaries("
    " key TEXT PRIMARY KEY NOT NULL,"  /* sf_binary_key_hex */
    " source TEXT NOT NULL,"
    " source_sha256 TEXT NOT NULL,"    /* to match layer variants' sources */
    " options TEXT NOT NULL,"
    " arch TEXT NOT NULL,"
    " nvrtc_version TEXT NOT NULL,"
    " generator_version TEXT NOT NULL,"
    " kind INTEGER NOT NULL,"          /* sf_binary_kind */
    " blob BLOB NOT NULL,"
    " sha256 TEXT NOT NULL,"           /* of blob */
    " created REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS binaries_by_source ON binaries(source_sha256);"
    "CREATE TABLE IF NOT EXISTS envs("
    " env_key TEXT PRIMARY KEY NOT NULL,"
    " name TEXT NOT NULL, cc_major INTEGER NOT NULL, cc_minor INTEGER NOT NULL,"
    " sm_count INTEGER NOT NULL, driver_version INTEGER NOT NULL,"
    " arch TEXT, l2_bytes INTEGER, smem_per_block_optin INTEGER,"
    " smem_per_sm INTEGER, regs_per_block INTEGER,"
    " max_threads_per_block INTEGER, clock_khz INTEGER,"
    " total_mem_bytes INTEGER, created REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS matrices("
    " fingerprint TEXT PRIMARY KEY NOT NULL,"
    " rows INTEGER NOT NULL, cols INTEGER NOT NULL, nnz INTEGER NOT NULL,"
    " dtype TEXT NOT NULL, info TEXT, created REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS trials("
    " env_key TEXT NOT NULL, matrix_fp TEXT NOT NULL, op TEXT NOT NULL,"
    " n INTEGER NOT NULL, config TEXT NOT NULL,"
    " status INTEGER NOT NULL,"        /* sf_trial_status */
    " median_ms REAL, p20_ms REAL, p80_ms REAL, min_ms REAL,"
    " reps INTEGER NOT NULL, max_error REAL, binary_key TEXT, message TEXT,"
    " created REAL NOT NULL,"
    " UNIQUE(env_key, matrix_fp, op, n, config));"
    /* The best ok trial per (env, matrix, op, n): derived, never stored. */
    "CREATE VIEW IF NOT EXISTS winners AS"
    " SELECT env_key, matrix_fp, op, n, config, median_ms, p20_ms, p80_ms,"
    "        min_ms, reps, max_error, binary_key, created FROM ("
    "  SELECT *, row_number() OVER (PARTITION BY env_key, matrix_fp, op, n"
    "                               ORDER BY median_ms, config) AS rank_"
    "  FROM trials WHERE status = 0 AND median_ms IS NOT NULL)"
    " WHERE rank_ = 1;"
    /* Packed weights, deduplicated by their sha256. */
    "CREATE TABLE IF NOT EXISTS blobs("
    " sha256 TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL,"
    " data BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS layers("
    " name TEXT NOT NULL, gpu_name TEXT NOT NULL,"
    " matrix_fp TEXT NOT NULL, op TEXT NOT NULL,"
    " rows INTEGER NOT NULL, cols INTEGER NOT NULL,"
    " x_elem_size INTEGER NOT NULL, y_elem_size INTEGER NOT NULL,"
    " created REAL NOT NULL, PRIMARY KEY(name, gpu_name));"
    "CREATE TABLE IF NOT EXISTS layer_variants("
    " layer_name TEXT NOT NULL, gpu_name TEXT NOT NULL,"
    " n_bucket INTEGER NOT NULL,"
    " source TEXT NOT NULL, source_sha256 TEXT NOT NULL,"
    " kernel_name TEXT NOT NULL, options TEXT NOT NULL,"
    " generator_version TEXT NOT NULL,"
    /* here the launch record's columns (columns.c): grid0, grid1, grid2,
     * n_axis, n_tile, block0, block1, block2, shared_bytes, zero_output */
    "%s,"
    " packed_sha256 TEXT NOT NULL,"    /* blobs.sha256 */
    " packed_size INTEGER NOT NULL, config TEXT,"
    " PRIMARY KEY(layer_name, gpu_name, n_bucket));"
    "CREATE INDEX IF NOT EXISTS layer_variants_by_packed"
    " ON layer_variants(packed_sha256);"
    "CREATE INDEX IF NOT EXISTS layer_variants_by_source"
    " ON layer_variants(source_sha256);";

/* SCHEMA_V1 with the launch record's columns, each "<name> INTEGER NOT
 * NULL"; the caller frees it.  NULL on NOMEM. */
static char *schema_v1(void) {
  char launch[SFC_LAUNCH_SQL_MAX];
  if (sfc_launch_columns(launch, sizeof launch, " ", " INTEGER NOT NULL") < 0)
    return NULL;
  size_t size = sizeof SCHEMA_V1 + strlen(launch);
  char *sql = malloc(size);
  if (sql) snprintf(sql, size, SCHEMA_V1, launch);
  return sql;
}

/* One integer from a PRAGMA or query; SQLite status in *rc. */
static int64_t query_int(sqlite3 *db, const char *sql, int *rc) {
  sqlite3_stmt *st = NULL;
  int64_t v = 0;
  *rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (*rc == SQLITE_OK) {
    *rc = sqlite3_step(st);
    if (*rc == SQLITE_ROW) {
      v = sqlite3_column_int64(st, 0);
      *rc = SQLITE_OK;
    } else if (*rc == SQLITE_DONE) {
      *rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(st);
  return v;
}

/* What a database holds, as far as opening it is concerned. */
typedef enum {
  DB_EMPTY,   /* no schema objects, no marker: may become a cache */
  DB_OURS     /* a sparseforge cache this library reads */
} db_state;

/* Classifies schema `schema` of c->db.  Only reads. */
static sf_status classify(sf_cache *c, const char *schema, const char *path,
                          db_state *state, int64_t *version) {
  char sql[160];
  int rc;
  snprintf(sql, sizeof sql, "PRAGMA \"%s\".application_id", schema);
  int64_t app = query_int(c->db, sql, &rc);
  if (rc == SQLITE_OK) {
    snprintf(sql, sizeof sql, "PRAGMA \"%s\".user_version", schema);
    *version = query_int(c->db, sql, &rc);
  }
  int64_t objects = 0;
  if (rc == SQLITE_OK) {
    snprintf(sql, sizeof sql, "SELECT count(*) FROM \"%s\".sqlite_master",
             schema);
    objects = query_int(c->db, sql, &rc);
  }
  if (rc != SQLITE_OK) {
    if ((rc & 0xff) == SQLITE_NOTADB)
      return sfc_fail(c, SF_ERR_NOT_A_DB,
                      "cache %s: not a SQLite database (%s)", path,
                      sqlite3_errmsg(c->db));
    return sfc_fail(c, sfc_status_of(rc) ? sfc_status_of(rc) : SF_ERR_DB,
                    "cache %s: cannot read the database header: %s", path,
                    sqlite3_errmsg(c->db));
  }
  if ((uint32_t)app == (uint32_t)SF_CACHE_APPLICATION_ID) {
    if (*version > SF_CACHE_SCHEMA_VERSION)
      return sfc_fail(c, SF_ERR_DB_VERSION,
                      "cache %s: schema version %lld is newer than this "
                      "library's %d; use a newer sparseforge",
                      path, (long long)*version, SF_CACHE_SCHEMA_VERSION);
    if (*version < 0)
      return sfc_fail(c, SF_ERR_NOT_A_DB,
                      "cache %s: invalid schema version %lld", path,
                      (long long)*version);
    *state = DB_OURS;
    return SF_OK;
  }
  if (app != 0)
    return sfc_fail(c, SF_ERR_NOT_A_DB,
                    "cache %s: a SQLite database of another application "
                    "(application_id 0x%08x, sparseforge's is 0x%08x), not a "
                    "sparseforge cache",
                    path, (unsigned)(uint32_t)app,
                    (unsigned)SF_CACHE_APPLICATION_ID);
  if (objects > 0 || *version != 0)
    return sfc_fail(c, SF_ERR_NOT_A_DB,
                    "cache %s: a SQLite database without the sparseforge "
                    "marker (application_id 0, %lld schema objects, "
                    "user_version %lld), not a sparseforge cache",
                    path, (long long)objects, (long long)*version);
  *state = DB_EMPTY;
  return SF_OK;
}

sf_status sfc_check_schema(sf_cache *c, const char *schema, const char *path) {
  db_state state;
  int64_t version;
  sf_status st = classify(c, schema, path, &state, &version);
  if (st) return st;
  if (state != DB_OURS || version < 1)
    return sfc_fail(c, SF_ERR_NOT_A_DB,
                    "cache %s: an empty SQLite database, not a sparseforge "
                    "cache",
                    path);
  return SF_OK;
}

/* Looks at the file without SQLite: missing, empty, or a SQLite header.
 * *wal is set when the header's format bytes (18 and 19) say WAL. */
typedef enum { FILE_MISSING, FILE_EMPTY, FILE_SQLITE } file_state;

static sf_status probe_file(sf_cache *c, int flags, file_state *fs, int *wal) {
  struct stat sb;
  *wal = 0;
  if (stat(c->file, &sb) != 0) {
    if (errno != ENOENT)
      return sfc_fail(c, SF_ERR_IO, "cache %s: cannot stat: %s", c->path,
                      strerror(errno));
    if (flags & SF_CACHE_READONLY)
      return sfc_fail(c, SF_ERR_NOT_FOUND,
                      "cache %s: no such file (a read-only open never "
                      "creates one)",
                      c->path);
    if (!(flags & SF_CACHE_CREATE))
      return sfc_fail(c, SF_ERR_NOT_FOUND,
                      "cache %s: no such file (open with SF_CACHE_CREATE to "
                      "create it)",
                      c->path);
    *fs = FILE_MISSING;
    return SF_OK;
  }
  if (S_ISDIR(sb.st_mode))
    return sfc_fail(c, SF_ERR_IO, "cache %s: is a directory, not a file",
                    c->path);
  if (sb.st_size == 0) {
    *fs = FILE_EMPTY;
    return SF_OK;
  }
  int fd = open(c->file, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return sfc_fail(c, SF_ERR_IO, "cache %s: cannot open: %s", c->path,
                    strerror(errno));
  unsigned char head[100];
  ssize_t got = 0;
  while (got < (ssize_t)sizeof head) {
    ssize_t r = read(fd, head + got, sizeof head - (size_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += r;
  }
  int err = errno;
  close(fd);
  if (got < 0)
    return sfc_fail(c, SF_ERR_IO, "cache %s: cannot read: %s", c->path,
                    strerror(err));
  if (got < (ssize_t)sizeof head || memcmp(head, "SQLite format 3", 16) != 0)
    return sfc_fail(c, SF_ERR_NOT_A_DB,
                    "cache %s: not a SQLite database (the file does not "
                    "start with the SQLite header)",
                    c->path);
  *fs = FILE_SQLITE;
  *wal = head[18] == 2 || head[19] == 2;
  return SF_OK;
}

/* ---- read-only connections ------------------------------------------- */

static const char RO_PLAIN[] = "?mode=ro";
static const char RO_IMMUTABLE[] = "?mode=ro&immutable=1";

/* How a read-only connection opens the file.  A side file with changes
 * not yet in the database file (a non-empty -wal in WAL mode, a non-empty
 * -journal otherwise) must be read (or rolled back) by SQLite, which then
 * needs to write beside the file; without one, and in a directory this
 * process cannot write (permissions or read-only media), the database is
 * opened immutable: no locks, no side files, no change detection. */
typedef struct {
  char *side;        /* "<file>-wal" or "<file>-journal" (malloc'd) */
  char *dir;         /* the file's directory (malloc'd) */
  int pending;       /* side exists and is not empty */
  int dir_writable;
} ro_plan;

static void free_plan(ro_plan *p) {
  free(p->side);
  free(p->dir);
}

static sf_status plan_readonly(sf_cache *c, int wal, ro_plan *p) {
  memset(p, 0, sizeof *p);
  size_t n = strlen(c->file);
  p->side = malloc(n + sizeof "-journal");
  p->dir = malloc(n + 2);
  if (!p->side || !p->dir) {
    free_plan(p);
    return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  }
  snprintf(p->side, n + sizeof "-journal", "%s%s", c->file,
           wal ? "-wal" : "-journal");
  const char *slash = strrchr(c->file, '/');
  if (!slash)
    snprintf(p->dir, n + 2, ".");
  else if (slash == c->file)
    snprintf(p->dir, n + 2, "/");
  else
    snprintf(p->dir, n + 2, "%.*s", (int)(slash - c->file), c->file);
  struct stat sb;
  p->pending = stat(p->side, &sb) == 0 && sb.st_size > 0;
  p->dir_writable = access(p->dir, W_OK) == 0;
  return SF_OK;
}

/* The error for a read-only open that failed because SQLite could not
 * create what it needs to read the changes in the side file. */
static sf_status pending_fail(sf_cache *c, int wal, const ro_plan *p) {
  if (wal)
    return sfc_fail(c, SF_ERR_IO,
                    "cache %s: cannot open read-only: the database has "
                    "un-checkpointed changes in its -wal file (%s), and "
                    "SQLite cannot create the -shm file it needs to read "
                    "them because the directory %s is not writable; open it "
                    "writable once, where it can be written, to fold them "
                    "into the database file",
                    c->path, p->side, p->dir);
  return sfc_fail(c, SF_ERR_IO,
                  "cache %s: cannot open read-only: its journal (%s) holds "
                  "an interrupted write that must be rolled back, and the "
                  "directory %s is not writable; open it writable once, "
                  "where it can be written, to roll it back",
                  c->path, p->side, p->dir);
}

static sf_status open_connection(sf_cache *c, int sqlite_flags,
                                 const char *query) {
  char *uri = sfc_path_uri(c->file, query);
  if (!uri) return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  int rc = sqlite3_open_v2(uri, &c->db, sqlite_flags | SQLITE_OPEN_URI, NULL);
  free(uri);
  if (rc != SQLITE_OK) {
    sf_status st = sfc_status_of(rc);
    sfc_fail(c, st ? st : SF_ERR_DB, "cache %s: cannot open: %s", c->path,
             c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
    sqlite3_close(c->db);
    c->db = NULL;
    return c->code;
  }
  sqlite3_extended_result_codes(c->db, 0);
  sqlite3_busy_timeout(c->db, SFC_BUSY_TIMEOUT_MS);
  rc = sqlite3_create_function_v2(c->db, "sf_sha256", 1,
                                  SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL,
                                  sql_sha256, NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "registering sf_sha256");
  return SF_OK;
}

/* Reads the file's markers through a read-only connection (which never
 * checkpoints or rolls anything into the file), chosen as plan_readonly
 * says; c->ro_query keeps the choice.  Leaves no connection open. */
static sf_status classify_readonly(sf_cache *c, int wal, db_state *state,
                                   int64_t *version) {
  ro_plan plan;
  sf_status st = plan_readonly(c, wal, &plan);
  if (st) return st;
  c->ro_query = !plan.pending && !plan.dir_writable ? RO_IMMUTABLE : RO_PLAIN;
  st = open_connection(c, SQLITE_OPEN_READONLY, c->ro_query);
  if (!st) st = classify(c, "main", c->path, state, version);
  sqlite3_close(c->db);
  c->db = NULL;
  if (st && plan.pending && !plan.dir_writable && st != SF_ERR_NOT_A_DB &&
      st != SF_ERR_DB_VERSION && st != SF_ERR_NOMEM)
    st = pending_fail(c, wal, &plan);
  free_plan(&plan);
  return st;
}

/* Runs one statement, retrying while busy. */
static int exec_retry(sqlite3 *db, const char *sql) {
  int rc;
  for (int attempt = 0;; attempt++) {
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    if (!is_busy(rc) || attempt >= SFC_BUSY_RETRIES) return rc;
    nap_ms(20 + 10 * (attempt % 8));
  }
}

static sf_status init_body(sf_cache *c, void *arg) {
  (void)arg;
  /* Re-check under the write lock: another process may have initialized
   * (or, in theory, claimed) the file since the first look. */
  db_state state;
  int64_t version = 0;
  sf_status st = classify(c, "main", c->path, &state, &version);
  if (st) return st;
  if (state == DB_OURS && version == SF_CACHE_SCHEMA_VERSION) return SF_OK;
  char *schema = schema_v1();
  if (!schema)
    return sfc_fail(c, SF_ERR_NOMEM, "cache %s: out of memory", c->path);
  int rc = sqlite3_exec(c->db, schema, NULL, NULL, NULL);
  free(schema);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "creating the schema");
  char sql[128];
  snprintf(sql, sizeof sql, "PRAGMA application_id = %d; PRAGMA user_version = %d",
           (int)SF_CACHE_APPLICATION_ID, SF_CACHE_SCHEMA_VERSION);
  rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "writing the schema version");
  return SF_OK;
}

sf_status sfc_open(const char *file, const char *shown, int flags,
                   sf_cache **out) {
  if (!out) return SF_ERR_INVALID_ARG;
  *out = NULL;
  sf_cache *c = calloc(1, sizeof *c);
  if (!c) return SF_ERR_NOMEM;
  *out = c;
  c->ro_query = RO_PLAIN;
  if (!file || !*file)
    return sfc_fail(c, SF_ERR_INVALID_ARG, "sf_cache_open: path is %s",
                    file ? "empty" : "NULL");
  if (flags & ~(SF_CACHE_READONLY | SF_CACHE_CREATE))
    return sfc_fail(c, SF_ERR_INVALID_ARG,
                    "sf_cache_open: unknown flags 0x%x for %s", (unsigned)flags,
                    shown);
  c->path = sf__strdup(shown);
  c->file = sf__strdup(file);
  if (!c->path || !c->file)
    return sfc_fail(c, SF_ERR_NOMEM, "sf_cache_open: out of memory");
  c->readonly = (flags & SF_CACHE_READONLY) != 0;

  /* 1. Look at the file's bytes: nothing has been opened for writing. */
  file_state fs = FILE_MISSING;
  int wal = 0;
  sf_status st = probe_file(c, flags, &fs, &wal);
  if (st) return st;

  /* 2. Read its markers through a read-only connection. */
  db_state state = DB_EMPTY;
  int64_t version = 0;
  if (fs == FILE_SQLITE && (st = classify_readonly(c, wal, &state, &version)))
    return st;
  if (c->readonly && (state == DB_EMPTY || version < 1))
    return sfc_fail(c, SF_ERR_NOT_A_DB,
                    "cache %s: an empty file, not yet a sparseforge cache "
                    "(open it writable to initialize it)",
                    c->path);

  /* 3. Only now open for real; writes (WAL, schema) follow the checks. */
  if (c->readonly) return open_connection(c, SQLITE_OPEN_READONLY, c->ro_query);
  st = open_connection(c,
                       SQLITE_OPEN_READWRITE |
                           ((flags & SF_CACHE_CREATE) ? SQLITE_OPEN_CREATE : 0),
                       "");
  if (st) return st;
  if (sqlite3_db_readonly(c->db, "main") == 1)
    return sfc_fail(c, SF_ERR_IO,
                    "cache %s: cannot open for writing (the file or its "
                    "directory is not writable); open it with "
                    "SF_CACHE_READONLY to read it",
                    c->path);
  char mode[16] = "";
  {
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode", -1, &q, NULL);
    if (rc == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) {
      const char *m = (const char *)sqlite3_column_text(q, 0);
      if (m) snprintf(mode, sizeof mode, "%s", m);
    }
    sqlite3_finalize(q);
  }
  if (strcmp(mode, "wal") != 0) {
    int rc = exec_retry(c->db, "PRAGMA journal_mode = WAL");
    if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "switching to WAL mode");
  }
  /* In WAL mode NORMAL keeps the database consistent on a crash; a power
   * loss may drop the last commits, which a cache can afford. */
  int rc = exec_retry(c->db, "PRAGMA synchronous = NORMAL");
  if (rc != SQLITE_OK) return sfc_db_fail(c, rc, "setting synchronous");
  if (state == DB_OURS && version == SF_CACHE_SCHEMA_VERSION) return SF_OK;
  return sfc_write_tx(c, "initialize the schema", init_body, NULL);
}

sf_status sf_cache_open(const char *path, int flags, sf_cache **out) {
  return sfc_open(path, path, flags, out);
}

void sf_cache_close(sf_cache *cache) {
  if (!cache) return;
  if (cache->db) sqlite3_close_v2(cache->db);
  free(cache->path);
  free(cache->file);
  free(cache);
}
