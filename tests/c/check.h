/* check.h -- the few assertion macros the C tests use.  It needs only the
 * driver-only runtime, so tests linked with libsparseforge_rt alone use it
 * too. */
#ifndef SF_TEST_CHECK_H
#define SF_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparseforge_runtime.h"

static int check_failures_ = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,    \
              #cond);                                                      \
      check_failures_++;                                                   \
    }                                                                      \
  } while (0)

#define CHECK_EQ_INT(expected, actual)                                     \
  do {                                                                     \
    long long e_ = (long long)(expected), a_ = (long long)(actual);        \
    if (e_ != a_) {                                                        \
      fprintf(stderr, "%s:%d: expected %s == %lld, got %lld\n", __FILE__,  \
              __LINE__, #actual, e_, a_);                                  \
      check_failures_++;                                                   \
    }                                                                      \
  } while (0)

/* The string must be `expected`, exactly. */
#define CHECK_STREQ(expected, actual)                                      \
  do {                                                                     \
    const char *e_ = (expected), *a_ = (actual);                           \
    if (!a_ || strcmp(e_, a_) != 0) {                                      \
      fprintf(stderr, "%s:%d: expected %s ==\n  \"%s\"\n  got \"%s\"\n",     \
              __FILE__, __LINE__, #actual, e_, a_ ? a_ : "(null)");        \
      check_failures_++;                                                   \
    }                                                                      \
  } while (0)

/* The message must contain `needle`. */
#define CHECK_CONTAINS(haystack, needle)                                   \
  do {                                                                     \
    const char *h_ = (haystack);                                           \
    if (!h_ || !strstr(h_, (needle))) {                                    \
      fprintf(stderr, "%s:%d: expected \"%s\" in \"%s\"\n", __FILE__,      \
              __LINE__, (needle), h_ ? h_ : "(null)");                     \
      check_failures_++;                                                   \
    }                                                                      \
  } while (0)

/* ctest treats 77 as skipped (SKIP_RETURN_CODE). */
#define SKIP(reason)                                                       \
  do {                                                                     \
    printf("SKIPPED: %s\n", (reason));                                     \
    return 77;                                                             \
  } while (0)

/* A context on GPU 0 and its description, for tests labelled gpu.  Returns
 * 0 with the reason in `reason` where there is no driver or no device (the
 * test then SKIPs with it); 1 otherwise. */
static int open_gpu(sf_context **ctx, sf_device_info *info, char *reason,
                    size_t size) {
  *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, ctx));
  sf_status st = sf_device_info_get(*ctx, info);
  if (st == SF_ERR_NO_DRIVER || st == SF_ERR_NO_DEVICE) {
    snprintf(reason, size, "%s", sf_errmsg(*ctx));
    sf_context_destroy(*ctx);
    *ctx = NULL;
    return 0;
  }
  CHECK_EQ_INT(SF_OK, st);
  return 1;
}

#define CHECK_DONE()                                                       \
  do {                                                                     \
    if (check_failures_) {                                                 \
      fprintf(stderr, "%d check(s) failed\n", check_failures_);            \
      return 1;                                                            \
    }                                                                      \
    printf("all checks passed\n");                                         \
    return 0;                                                              \
  } while (0)
#endif
