/*
 * binary.c -- the sf_binary object: compiled code (a cubin or PTX) held in
 * memory with the compiler's log.  Binaries are made from bytes read
 * elsewhere (sf_binary_from_memory) or, in libsparseforge, by NVRTC
 * (compile.c, through sf__binary_new); the runtime only reads them.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

struct sf_binary {
  sf_binary_kind kind;
  size_t size;
  char *data; /* size bytes and a NUL */
  char *log;
};

sf_status sf__binary_new(sf_binary_kind kind, char *data, size_t size,
                         char *log, sf_binary **out) {
  sf_binary *bin = malloc(sizeof *bin);
  if (!bin) {
    free(data);
    free(log);
    return SF_ERR_NOMEM;
  }
  bin->kind = kind;
  bin->size = size;
  bin->data = data;
  bin->log = log;
  *out = bin;
  return SF_OK;
}

sf_status sf_binary_from_memory(const void *data, size_t size,
                                sf_binary_kind kind, sf_binary **out) {
  if (!out) return SF_ERR_INVALID_ARG;
  *out = NULL;
  if (!data || size == 0) return SF_ERR_INVALID_ARG;
  if (kind != SF_BINARY_CUBIN && kind != SF_BINARY_PTX)
    return SF_ERR_INVALID_ARG;
  /* PTX is text and must end with its NUL: one is added if missing. */
  size_t keep = size;
  if (kind == SF_BINARY_PTX && ((const char *)data)[size - 1] != '\0')
    keep = size + 1;
  char *copy = malloc(keep + 1);
  char *log = sf__strdup("");
  if (!copy || !log) {
    free(copy);
    free(log);
    return SF_ERR_NOMEM;
  }
  memcpy(copy, data, size);
  copy[size] = '\0';
  copy[keep] = '\0';
  return sf__binary_new(kind, copy, keep, log, out);
}

const void *sf_binary_data(const sf_binary *bin, size_t *size) {
  if (!bin) {
    if (size) *size = 0;
    return NULL;
  }
  if (size) *size = bin->size;
  return bin->data;
}

sf_binary_kind sf_binary_get_kind(const sf_binary *bin) {
  return bin ? bin->kind : SF_BINARY_CUBIN;
}

const char *sf_binary_log(const sf_binary *bin) {
  return bin && bin->log ? bin->log : "";
}

void sf_binary_free(sf_binary *bin) {
  if (!bin) return;
  free(bin->data);
  free(bin->log);
  free(bin);
}
