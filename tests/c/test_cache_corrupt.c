/* test_cache_corrupt.c -- damage stays in its record.  One byte is flipped
 * (with plain SQLite, behind the library's back) in each kind of blob: a
 * binary's bytes, packed weights shared by two layers, packed weights of
 * one layer; one layer also loses its packed weights and one all of its
 * variants.  The listing hands out the whole layers and names the damaged
 * ones; fetching the damaged binary fails naming it; merge and export copy
 * every good record, skip exactly the damaged ones with one callback each
 * (naming the source file), and copy them once the source is repaired; a
 * failed export leaves no file behind. */
#include "cache_fixtures.h"

#define GPU "NVIDIA H100"

/* Packed weights: text, so that SQL can flip a byte with replace(). */
static const char G16[] = "good-weights-for-n16";
static const char G256[] = "good-weights-for-n256";
static const char SHARED[] = "shared-marker-weights";
static const char OWN[] = "own-marker-weights";
static const char LOST[] = "lost-marker-weights";
static const char CUBIN_GOOD[] = "cubin-good-marker";
static const char CUBIN_BAD[] = "cubin-bad-marker";

/* The fixture layer with the packed weights p16 and p256. */
static void put(sf_cache *c, const char *name, const char *p16,
                const char *p256) {
  sf_layer_variant v[2];
  sf_layer_record r = layer_fixture(v, name, GPU, NULL);
  v[0].packed = p16;
  v[0].packed_size = strlen(p16);
  v[1].packed = p256;
  v[1].packed_size = strlen(p256);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(c, &r));
}

/* The binaries: one whole, one to be damaged; their sources are the
 * fixture's variants' (so that export picks them). */
static void binary_keys(sf_binary_key *good, sf_binary_key *bad) {
  sf_layer_variant v[2];
  layer_fixture(v, "x", GPU, NULL);
  *good = key_for(v[0].source, "sm_90a");
  *bad = key_for(v[1].source, "sm_80");
}

static void put_binary(sf_cache *c, const sf_binary_key *k, const char *text) {
  sf_binary *b = make_binary(text, SF_BINARY_CUBIN);
  CHECK_EQ_INT(SF_OK, sf_cache_put_binary(c, k, b));
  sf_binary_free(b);
}

/* Every record, whole: whole.layer, shared.a and shared.b (sharing the
 * SHARED weights), own.bad (its own OWN weights), lost.layer (LOST),
 * empty.layer; two binaries, a matrix, an environment, three trials. */
static void put_everything(sf_cache *c) {
  put(c, "whole.layer", G16, G256);
  put(c, "shared.a", G16, SHARED);
  put(c, "shared.b", G16, SHARED);
  put(c, "own.bad", OWN, G256);
  put(c, "lost.layer", G16, LOST);
  put(c, "empty.layer", G16, G256);
  sf_binary_key good, bad;
  binary_keys(&good, &bad);
  put_binary(c, &good, CUBIN_GOOD);
  put_binary(c, &bad, CUBIN_BAD);
  sf_matrix_record m = {"fp-matrix-1", 3072, 768, 1000, "fp16", NULL};
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(c, &m));
  sf_device_info dev = device_fixture();
  char env[65];
  CHECK_EQ_INT(SF_OK, sf_cache_put_env(c, &dev, env));
  for (int i = 0; i < 3; i++) {
    char cfg[16];
    snprintf(cfg, sizeof cfg, "cfg-%d", i);
    sf_trial t = trial(env, cfg, 256, SF_TRIAL_OK, 1.0 + i);
    CHECK_EQ_INT(SF_OK, sf_cache_put_trial(c, &t));
  }
}

/* Flips one byte of the binary and of the SHARED and OWN weights, removes
 * the LOST weights and empty.layer's variants. */
static void damage(const char *path) {
  sql(path, "UPDATE binaries SET blob = CAST(replace(CAST(blob AS TEXT),"
            " 'cubin-bad-marker', 'cubin-bad-markeR') AS BLOB)");
  sql(path, "UPDATE blobs SET data = CAST(replace(CAST(data AS TEXT),"
            " 'shared-marker', 'shared-markeR') AS BLOB)");
  sql(path, "UPDATE blobs SET data = CAST(replace(CAST(data AS TEXT),"
            " 'own-marker', 'own-markeR') AS BLOB)");
  CHECK_EQ_INT(2, sql(path, "SELECT count(*) FROM blobs"
                            " WHERE instr(data, 'markeR') > 0"));
  char lost[65], q[160];
  sf_sha256_hex(LOST, strlen(LOST), lost);
  snprintf(q, sizeof q, "DELETE FROM blobs WHERE sha256 = '%s'", lost);
  sql(path, q);
  sql(path, "DELETE FROM layer_variants WHERE layer_name = 'empty.layer'");
}

