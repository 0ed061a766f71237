/* test_compile.c -- NVRTC compilation with no GPU: cubins for sm_80 and
 * sm_90a, PTX, compiler logs in error messages, include paths, options,
 * canonical option strings and compiling from several threads. */
#include <pthread.h>
#include <sys/stat.h>

#include "check.h"
#include "sparseforge.h"

static const char *kHalfKernel =
    "#include <cuda_fp16.h>\n"
    "extern \"C\" __global__ void scale_half(const __half *x, __half *y,\n"
    "                                       float a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) y[i] = __float2half(a * __half2float(x[i]));\n"
    "}\n";

static int is_elf(const sf_binary *bin) {
  size_t size = 0;
  const unsigned char *p = sf_binary_data(bin, &size);
  return p && size > 4 && p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' &&
         p[3] == 'F';
}

static void test_cubin(sf_context *ctx, const char *arch) {
  sf_compile_options o = {0};
  o.arch = arch;
  o.kind = SF_BINARY_CUBIN;
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kHalfKernel, "half.cu", &o, &bin));
  CHECK(bin != NULL);
  CHECK(is_elf(bin));
  CHECK_EQ_INT(SF_BINARY_CUBIN, sf_binary_get_kind(bin));
  CHECK(sf_binary_log(bin) != NULL);
  sf_binary_free(bin);
}

static void test_ptx(sf_context *ctx) {
  sf_compile_options o = {0};
  o.arch = "sm_90a";
  o.kind = SF_BINARY_PTX;
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
  size_t size = 0;
  const char *ptx = sf_binary_data(bin, &size);
  CHECK_EQ_INT(SF_BINARY_PTX, sf_binary_get_kind(bin));
  CHECK(ptx && size == strlen(ptx) + 1); /* NUL-terminated text */
  CHECK_CONTAINS(ptx, ".target sm_90a");
  CHECK_CONTAINS(ptx, ".entry scale_half");
  sf_binary_free(bin);
}

static void test_syntax_error(sf_context *ctx) {
  const char *bad =
      "extern \"C\" __global__ void broken(float *y) {\n"
      "  y[0] = 1.0f\n"
      "}\n";
  sf_compile_options o = {0};
  o.arch = "sm_80";
  sf_binary *bin = (sf_binary *)1;
  CHECK_EQ_INT(SF_ERR_COMPILE, sf_compile(ctx, bad, "broken.cu", &o, &bin));
  CHECK(bin == NULL);
  CHECK_EQ_INT(SF_ERR_COMPILE, sf_errcode(ctx));
  CHECK_CONTAINS(sf_errmsg(ctx), "NVRTC could not compile broken.cu for sm_80:\n");
  CHECK_CONTAINS(sf_errmsg(ctx), "broken.cu(3): error: expected a \";\"");
  CHECK_CONTAINS(sf_errmsg(ctx),
                 "1 error detected in the compilation of \"broken.cu\".");
}

static void test_missing_header(sf_context *ctx) {
  const char *src = "#include \"sf_no_such_header.cuh\"\n"
                    "extern \"C\" __global__ void k() {}\n";
  sf_compile_options o = {0};
  o.arch = "sm_90a";
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_ERR_COMPILE, sf_compile(ctx, src, "needs_header.cu", &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx),
                 "needs_header.cu(1): catastrophic error: cannot open source "
                 "file \"sf_no_such_header.cuh\"");
  CHECK_CONTAINS(sf_errmsg(ctx), "(include path: -I");

  /* A CUDA include directory without cuda_fp16.h names that header and
   * the directory searched. */
  o.cuda_include_dir = "/nonexistent/cuda/include";
  CHECK_EQ_INT(SF_ERR_COMPILE, sf_compile(ctx, kHalfKernel, "half.cu", &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx), "cannot open source file \"cuda_fp16.h\"");
  CHECK_CONTAINS(sf_errmsg(ctx), "(include path: -I/nonexistent/cuda/include)");

  /* CUDA_HOME is the fallback when no directory is given. */
  const char *old_home = getenv("CUDA_HOME");
  char *saved = old_home ? strdup(old_home) : NULL;
  setenv("CUDA_HOME", "/nonexistent-cuda-home", 1);
  o.cuda_include_dir = NULL;
  CHECK_EQ_INT(SF_ERR_COMPILE, sf_compile(ctx, kHalfKernel, "half.cu", &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx), "-I/nonexistent-cuda-home/include");
  if (saved) {
    setenv("CUDA_HOME", saved, 1);
    free(saved);
  } else {
    unsetenv("CUDA_HOME");
  }
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kHalfKernel, "half.cu", &o, &bin));
  sf_binary_free(bin);
}

