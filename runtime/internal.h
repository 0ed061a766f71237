/*
 * internal.h -- private declarations shared by the runtime and the cache.
 * Nothing here is part of the public interface (sparseforge.h).
 */
#ifndef SF_INTERNAL_H
#define SF_INTERNAL_H

#include "sparseforge.h"

#include <stdarg.h>

#define SF_MSG_MAX 16384

/* printf-style into a fixed message buffer of SF_MSG_MAX bytes (truncates). */
void sf__vformat(char *buf, const char *fmt, va_list ap);

/* strdup that returns NULL on NULL. */
char *sf__strdup(const char *s);

/* SHA-256 streaming interface. */
typedef struct sf__sha256 {
  uint32_t state[8];
  uint64_t bitlen;
  unsigned char buf[64];
  size_t buflen;
} sf__sha256;
void sf__sha256_init(sf__sha256 *c);
void sf__sha256_update(sf__sha256 *c, const void *data, size_t n);
void sf__sha256_final_hex(sf__sha256 *c, char hex_out[65]);

#endif
