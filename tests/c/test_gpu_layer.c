/* test_gpu_layer.c -- a layer stored in the cache with sources but no
 * cubins: opening it compiles every variant and stores the cubins, runs
 * give the right answer for each N bucket (split-K with zeroed output
 * included), and opening it again compiles nothing.  Also: missing layers,
 * sources that do not compile, the preference for records tuned on this
 * GPU, and records whose packed weights were damaged in the file
 * (sf_layer_record.problem).  Skipped without a GPU. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "raw_sql.h"
#include "sparseforge.h"

#include "dense_layer.h"

static sf_layer_variant variant_rowcol(void) {
  sf_layer_variant v;
  memset(&v, 0, sizeof v);
  v.n_bucket = 16;
  v.source = kRowCol;
  v.kernel_name = "dense_rowcol";
  v.options = "";
  v.generator_version = "test-1";
  v.launch = kRowColLaunch;
  v.packed = W;
  v.packed_size = sizeof W;
  v.config = "{\"kind\": \"rowcol\"}";
  return v;
}

static sf_layer_variant variant_splitk(void) {
  sf_layer_variant v = variant_rowcol();
  v.n_bucket = 1024;
  v.source = kSplitK;
  v.kernel_name = "dense_splitk";
  v.options = "-DSPLITS=2\n\n-lineinfo\n";
  v.launch = kSplitKLaunch;
  v.config = "{\"kind\": \"splitk\"}";
  return v;
}

static sf_layer_record record(const char *name, const char *gpu,
                              const sf_layer_variant *v, int n) {
  sf_layer_record r;
  memset(&r, 0, sizeof r);
  r.name = name;
  r.gpu_name = gpu;
  r.matrix_fp = "test-dense-64x32";
  r.op = "dense.fp32.fm";
  r.rows = M;
  r.cols = K;
  r.x_elem_size = 4;
  r.y_elem_size = 4;
  r.n_variants = n;
  r.variants = v;
  return r;
}

int main(void) {
  sf_context *ctx = NULL;
  sf_device_info info;
  static char reason[1024];
  if (!open_gpu(&ctx, &info, reason, sizeof reason)) SKIP(reason);
  fill_weights();

  const char *tmp = getenv("SF_TEST_TMPDIR");
  char path[1024], side[1100];
  snprintf(path, sizeof path, "%s/test_gpu_layer.db", tmp ? tmp : "/tmp");
  unlink(path);
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
  sf_cache *cache = NULL;
  sf_status st = sf_cache_open(path, SF_CACHE_CREATE, &cache);
  CHECK_EQ_INT(SF_OK, st);
  if (st != SF_OK) {
    fprintf(stderr, "cache: %s\n", sf_cache_errmsg(cache));
    sf_cache_close(cache);
    CHECK_DONE();
  }
  sf_matrix_record mat = {"test-dense-64x32", M, K, M * K, "fp32", "{}"};
  CHECK_EQ_INT(SF_OK, sf_cache_put_matrix(cache, &mat));

  sf_layer_variant vs[2] = {variant_rowcol(), variant_splitk()};
  sf_layer_record rec = record("test.dense", info.name, vs, 2);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));

  /* First open: no cubins yet, both variants compile. */
  sf_layer *layer = NULL;
  st = sf_layer_open(ctx, cache, "test.dense", &layer);
  CHECK_EQ_INT(SF_OK, st);
  if (st != SF_OK) fprintf(stderr, "open: %s\n", sf_errmsg(ctx));
  if (layer) {
    CHECK_EQ_INT(2, sf_layer_compiled_count(layer));
    int64_t rows = 0, cols = 0;
    int nv = 0;
    CHECK_EQ_INT(SF_OK, sf_layer_shape(layer, &rows, &cols, &nv));
    CHECK_EQ_INT(M, rows);
    CHECK_EQ_INT(K, cols);
    CHECK_EQ_INT(2, nv);
    check_run(ctx, layer, 10);   /* the n_bucket 16 variant */
    check_run(ctx, layer, 1000); /* split-K, zeroed first */
    check_run(ctx, layer, 1);
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_layer_run(ctx, layer, 0x1000, 0x2000, 0, NULL));
    CHECK_CONTAINS(sf_errmsg(ctx), "N = 0 is outside 1..");
    sf_layer_close(layer);
  }

  /* Second open: every cubin comes from the cache. */
  layer = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.dense", &layer));
  if (layer) {
    CHECK_EQ_INT(0, sf_layer_compiled_count(layer));
    check_run(ctx, layer, 300);
    check_run(ctx, layer, 77);
  }
  /* (left open: sf_context_destroy closes it) */

  /* Missing layer, and a source that does not compile. */
  sf_layer *none = (sf_layer *)1;
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_layer_open(ctx, cache, "no.such.layer", &none));
  CHECK(none == NULL);
  CHECK_CONTAINS(sf_errmsg(ctx), "no layer named \"no.such.layer\" in the cache");
  sf_layer_variant broken = variant_rowcol();
  broken.source = "extern \"C\" __global__ void dense_rowcol(const void *p) { oops }\n";
  rec = record("test.broken", info.name, &broken, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  CHECK_EQ_INT(SF_ERR_NO_BINARY, sf_layer_open(ctx, cache, "test.broken", &none));
  CHECK_CONTAINS(sf_errmsg(ctx), "layer \"test.broken\" variant 0 (n_bucket 16): no ");
  CHECK_CONTAINS(sf_errmsg(ctx), "compiling its source failed: NVRTC could not compile");
  CHECK_CONTAINS(sf_errmsg(ctx), "error: identifier \"oops\" is undefined");

  /* Records tuned on this GPU win over others (listed first: the cache
   * orders by GPU name); others serve otherwise. */
  sf_layer_variant wrong = variant_rowcol();
  wrong.kernel_name = "not_in_the_source";
  rec = record("test.pref", "AAA Other GPU", &wrong, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  sf_layer_variant good = variant_rowcol();
  rec = record("test.pref", info.name, &good, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  sf_layer *pref = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.pref", &pref));
  if (pref) {
    CHECK_EQ_INT(0, sf_layer_compiled_count(pref)); /* same key as test.dense's */
    check_run(ctx, pref, 33);
    sf_layer_close(pref);
  }
  rec = record("test.elsewhere", "AAA Other GPU", &good, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  pref = NULL;
  CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.elsewhere", &pref));
  if (pref) check_run(ctx, pref, 5);
  rec = record("test.wrong_kernel", "AAA Other GPU", &wrong, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  CHECK_EQ_INT(SF_ERR_NOT_FOUND, sf_layer_open(ctx, cache, "test.wrong_kernel", &none));
  CHECK_CONTAINS(sf_errmsg(ctx), "no kernel named \"not_in_the_source\"");

  /* Damaged packed weights: the record comes with a problem.  This GPU's
   * record is never passed over because of one; another GPU's is, for a
   * usable record. */
  static float W2[M * K];
  memcpy(W2, W, sizeof W);
  W2[0] += 1.0f; /* bytes of their own: damaging them spoils no other layer */
  sf_layer_variant damaged = variant_rowcol();
  damaged.packed = W2;
  rec = record("test.damaged", info.name, &damaged, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  rec = record("test.fallback", "AAA Other GPU", &damaged, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  rec = record("test.fallback", "BBB Other GPU", &good, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  rec = record("test.no_fallback", "AAA Other GPU", &good, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  rec = record("test.no_fallback", info.name, &damaged, 1);
  CHECK_EQ_INT(SF_OK, sf_cache_put_layer(cache, &rec));
  char sha[65], update[256];
  sf_sha256_hex(W2, sizeof W2, sha);
  snprintf(update, sizeof update,
           "UPDATE blobs SET data = zeroblob(size) WHERE sha256 = '%s'", sha);
  if (load_sqlite()) {
    sql(path, update);
    char want[512];
    snprintf(want, sizeof want,
             "layer \"test.damaged\" (tuned on %s) cannot be used: the packed "
             "weights of variant 0 (n_bucket 16) failed their sha256: %zu "
             "bytes hash to ",
             info.name, sizeof W2);
    none = (sf_layer *)1;
    CHECK_EQ_INT(SF_ERR_CORRUPT, sf_layer_open(ctx, cache, "test.damaged", &none));
    CHECK(none == NULL);
    CHECK_CONTAINS(sf_errmsg(ctx), want);
    CHECK_CONTAINS(sf_errmsg(ctx), sha);
    pref = NULL;
    CHECK_EQ_INT(SF_OK, sf_layer_open(ctx, cache, "test.fallback", &pref));
    if (pref) {
      check_run(ctx, pref, 40);
      sf_layer_close(pref);
    }
    CHECK_EQ_INT(SF_ERR_CORRUPT, sf_layer_open(ctx, cache, "test.no_fallback", &none));
    CHECK_CONTAINS(sf_errmsg(ctx), "layer \"test.no_fallback\" (tuned on ");
    CHECK_CONTAINS(sf_errmsg(ctx), "failed their sha256");
  } else {
    fprintf(stderr, "SQLite functions not found in the process\n");
    check_failures_++;
  }

  sf_context_destroy(ctx); /* closes the layers still open */
  sf_cache_close(cache);
  CHECK_DONE();
}
