/*
 * cache_internal.h -- private pieces shared by the files of the SQLite
 * cache (cache.c: open, schema, errors, transactions; records.c: binaries,
 * environments, matrices, trials; layers.c: layers; merge.c: merge, export,
 * counts; columns.c: the launch record's columns).  Nothing here is
 * public.
 */
#ifndef SF_CACHE_INTERNAL_H
#define SF_CACHE_INTERNAL_H

#include "internal.h"
#include "sparseforge.h"

#include <sqlite3.h>

struct sf_cache {
  sqlite3 *db;
  char *path;        /* as given to sf_cache_open: the name in messages */
  char *file;        /* the file opened: path, or the temporary file an
                        export writes before renaming it to path */
  int readonly;      /* opened with SF_CACHE_READONLY */
  /* The URI query every read-only connection to the file uses (the
   * checks of sf_cache_open, a read-only cache, merge's ATTACH):
   * "?mode=ro", or "?mode=ro&immutable=1" where the directory cannot be
   * written and no side file holds changes (sf_cache_open's comment). */
  const char *ro_query;
  sf_status code;    /* status of the last failed call */
  char msg[SF_MSG_MAX];
};

/* Records a failure on the cache (printf-style message) and returns st. */
sf_status sfc_fail(sf_cache *c, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records a SQLite failure: "<what>: <sqlite message>" with the status that
 * fits the SQLite code (SF_ERR_BUSY, SF_ERR_NOMEM, else SF_ERR_DB). */
sf_status sfc_db_fail(sf_cache *c, int rc, const char *what);

/* The status a SQLite result code maps to. */
sf_status sfc_status_of(int rc);

/* Prepares `sql`; on failure records it and returns its status. */
sf_status sfc_prepare(sf_cache *c, const char *sql, sqlite3_stmt **st);

/* SF_ERR_DB with a message when the cache was opened read-only. */
sf_status sfc_require_writable(sf_cache *c, const char *what);

/* Runs body(c, arg) inside BEGIN IMMEDIATE ... COMMIT, retrying the BEGIN
 * (and the COMMIT) while the database is busy.  A failing body rolls the
 * whole transaction back, so nothing of it is left half-written. */
typedef sf_status (*sfc_body)(sf_cache *c, void *arg);
sf_status sfc_write_tx(sf_cache *c, const char *what, sfc_body body, void *arg);

/* Current time in seconds since the epoch, with a fraction. */
double sfc_now(void);

/* Binds a double; NaN becomes SQL NULL (SQLite stores NaN as NULL anyway). */
int sfc_bind_real(sqlite3_stmt *st, int i, double v);
/* Reads a double; NULL gives NaN. */
double sfc_column_real(sqlite3_stmt *st, int i);
/* Binds a blob of `size` bytes (NULL data allowed when size is 0: binds an
 * empty blob, not NULL). */
int sfc_bind_blob(sqlite3_stmt *st, int i, const void *data, size_t size);
/* Binds a string, or NULL for a NULL pointer. */
int sfc_bind_text(sqlite3_stmt *st, int i, const char *s);

/* Percent-encodes `path` as a SQLite URI ("file:...") followed by `query`
 * (e.g. "?mode=ro", or ""); the caller frees the result.  NULL on NOMEM. */
char *sfc_path_uri(const char *path, const char *query);

/* sf_cache_open of the file `file`, with `shown` as its name in every
 * message (sf_cache_open passes the path twice; an export its temporary
 * file and the destination the caller named). */
sf_status sfc_open(const char *file, const char *shown, int flags,
                   sf_cache **out);

/* The version checks sf_cache_open makes, on an already attached schema
 * `schema` ("main" or an attached name): SF_OK for a sparseforge cache of a
 * version this library reads, SF_ERR_NOT_A_DB or SF_ERR_DB_VERSION. */
sf_status sfc_check_schema(sf_cache *c, const char *schema, const char *path);

/* Why a layer variant's packed weights cannot be used, written into buf
 * (and returned), or NULL when they can: the blob stored under `want` is
 * missing (present 0), or its bytes (got_size of them, hashing to `got`)
 * are not the variant's (want_size bytes hashing to want).  The words are
 * those of sf_layer_record.problem: "the packed weights of variant 1
 * (n_bucket 256) failed their sha256: ...". */
const char *sfc_packed_problem(char *buf, size_t size, int index,
                               int64_t n_bucket, const char *want,
                               int64_t want_size, int present,
                               int64_t got_size, const char *got);

/* ---- the launch record's columns (columns.c) ------------------------- */

/* Room enough for any list of launch columns below. */
#define SFC_LAUNCH_SQL_MAX 1024

/* Writes the launch record's columns (SF_LAUNCH_RECORD_FIELDS: an array
 * field grid[3] is grid0, grid1, grid2; a scalar keeps its name) into buf,
 * joined by ", ", each as before + name + after (e.g. "v." "grid0" "", or
 * "" "grid0" " INTEGER NOT NULL").  Returns how many columns, or -1 when
 * buf is too small. */
int sfc_launch_columns(char *buf, size_t size, const char *before,
                       const char *after);
/* The same number of parameters, "?<first>, ?<first + 1>, ...". */
int sfc_launch_params(char *buf, size_t size, int first);

/* Binds the launch record to the parameters from `first` on, in the order
 * of sfc_launch_columns; reads it back from the columns from `first` on. */
void sfc_bind_launch(sqlite3_stmt *st, int first, const sf_launch_record *l);
void sfc_column_launch(sqlite3_stmt *st, int first, sf_launch_record *l);

#endif