/* The sha256 of `text` with its 'r' after "marke" made 'R'. */
static void flipped_sha(const char *text, char out[65]) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", text);
  char *m = strstr(buf, "marker");
  if (m) m[5] = 'R';
  sf_sha256_hex(buf, strlen(buf), out);
}

static void sha(const char *text, char out[65]) {
  sf_sha256_hex(text, strlen(text), out);
}

/* The problem sf_cache_layers gives each damaged layer, and the message
 * merge or export gives it, with `src` the source's path. */
static void layer_problem(const char *name, char *out, size_t size) {
  char want[65], got[65];
  if (strcmp(name, "empty.layer") == 0) {
    snprintf(out, size, "it has no variants");
  } else if (strcmp(name, "lost.layer") == 0) {
    sha(LOST, want);
    snprintf(out, size,
             "the packed weights of variant 1 (n_bucket 256) are missing "
             "(sha256 %s)",
             want);
  } else {
    int own = strcmp(name, "own.bad") == 0;
    const char *text = own ? OWN : SHARED;
    sha(text, want);
    flipped_sha(text, got);
    snprintf(out, size,
             "the packed weights of variant %d (n_bucket %d) failed their "
             "sha256: %zu bytes hash to %s, not the stored %s",
             own ? 0 : 1, own ? 16 : 256, strlen(text), got, want);
  }
}

static void layer_message(const char *src, const char *name, char *out,
                          size_t size) {
  char problem[512];
  layer_problem(name, problem, sizeof problem);
  snprintf(out, size, "%s: layer \"%s\" (" GPU ") skipped: %s", src, name,
           problem);
}

static void binary_message(const char *src, char *out, size_t size) {
  sf_binary_key good, bad;
  binary_keys(&good, &bad);
  char hex[65], want[65], got[65];
  sf_binary_key_hex(&bad, hex);
  sha(CUBIN_BAD, want);
  flipped_sha(CUBIN_BAD, got);
  snprintf(out, size,
           "%s: binary %s (sm_80) skipped: its bytes failed their sha256: "
           "%zu bytes hash to %s, not the stored %s",
           src, hex, strlen(CUBIN_BAD), got, want);
}

/* What the skip callback received. */
typedef struct {
  int n;
  char msg[16][1024];
} skips_seen;

static void skip_cb(const char *message, void *user) {
  skips_seen *s = user;
  if (s->n < 16) snprintf(s->msg[s->n], sizeof s->msg[0], "%s", message);
  s->n++;
}

/* The callback got exactly these messages, in this order: the binary (when
 * `binary`), then each layer named in `layers` (NULL-terminated). */
static void check_skips(const skips_seen *s, const char *src, int binary,
                        const char *const *layers) {
  char want[1024];
  int i = 0;
  if (binary) {
    binary_message(src, want, sizeof want);
    CHECK_STREQ(want, s->n > i ? s->msg[i] : "(no call)");
    i++;
  }
  for (; *layers; layers++, i++) {
    layer_message(src, *layers, want, sizeof want);
    CHECK_STREQ(want, s->n > i ? s->msg[i] : "(no call)");
  }
  CHECK_EQ_INT(i, s->n);
}

static const char *const ALL_BAD[] = {"empty.layer", "lost.layer", "own.bad",
                                      "shared.a", "shared.b", NULL};

/* ---- tests ------------------------------------------------------------- */

static void test_listing_and_binaries(const char *src) {
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(src, SF_CACHE_READONLY, &c));
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, NULL, layer_cb, &ls));
  CHECK_EQ_INT(6, ls.calls);
  /* empty.layer lost.layer own.bad shared.a shared.b whole.layer */
  for (int i = 0; i < 5 && i < ls.calls; i++) {
    char problem[512];
    CHECK_STREQ(ALL_BAD[i], ls.names[i]);
    CHECK(ls.unusable[i]);
    layer_problem(ALL_BAD[i], problem, sizeof problem);
    CHECK_STREQ(problem, ls.problem[i]);
  }
  CHECK_STREQ("whole.layer", ls.names[5]);
  CHECK_STREQ("", ls.problem[5]);
  CHECK_EQ_INT(2, ls.n_variants[5]);

  sf_binary_key good, bad;
  binary_keys(&good, &bad);
  sf_binary *got = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(c, &good, &got));
  sf_binary_free(got);
  got = (sf_binary *)1;
  CHECK_EQ_INT(SF_ERR_CORRUPT, sf_cache_get_binary(c, &bad, &got));
  CHECK(got == NULL);
  char hex[65];
  sf_binary_key_hex(&bad, hex);
  CHECK_CONTAINS(sf_cache_errmsg(c), src);
  CHECK_CONTAINS(sf_cache_errmsg(c), hex);
  CHECK_CONTAINS(sf_cache_errmsg(c), "is corrupt");
  sf_cache_close(c);
}

