/*
 * layer.c -- tuned layers held in memory, loaded and run.
 *
 * A layer is a set of variants (one tuned kernel per N bucket) that share
 * packed weights.  Loading one (sf_layer_load) loads each variant's binary,
 * looks its kernel up and uploads each distinct packed blob once; running
 * it picks the variant tuned for the N nearest in ratio and launches it
 * with the configuration of the one grid rule (sf_launch_config_for), on
 * its own packed buffer or on one the caller holds (sf_layer_run_packed).
 * Nothing here compiles or reads a cache: sf_layer_open (layer_open.c, in
 * libsparseforge) builds a descriptor from the cache and loads it here.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One variant, ready to launch. */
typedef struct layer_variant {
  int64_t n_bucket;
  sf_module *mod;
  sf_kernel *kernel;
  sf_launch_record launch;
  sf_devptr packed; /* 0 for an empty blob; shared between variants */
} layer_variant;

struct sf_layer {
  sf__owned owned; /* in the context */
  sf_context *ctx;
  int64_t rows, cols;
  int y_elem_size;
  int n_variants; /* while loading: the variants set up so far */
  int compiled;
  layer_variant *variants;
};

/* ---- the descriptor ------------------------------------------------------ */

/* Why variant i cannot be loaded, into why[size]; NULL when it can. */
static const char *variant_problem(const sf_layer_desc *d, int i,
                                   int need_binaries, char *why,
                                   size_t size) {
  const sf_layer_code *v = &d->variants[i];
  const char *launch = sf_launch_record_problem(&v->launch);
  if (v->n_bucket < 1) {
    snprintf(why, size, "n_bucket is below 1");
  } else if (!v->kernel_name || !*v->kernel_name) {
    snprintf(why, size, "no kernel name");
  } else if (launch) {
    char what[256];
    sf__launch_describe(&v->launch, what, sizeof what);
    snprintf(why, size, "%s (%s)", launch, what);
  } else if (!v->packed && v->packed_size > 0) {
    snprintf(why, size, "NULL packed with packed_size %zu", v->packed_size);
  } else if (need_binaries && (!v->binary || v->binary_size == 0)) {
    snprintf(why, size, "no binary");
  } else if (need_binaries && v->binary_kind != SF_BINARY_CUBIN &&
             v->binary_kind != SF_BINARY_PTX) {
    snprintf(why, size,
             "binary kind %d is neither SF_BINARY_CUBIN nor SF_BINARY_PTX",
             (int)v->binary_kind);
  } else {
    return NULL;
  }
  return why;
}

const char *sf__layer_desc_problem(const sf_layer_desc *d, int need_binaries,
                                   char *msg, size_t size) {
  const char *name = d->name ? d->name : "(unnamed)";
  if (d->rows < 1 || d->cols < 1 || d->x_elem_size < 1 ||
      d->y_elem_size < 1) {
    snprintf(msg, size,
             "layer \"%s\": rows %lld, cols %lld, x_elem_size %d, "
             "y_elem_size %d must all be positive",
             name, (long long)d->rows, (long long)d->cols, d->x_elem_size,
             d->y_elem_size);
    return msg;
  }
  if (d->n_variants < 1 || !d->variants) {
    snprintf(msg, size, "layer \"%s\": no variants (n_variants %d%s)", name,
             d->n_variants, d->variants ? "" : ", variants NULL");
    return msg;
  }
  for (int i = 0; i < d->n_variants; i++) {
    char why[512];
    const sf_layer_code *v = &d->variants[i];
    if (variant_problem(d, i, need_binaries, why, sizeof why)) {
      snprintf(msg, size, "layer \"%s\" variant %d (n_bucket %lld): %s",
               name, i, (long long)v->n_bucket, why);
      return msg;
    }
    for (int j = 0; j < i; j++)
      if (d->variants[j].n_bucket == v->n_bucket) {
        snprintf(msg, size,
                 "layer \"%s\": variants %d and %d both have n_bucket %lld",
                 name, j, i, (long long)v->n_bucket);
        return msg;
      }
  }
  return NULL;
}

/* ---- load and close ------------------------------------------------------ */

/* Unloads what was set up of a layer and frees it; the layer is no longer
 * owned.  Device memory goes even from a faulted context. */
static void layer_release(sf__owned *o) {
  struct sf_layer *l = SF__OWNER(o, struct sf_layer, owned);
  for (int i = 0; i < l->n_variants; i++) {
    layer_variant *v = &l->variants[i];
    if (v->mod) sf_module_unload(v->mod);
    if (v->packed) {
      /* Blobs are shared between variants: free each once. */
      sf_devptr p = v->packed;
      for (int j = i; j < l->n_variants; j++)
        if (l->variants[j].packed == p) l->variants[j].packed = 0;
      sf__release_alloc(l->ctx, p);
    }
  }
  free(l->variants);
  free(l);
}

void sf_layer_close(sf_layer *layer) {
  if (!layer) return;
  sf__disown(layer->ctx, &layer->owned);
  layer_release(&layer->owned);
}

/* Sets up variant i of l from the (checked) descriptor: its module, its
 * kernel and its packed blob, shared with an earlier variant's when the
 * bytes are equal. */
