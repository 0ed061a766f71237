/* raw_sql.h -- SQLite for the tests that edit cache files behind the
 * library's back (a flipped blob byte, a deleted row).  libsparseforge
 * already loads libsqlite3, so the few SQLite functions needed are looked
 * up with dlsym: the tests need neither sqlite3.h nor a link line of their
 * own.  Call load_sqlite() first. */
#ifndef SF_TEST_RAW_SQL_H
#define SF_TEST_RAW_SQL_H

#include <dlfcn.h>

#include "check.h"

typedef struct sqlite3 sqlite3;
typedef int (*row_cb)(void *, int, char **, char **);
static int (*db_open)(const char *, sqlite3 **, int, const char *);
static int (*db_exec)(sqlite3 *, const char *, row_cb, void *, char **);
static int (*db_close)(sqlite3 *);
static const char *(*db_errmsg)(sqlite3 *);
#define DB_OPEN_READWRITE 0x2
#define DB_OPEN_CREATE 0x4

static int load_sqlite(void) {
  db_open = (int (*)(const char *, sqlite3 **, int, const char *))dlsym(
      RTLD_DEFAULT, "sqlite3_open_v2");
  db_exec = (int (*)(sqlite3 *, const char *, row_cb, void *, char **))dlsym(
      RTLD_DEFAULT, "sqlite3_exec");
  db_close = (int (*)(sqlite3 *))dlsym(RTLD_DEFAULT, "sqlite3_close");
  db_errmsg = (const char *(*)(sqlite3 *))dlsym(RTLD_DEFAULT, "sqlite3_errmsg");
  return db_open && db_exec && db_close && db_errmsg;
}

static int first_int_cb(void *user, int n, char **vals, char **names) {
  (void)names;
  if (n > 0 && vals[0]) *(long long *)user = atoll(vals[0]);
  return 0;
}

/* Runs SQL on `path` with plain SQLite; returns the first column of the
 * last row as an integer (or -1). */
static long long sql(const char *path, const char *text) {
  sqlite3 *db = NULL;
  long long v = -1;
  if (db_open(path, &db, DB_OPEN_READWRITE | DB_OPEN_CREATE, NULL) != 0) {
    fprintf(stderr, "cannot open %s\n", path);
    check_failures_++;
    db_close(db);
    return -1;
  }
  char *err = NULL;
  if (db_exec(db, text, first_int_cb, &v, &err) != 0) {
    fprintf(stderr, "SQL failed on %s: %s: %s\n", path, text,
            err ? err : db_errmsg(db));
    check_failures_++;
  }
  db_close(db);
  return v;
}

#endif