static void test_merge(const char *src) {
  snapshot before = take(src);
  sf_cache *dst = open_new("merge-dst.db");
  if (!dst) return;
  skips_seen s;
  memset(&s, 0, sizeof s);
  int64_t added = -1;
  CHECK_EQ_INT(SF_OK, sf_cache_merge(dst, src, &added, skip_cb, &s));
  check_skips(&s, src, 1, ALL_BAD);
  /* 1 binary, 1 env, 1 matrix, 3 trials, whole.layer with its 2 variants
   * and 2 blobs (the good weights the damaged layers share come too) */
  CHECK_EQ_INT(1 + 1 + 1 + 3 + 1 + 2 + 2, added);
  CHECK_COUNTS(dst, "binaries 1 envs 1 matrices 1 trials 3 layers 1 "
                    "variants 2 blobs 2");
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(dst, NULL, layer_cb, &ls));
  CHECK_EQ_INT(1, ls.calls);
  CHECK_STREQ("whole.layer", ls.names[0]);
  CHECK_STREQ("", ls.problem[0]);
  /* again: nothing added, the same records skipped; the source untouched */
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_merge(dst, src, &added, skip_cb, &s));
  CHECK_EQ_INT(0, added);
  check_skips(&s, src, 1, ALL_BAD);
  /* no callback: the same outcome */
  CHECK_EQ_INT(SF_OK, sf_cache_merge(dst, src, &added, NULL, NULL));
  CHECK_EQ_INT(0, added);
  CHECK(same_as(&before, src));
  free(before.bytes);
  sf_cache_close(dst);

  /* what the destination already holds (the binary intact, own.bad) is
   * not reported: nothing of it is lost */
  sf_cache *has = open_new("merge-has.db");
  if (!has) return;
  sf_binary_key good, bad;
  binary_keys(&good, &bad);
  put_binary(has, &bad, CUBIN_BAD);
  put(has, "own.bad", OWN, G256);
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_merge(has, src, &added, skip_cb, &s));
  const char *const rest[] = {"empty.layer", "lost.layer", "shared.a",
                              "shared.b", NULL};
  check_skips(&s, src, 0, rest);
  sf_cache_close(has);
}

