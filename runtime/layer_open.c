/*
 * layer_open.c -- sf_layer_open: a tuned layer read from the cache and
 * loaded with sf_layer_load.
 *
 * The record tuned on this GPU is picked (else another GPU's), each
 * variant's cubin for this GPU is fetched from the cache, or compiled from
 * the stored source and stored, and the variants go to sf_layer_load as a
 * descriptor.  Only public calls are used, but for recording how many
 * variants were compiled; this file is in libsparseforge only.
 */
#include "internal.h"
#include "sparseforge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a private copy of the record sf_cache_layers hands out ------------ */

typedef struct record_copy {
  char *name, *gpu_name, *problem;
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
  free(r->problem);
  free(r);
}

static record_copy *record_copy_of(const sf_layer_record *rec) {
  record_copy *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->name = sf__strdup(rec->name ? rec->name : "");
  r->gpu_name = sf__strdup(rec->gpu_name ? rec->gpu_name : "");
  r->problem = sf__strdup(rec->problem);
  r->rows = rec->rows;
  r->cols = rec->cols;
  r->x_elem_size = rec->x_elem_size;
  r->y_elem_size = rec->y_elem_size;
  int n = rec->n_variants > 0 && rec->variants ? rec->n_variants : 0;
  r->variants = n ? calloc((size_t)n, sizeof *r->variants) : NULL;
  r->n_variants = n;
  if (!r->name || !r->gpu_name || (rec->problem && !r->problem) ||
      (n && !r->variants)) {
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
 * one (usable or not: its problem is reported, not hidden), else the first
 * usable record of another GPU, else the first record. */
typedef struct pick_state {
  const char *gpu_name;
  record_copy *best;
  int best_rank;
  int nomem;
} pick_state;

static int pick_cb(const sf_layer_record *rec, void *user) {
  pick_state *p = user;
  int this_gpu = rec->gpu_name && strcmp(rec->gpu_name, p->gpu_name) == 0;
  int rank = this_gpu ? 3 : rec->problem ? 1 : 2;
  if (p->best && p->best_rank >= rank) return 0;
  record_copy *c = record_copy_of(rec);
  if (!c) {
    p->nomem = 1;
    return 1;
  }
  record_free(p->best);
  p->best = c;
  p->best_rank = rank;
  return this_gpu; /* found the best there can be: stop */
}

/* ---- each variant's cubin ---------------------------------------------- */

/* Splits "a\nb\n" into a NULL-terminated array of lines (empty lines and
 * surrounding blanks dropped); the strings live in *storage. */
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

/* Gets the cubin of one variant: from the cache, else compiled and stored.
 * *compiled is set when it had to compile. */
static sf_status variant_binary(sf_context *ctx, sf_cache *cache,
                                const char *layer_name, int index,
                                const sf_layer_variant *v,
                                const sf_device_info *info, sf_binary **out,
                                int *compiled) {
  *out = NULL;
  *compiled = 0;
  if (!v->source || !*v->source)
    return sf__fail(ctx, SF_ERR_NO_BINARY,
                    "layer \"%s\" variant %d (n_bucket %lld) has no source "
                    "to compile",
                    layer_name, index, (long long)v->n_bucket);
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

/* ---- open -------------------------------------------------------------- */

/* Checks the record as a descriptor (SF_ERR_CORRUPT: the cache holds
 * something unusable), gets every cubin, then loads. */
static sf_status open_record(sf_context *ctx, sf_cache *cache,
                             const record_copy *rec,
                             const sf_device_info *info, sf_layer **out) {
  int n = rec->n_variants;
  sf_layer_code *codes = calloc(n > 0 ? (size_t)n : 1, sizeof *codes);
  sf_binary **bins = calloc(n > 0 ? (size_t)n : 1, sizeof *bins);
  if (!codes || !bins) {
    free(codes);
    free(bins);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  sf_layer_desc desc = {rec->name,        rec->rows,        rec->cols,
                        rec->x_elem_size, rec->y_elem_size, n,
                        codes};
  for (int i = 0; i < n; i++) {
    const sf_layer_variant *v = &rec->variants[i];
    codes[i].n_bucket = v->n_bucket;
    codes[i].kernel_name = v->kernel_name;
    codes[i].launch = v->launch;
    codes[i].binary_kind = SF_BINARY_CUBIN;
    codes[i].packed = v->packed;
    codes[i].packed_size = v->packed_size;
  }
  sf_status st = SF_OK;
  char msg[1024];
  if (sf__layer_desc_problem(&desc, 0, msg, sizeof msg)) {
    st = sf__fail(ctx, SF_ERR_CORRUPT, "%s (tuned on %s, in the cache)", msg,
                  rec->gpu_name);
    goto done;
  }
  int compiled = 0;
  for (int i = 0; i < n; i++) {
    int c = 0;
    st = variant_binary(ctx, cache, rec->name, i, &rec->variants[i], info,
                        &bins[i], &c);
    if (st != SF_OK) goto done;
    compiled += c;
    codes[i].binary = sf_binary_data(bins[i], &codes[i].binary_size);
  }
  st = sf_layer_load(ctx, &desc, out);
  if (st == SF_OK) sf__layer_set_compiled(*out, compiled);
done:
  for (int i = 0; i < n; i++) sf_binary_free(bins[i]);
  free(bins);
  free(codes);
  return st;
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
  record_copy *rec = pick.best;
  if (pick.nomem)
    st = sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  else if (st != SF_OK)
    st = sf__fail(ctx, st, "reading layer \"%s\" from the cache failed: %s",
                  name, sf_cache_errmsg(cache));
  else if (!rec)
    st = sf__fail(ctx, SF_ERR_NOT_FOUND, "no layer named \"%s\" in the cache",
                  name);
  else if (rec->problem)
    st = sf__fail(ctx, SF_ERR_CORRUPT,
                  "layer \"%s\" (tuned on %s) cannot be used: %s", name,
                  rec->gpu_name, rec->problem);
  else
    st = open_record(ctx, cache, rec, &info, out);
  record_free(rec);
  return st;
}
