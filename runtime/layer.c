/*
 * layer.c -- tuned layers, opened from the cache and run.
 *
 * A layer is a set of variants (one tuned kernel per N bucket) that share
 * packed weights.  Opening one fetches each variant's cubin for this GPU
 * from the cache (compiling and storing it when only the source is there),
 * loads it, and uploads each distinct packed blob once.  Only the public
 * cache API is used here.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One variant, ready to launch. */
struct sf_layer_variant_rt {
  int64_t n_bucket;
  sf_module *mod;
  sf_kernel *kernel;
  unsigned grid[3];
  int n_axis, n_tile;
  unsigned block[3];
  unsigned shared_bytes;
  int zero_output;
  sf_devptr packed;
};

/* ---- a private copy of the record sf_cache_layers hands out ------------ */

typedef struct record_copy {
  char *name, *gpu_name;
  int64_t rows, cols;
  int x_elem_size, y_elem_size;
  int n_variants;
  sf_layer_variant *variants; /* deep copies */
} record_copy;

static void record_free(record_copy *r) {
  if (!r) return;
  for (int i = 0; i < r->n_variants && r->variants; i++) {
    sf_layer_variant *v = &r->variants[i];
    free((char *)v->source);
    free((char *)v->kernel_name);
    free((char *)v->options);
    free((char *)v->generator_version);
    free((char *)v->config);
    free((void *)v->packed);
  }
  free(r->variants);
  free(r->name);
  free(r->gpu_name);
  free(r);
}

static record_copy *record_copy_of(const sf_layer_record *rec) {
  record_copy *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->name = sf__strdup(rec->name ? rec->name : "");
  r->gpu_name = sf__strdup(rec->gpu_name ? rec->gpu_name : "");
  r->rows = rec->rows;
  r->cols = rec->cols;
  r->x_elem_size = rec->x_elem_size;
  r->y_elem_size = rec->y_elem_size;
  int n = rec->n_variants > 0 && rec->variants ? rec->n_variants : 0;
  r->variants = n ? calloc((size_t)n, sizeof *r->variants) : NULL;
  r->n_variants = n;
  if (!r->name || !r->gpu_name || (n && !r->variants)) {
    record_free(r);
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    const sf_layer_variant *s = &rec->variants[i];
    sf_layer_variant *d = &r->variants[i];
    *d = *s;
    d->source = sf__strdup(s->source);
    d->kernel_name = sf__strdup(s->kernel_name);
    d->options = sf__strdup(s->options ? s->options : "");
    d->generator_version =
        sf__strdup(s->generator_version ? s->generator_version : "");
    d->config = sf__strdup(s->config);
    d->packed = NULL;
    if (s->packed && s->packed_size > 0) {
      void *p = malloc(s->packed_size);
      if (p) memcpy(p, s->packed, s->packed_size);
      d->packed = p;
    }
    if ((s->source && !d->source) || (s->kernel_name && !d->kernel_name) ||
        !d->options || !d->generator_version || (s->config && !d->config) ||
        (s->packed && s->packed_size > 0 && !d->packed)) {
      record_free(r);
      return NULL;
    }
  }
  return r;
}

/* sf_cache_layers callback: keeps the record tuned on this GPU if there is
 * one, else the first record. */
typedef struct pick_state {
  const char *gpu_name;
  record_copy *best;
  int best_is_this_gpu;
  int nomem;
} pick_state;

static int pick_cb(const sf_layer_record *rec, void *user) {
  pick_state *p = user;
  int this_gpu = rec->gpu_name && strcmp(rec->gpu_name, p->gpu_name) == 0;
  if (p->best && (p->best_is_this_gpu || !this_gpu)) return 0;
  record_copy *c = record_copy_of(rec);
  if (!c) {
    p->nomem = 1;
    return 1;
  }
  record_free(p->best);
  p->best = c;
  p->best_is_this_gpu = this_gpu;
  return this_gpu; /* found the best there can be: stop */
}

/* ---- open -------------------------------------------------------------- */

/* Splits "a\nb\n" into a NULL-terminated array of lines (empty lines and
 * trailing '\r' dropped); the strings live in *storage. */
