/*
 * compile.c -- NVRTC: CUDA C++ to cubin or PTX, on any machine.
 *
 * NVRTC is linked (it needs no GPU), so this file is in libsparseforge
 * only; the binaries it makes are binary.c's.  Nothing here keeps global
 * state, so several threads may compile at once, each with its own
 * context.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"
#include "sparseforge.h"

#include <ctype.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SF_CUDA_INCLUDE_DEFAULT
#define SF_CUDA_INCLUDE_DEFAULT "/usr/local/cuda/include"
#endif

/* ---- options ----------------------------------------------------------- */

/* The option list sf_compile passes: opts[0..n).  is_include[i] marks the
 * -I options, which the canonical (hashed) form leaves out. */
typedef struct option_list {
  char **opts;
  char *is_include;
  int n, cap;
  char arch[32]; /* the resolved arch as given to NVRTC */
} option_list;

static void options_free(option_list *l) {
  for (int i = 0; i < l->n; i++) free(l->opts[i]);
  free(l->opts);
  free(l->is_include);
  memset(l, 0, sizeof *l);
}

static int options_add(option_list *l, const char *prefix, const char *value,
                       int is_include) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    char **o = realloc(l->opts, (size_t)cap * sizeof *o);
    if (!o) return 0;
    l->opts = o;
    char *f = realloc(l->is_include, (size_t)cap);
    if (!f) return 0;
    l->is_include = f;
    l->cap = cap;
  }
  size_t a = strlen(prefix), b = strlen(value);
  char *s = malloc(a + b + 1);
  if (!s) return 0;
  memcpy(s, prefix, a);
  memcpy(s + a, value, b + 1);
  l->opts[l->n] = s;
  l->is_include[l->n] = (char)is_include;
  l->n++;
  return 1;
}

static int arch_supported(int number) {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > 256)
    return 1; /* cannot tell: let NVRTC decide */
  int archs[256];
  if (nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS) return 1;
  for (int i = 0; i < n; i++)
    if (archs[i] == number) return 1;
  return 0;
}

/* Resolves and checks the arch: "sm_<2 or 3 digits>" with an optional 'a'
 * or 'f' suffix, "compute_..." of the same shape for PTX only, or NULL /
 * "native" for the context's GPU.  Writes the NVRTC target into l->arch:
 * sm_XX for a cubin, compute_XX for PTX. */
static sf_status resolve_arch(sf_context *ctx, const char *arch,
                              sf_binary_kind kind, option_list *l) {
  char native[16];
  if (!arch || strcmp(arch, "native") == 0) {
    sf_device_info info;
    sf_status st = sf_device_info_get(ctx, &info);
    if (st != SF_OK) return st; /* message already on ctx */
    snprintf(native, sizeof native, "%s", info.arch);
    arch = native;
  }
  const char *rest = NULL;
  int virtual_arch = 0;
  if (strncmp(arch, "sm_", 3) == 0) {
    rest = arch + 3;
  } else if (strncmp(arch, "compute_", 8) == 0) {
    rest = arch + 8;
    virtual_arch = 1;
  }
  size_t digits = 0;
  if (rest)
    while (isdigit((unsigned char)rest[digits])) digits++;
  int ok = rest && (digits == 2 || digits == 3) &&
           (rest[digits] == '\0' ||
            ((rest[digits] == 'a' || rest[digits] == 'f') &&
             rest[digits + 1] == '\0'));
  if (!ok)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "malformed arch \"%s\": expected sm_<number> with an "
                    "optional 'a' or 'f' suffix (e.g. sm_80, sm_90a), or "
                    "\"native\"",
                    arch);
  if (virtual_arch && kind == SF_BINARY_CUBIN)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "arch \"%s\" is a virtual architecture: a cubin needs "
                    "sm_%s",
                    arch, rest);
  int number = atoi(rest);
  if (!arch_supported(number)) {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "arch \"%s\" is not supported by NVRTC %d.%d", arch,
                    major, minor);
  }
  snprintf(l->arch, sizeof l->arch, "%s%s",
           kind == SF_BINARY_PTX ? "compute_" : "sm_", rest);
  return SF_OK;
}

