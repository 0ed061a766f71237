/* test_cache.c -- the SQLite cache: every record kind round trip, refusal
 * of files that are not ours (left byte for byte as they were), corrupt
 * blobs, merge, export, read-only opens and NULL arguments.
 *
 * The test edits database files behind the library's back with SQLite
 * itself (raw_sql.h). */
#include "cache_fixtures.h"

/* ---- collecting what the walks hand out -------------------------------- */

/* Collects trials in the order handed out. */
typedef struct {
  int n;
  char configs[64][32];
  int status[64];
  double median[64];
  int64_t ns[64];
  int nan_ok[64];     /* NaN fields read back as NaN */
  char message[64][64];
  char binary_key[64][80];
  int stop_after;
} trial_seen;

static int trial_cb(const sf_trial *t, void *user) {
  trial_seen *s = user;
  if (s->n < 64) {
    snprintf(s->configs[s->n], 32, "%s", t->config);
    s->status[s->n] = t->status;
    s->median[s->n] = t->median_ms;
    s->ns[s->n] = t->n;
    s->nan_ok[s->n] = t->status == SF_TRIAL_OK || (isnan(t->median_ms) &&
                      isnan(t->p20_ms) && isnan(t->max_error));
    snprintf(s->message[s->n], 64, "%s", t->message ? t->message : "(null)");
    snprintf(s->binary_key[s->n], 80, "%s", t->binary_key ? t->binary_key : "(null)");
    CHECK(t->created > 1.6e9);
  }
  s->n++;
  return s->stop_after && s->n >= s->stop_after;
}

typedef struct {
  int n;
  char key[65];
  sf_device_info dev;
} env_seen;

static int env_cb(const char *key, const sf_device_info *d, void *user) {
  env_seen *s = user;
  s->n++;
  snprintf(s->key, sizeof s->key, "%s", key);
  s->dev = *d;
  return 0;
}

typedef struct {
  int n;
  char fp[4][32], dtype[4][8], info[4][64];
  int64_t rows[4], cols[4], nnz[4];
} matrix_seen;

static int matrix_cb(const sf_matrix_record *m, void *user) {
  matrix_seen *s = user;
  if (s->n < 4) {
    snprintf(s->fp[s->n], 32, "%s", m->fingerprint);
    snprintf(s->dtype[s->n], 8, "%s", m->dtype);
    snprintf(s->info[s->n], 64, "%s", m->info ? m->info : "(null)");
    s->rows[s->n] = m->rows;
    s->cols[s->n] = m->cols;
    s->nnz[s->n] = m->nnz;
  }
  s->n++;
  return 0;
}


/* ---- tests ------------------------------------------------------------- */

static void test_binary_keys(void) {
  const char *src = "extern \"C\" __global__ void k() {}";
  sf_binary_key k = key_for(src, "sm_90a");
  char base[65], h[65], seen[8][65];
  CHECK_EQ_INT(SF_OK, sf_binary_key_hex(&k, base));
  CHECK_EQ_INT(64, strlen(base));
  CHECK_EQ_INT(SF_OK, sf_binary_key_hex(&k, h));
  CHECK(strcmp(base, h) == 0);
  /* every field changes the key */
  int n = 0;
  memcpy(seen[n++], base, 65);
  sf_binary_key m = k; m.source = "extern \"C\" __global__ void j() {}";
  sf_binary_key_hex(&m, seen[n++]);
  m = k; m.options = "-std=c++17";
  sf_binary_key_hex(&m, seen[n++]);
  m = k; m.arch = "sm_90";
  sf_binary_key_hex(&m, seen[n++]);
  m = k; m.nvrtc_version = "12.9";
  sf_binary_key_hex(&m, seen[n++]);
  m = k; m.generator_version = "0.1.1";
  sf_binary_key_hex(&m, seen[n++]);
  m = k; m.kind = SF_BINARY_PTX;
  sf_binary_key_hex(&m, seen[n++]);
  /* field boundaries are part of the key ("ab"+"c" != "a"+"bc") */
  sf_binary_key p = k, q = k;
  p.nvrtc_version = "ab"; p.generator_version = "c";
  q.nvrtc_version = "a"; q.generator_version = "bc";
  sf_binary_key_hex(&p, seen[n++]);
  sf_binary_key_hex(&q, h);
  CHECK(strcmp(seen[n - 1], h) != 0);
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) CHECK(strcmp(seen[i], seen[j]) != 0);
  /* the documented formula */
  char text[512];
  int len = snprintf(text, sizeof text,
                     "sparseforge-binary-key-v1\n%zu:%s\n%zu:%s\n%zu:%s\n"
                     "%zu:%s\n%zu:%s\n5:cubin\n",
                     strlen(k.source), k.source, strlen(k.options), k.options,
                     strlen(k.arch), k.arch, strlen(k.nvrtc_version),
                     k.nvrtc_version, strlen(k.generator_version),
                     k.generator_version);
  sf_sha256_hex(text, (size_t)len, h);
  CHECK(strcmp(base, h) == 0);
  /* invalid keys */
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_key_hex(NULL, h));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_key_hex(&k, NULL));
  m = k; m.source = NULL;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_key_hex(&m, h));
  m = k; m.arch = "";
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_key_hex(&m, h));
  m = k; m.kind = (sf_binary_kind)7;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_binary_key_hex(&m, h));
}

