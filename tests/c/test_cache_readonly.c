/* test_cache_readonly.c -- caches shipped read-only: a WAL database (alone,
 * and with the empty -wal and -shm that a read-only open in a writable
 * directory leaves), a DELETE-journal database and an exported file, each
 * (files 0444) in a directory of mode 0555, open with SF_CACHE_READONLY:
 * their layers,
 * binaries, trials and counts read back, merge and export read from them,
 * and the directory's list of files is the same afterwards (no -wal, -shm
 * or -journal appears) with the file's bytes and mtime unchanged.  A WAL
 * database whose -wal still holds changes opens when its -shm is there and
 * otherwise fails with the documented SF_ERR_IO.
 *
 * Permissions must bite for this to mean anything, and they do not for
 * root.  So the reading runs in a child process which, when the test runs
 * as root, first drops to the unprivileged user nobody (65534) and then
 * checks that it cannot create a file in a 0555 directory: that is the
 * read-only medium, emulated, and "no side file appears" is checked by
 * listing the directory before and after.  Where privileges cannot be
 * dropped, or writes are not stopped even then, the test says why and is
 * skipped (77). */
#include "cache_fixtures.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/wait.h>

#define NOBODY 65534

static char g_rw[4352]; /* a directory the child may write (0777) */

/* dir/name in a buffer of the caller's. */
static const char *join(char *buf, size_t size, const char *dir,
                        const char *name) {
  snprintf(buf, size, "%s/%s", dir, name);
  return buf;
}

/* A cache at <g_dir>/<dir>/c.db with one layer, one binary, three trials;
 * closed cleanly (its -wal folded in and removed). */
static void make_cache(const char *dir, char *path, size_t size) {
  char d[4352];
  join(d, sizeof d, g_dir, dir);
  CHECK_EQ_INT(0, mkdir(d, 0755));
  join(path, size, d, "c.db");
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(path, SF_CACHE_CREATE, &c));
  if (!c) return;
  sf_layer_variant v[2];
  sf_layer_record r = layer_fixture(v, "ffn.up", "NVIDIA H100", NULL);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r));
  sf_binary_key k = key_for(v[0].source, "sm_90a");
  sf_binary *b = make_binary("cubin-bytes", SF_BINARY_CUBIN);
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, &k, b));
  sf_binary_free(b);
  for (int i = 0; i < 3; i++) {
    char cfg[16];
    snprintf(cfg, sizeof cfg, "cfg-%d", i);
    sf_trial t = trial("env", cfg, 256, SF_TRIAL_OK, 1.0 + i);
    CHECK_EQ_INT(SF_OK, sf_cache_put_trial(c, &t));
  }
  sf_cache_close(c);
}

/* The journal mode in the file's header: bytes 18 and 19 (2: WAL). */
static int header_mode(const char *path) {
  snapshot s = take(path);
  int mode = s.size >= 100 ? s.bytes[18] * 10 + s.bytes[19] : -1;
  free(s.bytes);
  return mode;
}

/* Adds one trial to the cache at `path` from a child process that exits
 * without closing it: the trial stays in the -wal, beside the -shm. */