static const char **split_lines(const char *text, char **storage) {
  *storage = sf__strdup(text ? text : "");
  if (!*storage) return NULL;
  size_t count = 1;
  for (const char *p = *storage; *p; p++) count += *p == '\n';
  const char **lines = calloc(count + 1, sizeof *lines);
  if (!lines) {
    free(*storage);
    *storage = NULL;
    return NULL;
  }
  size_t n = 0;
  char *save = NULL;
  for (char *tok = strtok_r(*storage, "\n", &save); tok;
       tok = strtok_r(NULL, "\n", &save)) {
    size_t len = strlen(tok);
    while (len > 0 && (tok[len - 1] == '\r' || tok[len - 1] == ' '))
      tok[--len] = '\0';
    while (*tok == ' ') tok++;
    if (*tok) lines[n++] = tok;
  }
  lines[n] = NULL;
  return lines;
}

static void layer_unlink(struct sf_layer *l) {
  sf_context *ctx = l->ctx;
  if (l->prev)
    l->prev->next = l->next;
  else if (ctx->layers == l)
    ctx->layers = l->next;
  if (l->next) l->next->prev = l->prev;
  l->prev = l->next = NULL;
}

void sf__layer_release(struct sf_layer *l) {
  if (!l) return;
  sf_context *ctx = l->ctx;
  for (int i = 0; i < l->n_variants; i++) {
    struct sf_layer_variant_rt *v = &l->variants[i];
    if (v->mod) sf_module_unload(v->mod);
    if (v->packed) {
      /* Blobs are shared between variants: free each once. */
      sf_devptr p = v->packed;
      for (int j = i; j < l->n_variants; j++)
        if (l->variants[j].packed == p) l->variants[j].packed = 0;
      sf_mem_free(ctx, p);
    }
  }
  free(l->variants);
  free(l);
}

void sf_layer_close(sf_layer *layer) {
  if (!layer) return;
  layer_unlink(layer);
  sf__layer_release(layer);
}

/* Gets the cubin of one variant: from the cache, else compiled and stored.
 * *compiled is set when it had to compile. */
static sf_status variant_binary(sf_context *ctx, sf_cache *cache,
                                const char *layer_name, int index,
                                const sf_layer_variant *v,
                                const sf_device_info *info, sf_binary **out,
                                int *compiled) {
  *out = NULL;
  *compiled = 0;
  char *line_store = NULL;
  const char **extra = split_lines(v->options, &line_store);
  if (!extra) return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  sf_compile_options copts;
  memset(&copts, 0, sizeof copts);
  copts.arch = info->arch;
  copts.kind = SF_BINARY_CUBIN;
  copts.extra_options = extra;
  char *canon = NULL;
  sf_status st = sf_compile_canonical_options(ctx, &copts, &canon);
  if (st != SF_OK) goto out;
  int major = 0, minor = 0;
  sf_nvrtc_version(&major, &minor);
  char nvrtc[32];
  snprintf(nvrtc, sizeof nvrtc, "%d.%d", major, minor);
  sf_binary_key key;
  memset(&key, 0, sizeof key);
  key.source = v->source;
  key.options = canon;
  key.arch = info->arch;
  key.nvrtc_version = nvrtc;
  key.generator_version = v->generator_version;
  key.kind = SF_BINARY_CUBIN;

  st = sf_cache_get_binary(cache, &key, out);
  if (st == SF_OK) goto out;
  if (st != SF_ERR_NOT_FOUND) {
    sf__fail(ctx, st,
             "layer \"%s\" variant %d (n_bucket %lld): reading its %s cubin "
             "from the cache failed: %s",
             layer_name, index, (long long)v->n_bucket, info->arch,
             sf_cache_errmsg(cache));
    goto out;
  }
  /* Not cached for this GPU: compile from the stored source. */
  char program[256];
  snprintf(program, sizeof program, "%.200s.n%lld.cu", layer_name,
           (long long)v->n_bucket);
  st = sf_compile(ctx, v->source, program, &copts, out);
  if (st != SF_OK) {
    /* The compile message (with NVRTC's log) is on ctx: keep it. */
    char *why = sf__strdup(sf_errmsg(ctx));
    st = sf__fail(ctx, SF_ERR_NO_BINARY,
                  "layer \"%s\" variant %d (n_bucket %lld): no %s cubin in "
                  "the cache and compiling its source failed: %s",
                  layer_name, index, (long long)v->n_bucket, info->arch,
                  why ? why : sf_errstr(st));
    free(why);
    goto out;
  }
  *compiled = 1;
  st = sf_cache_put_binary(cache, &key, *out);
  if (st != SF_OK) {
    sf__fail(ctx, st,
             "layer \"%s\" variant %d: compiled its %s cubin but could not "
             "store it in the cache: %s",
             layer_name, index, info->arch, sf_cache_errmsg(cache));
    sf_binary_free(*out);
    *out = NULL;
  }
out:
  free(canon);
  free(extra);
  free(line_store);
  return st;
}