static void test_roundtrip(void) {
  sf_cache *c = open_new("roundtrip.db");
  if (!c) return;
  CHECK(strcmp(sf_cache_errmsg(c), "") == 0);
  CHECK_EQ_INT(SF_OK, sf_cache_errcode(c));
  const char *path = tmp_path("roundtrip.db");
  /* schema markers, WAL */
  CHECK_EQ_INT(SF_CACHE_SCHEMA_VERSION, sql(path, "PRAGMA user_version"));
  CHECK_EQ_INT(SF_CACHE_APPLICATION_ID, sql(path, "PRAGMA application_id"));

  /* binaries: cubin and PTX */
  const char *src = "extern \"C\" __global__ void k() {}";
  sf_binary_key k = key_for(src, "sm_90a");
  sf_binary *bin = make_binary("cubin-marker-0123456789", SF_BINARY_CUBIN);
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, &k, bin));
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, &k, bin)); /* again: no-op */
  sf_binary *got = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(c, &k, &got));
  size_t n1 = 0, n2 = 0;
  const void *d1 = sf_binary_data(bin, &n1), *d2 = sf_binary_data(got, &n2);
  CHECK_EQ_INT(n1, n2);
  CHECK(d2 && memcmp(d1, d2, n1) == 0);
  CHECK_EQ_INT(SF_BINARY_CUBIN, sf_binary_get_kind(got));
  sf_binary_free(got);
  sf_binary_key kp = k;
  kp.kind = SF_BINARY_PTX;
  /* the binary's kind must be the key's */
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_binary(c, &kp, bin));
  CHECK_CONTAINS(sf_cache_errmsg(c), "the key says PTX but the binary is a cubin");
  sf_binary *ptx = make_binary(".version 8.0\n.target sm_90a\n", SF_BINARY_PTX);
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, &kp, ptx));
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(c, &kp, &got));
  CHECK_EQ_INT(SF_BINARY_PTX, sf_binary_get_kind(got));
  CHECK(strcmp(sf_binary_data(got, NULL), ".version 8.0\n.target sm_90a\n") == 0);
  sf_binary_free(got);
  sf_binary_free(ptx);
  /* absent key */
  sf_binary_key other = key_for(src, "sm_80");
  char hex[65];
  sf_binary_key_hex(&other, hex);
  got = (sf_binary *)1;
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_get_binary(c, &other, &got));
  CHECK(got == NULL);
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_errcode(c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "no binary with key");
  CHECK_CONTAINS(sf_cache_errmsg(c), hex);
  CHECK_CONTAINS(sf_cache_errmsg(c), "(arch sm_80)");
  sf_binary_free(bin);

  /* environment: the documented key */
  sf_device_info dev = device_fixture();
  char env[65], want[65];
  CHECK_EQ_INT(SF_OK, sf_cache_put_env(c, &dev, env));
  const char *env_text = "NVIDIA Test GPU|9.0|132|13000";
  sf_sha256_hex(env_text, strlen(env_text), want);
  CHECK(strcmp(env, want) == 0);
  dev.clock_khz = 1980000; /* a second put updates the other fields */
  CHECK_EQ_INT(SF_OK, sf_cache_put_env(c, &dev, env)); /* again: one row */
  CHECK_EQ_INT(1, counts(c).envs);
  env_seen es;
  memset(&es, 0, sizeof es);
  CHECK_EQ_INT(SF_OK, sf_cache_envs(c, env_cb, &es));
  CHECK_EQ_INT(1, es.n);
  CHECK(strcmp(es.key, env) == 0);
  CHECK(strcmp(es.dev.name, "NVIDIA Test GPU") == 0 && strcmp(es.dev.arch, "sm_90a") == 0);
  CHECK(es.dev.cc_major == 9 && es.dev.cc_minor == 0 && es.dev.sm_count == 132);
  CHECK(es.dev.driver_version == 13000 && es.dev.clock_khz == 1980000);
  CHECK(es.dev.l2_bytes == 50 << 20 && es.dev.total_mem_bytes == 80ull << 30);

  /* matrix */
  sf_matrix_record m = {"fp-matrix-1", 3072, 768, 235930, "fp16", "{\"pattern\": \"shflbw64\"}"};
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(c, &m));
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(c, &m));
  CHECK_EQ_INT(1, counts(c).matrices);
  sf_matrix_record m2 = {"fp-matrix-2", 10, 20, 0, "fp32", NULL};
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(c, &m2));
  matrix_seen ms;
  memset(&ms, 0, sizeof ms);
  CHECK_EQ_INT(SF_OK, sf_cache_matrices(c, NULL, matrix_cb, &ms));
  CHECK_EQ_INT(2, ms.n);
  CHECK(strcmp(ms.fp[0], "fp-matrix-1") == 0 && strcmp(ms.fp[1], "fp-matrix-2") == 0);
  CHECK(ms.rows[0] == 3072 && ms.cols[0] == 768 && ms.nnz[0] == 235930);
  CHECK(strcmp(ms.dtype[0], "fp16") == 0 && strcmp(ms.info[0], "{\"pattern\": \"shflbw64\"}") == 0);
  CHECK(strcmp(ms.info[1], "(null)") == 0);
  memset(&ms, 0, sizeof ms);
  CHECK_EQ_INT(SF_OK, sf_cache_matrices(c, "fp-matrix-2", matrix_cb, &ms));
  CHECK(ms.n == 1 && ms.rows[0] == 10);
  memset(&ms, 0, sizeof ms);
  CHECK_EQ_INT(SF_OK, sf_cache_matrices(c, "nope", matrix_cb, &ms));
  CHECK_EQ_INT(0, ms.n);

  /* trials: two groups (n 256 and 1024) */
  sf_trial ts[] = {
      trial(env, "cfg-slow", 256, SF_TRIAL_OK, 2.0),
      trial(env, "cfg-wrong", 256, SF_TRIAL_WRONG, NAN),
      trial(env, "cfg-fast", 256, SF_TRIAL_OK, 1.0),
      trial(env, "cfg-nocompile", 256, SF_TRIAL_COMPILE_FAIL, NAN),
      trial(env, "cfg-timeout", 1024, SF_TRIAL_TIMEOUT, NAN),
      trial(env, "cfg-big", 1024, SF_TRIAL_OK, 7.5),
  };
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    CHECK_EQ_INT(SF_OK, sf_cache_put_trial(c, &ts[i]));
  trial_seen s;
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, NULL, trial_cb, &s));
  CHECK_EQ_INT(6, s.n);
  const char *order[] = {"cfg-fast", "cfg-slow", "cfg-nocompile", "cfg-wrong",
                         "cfg-big", "cfg-timeout"};
  for (int i = 0; i < 6 && i < s.n; i++) {
    CHECK(strcmp(s.configs[i], order[i]) == 0);
    CHECK(s.nan_ok[i]);
  }
  CHECK(s.median[0] == 1.0 && s.median[1] == 2.0);
  CHECK_EQ_INT(SF_TRIAL_COMPILE_FAIL, s.status[2]);
  CHECK(strcmp(s.message[3], "it failed") == 0);
  CHECK(strcmp(s.message[0], "(null)") == 0);
  CHECK(strcmp(s.binary_key[0], "bkey") == 0);
  CHECK_EQ_INT(2, counts(c).winners);
  /* the winners view: one row per group, the lowest median */
  CHECK_EQ_INT(256, sql(path, "SELECT n FROM winners WHERE config = 'cfg-fast'"));
  CHECK_EQ_INT(0, sql(path, "SELECT count(*) FROM winners WHERE config = 'cfg-slow'"));
  /* the same (env, matrix, op, n, config) replaces: cfg-slow becomes best */
  sf_trial better = trial(env, "cfg-slow", 256, SF_TRIAL_OK, 0.5);
  CHECK_EQ_INT(SF_OK, sf_cache_put_trial(c, &better));
  CHECK_EQ_INT(6, counts(c).trials);
  sf_trial_filter f = {env, "fp-matrix-1", "shflbw64.fp16.fm.bias_gelu", 256};
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, &f, trial_cb, &s));
  CHECK_EQ_INT(4, s.n);
  CHECK(strcmp(s.configs[0], "cfg-slow") == 0 && s.median[0] == 0.5);
  CHECK(strcmp(s.configs[1], "cfg-fast") == 0);
  f.n = -1;
  f.op = "other.op";
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, &f, trial_cb, &s));
  CHECK_EQ_INT(0, s.n);
  /* a nonzero return stops the walk */
  memset(&s, 0, sizeof s);
  s.stop_after = 2;
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, NULL, trial_cb, &s));
  CHECK_EQ_INT(2, s.n);

  /* layers: two variants with packed bytes, the same on two GPUs */
  sf_layer_variant v[2];
  sf_layer_record r = layer_fixture(v, "bert.l0.ffn1", "NVIDIA H100", "{\"tile\": 64}");
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r));
  r.gpu_name = "NVIDIA A100";
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r));
  sf_layer_record r2 = layer_fixture(v, "bert.l1.ffn1", "NVIDIA H100", NULL);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r2));
  sf_cache_counts k1 = counts(c);
  CHECK_EQ_INT(3, k1.layers);
  CHECK_EQ_INT(6, k1.layer_variants);
  CHECK_EQ_INT(2, k1.blobs); /* packed bytes stored once each */
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "bert.l0.ffn1", layer_cb, &ls));
  CHECK_EQ_INT(2, ls.calls);
  CHECK(strcmp(ls.gpus[0], "NVIDIA A100") == 0 && strcmp(ls.gpus[1], "NVIDIA H100") == 0);
  CHECK(ls.ok[0] && ls.ok[1]);
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(3, ls.calls);
  CHECK(strcmp(ls.names[2], "bert.l1.ffn1") == 0 && ls.ok[2]);
  memset(&ls, 0, sizeof ls);
  ls.stop_after = 1;
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "no.such.layer", layer_cb, &ls));
  CHECK_EQ_INT(0, ls.calls);

  /* a bad layer is refused and the stored one stays whole */
  sf_layer_record bad = layer_fixture(v, "bert.l0.ffn1", "NVIDIA H100", "x");
  v[1].n_bucket = 16;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_layer(c, &bad));
  CHECK_CONTAINS(sf_cache_errmsg(c),
                 "sf_cache_put_layer: layer \"bert.l0.ffn1\": variants 0 and 1 both have n_bucket 16");
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "bert.l0.ffn1", layer_cb, &ls));
  CHECK(ls.calls == 2 && ls.ok[0] && ls.ok[1]);

  /* replacing a layer with one variant; unused packed bytes go away */
  sf_layer_record one = layer_fixture(v, "bert.l1.ffn1", "NVIDIA H100", NULL);
  one.n_variants = 1;
  v[0].packed = (const void *)"unique";
  v[0].packed_size = 6;
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &one));
  CHECK_EQ_INT(5, counts(c).layer_variants);
  CHECK_EQ_INT(3, counts(c).blobs);
  /* delete: all GPUs of the name, then NOT_FOUND */
  CHECK_EQ_INT(SF_OK, sf_cache_delete_layer(c, "bert.l1.ffn1"));
  CHECK_EQ_INT(2, counts(c).blobs);
  CHECK_EQ_INT(SF_OK, sf_cache_delete_layer(c, "bert.l0.ffn1"));
  sf_cache_counts k2 = counts(c);
  CHECK_EQ_INT(0, k2.layers);
  CHECK_EQ_INT(0, k2.layer_variants);
  CHECK_EQ_INT(0, k2.blobs);
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_delete_layer(c, "bert.l0.ffn1"));
  CHECK_CONTAINS(sf_cache_errmsg(c), "no layer named bert.l0.ffn1");
  CHECK_CONTAINS(sf_cache_errmsg(c), path);
  /* an empty packed buffer is fine */
  sf_layer_record empty = layer_fixture(v, "tiny", "NVIDIA H100", NULL);
  v[0].packed = NULL;
  v[0].packed_size = 0;
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &empty));
  sf_cache_close(c);

  /* everything is still there after reopening */
  CHECK_EQ_INT(SF_OK, sf_cache_open(path, 0, &c));
  sf_cache_counts k3 = counts(c);
  CHECK_EQ_INT(2, k3.binaries);
  CHECK_EQ_INT(6, k3.trials);
  CHECK_EQ_INT(1, k3.layers);
  sf_cache_close(c);
}