static void leave_pending_wal(const char *path) {
  pid_t pid = fork();
  if (pid == 0) {
    sf_cache *c = NULL;
    if (sf_cache_open(path, 0, &c) != SF_OK) _exit(1);
    sf_trial t = trial("env", "cfg-pending", 256, SF_TRIAL_OK, 0.5);
    _exit(sf_cache_put_trial(c, &t) == SF_OK ? 0 : 1);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void make_readonly(const char *path) {
  char dir[4352];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  char list[4096];
  dir_list(dir, list, sizeof list);
  /* every file of the directory, then the directory */
  char *save = NULL;
  for (char *name = strtok_r(list, " ", &save); name;
       name = strtok_r(NULL, " ", &save)) {
    char p[4608];
    CHECK_EQ_INT(0, chmod(join(p, sizeof p, dir, name), 0444));
  }
  CHECK_EQ_INT(0, chmod(dir, 0555));
}

/* ---- in the child: the read-only world ---------------------------------- */

static int count_trials(const sf_trial *t, void *user) {
  (void)t;
  ++*(int *)user;
  return 0;
}

/* Opens `path` read-only and reads everything; merges from it and exports
 * from it into g_rw; the directory and the file are unchanged after. */
static void read_everything(const char *path, const char *tag, int trials) {
  char dir[4352], before[4096], after[4096];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  dir_list(dir, before, sizeof before);
  snapshot snap = take(path);

  sf_cache *c = NULL;
  sf_status st = sf_cache_open(path, SF_CACHE_READONLY, &c);
  if (st) fprintf(stderr, "%s: %s\n", tag, sf_cache_errmsg(c));
  CHECK_EQ_INT(SF_OK, st);
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  CHECK(ls.ok[0]);
  sf_layer_variant v[2];
  layer_fixture(v, "x", "y", NULL);
  sf_binary_key k = key_for(v[0].source, "sm_90a");
  sf_binary *b = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(c, &k, &b));
  size_t size = 0;
  const void *data = b ? sf_binary_data(b, &size) : NULL;
  CHECK(size == strlen("cubin-bytes") && data && memcmp(data, "cubin-bytes", size) == 0);
  sf_binary_free(b);
  sf_cache_counts n = counts(c);
  CHECK_EQ_INT(1, n.layers);
  CHECK_EQ_INT(2, n.layer_variants);
  CHECK_EQ_INT(1, n.binaries);
  CHECK_EQ_INT(trials, n.trials);
  int seen = 0;
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, NULL, count_trials, &seen));
  CHECK_EQ_INT(trials, seen);
  sf_trial t = trial("env", "cfg-new", 16, SF_TRIAL_OK, 1.0);
  CHECK_EQ_INT(SF_ERR_DB, sf_cache_put_trial(c, &t));
  CHECK_CONTAINS(sf_cache_errmsg(c), "opened read-only");
  /* export from the read-only cache into a writable directory */
  char out[4608];
  snprintf(out, sizeof out, "%s/exported-%s.db", g_rw, tag);
  int64_t added = 0;
  st = sf_cache_export(c, out, NULL, &added, NULL, NULL);
  if (st) fprintf(stderr, "%s: export: %s\n", tag, sf_cache_errmsg(c));
  CHECK_EQ_INT(SF_OK, st);
  CHECK_EQ_INT(1 + 2 + 2 + 1, added); /* binary, blobs, variants, layer */
  sf_cache_close(c);

  /* a writable open is refused, writing nothing */
  CHECK_EQ_INT(SF_ERR_IO, sf_cache_open(path, 0, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "cannot open for writing");
  sf_cache_close(c);
  /* merge reads it (attached the same way) */
  snprintf(out, sizeof out, "%s/merged-%s.db", g_rw, tag);
  CHECK_EQ_INT(SF_OK, sf_cache_open(out, SF_CACHE_CREATE, &c));
  st = sf_cache_merge(c, path, &added, NULL, NULL);
  if (st) fprintf(stderr, "%s: merge: %s\n", tag, sf_cache_errmsg(c));
  CHECK_EQ_INT(SF_OK, st);
  CHECK_EQ_INT(trials, counts(c).trials);
  sf_cache_close(c);

  dir_list(dir, after, sizeof after);
  CHECK_STREQ(before, after);
  CHECK(same_as(&snap, path));
  free(snap.bytes);
}

/* The documented failure: changes in the -wal and no -shm to read them. */
static void pending_without_shm(const char *path) {
  char dir[4352], before[4096], after[4096], wal[4400];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  snprintf(wal, sizeof wal, "%s-wal", path);
  dir_list(dir, before, sizeof before);
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_ERR_IO, sf_cache_open(path, SF_CACHE_READONLY, &c));
  char want[8192];
  snprintf(want, sizeof want,
           "cache %s: cannot open read-only: the database has un-checkpointed "
           "changes in its -wal file (%s), and SQLite cannot create the -shm "
           "file it needs to read them because the directory %s is not "
           "writable; open it writable once, where it can be written, to "
           "fold them into the database file",
           path, wal, dir);
  CHECK_STREQ(want, sf_cache_errmsg(c));
  sf_cache_close(c);
  /* merge refuses it the same way */
  char out[4608];
  snprintf(out, sizeof out, "%s/merged-pending.db", g_rw);
  CHECK_EQ_INT(SF_OK, sf_cache_open(out, SF_CACHE_CREATE, &c));
  CHECK_EQ_INT(SF_ERR_IO, sf_cache_merge(c, path, NULL, NULL, NULL));
  CHECK_STREQ(want, sf_cache_errmsg(c));
  sf_cache_close(c);
  dir_list(dir, after, sizeof after);
  CHECK_STREQ(before, after);
}