static void test_includes_and_options(sf_context *ctx) {
  const char *tmp = getenv("SF_TEST_TMPDIR");
  char dir[1024], path[1100];
  snprintf(dir, sizeof dir, "%s/sf_compile_inc", tmp ? tmp : "/tmp");
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/sf_test_value.h", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("#define SF_TEST_VALUE 42\n", f);
  fclose(f);
  const char *src =
      "#include \"sf_test_value.h\"\n"
      "#ifndef SF_SCALE\n#error SF_SCALE must be defined\n#endif\n"
      "extern \"C\" __global__ void k(float *y) { y[0] = SF_SCALE * SF_TEST_VALUE; }\n";
  const char *incs[] = {dir, NULL};
  const char *extra[] = {"-DSF_SCALE=3.0f", NULL};
  sf_compile_options o = {0};
  o.arch = "sm_90a";
  o.include_dirs = incs;
  o.extra_options = extra;
  sf_binary *bin = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, src, "inc.cu", &o, &bin));
  CHECK(is_elf(bin));
  sf_binary_free(bin);

  /* Without the define the source's own #error shows in the message. */
  o.extra_options = NULL;
  CHECK_EQ_INT(SF_ERR_COMPILE, sf_compile(ctx, src, "inc.cu", &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx), "SF_SCALE must be defined");

  /* An option NVRTC does not know is an NVRTC error, not a compile one. */
  const char *bogus[] = {"--no-such-option", NULL};
  o.extra_options = bogus;
  CHECK_EQ_INT(SF_ERR_NVRTC, sf_compile(ctx, src, "inc.cu", &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx),
                 "nvrtcCompileProgram(inc.cu, sm_90a) failed: "
                 "NVRTC_ERROR_INVALID_OPTION");

  /* Canonical options: the list passed, without -I paths. */
  char *canon = NULL;
  o.extra_options = extra;
  CHECK_EQ_INT(SF_OK, sf_compile_canonical_options(ctx, &o, &canon));
  CHECK(canon && strcmp(canon, "--gpu-architecture=sm_90a -std=c++17 "
                               "-default-device -DSF_SCALE=3.0f") == 0);
  sf_free_buffer(canon);
  o.kind = SF_BINARY_PTX;
  o.extra_options = NULL;
  CHECK_EQ_INT(SF_OK, sf_compile_canonical_options(ctx, &o, &canon));
  CHECK(canon && strcmp(canon, "--gpu-architecture=compute_90a -std=c++17 "
                               "-default-device") == 0);
  sf_free_buffer(canon);
  o.arch = "sm_80";
  o.kind = SF_BINARY_CUBIN;
  CHECK_EQ_INT(SF_OK, sf_compile_canonical_options(ctx, &o, &canon));
  CHECK(canon && strcmp(canon, "--gpu-architecture=sm_80 -std=c++17 "
                               "-default-device") == 0);
  sf_free_buffer(canon);
}