static void test_refused(void) {
  sf_cache *c = NULL;
  /* missing */
  const char *missing = tmp_path("missing.db");
  remove_db(missing);
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_open(missing, 0, &c));
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_errcode(c));
  CHECK_CONTAINS(sf_cache_errmsg(c), missing);
  CHECK_CONTAINS(sf_cache_errmsg(c), "no such file (open with SF_CACHE_CREATE to create it)");
  sf_cache_close(c);
  CHECK_EQ_INT(SF_ERR_NOT_FOUND,
               sf_cache_open(missing, SF_CACHE_READONLY | SF_CACHE_CREATE, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "no such file (a read-only open never creates one)");
  sf_cache_close(c);
  CHECK(access(missing, F_OK) != 0);

  /* a text file */
  const char *text = tmp_path("notes.txt");
  write_file(text, "These are notes, not a database.\n"
                   "They are long enough to fill one SQLite header, which is "
                   "one hundred bytes long.\n");
  snapshot before = take(text);
  int modes[] = {0, SF_CACHE_CREATE, SF_CACHE_READONLY};
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_open(text, modes[i], &c));
    CHECK_CONTAINS(sf_cache_errmsg(c), text);
    CHECK_CONTAINS(sf_cache_errmsg(c), "not a SQLite database (the file does not start with the SQLite header)");
    sf_cache_close(c);
  }
  CHECK(same_as(&before, text));
  free(before.bytes);
  /* a short text file */
  const char *shorty = tmp_path("short.txt");
  write_file(shorty, "hi\n");
  before = take(shorty);
  CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_open(shorty, SF_CACHE_CREATE, &c));
  sf_cache_close(c);
  CHECK(same_as(&before, shorty));
  free(before.bytes);

  /* another application's SQLite database (its own application_id) */
  const char *foreign = tmp_path("foreign.db");
  remove_db(foreign);
  sql(foreign, "PRAGMA application_id = 1234; CREATE TABLE notes(x);"
               "INSERT INTO notes VALUES ('keep me')");
  before = take(foreign);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_open(foreign, modes[i], &c));
    CHECK_CONTAINS(sf_cache_errmsg(c), foreign);
    CHECK_CONTAINS(sf_cache_errmsg(c), "a SQLite database of another application (application_id 0x000004d2");
    sf_cache_close(c);
  }
  CHECK(same_as(&before, foreign));
  free(before.bytes);
  char side[4400];
  snprintf(side, sizeof side, "%s-wal", foreign);
  CHECK(access(side, F_OK) != 0);
  /* ... and one with no application_id but tables of its own */
  const char *plain = tmp_path("plain.db");
  remove_db(plain);
  sql(plain, "CREATE TABLE t(x); INSERT INTO t VALUES (1)");
  before = take(plain);
  CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_open(plain, SF_CACHE_CREATE, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "without the sparseforge marker (application_id 0, 1 schema objects");
  sf_cache_close(c);
  CHECK(same_as(&before, plain));
  free(before.bytes);

  /* a cache from a newer sparseforge */
  const char *newer = tmp_path("newer.db");
  sf_cache_close(open_new("newer.db"));
  sql(newer, "PRAGMA user_version = 99");
  before = take(newer);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(SF_ERR_DB_VERSION, sf_cache_open(newer, modes[i], &c));
    CHECK_CONTAINS(sf_cache_errmsg(c), newer);
    CHECK_CONTAINS(sf_cache_errmsg(c), "schema version 99 is newer than this library's 1");
    sf_cache_close(c);
  }
  CHECK(same_as(&before, newer));
  free(before.bytes);

  /* an empty file: read-only refuses, writable initializes */
  const char *empty = tmp_path("empty.db");
  remove_db(empty);
  write_file(empty, "");
  CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_open(empty, SF_CACHE_READONLY, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "an empty file, not yet a sparseforge cache");
  sf_cache_close(c);
  CHECK_EQ_INT(SF_OK, sf_cache_open(empty, 0, &c));
  sf_cache_close(c);
  CHECK_EQ_INT(SF_CACHE_APPLICATION_ID, sql(empty, "PRAGMA application_id"));

  /* a directory */
  CHECK_EQ_INT(SF_ERR_IO, sf_cache_open(g_dir, SF_CACHE_CREATE, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "is a directory");
  sf_cache_close(c);
}

