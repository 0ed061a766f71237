/*
 * deploy_check -- runs every layer of a deployment bundle for a few N and
 * checks each result against a reference computed here, on the CPU, from the
 * bundle's test vectors (vectors/layer<i>.sfv: W's coordinates and values,
 * the epilogue, an X).  It also times the bundle's open (no compilation).
 *
 *   deploy_check VECTORS_DIR [WEIGHTS_FILE]
 *
 * Exit codes: 0 every check passed; 1 a result was wrong; 2 bad usage or
 * unreadable vectors; 3 no CUDA driver or no GPU (with the message); 4 any
 * other failure of the bundle (with its message).
 */
#define _POSIX_C_SOURCE 200809L
#include "sparseforge_bundle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  int64_t rows, cols, nnz, ncol;
  int dtype, layout, act;
  float scale;
  int32_t *r, *c;
  float *v;
  float *x;  /* K x ncol (fm) or ncol x K (tm) */
} vectors;

static int read_vectors(const char *path, vectors *t) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  char magic[4];
  int64_t h[4];
  int32_t k[3];
  int ok = fread(magic, 1, 4, f) == 4 && memcmp(magic, "SFV1", 4) == 0 &&
           fread(h, 8, 4, f) == 4 && fread(k, 4, 3, f) == 3 && fread(&t->scale, 4, 1, f) == 1;
  if (ok) {
    t->rows = h[0], t->cols = h[1], t->nnz = h[2], t->ncol = h[3];
    t->dtype = k[0], t->layout = k[1], t->act = k[2];
    t->r = malloc(4 * (size_t)t->nnz + 4);
    t->c = malloc(4 * (size_t)t->nnz + 4);
    t->v = malloc(4 * (size_t)t->nnz + 4);
    t->x = malloc(4 * (size_t)(t->cols * t->ncol));
    ok = t->r && t->c && t->v && t->x;
    for (int64_t i = 0; ok && i < t->nnz; i++)
      ok = fread(&t->r[i], 4, 1, f) == 1 && fread(&t->c[i], 4, 1, f) == 1 &&
           fread(&t->v[i], 4, 1, f) == 1;
    ok = ok && fread(t->x, 4, (size_t)(t->cols * t->ncol), f) == (size_t)(t->cols * t->ncol);
  }
  fclose(f);
  return ok ? 0 : -1;
}

/* float <-> the device's element type (fp32, fp16, bf16), round to nearest even */
static uint16_t to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
  if (e == 0xff) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 : 0));
  int exp = (int)e - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    m |= 0x800000;
    int shift = 14 - exp;
    uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = (uint32_t)exp << 10 | m >> 13, rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return (uint16_t)(sign | half);
}
static float from_half(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
  if (e == 0) {
    if (!m) x = sign;
    else {
      e = 127 - 15 + 1;
      while (!(m & 0x400)) { m <<= 1; e--; }
      x = sign | e << 23 | (m & 0x3ff) << 13;
    }
  } else if (e == 31) x = sign | 0x7f800000 | m << 13;
  else x = sign | (e - 15 + 127) << 23 | m << 13;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static void put(void *buf, int dtype, size_t i, float v) {
  if (dtype == 0) ((float *)buf)[i] = v;
  else ((uint16_t *)buf)[i] = dtype == 1 ? to_half(v) : to_bf16(v);
}
static float get(const void *buf, int dtype, size_t i) {
  if (dtype == 0) return ((const float *)buf)[i];
  uint16_t u = ((const uint16_t *)buf)[i];
  return dtype == 1 ? from_half(u) : from_bf16(u);
}

static double act(int code, double y) {
  if (code == 1) return y > 0 ? y : 0;
  if (code == 2) return 0.5 * y * (1 + tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)));
  return y;
}

/* Runs `layer` for N columns and compares with the CPU reference; returns
 * the normwise relative error (or -1 on a runtime failure). */