static void test_arch_validation(sf_context *ctx) {
  static const char *bad[] = {"sm90", "sm_9", "sm_90b", "sm_", "90",
                              "sm_90aa", "SM_90", ""};
  sf_compile_options o = {0};
  sf_binary *bin = NULL;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.arch = bad[i];
    CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
    char want[128];
    snprintf(want, sizeof want, "malformed arch \"%s\"", bad[i]);
    CHECK_CONTAINS(sf_errmsg(ctx), want);
  }
  o.arch = "sm_99";
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx), "arch \"sm_99\" is not supported by NVRTC ");
  o.arch = "compute_90a";
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx),
                 "arch \"compute_90a\" is a virtual architecture: a cubin "
                 "needs sm_90a");
  o.kind = SF_BINARY_PTX; /* compute_ is fine for PTX */
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
  sf_binary_free(bin);
  o.kind = (sf_binary_kind)7;
  o.arch = "sm_80";
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
  CHECK_CONTAINS(sf_errmsg(ctx), "binary kind 7 is neither");
  /* newer arch names with suffixes are accepted where NVRTC has them */
  o.kind = SF_BINARY_CUBIN;
  o.arch = "sm_100a";
  CHECK_EQ_INT(SF_OK, sf_compile(ctx, kHalfKernel, NULL, &o, &bin));
  sf_binary_free(bin);
}

static void test_binary_from_memory(void) {
  sf_binary *bin = NULL;
  const unsigned char elf[] = {0x7f, 'E', 'L', 'F', 1, 2, 3};
  CHECK_EQ_INT(SF_OK, sf_binary_from_memory(elf, sizeof elf, SF_BINARY_CUBIN, &bin));
  size_t size = 0;
  const unsigned char *p = sf_binary_data(bin, &size);
  CHECK_EQ_INT(sizeof elf, size);
  CHECK(p && memcmp(p, elf, sizeof elf) == 0);
  CHECK(strcmp(sf_binary_log(bin), "") == 0);
  sf_binary_free(bin);
  /* PTX without its NUL gets one */
  const char ptx[] = {'.', 'v', 'e', 'r'};
  CHECK_EQ_INT(SF_OK, sf_binary_from_memory(ptx, sizeof ptx, SF_BINARY_PTX, &bin));
  const char *text = sf_binary_data(bin, &size);
  CHECK_EQ_INT(5, size);
  CHECK(text && strcmp(text, ".ver") == 0);
  sf_binary_free(bin);
}

/* Each thread compiles with its own context. */
static void *compile_thread(void *arg) {
  int *ok = arg;
  sf_context *ctx = NULL;
  *ok = 0;
  if (sf_context_create(0, &ctx) != SF_OK) return NULL;
  sf_compile_options o = {0};
  o.arch = "sm_90a";
  for (int i = 0; i < 3; i++) {
    sf_binary *bin = NULL;
    if (sf_compile(ctx, kHalfKernel, "thread.cu", &o, &bin) != SF_OK) break;
    if (is_elf(bin)) (*ok)++;
    sf_binary_free(bin);
  }
  sf_context_destroy(ctx);
  return NULL;
}

static void test_threads(void) {
  pthread_t t[4];
  int ok[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, compile_thread, &ok[i]);
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    CHECK_EQ_INT(3, ok[i]);
  }
}

int main(void) {
  sf_context *ctx = NULL;
  CHECK_EQ_INT(SF_OK, sf_context_create(0, &ctx));
  int major = 0, minor = -1;
  CHECK_EQ_INT(SF_OK, sf_nvrtc_version(&major, &minor));
  CHECK(major >= 11 && minor >= 0);
  test_cubin(ctx, "sm_80");
  test_cubin(ctx, "sm_90a");
  test_ptx(ctx);
  test_syntax_error(ctx);
  test_missing_header(ctx);
  test_includes_and_options(ctx);
  test_arch_validation(ctx);
  test_binary_from_memory();
  test_threads();
  sf_context_destroy(ctx);
  CHECK_DONE();
}