/* Appends each row's column `name` ("name TYPE notnull") to a string. */
typedef struct {
  char text[2048];
} column_list;

static int column_cb(void *user, int n, char **vals, char **names) {
  (void)names;
  column_list *l = user;
  size_t len = strlen(l->text);
  if (n >= 4)
    snprintf(l->text + len, sizeof l->text - len, "%s%s %s %s",
             len ? ", " : "", vals[1] ? vals[1] : "?", vals[2] ? vals[2] : "?",
             vals[3] ? vals[3] : "?");
  return 0;
}

/* The schema's layer_variants columns are those of version 1, and its
 * launch columns are SF_LAUNCH_RECORD_FIELDS': grid[3] as grid0..grid2, a
 * scalar by its name, each INTEGER NOT NULL. */
static void test_schema(void) {
  sf_cache_close(open_new("schema.db"));
  const char *path = tmp_path("schema.db");
  sqlite3 *db = NULL;
  column_list got = {""};
  CHECK_EQ_INT(0, db_open(path, &db, DB_OPEN_READWRITE, NULL));
  CHECK_EQ_INT(0, db_exec(db, "PRAGMA table_info(layer_variants)", column_cb,
                          &got, NULL));
  db_close(db);
  const char *v1 =
      "layer_name TEXT 1, gpu_name TEXT 1, n_bucket INTEGER 1, source TEXT 1, "
      "source_sha256 TEXT 1, kernel_name TEXT 1, options TEXT 1, "
      "generator_version TEXT 1, grid0 INTEGER 1, grid1 INTEGER 1, "
      "grid2 INTEGER 1, n_axis INTEGER 1, n_tile INTEGER 1, block0 INTEGER 1, "
      "block1 INTEGER 1, block2 INTEGER 1, shared_bytes INTEGER 1, "
      "zero_output INTEGER 1, packed_sha256 TEXT 1, packed_size INTEGER 1, "
      "config TEXT 0";
  CHECK_STREQ(v1, got.text);
  column_list table = {""};
  size_t len = 0;
#define TEST_SCALAR_(type, field, doc)                                     \
  len += (size_t)snprintf(table.text + len, sizeof table.text - len,        \
                          "%s" #field " INTEGER 1", len ? ", " : "");
#define TEST_ARRAY_(type, field, count, doc)                               \
  for (int k = 0; k < (count); k++)                                         \
    len += (size_t)snprintf(table.text + len, sizeof table.text - len,      \
                            "%s" #field "%d INTEGER 1", len ? ", " : "", k);
  SF_LAUNCH_RECORD_FIELDS(TEST_SCALAR_, TEST_ARRAY_)
#undef TEST_SCALAR_
#undef TEST_ARRAY_
  CHECK_CONTAINS(got.text, table.text);
}

static void test_readonly(void) {
  sf_cache *c = open_new("ro.db");
  if (!c) return;
  sf_trial t = trial("env", "cfg", 16, SF_TRIAL_OK, 1.0);
  CHECK_EQ_INT(SF_OK, sf_cache_put_trial(c, &t));
  sf_cache_close(c);
  const char *path = tmp_path("ro.db");
  snapshot before = take(path);
  CHECK_EQ_INT(SF_OK, sf_cache_open(path, SF_CACHE_READONLY, &c));
  trial_seen s;
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, NULL, trial_cb, &s));
  CHECK_EQ_INT(1, s.n);
  t.config = "cfg2";
  CHECK_EQ_INT(SF_ERR_DB, sf_cache_put_trial(c, &t));
  CHECK_CONTAINS(sf_cache_errmsg(c), "cannot store a trial: the cache was opened read-only (SF_CACHE_READONLY)");
  CHECK_EQ_INT(SF_ERR_DB, sf_cache_merge(c, path, NULL, NULL, NULL));
  CHECK_CONTAINS(sf_cache_errmsg(c), "read-only");
  CHECK_EQ_INT(SF_ERR_DB, sf_cache_delete_layer(c, "x"));
  sf_cache_close(c);
  CHECK(same_as(&before, path));
  free(before.bytes);
}

