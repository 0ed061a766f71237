/* test_cache_concurrent.c -- several processes writing one cache file at
 * the same time lose nothing: two forked writers create the (missing) file
 * together, then each stores 500 trials plus 50 that both write, and both
 * keep replacing one shared layer.  Afterwards every trial is there and the
 * layer is whole: all of its variants come from one writer. */
#include "check.h"
#include "sparseforge.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PER_WRITER 500
#define SHARED 50
#define LAYER_ROUNDS 40

static char g_path[4200];

static unsigned char packed[2][4096];

static void put_layer(sf_cache *c, int writer, int round, int *fails) {
  char tag[64], src0[128], src1[128];
  snprintf(tag, sizeof tag, "writer %d round %d", writer, round);
  snprintf(src0, sizeof src0, "// %s\nextern \"C\" __global__ void k0() {}", tag);
  snprintf(src1, sizeof src1, "// %s\nextern \"C\" __global__ void k1() {}", tag);
  sf_layer_variant v[3];
  memset(v, 0, sizeof v);
  for (int i = 0; i < 3; i++) {
    v[i].n_bucket = 16 << (2 * i);
    v[i].source = i == 1 ? src1 : src0;
    v[i].kernel_name = i == 1 ? "k1" : "k0";
    v[i].options = "";
    v[i].generator_version = "0.1.0";
    v[i].launch = (sf_launch_record){{1, 1, 1}, -1, 0, {1, 1, 1}, 0, 0};
    v[i].packed = packed[writer];
    v[i].packed_size = sizeof packed[writer];
    v[i].config = tag;
  }
  sf_layer_record r = {"shared.layer", "GPU", "fp", "op", 64, 64, 4, 4, 3, v};
  if (sf_cache_put_layer(c, &r) != SF_OK) {
    fprintf(stderr, "writer %d: put_layer: %s\n", writer, sf_cache_errmsg(c));
    (*fails)++;
  }
}

static int writer(int id, int start_fd) {
  char go;
  if (read(start_fd, &go, 1) != 1) return 2;
  sf_cache *c = NULL;
  if (sf_cache_open(g_path, SF_CACHE_CREATE, &c) != SF_OK) {
    fprintf(stderr, "writer %d: open: %s\n", id, sf_cache_errmsg(c));
    sf_cache_close(c);
    return 3;
  }
  int fails = 0;
  char cfg[64], msg[64];
  snprintf(msg, sizeof msg, "writer %d", id);
  for (int i = 0; i < PER_WRITER + SHARED; i++) {
    if (i < PER_WRITER)
      snprintf(cfg, sizeof cfg, "{\"writer\": %d, \"i\": %d}", id, i);
    else
      snprintf(cfg, sizeof cfg, "{\"shared\": %d}", i - PER_WRITER);
    sf_trial t;
    memset(&t, 0, sizeof t);
    t.env_key = "env";
    t.matrix_fp = "fp";
    t.op = "op";
    t.n = 256;
    t.config = cfg;
    t.status = SF_TRIAL_OK;
    t.median_ms = 1.0 + i;
    t.p20_ms = t.p80_ms = t.min_ms = t.median_ms;
    t.reps = 30;
    t.max_error = 0.0;
    t.message = msg;
    if (sf_cache_put_trial(c, &t) != SF_OK) {
      fprintf(stderr, "writer %d: put_trial: %s\n", id, sf_cache_errmsg(c));
      fails++;
    }
    if (i % ((PER_WRITER + SHARED) / LAYER_ROUNDS) == 0)
      put_layer(c, id, i, &fails);
  }
  sf_cache_close(c);
  return fails ? 4 : 0;
}

static int count_cb(const sf_trial *t, void *user) {
  (void)t;
  (*(int *)user)++;
  return 0;
}

typedef struct {
  int calls, whole;
} layer_check;

static int layer_cb(const sf_layer_record *r, void *user) {
  layer_check *lc = user;
  lc->calls++;
  int whole = r->n_variants == 3;
  for (int i = 0; whole && i < 3; i++) {
    whole = r->variants[i].config &&
            strcmp(r->variants[i].config, r->variants[0].config) == 0 &&
            r->variants[i].packed_size == sizeof packed[0] &&
            memcmp(r->variants[i].packed, packed[r->variants[0].config[7] - '0'],
                   sizeof packed[0]) == 0 &&
            strstr(r->variants[i].source, r->variants[0].config) != NULL;
  }
  lc->whole = whole;
  return 0;
}

int main(void) {
  const char *base = getenv("SF_TEST_TMPDIR");
  snprintf(g_path, sizeof g_path, "%s/test_cache_concurrent.%d.db",
           base && *base ? base : "/tmp", (int)getpid());
  for (int w = 0; w < 2; w++)
    for (size_t i = 0; i < sizeof packed[w]; i++)
      packed[w][i] = (unsigned char)(i * (w + 3) + w);

  int pipes[2][2];
  pid_t pids[2];
  for (int w = 0; w < 2; w++) {
    if (pipe(pipes[w]) != 0) return 1;
    pids[w] = fork();
    if (pids[w] < 0) return 1;
    if (pids[w] == 0) {
      close(pipes[w][1]);
      _exit(writer(w, pipes[w][0]));
    }
    close(pipes[w][0]);
  }
  /* both start together, on a file that does not exist yet */
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(1, write(pipes[w][1], "g", 1));
  for (int w = 0; w < 2; w++) {
    int status = 0;
    CHECK(waitpid(pids[w], &status, 0) == pids[w]);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(0, WEXITSTATUS(status));
    close(pipes[w][1]);
  }

  sf_cache *c = NULL;
  CHECK_EQ_INT(SF_OK, sf_cache_open(g_path, SF_CACHE_READONLY, &c));
  int total = 0;
  CHECK_EQ_INT(SF_OK, sf_cache_trials(c, NULL, count_cb, &total));
  CHECK_EQ_INT(2 * PER_WRITER + SHARED, total);
  sf_cache_counts k;
  CHECK_EQ_INT(SF_OK, sf_cache_count(c, &k));
  CHECK_EQ_INT(2 * PER_WRITER + SHARED, k.trials);
  CHECK_EQ_INT(1, k.winners);
  CHECK_EQ_INT(1, k.layers);
  CHECK_EQ_INT(3, k.layer_variants);
  CHECK_EQ_INT(1, k.blobs);
  layer_check lc = {0, 0};
  CHECK_EQ_INT(SF_OK, sf_cache_layers(c, "shared.layer", layer_cb, &lc));
  CHECK_EQ_INT(1, lc.calls);
  CHECK(lc.whole);
  sf_cache_close(c);
  if (!check_failures_) {
    char side[4300];
    unlink(g_path);
    snprintf(side, sizeof side, "%s-wal", g_path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", g_path);
    unlink(side);
  }
  CHECK_DONE();
}