static sf_status check_variant(sf_context *ctx, const char *name, int i,
                               const sf_layer_variant *v, int y_elem_size) {
  const char *why = NULL;
  if (!v->source || !*v->source)
    return sf__fail(ctx, SF_ERR_NO_BINARY,
                    "layer \"%s\" variant %d has no source to compile", name,
                    i);
  if (!v->kernel_name || !*v->kernel_name)
    why = "no kernel name";
  else if (v->n_bucket < 1)
    why = "an n_bucket below 1";
  else if (v->n_axis < -1 || v->n_axis > 2)
    why = "an n_axis outside -1..2";
  else if (v->n_axis >= 0 && v->n_tile < 1)
    why = "an n_tile below 1";
  else if (v->zero_output && y_elem_size < 1)
    why = "zero_output but no y_elem_size";
  if (why)
    return sf__fail(ctx, SF_ERR_CORRUPT, "layer \"%s\" variant %d has %s",
                    name, i, why);
  return SF_OK;
}

sf_status sf_layer_open(sf_context *ctx, sf_cache *cache, const char *name,
                        sf_layer **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!cache) return sf__fail(ctx, SF_ERR_INVALID_ARG, "cache is NULL");
  if (!name || !*name)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "layer name is NULL or empty");
  sf_device_info info;
  sf_status st = sf_device_info_get(ctx, &info);
  if (st != SF_OK) return st;

  pick_state pick;
  memset(&pick, 0, sizeof pick);
  pick.gpu_name = info.name;
  st = sf_cache_layers(cache, name, pick_cb, &pick);
  if (pick.nomem) {
    record_free(pick.best);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  if (st != SF_OK) {
    record_free(pick.best);
    return sf__fail(ctx, st, "reading layer \"%s\" from the cache failed: %s",
                    name, sf_cache_errmsg(cache));
  }
  record_copy *rec = pick.best;
  if (!rec) return sf__fail(ctx, SF_ERR_NOT_FOUND, "no layer named \"%s\" in the cache", name);
  if (rec->n_variants < 1) {
    record_free(rec);
    return sf__fail(ctx, SF_ERR_CORRUPT, "layer \"%s\" has no variants",
                    name);
  }
  for (int i = 0; i < rec->n_variants; i++)
    if ((st = check_variant(ctx, name, i, &rec->variants[i],
                            rec->y_elem_size)) != SF_OK) {
      record_free(rec);
      return st;
    }

  struct sf_layer *l = calloc(1, sizeof *l);
  struct sf_layer_variant_rt *vs =
      calloc((size_t)rec->n_variants, sizeof *vs);
  if (!l || !vs) {
    free(l);
    free(vs);
    record_free(rec);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  l->ctx = ctx;
  l->rows = rec->rows;
  l->cols = rec->cols;
  l->y_elem_size = rec->y_elem_size;
  l->variants = vs;
  l->n_variants = 0; /* counts the variants set up so far */

  for (int i = 0; i < rec->n_variants; i++) {
    const sf_layer_variant *v = &rec->variants[i];
    struct sf_layer_variant_rt *rt = &vs[i];
    l->n_variants = i + 1;
    sf_binary *bin = NULL;
    int compiled = 0;
    st = variant_binary(ctx, cache, name, i, v, &info, &bin, &compiled);
    if (st != SF_OK) goto fail;
    l->compiled += compiled;
    st = sf_module_load(ctx, bin, &rt->mod);
    sf_binary_free(bin);
    if (st != SF_OK) goto fail;
    st = sf_kernel_get(ctx, rt->mod, v->kernel_name, &rt->kernel);
    if (st != SF_OK) goto fail;
    rt->n_bucket = v->n_bucket;
    memcpy(rt->grid, v->grid, sizeof rt->grid);
    memcpy(rt->block, v->block, sizeof rt->block);
    rt->n_axis = v->n_axis;
    rt->n_tile = v->n_tile;
    rt->shared_bytes = v->shared_bytes;
    rt->zero_output = v->zero_output;
    /* The packed blob: shared with an earlier variant when identical. */
    if (v->packed && v->packed_size > 0) {
      for (int j = 0; j < i; j++) {
        const sf_layer_variant *w = &rec->variants[j];
        if (w->packed_size == v->packed_size && w->packed &&
            memcmp(w->packed, v->packed, v->packed_size) == 0) {
          rt->packed = vs[j].packed;
          break;
        }
      }
      if (!rt->packed) {
        st = sf_mem_alloc(ctx, v->packed_size, &rt->packed);
        if (st == SF_OK)
          st = sf_memcpy_htod(ctx, rt->packed, v->packed, v->packed_size);
        if (st != SF_OK) goto fail;
      }
    }
  }
  record_free(rec);
  l->next = ctx->layers;
  if (ctx->layers) ctx->layers->prev = l;
  ctx->layers = l;
  *out = l;
  return SF_OK;

fail:
  /* The failure's message is on ctx already; undo what was set up. */
  {
    sf_status code = ctx->code;
    char *msg = sf__strdup(sf_errmsg(ctx));
    sf__layer_release(l);
    if (msg) {
      sf__fail(ctx, code, "%s", msg);
      free(msg);
    }
  }
  record_free(rec);
  return st;
}

/* ---- run --------------------------------------------------------------- */

sf_status sf_layer_run(sf_context *ctx, sf_layer *layer, sf_devptr x,
                       sf_devptr y, int64_t n, void *stream) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!layer) return sf__fail(ctx, SF_ERR_INVALID_ARG, "layer is NULL");
  if (layer->ctx != ctx)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "the layer belongs to another context");
  if (n < 1 || n > INT_MAX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "N = %lld is outside 1..%d",
                    (long long)n, INT_MAX);
  if (!x || !y)
    return sf__fail(ctx, SF_ERR_INVALID_ARG, "X or Y is a null pointer");
  /* The variant tuned for the N nearest in ratio (ties: the first). */
  const struct sf_layer_variant_rt *v = &layer->variants[0];
  double best = INFINITY;
  for (int i = 0; i < layer->n_variants; i++) {
    double dist = fabs(log((double)n / (double)layer->variants[i].n_bucket));
    if (dist < best) {
      best = dist;
      v = &layer->variants[i];
    }
  }
  sf_launch_config cfg;
  memset(&cfg, 0, sizeof cfg);
  static const uint64_t grid_limit[3] = {2147483647u, 65535u, 65535u};  /* CUDA's */
  for (int a = 0; a < 3; a++) {
    uint64_t g = v->grid[a];
    if (a == v->n_axis) g *= (uint64_t)((n + v->n_tile - 1) / v->n_tile);
    if (g == 0 || g > grid_limit[a])
      return sf__fail(ctx, SF_ERR_INVALID_ARG,
                      "N = %lld gives grid dimension %d of %llu blocks (CUDA takes 1..%llu)",
                      (long long)n, a, (unsigned long long)g,
                      (unsigned long long)grid_limit[a]);
    cfg.grid[a] = (unsigned)g;
    cfg.block[a] = v->block[a];
  }
  cfg.shared_bytes = v->shared_bytes;
  cfg.stream = stream;
  sf_status st = sf__ctx_enter(ctx);
  if (st != SF_OK) return st;
  if (v->zero_output) {
    size_t bytes = (size_t)layer->rows * (size_t)n * (size_t)layer->y_elem_size;
    CUresult r =
        ctx->drv->MemsetD8Async((CUdeviceptr)y, 0, bytes, (CUstream)stream);
    if (r != CUDA_SUCCESS)
      return sf__cu_fail(ctx, SF_ERR_CUDA, r, "zeroing Y (cuMemsetD8Async)");
  }
  CUdeviceptr packed = (CUdeviceptr)v->packed, dx = (CUdeviceptr)x,
              dy = (CUdeviceptr)y;
  int nn = (int)n;
  void *args[4] = {&packed, &dx, &dy, &nn};
  return sf_launch(ctx, v->kernel, &cfg, args);
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