static void test_corrupt(void) {
  sf_cache *c = open_new("corrupt.db");
  if (!c) return;
  const char *path = tmp_path("corrupt.db");
  sf_binary_key k = key_for("extern \"C\" __global__ void k() {}", "sm_90a");
  sf_binary *bin = make_binary("cubin-marker-0123456789", SF_BINARY_CUBIN);
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, &k, bin));
  sf_layer_variant v[2];
  sf_layer_record r = layer_fixture(v, "bad.layer", "NVIDIA H100", NULL);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r));
  sf_layer_record r2 = layer_fixture(v, "good.layer", "NVIDIA H100", NULL);
  v[0].packed = "fine"; v[0].packed_size = 4;
  v[1].packed = "also fine"; v[1].packed_size = 9;
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r2));
  sf_cache_close(c);

  /* flip one byte of each stored blob with plain SQLite */
  sql(path, "UPDATE binaries SET blob = CAST(replace(CAST(blob AS TEXT),"
            " 'cubin-marker', 'cubin-markeR') AS BLOB)");
  sql(path, "UPDATE blobs SET data = CAST(replace(CAST(data AS TEXT),"
            " 'packed-marker-BBBB', 'packed-marker-BBBC') AS BLOB)"
            " WHERE size = 23");
  CHECK_EQ_INT(1, sql(path, "SELECT count(*) FROM binaries WHERE instr(blob, 'cubin-markeR') > 0"));

  CHECK_EQ_INT(SF_OK, sf_cache_open(path, 0, &c));
  char hex[65];
  sf_binary_key_hex(&k, hex);
  sf_binary *got = (sf_binary *)1;
  CHECK_EQ_INT(SF_ERR_CORRUPT, sf_cache_get_binary(c, &k, &got));
  CHECK(got == NULL);
  CHECK_CONTAINS(sf_cache_errmsg(c), "binary ");
  CHECK_CONTAINS(sf_cache_errmsg(c), hex);
  CHECK_CONTAINS(sf_cache_errmsg(c), "is corrupt");
  CHECK_CONTAINS(sf_cache_errmsg(c), "not used");
  /* The walk hands out both layers: the damaged one as unusable, with a
   * problem naming its variant and no variants, the other whole. */
  unsigned char flipped[sizeof PACKED_B];
  memcpy(flipped, PACKED_B, sizeof flipped);
  flipped[17] = 'C';
  char want_sha[65], got_sha[65], problem[512];
  sf_sha256_hex(PACKED_B, sizeof PACKED_B, want_sha);
  sf_sha256_hex(flipped, sizeof flipped, got_sha);
  snprintf(problem, sizeof problem,
           "the packed weights of variant 1 (n_bucket 256) failed their "
           "sha256: 23 bytes hash to %s, not the stored %s",
           got_sha, want_sha);
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "bad.layer", layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  CHECK(ls.unusable[0]);
  CHECK_STREQ(problem, ls.problem[0]);
  memset(&ls, 0, sizeof ls);
  ls.want = v; /* good.layer's variants */
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(2, ls.calls);
  CHECK(strcmp(ls.names[0], "bad.layer") == 0 && ls.unusable[0]);
  CHECK_STREQ(problem, ls.problem[0]);
  CHECK(strcmp(ls.names[1], "good.layer") == 0 && ls.ok[1]);
  CHECK_STREQ("", ls.problem[1]);
  CHECK_EQ_INT(2, ls.n_variants[1]);
  /* the walk still stops when asked to, at the damaged layer */
  memset(&ls, 0, sizeof ls);
  ls.stop_after = 1;
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);

  /* merging from the damaged file copies what is whole (every damaged
   * kind in detail: test_cache_corrupt.c) */
  sf_cache *dst = open_new("corrupt-dst.db");
  int64_t added = -1;
  CHECK_EQ_INT(SF_OK, sf_cache_merge(dst, path, &added, NULL, NULL));
  CHECK_EQ_INT(1 + 2 + 2, added); /* good.layer, its variants and blobs */
  CHECK_EQ_INT(1, counts(dst).layers);
  CHECK_EQ_INT(0, counts(dst).binaries);
  sf_cache_close(dst);

  /* storing the binary again repairs it; so does storing the layer */
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, &k, bin));
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(c, &k, &got));
  sf_binary_free(got);
  r = layer_fixture(v, "bad.layer", "NVIDIA H100", NULL);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r));
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "bad.layer", layer_cb, &ls));
  CHECK(ls.calls == 1 && ls.ok[0]);

  /* a variant whose blob vanished */
  sf_cache_close(c);
  sql(path, "DELETE FROM blobs WHERE size = 4");
  CHECK_EQ_INT(SF_OK, sf_cache_open(path, 0, &c));
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "good.layer", layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  CHECK(ls.unusable[0]);
  sf_sha256_hex("fine", 4, want_sha);
  snprintf(problem, sizeof problem,
           "the packed weights of variant 0 (n_bucket 16) are missing "
           "(sha256 %s)", want_sha);
  CHECK_STREQ(problem, ls.problem[0]);
  /* a layer row whose variants are gone */
  sf_cache_close(c);
  sql(path, "DELETE FROM layer_variants WHERE layer_name = 'good.layer'");
  CHECK_EQ_INT(SF_OK, sf_cache_open(path, 0, &c));
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(2, ls.calls);
  CHECK(ls.ok[0] && ls.unusable[1]);
  CHECK_STREQ("it has no variants", ls.problem[1]);
  sf_cache_close(c);
  sf_binary_free(bin);
}