static const char *cuda_include_dir(const sf_compile_options *o) {
  if (o && o->cuda_include_dir && *o->cuda_include_dir)
    return o->cuda_include_dir;
  return NULL; /* resolved by the caller: it may need a buffer */
}

/* Builds the full option list (with_includes) or the canonical one. */
static sf_status build_options(sf_context *ctx, const sf_compile_options *o,
                               int with_includes, option_list *l) {
  memset(l, 0, sizeof *l);
  sf_binary_kind kind = o ? o->kind : SF_BINARY_CUBIN;
  if (kind != SF_BINARY_CUBIN && kind != SF_BINARY_PTX)
    return sf__fail(ctx, SF_ERR_INVALID_ARG,
                    "binary kind %d is neither SF_BINARY_CUBIN nor "
                    "SF_BINARY_PTX",
                    (int)kind);
  sf_status st = resolve_arch(ctx, o ? o->arch : NULL, kind, l);
  if (st != SF_OK) return st;
  int ok = options_add(l, "--gpu-architecture=", l->arch, 0) &&
           options_add(l, "-std=c++17", "", 0) &&
           options_add(l, "-default-device", "", 0);
  if (ok && with_includes) {
    const char *inc = cuda_include_dir(o);
    char buf[4096];
    if (!inc) {
      const char *home = getenv("CUDA_HOME");
      if (!home || !*home) home = getenv("CUDA_PATH");
      if (home && *home) {
        snprintf(buf, sizeof buf, "%s/include", home);
        inc = buf;
      } else {
        inc = SF_CUDA_INCLUDE_DEFAULT;
        if (!*inc) inc = "/usr/local/cuda/include";
      }
    }
    ok = options_add(l, "-I", inc, 1);
    for (const char *const *d = o ? o->include_dirs : NULL; ok && d && *d;
         d++)
      ok = options_add(l, "-I", *d, 1);
  }
  for (const char *const *e = o ? o->extra_options : NULL; ok && e && *e;
       e++)
    ok = options_add(l, *e, "", 0);
  if (!ok) {
    options_free(l);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  return SF_OK;
}

sf_status sf_compile_canonical_options(sf_context *ctx,
                                       const sf_compile_options *opts,
                                       char **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  option_list l;
  sf_status st = build_options(ctx, opts, 0, &l);
  if (st != SF_OK) return st;
  size_t len = 1;
  for (int i = 0; i < l.n; i++) len += strlen(l.opts[i]) + 1;
  char *s = malloc(len);
  if (!s) {
    options_free(&l);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  char *p = s;
  for (int i = 0; i < l.n; i++) {
    if (i) *p++ = ' ';
    size_t k = strlen(l.opts[i]);
    memcpy(p, l.opts[i], k);
    p += k;
  }
  *p = '\0';
  options_free(&l);
  *out = s;
  return SF_OK;
}

/* ---- compile ----------------------------------------------------------- */

static char *program_log(nvrtcProgram prog) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0)
    return sf__strdup("");
  char *log = malloc(n + 1);
  if (!log) return NULL;
  if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
  log[n] = '\0';
  /* NVRTC ends its log with a newline and a NUL; drop trailing blanks. */
  size_t k = strlen(log);
  while (k > 0 && (log[k - 1] == '\n' || log[k - 1] == ' ')) log[--k] = '\0';
  return log;
}