/* 0 with the reason when permissions cannot be made to bite. */
static int become_unprivileged(const char *ro_dir, char *why, size_t size) {
  if (geteuid() == 0) {
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) {
      snprintf(why, size, "running as root and cannot drop to uid %d: %s",
               NOBODY, strerror(errno));
      return 0;
    }
    if (access(g_dir, X_OK) != 0) {
      snprintf(why, size, "uid %d cannot reach %s: %s", NOBODY, g_dir,
               strerror(errno));
      return 0;
    }
  }
  char probe[4608];
  join(probe, sizeof probe, ro_dir, "write-probe");
  int fd = open(probe, O_CREAT | O_WRONLY | O_EXCL, 0644);
  if (fd >= 0) {
    close(fd);
    unlink(probe);
    snprintf(why, size, "a 0555 directory does not stop writes here");
    return 0;
  }
  return 1;
}

int main(void) {
  if (!fixture_start("test_cache_readonly")) return 1;
  /* the unprivileged child must reach the scratch directory */
  CHECK_EQ_INT(0, chmod(g_dir, 0755));
  join(g_rw, sizeof g_rw, g_dir, "rw");
  CHECK_EQ_INT(0, mkdir(g_rw, 0777));
  CHECK_EQ_INT(0, chmod(g_rw, 0777));

  char wal[4352], del[4352], exp[4352], pend[4352], nshm[4352];
  make_cache("wal", wal, sizeof wal);
  CHECK_EQ_INT(22, header_mode(wal));
  char d[4352], list[4096];
  dir_list(join(d, sizeof d, g_dir, "wal"), list, sizeof list);
  CHECK_STREQ("c.db ", list); /* closed cleanly: no side file */
  make_cache("delete", del, sizeof del);
  sql(del, "PRAGMA journal_mode = DELETE");
  CHECK_EQ_INT(11, header_mode(del));
  /* a WAL cache with the empty -wal and -shm that a read-only open in a
   * writable directory leaves; and an export from it */
  char left[4352];
  make_cache("leftover", left, sizeof left);
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(left, SF_CACHE_READONLY, &c));
  CHECK_EQ_INT(0, mkdir(join(d, sizeof d, g_dir, "export"), 0755));
  join(exp, sizeof exp, d, "c.db");
  CHECK_EQ_INT(SF_OK, sf_cache_export(c, exp, NULL, NULL, NULL, NULL));
  sf_cache_close(c);
  CHECK_EQ_INT(11, header_mode(exp));
  dir_list(d, list, sizeof list);
  CHECK_STREQ("c.db ", list);
  dir_list(join(d, sizeof d, g_dir, "leftover"), list, sizeof list);
  CHECK_STREQ("c.db c.db-shm c.db-wal ", list);
  /* WAL caches with a trial still in the -wal: with and without -shm */
  make_cache("pending", pend, sizeof pend);
  leave_pending_wal(pend);
  make_cache("pending-noshm", nshm, sizeof nshm);
  leave_pending_wal(nshm);
  char shm[4400];
  snprintf(shm, sizeof shm, "%s-shm", nshm);
  CHECK_EQ_INT(0, unlink(shm));
  snprintf(shm, sizeof shm, "%s-wal", nshm);
  struct stat sb;
  CHECK(stat(shm, &sb) == 0 && sb.st_size > 0);

  const char *paths[] = {wal, left, del, exp, pend, nshm};
  for (int i = 0; i < 6; i++) make_readonly(paths[i]);
  join(d, sizeof d, g_dir, "wal");
  if (check_failures_) CHECK_DONE();

  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    char why[512];
    if (!become_unprivileged(d, why, sizeof why)) {
      printf("SKIPPED: %s\n", why);
      fflush(NULL);
      _exit(77);
    }
    printf("reading as uid %d\n", (int)geteuid());
    read_everything(wal, "wal", 3);
    read_everything(left, "leftover", 3);
    read_everything(del, "delete", 3);
    read_everything(exp, "export", 0);
    read_everything(pend, "pending", 4); /* the -shm is there: read */
    pending_without_shm(nshm);
    fflush(NULL);
    _exit(check_failures_ ? 1 : 0);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (code == 77) {
    fixture_dir_remove();
    return 77;
  }
  CHECK_EQ_INT(0, code);
  fixture_dir_remove();
  CHECK_DONE();
}