static void fill(sf_cache *c, const char *tag, int first, int count) {
  char cfg[64];
  for (int i = first; i < first + count; i++) {
    snprintf(cfg, sizeof cfg, "cfg-%d", i);
    sf_trial t = trial("env-1", cfg, 256, SF_TRIAL_OK, 1.0 + i);
    t.message = tag;
    CHECK_EQ_INT(SF_OK, sf_cache_put_trial(c, &t));
  }
}

static void test_merge_export(void) {
  sf_cache *a = open_new("merge-a.db"), *b = open_new("merge-b.db");
  if (!a || !b) return;
  const char *pa = tmp_path("merge-a.db"), *pb = tmp_path("merge-b.db");
  sf_device_info dev = device_fixture();
  char env[65];
  /* a: trials 0..9, one env, one layer; b: trials 5..19 (5 shared), the
   * same env, the same layer (other content) and a second layer with a
   * binary whose source is one of its variants' */
  fill(a, "from a", 0, 10);
  fill(b, "from b", 5, 15);
  CHECK_EQ_INT(SF_OK, sf_cache_put_env(a, &dev, env));
  CHECK_EQ_INT(SF_OK, sf_cache_put_env(b, &dev, env));
  sf_matrix_record m = {"fp-matrix-1", 3072, 768, 1000, "fp16", NULL};
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(b, &m));
  sf_layer_variant v[2];
  sf_layer_record la = layer_fixture(v, "shared.layer", "NVIDIA H100", "a's");
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(a, &la));
  sf_layer_record lb = layer_fixture(v, "shared.layer", "NVIDIA H100", "b's");
  v[0].n_bucket = 32; /* b's variants differ: they must not mix into a's */
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(b, &lb));
  sf_layer_record lb2 = layer_fixture(v, "b.only", "NVIDIA H100", "b2");
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(b, &lb2));
  sf_binary_key k = key_for(v[0].source, "sm_90a");
  sf_binary *bin = make_binary("cubin-of-k16", SF_BINARY_CUBIN);
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(b, &k, bin));
  sf_binary_key k_other = key_for("unrelated source", "sm_90a");
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(b, &k_other, bin));
  sf_binary_free(bin);
  sf_cache_close(b);
  snapshot before = take(pb);

  int64_t added = -1;
  CHECK_EQ_INT(SF_OK, sf_cache_merge(a, pb, &added, NULL, NULL));
  /* 10 trials, 1 matrix, 2 binaries, layer b.only: 1 row + 2 variants +
   * 2 blobs (b.only's packed bytes equal a's: already there, not added) */
  CHECK_COUNTS(a, "binaries 2 envs 1 matrices 1 trials 20 layers 2 "
                  "variants 4 blobs 2");
  CHECK_EQ_INT(10 + 1 + 2 + 1 + 2, added);
  /* what a had wins */
  trial_seen s;
  memset(&s, 0, sizeof s);
  sf_trial_filter f = {NULL, NULL, NULL, -1};
  CHECK_EQ_INT(SF_OK, sf_cache_trials(a, &f, trial_cb, &s));
  CHECK_EQ_INT(20, s.n);
  CHECK(strcmp(s.message[5], "from a") == 0);   /* cfg-5, shared */
  CHECK(strcmp(s.message[10], "from b") == 0);  /* cfg-10 */
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(a, "shared.layer", layer_cb, &ls));
  CHECK(ls.calls == 1 && ls.ok[0] && ls.n_variants[0] == 2);
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(a, "b.only", layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  CHECK_EQ_INT(2, ls.n_variants[0]);
  /* twice adds nothing; the source file is untouched */
  CHECK_EQ_INT(SF_OK, sf_cache_merge(a, pb, &added, NULL, NULL));
  CHECK_EQ_INT(0, added);
  CHECK_EQ_INT(20, counts(a).trials);
  CHECK(same_as(&before, pb));
  free(before.bytes);

  /* what merge refuses */
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_merge(a, tmp_path("missing.db"), &added, NULL, NULL));
  CHECK_CONTAINS(sf_cache_errmsg(a), "no such file");
  CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_merge(a, tmp_path("notes.txt"), &added, NULL, NULL));
  CHECK_CONTAINS(sf_cache_errmsg(a), "notes.txt: not a SQLite database");
  CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_merge(a, tmp_path("foreign.db"), &added, NULL, NULL));
  CHECK_EQ_INT(SF_ERR_DB_VERSION, sf_cache_merge(a, tmp_path("newer.db"), &added, NULL, NULL));
  CHECK_CONTAINS(sf_cache_errmsg(a), "schema version 99");
  CHECK_EQ_INT(20, counts(a).trials);

  /* export one layer: its variants, packed bytes, matrix and binary */
  const char *pc = tmp_path("export-c.db");
  remove_db(pc);
  const char *names[] = {"b.only", NULL};
  CHECK_EQ_INT(SF_OK, sf_cache_export(a, pc, names, &added, NULL, NULL));
  CHECK_EQ_INT(1 + 1 + 2 + 2 + 1, added);
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(pc, SF_CACHE_READONLY, &c));
  CHECK_COUNTS(c, "binaries 1 envs 0 matrices 1 trials 0 layers 1 "
                  "variants 2 blobs 2");
  sf_binary *got = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(c, &k, &got));
  sf_binary_free(got);
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_get_binary(c, &k_other, &got));
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "b.only", layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  /* export from a read-only cache, every layer */
  const char *pd = tmp_path("export-d.db");
  remove_db(pd);
  CHECK_EQ_INT(SF_OK, sf_cache_export(c, pd, NULL, &added, NULL, NULL));
  sf_cache_close(c);
  CHECK_EQ_INT(1, sql(pd, "SELECT count(*) FROM layers"));
  /* into an existing file: switched to journal_mode DELETE (header bytes
   * 18 and 19 are 1) when nobody else has it open; left in WAL (2), and
   * still SF_OK, while another handle holds it (a WAL connection keeps
   * its shared lock from its first read until it closes) */
  sf_cache *holder = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(pd, 0, &holder));
  CHECK_EQ_INT(1, counts(holder).layers);
  snapshot h = take(pd);
  CHECK(h.size > 100 && h.bytes[18] == 2);
  free(h.bytes);
  CHECK_EQ_INT(SF_OK, sf_cache_export(a, pd, names, &added, NULL, NULL));
  h = take(pd);
  CHECK(h.size > 100 && h.bytes[18] == 2 && h.bytes[19] == 2);
  free(h.bytes);
  sf_cache_close(holder);
  CHECK_EQ_INT(SF_OK, sf_cache_export(a, pd, names, &added, NULL, NULL));
  h = take(pd);
  CHECK(h.size > 100 && h.bytes[18] == 1 && h.bytes[19] == 1);
  free(h.bytes);
  /* an unknown name writes nothing, not even the file */
  const char *pe = tmp_path("export-e.db");
  remove_db(pe);
  const char *bad[] = {"b.only", "no.such", NULL};
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_export(a, pe, bad, &added, NULL, NULL));
  CHECK_CONTAINS(sf_cache_errmsg(a), "no layer named no.such to export");
  CHECK(access(pe, F_OK) != 0);
  /* into a file that is not ours */
  CHECK_EQ_INT(SF_ERR_NOT_A_DB, sf_cache_export(a, tmp_path("notes.txt"), names, &added, NULL, NULL));
  CHECK_CONTAINS(sf_cache_errmsg(a), "notes.txt: not a SQLite database");
  sf_cache_close(a);
  (void)pa;
}