sf_status sf_compile(sf_context *ctx, const char *source,
                     const char *program_name, const sf_compile_options *opts,
                     sf_binary **out) {
  if (!ctx) return SF_ERR_INVALID_ARG;
  if (!out) return sf__fail(ctx, SF_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!source) return sf__fail(ctx, SF_ERR_INVALID_ARG, "source is NULL");
  const char *name = program_name && *program_name ? program_name : "kernel.cu";
  option_list l;
  sf_status st = build_options(ctx, opts, 1, &l);
  if (st != SF_OK) return st;

  nvrtcProgram prog = NULL;
  nvrtcResult r = nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) {
    options_free(&l);
    return sf__fail(ctx, r == NVRTC_ERROR_OUT_OF_MEMORY ? SF_ERR_NOMEM
                                                        : SF_ERR_NVRTC,
                    "nvrtcCreateProgram(%s) failed: %s", name,
                    nvrtcGetErrorString(r));
  }
  r = nvrtcCompileProgram(prog, l.n, (const char *const *)l.opts);
  char *log = program_log(prog);
  if (!log) {
    nvrtcDestroyProgram(&prog);
    options_free(&l);
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  }
  if (r != NVRTC_SUCCESS) {
    if (r == NVRTC_ERROR_COMPILATION) {
      /* A missing header is named in the log ("cannot open source file");
       * say where it was looked for. */
      int missing = strstr(log, "cannot open source file") != NULL;
      size_t paths = 1;
      for (int i = 0; i < l.n; i++)
        if (l.is_include[i]) paths += strlen(l.opts[i]) + 1;
      char *inc = malloc(paths);
      if (inc) {
        inc[0] = '\0';
        for (int i = 0; i < l.n; i++)
          if (l.is_include[i]) {
            if (inc[0]) strcat(inc, " ");
            strcat(inc, l.opts[i]);
          }
      }
      st = sf__fail(ctx, SF_ERR_COMPILE,
                    "NVRTC could not compile %s for %s:\n%s%s%s%s", name,
                    l.arch, log, missing ? "\n(include path: " : "",
                    missing && inc ? inc : "", missing ? ")" : "");
      free(inc);
    } else {
      st = sf__fail(ctx, r == NVRTC_ERROR_OUT_OF_MEMORY ? SF_ERR_NOMEM
                                                        : SF_ERR_NVRTC,
                    "nvrtcCompileProgram(%s, %s) failed: %s%s%s", name,
                    l.arch, nvrtcGetErrorString(r), *log ? "\n" : "", log);
    }
    free(log);
    nvrtcDestroyProgram(&prog);
    options_free(&l);
    return st;
  }

  sf_binary_kind kind = opts ? opts->kind : SF_BINARY_CUBIN;
  size_t size = 0;
  r = kind == SF_BINARY_PTX ? nvrtcGetPTXSize(prog, &size)
                            : nvrtcGetCUBINSize(prog, &size);
  char *data = NULL;
  if (r == NVRTC_SUCCESS && size > 0) {
    data = malloc(size + 1);
    if (!data) {
      free(log);
      nvrtcDestroyProgram(&prog);
      options_free(&l);
      return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
    }
    r = kind == SF_BINARY_PTX ? nvrtcGetPTX(prog, data)
                              : nvrtcGetCUBIN(prog, data);
    data[size] = '\0';
  }
  nvrtcDestroyProgram(&prog);
  if (r != NVRTC_SUCCESS || size == 0) {
    st = sf__fail(ctx, SF_ERR_NVRTC, "NVRTC produced no %s for %s (%s): %s",
                  kind == SF_BINARY_PTX ? "PTX" : "cubin", name, l.arch,
                  r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "empty");
    free(data);
    free(log);
    options_free(&l);
    return st;
  }
  options_free(&l);
  if (sf__binary_new(kind, data, size, log, out) != SF_OK)
    return sf__fail(ctx, SF_ERR_NOMEM, "out of host memory");
  return SF_OK;
}

/* ---- version ----------------------------------------------------------- */

sf_status sf_nvrtc_version(int *major, int *minor) {
  if (!major || !minor) return SF_ERR_INVALID_ARG;
  nvrtcResult r = nvrtcVersion(major, minor);
  return r == NVRTC_SUCCESS ? SF_OK : SF_ERR_NVRTC;
}