static sf_status load_variant(sf_context *ctx, const sf_layer_desc *d, int i,
                              struct sf_layer *l) {
  const sf_layer_code *c = &d->variants[i];
  layer_variant *v = &l->variants[i];
  v->n_bucket = c->n_bucket;
  v->launch = c->launch;
  sf_binary *bin = NULL;
  sf_status st =
      sf_binary_from_memory(c->binary, c->binary_size, c->binary_kind, &bin);
  if (st != SF_OK) return sf__fail(ctx, st, "out of host memory");
  st = sf_module_load(ctx, bin, &v->mod);
  sf_binary_free(bin);
  if (st == SF_OK) st = sf_kernel_get(ctx, v->mod, c->kernel_name, &v->kernel);
  if (st != SF_OK || !c->packed || c->packed_size == 0) return st;
  for (int j = 0; j < i; j++) {
    const sf_layer_code *w = &d->variants[j];
    if (w->packed && w->packed_size == c->packed_size &&
        memcmp(w->packed, c->packed, c->packed_size) == 0) {
      v->packed = l->variants[j].packed;
      return SF_OK;
    }
  }
  st = sf_mem_alloc(ctx, c->packed_size, &v->packed);
  if (st == SF_OK) st = sf_memcpy_htod(ctx, v->packed, c->packed, c->packed_size);
  return st;
}

sf_status sf_layer_load(sf_context *ctx, const sf_layer_desc *desc,
                        sf_layer **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!desc)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "layer descriptor is NULL");
  char msg[1024];
  if (sf__layer_desc_problem(desc, 1, msg, sizeof msg))
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "%s", msg);
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;

  struct sf_layer *l = calloc(1, sizeof *l);
  layer_variant *vs = calloc((size_t)desc->n_variants, sizeof *vs);
  if (!l || !vs) {
    free(l);
    free(vs);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  l->ctx = ctx;
  l->rows = desc->rows;
  l->cols = desc->cols;
  l->y_elem_size = desc->y_elem_size;
  l->variants = vs;
  for (int i = 0; i < desc->n_variants; i++) {
    l->n_variants = i + 1;
    st = load_variant(ctx, desc, i, l);
    if (st != SF_OK) {
      /* Name the layer and variant before the failure's own message, then
       * undo what was set up (which may record messages of its own). */
      const char *name = desc->name ? desc->name : "(unnamed)";
      char *why = sf__strdup(sf_errmsg(ctx));
      layer_release(&l->owned);
      st = sf__fail(ctx, st, "layer \"%s\" variant %d (n_bucket %lld): %s",
                    name, i, (long long)desc->variants[i].n_bucket,
                    why ? why : sf_errstr(st));
      free(why);
      return st;
    }
  }
  sf__own(ctx, &l->owned, layer_release);
  *out = l;
  return SF_OK;
}

void sf__layer_set_compiled(sf_layer *layer, int compiled) {
  if (layer) layer->compiled = compiled;
}

/* ---- run ----------------------------------------------------------------- */

/* Runs the variant nearest to N, with its own packed buffer or, when
 * `packed` is given, packed[variant]. */
static sf_status run(sf_context *ctx, sf_layer *layer, const sf_devptr *packed,
                     sf_devptr x, sf_devptr y, int64_t n, void *stream) {
  if (!x || !y)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "X or Y is a null pointer");
  /* The variant tuned for the N nearest in ratio (ties: the first); an N
   * below 1 keeps the first, and sf_launch_config_for refuses it. */
  int chosen = 0;
  double best = INFINITY;
  for (int i = 0; n >= 1 && i < layer->n_variants; i++) {
    double dist = fabs(log((double)n / (double)layer->variants[i].n_bucket));
    if (dist < best) {
      best = dist;
      chosen = i;
    }
  }
  const layer_variant *v = &layer->variants[chosen];
  sf_launch_config cfg;
  sf_status st = sf_launch_config_for(ctx, &v->launch, n, stream, &cfg);
  if (st == SF_OK) st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  if (v->launch.zero_output) {
    size_t bytes = (size_t)layer->rows * (size_t)n * (size_t)layer->y_elem_size;
    CUresult r =
        ctx->drv->MemsetD8Async((CUdeviceptr)y, 0, bytes, (CUstream)stream);
    if (r != CUDA_SUCCESS)
      return sf__cu_fail(ctx, SF_ERR_CUDA, r, "zeroing Y (cuMemsetD8Async)");
  }
  sf_kernel_args args;
  st = sf_kernel_args_set(ctx, v->kernel, packed ? packed[chosen] : v->packed, x, y, n,
                          &args);
  if (st != SF_OK) return st;
  return sf_launch(ctx, v->kernel, &cfg, args.ptrs);
}

static sf_status check_layer(sf_context *ctx, const sf_layer *layer) {
  if (!layer) return sf__fail(ctx, SF_ERR_INVALID_ARG, "layer is NULL");
  if (layer->ctx != ctx)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "the layer belongs to another context");
  return SF_OK;
}

sf_status sf_layer_run(sf_context *ctx, sf_layer *layer, sf_devptr x,
                       sf_devptr y, int64_t n, void *stream) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_layer(ctx, layer);
  return st != SF_OK ? st : run(ctx, layer, NULL, x, y, n, stream);
}

sf_status sf_layer_run_packed(sf_context *ctx, sf_layer *layer,
                              const sf_devptr *packed, int n_packed,
                              sf_devptr x, sf_devptr y, int64_t n,
                              void *stream) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  sf_status st = check_layer(ctx, layer);
  if (st != SF_OK) return st;
  if (!packed)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "packed is NULL");
  if (n_packed != layer->n_variants)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "%d packed pointers for a layer of %d variant%s", n_packed,
                    layer->n_variants, layer->n_variants == 1 ? "" : "s");
  return run(ctx, layer, packed, x, y, n, stream);
}

sf_status sf_layer_shape(const sf_layer *layer, int64_t *rows, int64_t *cols,
                         int *n_variants) {
  if (!layer) return SF_ERR_INVALID_ARG;
  if (rows) *rows = layer->rows;
  if (cols) *cols = layer->cols;
  if (n_variants) *n_variants = layer->n_variants;
  return SF_OK;
}

int sf_layer_compiled_count(const sf_layer *layer) {
  return layer ? layer->compiled : -1;
}