#define EXPECT_INVALID(call, text)                         \
  do {                                                     \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, (call));              \
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_errcode(c)); \
    CHECK_CONTAINS(sf_cache_errmsg(c), (text));            \
  } while (0)

static int never_cb_t(const sf_trial *t, void *u) { (void)t; (void)u; return 0; }
static int never_cb_l(const sf_layer_record *r, void *u) { (void)r; (void)u; return 0; }

static void test_null_args(void) {
  sf_cache *c = (sf_cache *)1;
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_open("x.db", 0, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_open(NULL, SF_CACHE_CREATE, &c));
  CHECK(c != NULL);
  CHECK_CONTAINS(sf_cache_errmsg(c), "sf_cache_open: path is NULL");
  sf_cache_close(c);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_open("", SF_CACHE_CREATE, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "sf_cache_open: path is empty");
  sf_cache_close(c);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_open(tmp_path("f.db"), 64, &c));
  CHECK_CONTAINS(sf_cache_errmsg(c), "sf_cache_open: unknown flags 0x40");
  sf_cache_close(c);
  sf_cache_close(NULL);
  CHECK(strcmp(sf_cache_errmsg(NULL), "NULL cache") == 0);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_errcode(NULL));

  sf_binary_key k = key_for("src", "sm_90a");
  sf_binary *bin = make_binary("bytes", SF_BINARY_CUBIN), *out = NULL;
  sf_device_info dev = device_fixture();
  char env[65];
  sf_matrix_record m = {"fp", 4, 4, 2, "fp32", NULL};
  sf_trial t = trial("env", "cfg", 16, SF_TRIAL_OK, 1.0);
  sf_layer_variant v[2];
  sf_layer_record r = layer_fixture(v, "L", "G", NULL);
  sf_cache_counts counts_out;
  int64_t added;

  /* NULL cache: the code, no message to keep */
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_binary(NULL, &k, bin));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_get_binary(NULL, &k, &out));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_env(NULL, &dev, env));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_matrix(NULL, &m));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_trial(NULL, &t));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_trials(NULL, NULL, never_cb_t, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_put_layer(NULL, &r));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_layers(NULL, NULL, never_cb_l, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_delete_layer(NULL, "L"));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_merge(NULL, "x.db", &added, NULL, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_export(NULL, "x.db", NULL, &added, NULL, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_count(NULL, &counts_out));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_envs(NULL, env_cb, NULL));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_cache_matrices(NULL, NULL, matrix_cb, NULL));

  c = open_new("args.db");
  if (!c) return;
  EXPECT_INVALID(sf_cache_put_binary(c, NULL, bin), "sf_cache_put_binary: key is NULL");
  EXPECT_INVALID(sf_cache_put_binary(c, &k, NULL), "sf_cache_put_binary: bin is NULL");
  sf_binary_key kb = k;
  kb.options = NULL;
  EXPECT_INVALID(sf_cache_put_binary(c, &kb, bin), "sf_cache_put_binary: key->options is NULL");
  EXPECT_INVALID(sf_cache_get_binary(c, NULL, &out), "sf_cache_get_binary: key is NULL");
  EXPECT_INVALID(sf_cache_get_binary(c, &k, NULL), "sf_cache_get_binary: out is NULL");
  kb = k;
  kb.arch = NULL;
  EXPECT_INVALID(sf_cache_get_binary(c, &kb, &out), "sf_cache_get_binary: key->arch is NULL");
  EXPECT_INVALID(sf_cache_put_env(c, NULL, env), "sf_cache_put_env: dev is NULL");
  EXPECT_INVALID(sf_cache_put_env(c, &dev, NULL), "sf_cache_put_env: env_key is NULL");
  sf_device_info noname = dev;
  noname.name[0] = '\0';
  EXPECT_INVALID(sf_cache_put_env(c, &noname, env), "sf_cache_put_env: dev->name is empty");
  EXPECT_INVALID(sf_cache_put_matrix(c, NULL), "sf_cache_put_matrix: m is NULL");
  sf_matrix_record mb = m;
  mb.fingerprint = NULL;
  EXPECT_INVALID(sf_cache_put_matrix(c, &mb), "sf_cache_put_matrix: m->fingerprint is NULL or empty");
  mb = m;
  mb.dtype = NULL;
  EXPECT_INVALID(sf_cache_put_matrix(c, &mb), "sf_cache_put_matrix: m->dtype is NULL or empty");
  mb = m;
  mb.nnz = 17;
  EXPECT_INVALID(sf_cache_put_matrix(c, &mb), "bad shape 4 x 4 with 17 nonzeros");
  EXPECT_INVALID(sf_cache_put_trial(c, NULL), "sf_cache_put_trial: t is NULL");
  sf_trial tb = t;
  tb.env_key = NULL;
  EXPECT_INVALID(sf_cache_put_trial(c, &tb), "sf_cache_put_trial: t->env_key is NULL");
  tb = t;
  tb.config = NULL;
  EXPECT_INVALID(sf_cache_put_trial(c, &tb), "sf_cache_put_trial: t->config is NULL");
  tb = t;
  tb.status = 5;
  EXPECT_INVALID(sf_cache_put_trial(c, &tb), "status 5 is not an sf_trial_status (0..4)");
  tb = t;
  tb.n = -3;
  EXPECT_INVALID(sf_cache_put_trial(c, &tb), "negative n (-3)");
  EXPECT_INVALID(sf_cache_trials(c, NULL, NULL, NULL), "sf_cache_trials: cb is NULL");
  EXPECT_INVALID(sf_cache_put_layer(c, NULL), "sf_cache_put_layer: rec is NULL");
  sf_layer_record rb = r;
  rb.gpu_name = NULL;
  EXPECT_INVALID(sf_cache_put_layer(c, &rb), "sf_cache_put_layer: rec->gpu_name is NULL");
  rb = r;
  rb.variants = NULL;
  EXPECT_INVALID(sf_cache_put_layer(c, &rb),
                 "sf_cache_put_layer: layer \"L\": no variants (n_variants 2, variants NULL)");
  rb = r;
  rb.n_variants = 0;
  EXPECT_INVALID(sf_cache_put_layer(c, &rb),
                 "sf_cache_put_layer: layer \"L\": no variants (n_variants 0)");
  rb = r;
  rb.rows = 0;
  EXPECT_INVALID(sf_cache_put_layer(c, &rb),
                 "sf_cache_put_layer: layer \"L\": rows 0, cols 768, x_elem_size 2, "
                 "y_elem_size 2 must all be positive");
  v[1].source = NULL;
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "sf_cache_put_layer: layer \"L\" variant 1 (n_bucket 256): NULL or empty source");
  r = layer_fixture(v, "L", "G", NULL);
  v[1].kernel_name = "";
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "sf_cache_put_layer: layer \"L\" variant 1 (n_bucket 256): no kernel name");
  r = layer_fixture(v, "L", "G", NULL);
  v[0].n_bucket = 0;
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "sf_cache_put_layer: layer \"L\" variant 0 (n_bucket 0): n_bucket is below 1");
  /* the launch record: sf_launch_record_problem's words and the record */
  r = layer_fixture(v, "L", "G", NULL);
  v[0].launch.block[2] = 0;
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "sf_cache_put_layer: layer \"L\" variant 0 (n_bucket 16): a grid or "
                 "block dimension is 0 (grid 96 x 1 x 1, block 128 x 1 x 0, "
                 "n_axis 1, n_tile 16, 4096 bytes shared memory)");
  r = layer_fixture(v, "L", "G", NULL);
  v[0].launch.n_axis = 3;
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "layer \"L\" variant 0 (n_bucket 16): n_axis is outside -1..2 (grid 96");
  r = layer_fixture(v, "L", "G", NULL);
  v[0].launch.n_tile = 0;
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "layer \"L\" variant 0 (n_bucket 16): n_tile is below 1 while n_axis "
                 "names an axis (grid 96");
  r = layer_fixture(v, "L", "G", NULL);
  v[1].packed = NULL;
  EXPECT_INVALID(sf_cache_put_layer(c, &r),
                 "layer \"L\" variant 1 (n_bucket 256): NULL packed with packed_size 23");
  EXPECT_INVALID(sf_cache_layers(c, NULL, NULL, NULL), "sf_cache_layers: cb is NULL");
  EXPECT_INVALID(sf_cache_delete_layer(c, NULL), "sf_cache_delete_layer: name is NULL");
  EXPECT_INVALID(sf_cache_merge(c, NULL, &added, NULL, NULL), "sf_cache_merge: other_path is NULL");
  EXPECT_INVALID(sf_cache_export(c, NULL, NULL, &added, NULL, NULL), "sf_cache_export: dest_path is NULL");
  EXPECT_INVALID(sf_cache_count(c, NULL), "sf_cache_count: out is NULL");
  EXPECT_INVALID(sf_cache_envs(c, NULL, NULL), "sf_cache_envs: cb is NULL");
  EXPECT_INVALID(sf_cache_matrices(c, NULL, NULL, NULL), "sf_cache_matrices: cb is NULL");
  /* nothing was stored by any of these */
  sf_cache_counts k0 = counts(c);
  CHECK_EQ_INT(0, k0.binaries + k0.envs + k0.matrices + k0.trials + k0.layers);
  sf_cache_close(c);
  sf_binary_free(bin);
}

int main(void) {
  if (!fixture_start("test_cache")) return 1;
  test_binary_keys();
  test_roundtrip();
  test_refused();
  test_schema();
  test_readonly();
  test_corrupt();
  test_merge_export();
  test_null_args();
  fixture_dir_remove();
  CHECK_DONE();
}
