/* test_internal_cubin_symbols.c -- the runtime reads which optional
 * symbols (sf_x_map, sf_y_map, sf_pdl) a cubin declares from its own ELF
 * symbol table, so that loading a module asks the driver only for symbols
 * that are there: cubins of both archs from NVRTC, exact names, PTX, NULL,
 * every truncation and damaged headers (no GPU).  Links the static library
 * for the internal sf__cubin_symbols. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "sparseforge.h"

static const char *const kNames[] = {"sf_x_map", "sf_y_map", "sf_pdl"};
enum { X_MAP = 1, Y_MAP = 2, PDL = 4 };

/* x_map and pdl, and look-alikes that must not count as y_map or pdl */
static const char *kDeclares =
    "extern \"C\" __device__ const int sf_x_map[4] = {2, 64, 64, 32};\n"
    "extern \"C\" __device__ const int sf_pdl = 1;\n"
    "extern \"C\" __device__ const int sf_y_map_old[4] = {1, 1, 64, 1};\n"
    "extern \"C\" __device__ const int sf_pd = 1;\n"
    "extern \"C\" __global__ void k(int *y) {\n"
    "  y[0] = sf_x_map[threadIdx.x & 3] + sf_pdl + sf_y_map_old[1] + sf_pd;\n"
    "}\n";
static const char *kPlain = "extern \"C\" __global__ void k(int *y) { y[0] = 1; }\n";

static sf_binary *compile(sf_context *ctx, const char *src, const char *arch,
                          sf_binary_kind kind) {
  sf_compile_options o = {0};
  o.arch = arch;
  o.kind = kind;
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, src, "decl.cu", &o, &bin));
  return bin;
}

static unsigned symbols_of(const sf_binary *bin, int *ok) {
  size_t size = 0;
  const void *data = sf_binary_data(bin, &size);
  unsigned found = 99;
  *ok = sf__cubin_symbols(data, size, kNames, 3, &found);
  return found;
}

/* Every prefix of the image (each copy exactly its length, so that an
 * overread shows under AddressSanitizer) and damaged bytes of its ELF
 * header: a result is either "unknown" (0, nothing found) or a subset of
 * what the whole image declares. */
static void damaged(const sf_binary *bin, unsigned whole) {
  size_t size = 0;
  const unsigned char *data = sf_binary_data(bin, &size);
  for (size_t len = 0; len < size; len += len < 256 ? 1 : 97) {
    unsigned char *copy = malloc(len ? len : 1);
    CHECK(copy != NULL);
    memcpy(copy, data, len);
    unsigned found = 99;
    int ok = sf__cubin_symbols(copy, len, kNames, 3, &found);
    CHECK(ok ? (found & ~whole) == 0 : found == 0);
    free(copy);
  }
  unsigned char *copy = malloc(size);
  CHECK(copy != NULL);
  for (size_t at = 0; at < 64; ++at) {
    for (int v = 0; v < 256; v += 51) {
      memcpy(copy, data, size);
      copy[at] = (unsigned char)v;
      unsigned found = 99;
      int ok = sf__cubin_symbols(copy, size, kNames, 3, &found);
      CHECK(ok ? (found & ~whole) == 0 : found == 0);
    }
  }
  free(copy);
}

int main(void) {
  sf_context *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  const char *archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; ++a) {
    int ok = 0;
    sf_binary *decl = compile(ctx, kDeclares, archs[a], SF_BINARY_CUBIN);
    CHECK_EQ_INT(X_MAP | PDL, (int)symbols_of(decl, &ok));
    CHECK_EQ_INT(1, ok);
    damaged(decl, X_MAP | PDL);
    sf_binary_free(decl);

    sf_binary *plain = compile(ctx, kPlain, archs[a], SF_BINARY_CUBIN);
    CHECK_EQ_INT(0, (int)symbols_of(plain, &ok));
    CHECK_EQ_INT(1, ok);
    sf_binary_free(plain);
  }
  /* PTX is no ELF: unknown (the runtime then asks the driver) */
  int ok = 1;
  sf_binary *ptx = compile(ctx, kDeclares, "sm_90a", SF_BINARY_PTX);
  CHECK_EQ_INT(0, (int)symbols_of(ptx, &ok));
  CHECK_EQ_INT(0, ok);
  sf_binary_free(ptx);
  unsigned found = 99;
  CHECK_EQ_INT(0, sf__cubin_symbols(NULL, 100, kNames, 3, &found));
  CHECK_EQ_INT(0, (int)found);
  sf_context_destroy(ctx);
  CHECK_DONE();
}