static void test_export(const char *src) {
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(src, SF_CACHE_READONLY, &c));
  if (!c) return;
  /* every layer into a new file */
  const char *all = tmp_path("export-all.db");
  remove_db(all);
  skips_seen s;
  memset(&s, 0, sizeof s);
  int64_t added = -1;
  CHECK_EQ_INT(SF_OK, sf_cache_export(c, all, NULL, &added, skip_cb, &s));
  check_skips(&s, src, 1, ALL_BAD);
  CHECK_EQ_INT(1 + 1 + 1 + 2 + 2, added); /* binary, matrix, layer, ... */
  /* one self-contained file: journal_mode DELETE in its header (bytes 18
   * and 19 are 1), no side files, no temporary file left */
  snapshot f = take(all);
  CHECK(f.size > 100 && f.bytes[18] == 1 && f.bytes[19] == 1);
  free(f.bytes);
  char list[4096];
  dir_list(g_dir, list, sizeof list);
  CHECK(!strstr(list, "export-all.db-"));
  CHECK(!strstr(list, "export-tmp"));
  sf_cache *e = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(all, SF_CACHE_READONLY, &e));
  CHECK_COUNTS(e, "binaries 1 envs 0 matrices 1 trials 0 layers 1 "
                  "variants 2 blobs 2");
  sf_cache_close(e);

  /* named layers: only their damage is reported */
  const char *two = tmp_path("export-two.db");
  remove_db(two);
  const char *names[] = {"shared.a", "whole.layer", NULL};
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_export(c, two, names, &added, skip_cb, &s));
  const char *const shared_a[] = {"shared.a", NULL};
  check_skips(&s, src, 1, shared_a);
  /* into an existing file: it gains what it lacks, damage is reported */
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_OK, sf_cache_export(c, two, NULL, &added, skip_cb, &s));
  CHECK_EQ_INT(0, added);
  check_skips(&s, src, 1, ALL_BAD);
  f = take(two);
  CHECK(f.size > 100 && f.bytes[18] == 1 && f.bytes[19] == 1);
  free(f.bytes);

  /* failures leave no file: a directory that does not exist, */
  const char *nodir = tmp_path("no-such-dir/x.db");
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(SF_ERR_IO, sf_cache_export(c, nodir, NULL, &added, skip_cb, &s));
  CHECK_CONTAINS(sf_cache_errmsg(c), nodir);
  CHECK(!strstr(sf_cache_errmsg(c), "export-tmp"));
  CHECK_EQ_INT(0, s.n);
  CHECK_EQ_INT(0, added);
  CHECK(access(nodir, F_OK) != 0);
  /* a name with no layer, */
  const char *never = tmp_path("never.db");
  remove_db(never);
  const char *bad[] = {"whole.layer", "no.such", NULL};
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_cache_export(c, never, bad, &added, skip_cb, &s));
  CHECK(access(never, F_OK) != 0);
  sf_cache_close(c);
  /* and a source refused once the temporary file exists (its schema
   * version made newer behind the library's back): the temporary file
   * and its side files are removed too */
  const char *newer = tmp_path("newer-src.db");
  sf_cache *n = open_new("newer-src.db");
  if (!n) return;
  put(n, "whole.layer", G16, G256);
  sql(newer, "PRAGMA user_version = 99");
  CHECK_EQ_INT(SF_ERR_DB_VERSION, sf_cache_export(n, never, NULL, &added, skip_cb, &s));
  CHECK_CONTAINS(sf_cache_errmsg(n), newer);
  CHECK_CONTAINS(sf_cache_errmsg(n), "schema version 99");
  CHECK_EQ_INT(0, s.n);
  CHECK(access(never, F_OK) != 0);
  dir_list(g_dir, list, sizeof list);
  CHECK(!strstr(list, "never.db"));
  CHECK(!strstr(list, "export-tmp"));
  sf_cache_close(n);
}

/* Repairing the source (storing the damaged records again) and merging
 * again adds what was skipped. */
static void test_repair(const char *src) {
  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(src, 0, &c));
  if (!c) return;
  sf_binary_key good, bad;
  binary_keys(&good, &bad);
  put_binary(c, &bad, CUBIN_BAD);
  put(c, "shared.a", G16, SHARED); /* repairs shared.b's weights too */
  put(c, "own.bad", OWN, G256);
  put(c, "lost.layer", G16, LOST);
  put(c, "empty.layer", G16, G256);
  sf_cache_close(c);
  sf_cache *dst = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(tmp_path("merge-dst.db"), 0, &dst));
  if (!dst) return;
  skips_seen s;
  memset(&s, 0, sizeof s);
  int64_t added = -1;
  CHECK_EQ_INT(SF_OK, sf_cache_merge(dst, src, &added, skip_cb, &s));
  CHECK_EQ_INT(0, s.n);
  /* the binary, 5 layers, their 10 variants, 3 blobs (SHARED, OWN, LOST) */
  CHECK_EQ_INT(1 + 5 + 10 + 3, added);
  layer_seen ls;
  memset(&ls, 0, sizeof ls);
  CHECK_EQ_INT(SF_OK, sf_cache_layers(dst, NULL, layer_cb, &ls));
  CHECK_EQ_INT(6, ls.calls);
  for (int i = 0; i < 6 && i < ls.calls; i++) {
    CHECK_STREQ("", ls.problem[i]);
    CHECK_EQ_INT(2, ls.n_variants[i]);
  }
  sf_binary *got = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_get_binary(dst, &bad, &got));
  sf_binary_free(got);
  sf_cache_close(dst);
}

int main(void) {
  if (!fixture_start("test_cache_corrupt")) return 1;
  static char src[4352]; /* tmp_path's buffers are reused */
  snprintf(src, sizeof src, "%s", tmp_path("src.db"));
  sf_cache *c = open_new("src.db");
  if (!c) return 1;
  put_everything(c);
  sf_cache_close(c);
  damage(src);
  test_listing_and_binaries(src);
  test_merge(src);
  test_export(src);
  test_repair(src);
  fixture_dir_remove();
  CHECK_DONE();
}