static double check(sf_context *ctx, sfb_bundle *b, int layer, const vectors *t, int64_t n) {
  size_t es = t->dtype == 0 ? 4 : 2, xn = (size_t)(t->cols * n), yn = (size_t)(t->rows * n);
  void *hx = malloc(xn * es), *hy = malloc(yn * es);
  double *ref = calloc(yn, sizeof *ref);
  for (int64_t k = 0; k < t->cols; k++)
    for (int64_t j = 0; j < n; j++) {
      size_t src = t->layout ? (size_t)(j * t->cols + k) : (size_t)(k * t->ncol + j);
      size_t dst = t->layout ? (size_t)(j * t->cols + k) : (size_t)(k * n + j);
      put(hx, t->dtype, dst, t->x[src]);
    }
  for (int64_t i = 0; i < t->nnz; i++)
    for (int64_t j = 0; j < n; j++) {
      size_t xi = t->layout ? (size_t)(j * t->cols + t->c[i]) : (size_t)(t->c[i] * n + j);
      size_t yi = t->layout ? (size_t)(j * t->rows + t->r[i]) : (size_t)(t->r[i] * n + j);
      ref[yi] += (double)t->v[i] * get(hx, t->dtype, xi);
    }
  sf_devptr dx = 0, dy = 0;
  double err = -1;
  if (sf_mem_alloc(ctx, xn * es, &dx) == SF_OK && sf_mem_alloc(ctx, yn * es, &dy) == SF_OK &&
      sf_memcpy_htod(ctx, dx, hx, xn * es) == SF_OK &&
      sf_memset_d8(ctx, dy, 0xFF, yn * es) == SF_OK &&   /* poison: unwritten stays NaN */
      sfb_run(b, layer, dx, dy, n, NULL) == SF_OK && sf_synchronize(ctx) == SF_OK &&
      sf_memcpy_dtoh(ctx, hy, dy, yn * es) == SF_OK) {
    double num = 0, den = 0;
    for (size_t i = 0; i < yn; i++) {
      double r = act(t->act, t->scale * ref[i]), d = get(hy, t->dtype, i) - r;
      num += d * d;
      den += r * r;
    }
    err = isnan(num) ? INFINITY : (den > 0 ? sqrt(num / den) : sqrt(num));
  }
  sf_mem_free(ctx, dx);
  sf_mem_free(ctx, dy);
  free(hx);
  free(hy);
  free(ref);
  return err;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s VECTORS_DIR [WEIGHTS_FILE]\n", argv[0]);
    return 2;
  }
  sf_context *ctx = NULL;
  if (sf_context_create(0, &ctx) != SF_OK) return 4;
  /* the driver and the device's context start before the timed open (a
   * program pays that once, whatever it loads) */
  sf_device_info dev;
  sf_devptr warm = 0;
  if (sf_device_info_get(ctx, &dev) == SF_OK && sf_mem_alloc(ctx, 256, &warm) == SF_OK)
    sf_mem_free(ctx, warm);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sfb_bundle *b = NULL;
  sf_status st = sfb_open(ctx, argc == 3 ? argv[2] : NULL, &b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (st != SF_OK) {
    fprintf(stderr, "deploy_check: %s\n", sf_errmsg(ctx));
    sf_context_destroy(ctx);
    return st == SF_ERR_NO_DRIVER || st == SF_ERR_NO_DEVICE ? 3 : 4;
  }
  double open_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
  printf("opened %d layer(s) for %s in %.3f ms, %.3f ms a layer (no compilation; the "
         "driver already started)\n", SFB_LAYERS, sfb_archs(), open_ms, open_ms / SFB_LAYERS);
  int failed = 0;
  for (int l = 0; l < SFB_LAYERS; l++) {
    char path[4096];
    const char *name = sfb_layer_name(l);
    vectors t;
    memset(&t, 0, sizeof t);
    snprintf(path, sizeof path, "%s/layer%d.sfv", argv[1], l);
    if (read_vectors(path, &t) != 0) {
      fprintf(stderr, "deploy_check: cannot read %s\n", path);
      return 2;
    }
    double tol = t.dtype == 0 ? 1e-5 : t.dtype == 1 ? 2e-3 : 1.6e-2;
    const int64_t ns[] = {1, 17, 64, t.ncol};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
      double err = check(ctx, b, l, &t, ns[i]);
      int ok = err >= 0 && err <= tol;
      failed += !ok;
      printf("%-32s N=%-5lld error %.2e (tol %.1e) %s\n", name, (long long)ns[i], err, tol,
             ok ? "ok" : "WRONG");
      if (err < 0) fprintf(stderr, "deploy_check: %s\n", sf_errmsg(ctx));
    }
    free(t.r), free(t.c), free(t.v), free(t.x);
  }
  sfb_close(b);
  sf_context_destroy(ctx);
  printf("%s\n", failed ? "FAILED" : "all layers correct");
  return failed ? 1 : 0;
}
