/*
 * sparseforge.h -- the public interface of libsparseforge.
 *
 * libsparseforge is the C half of sparseforge: the driver-only runtime of
 * sparseforge_runtime.h (included here: contexts, modules, launches,
 * timing, layers held in memory), and above it NVRTC compilation, the
 * peers the benchmarks compare with (cuBLAS, cuSPARSE, loaded at run
 * time), a SQLite cache of compiled kernels, tuning trials and tuned
 * layers, and layers opened from that cache.  The two headers are the
 * whole contract: whatever is not in them is private.  The conventions are
 * sparseforge_runtime.h's.
 *
 * Threads: an sf_context or sf_cache may be used by one thread at a time.
 * sf_compile() may run in several threads at once, each with its own
 * context (NVRTC is thread-safe).  Several processes may share one cache
 * file (WAL mode and a busy timeout).
 */
#ifndef SPARSEFORGE_H
#define SPARSEFORGE_H

#include "sparseforge_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Compilation (NVRTC; needs no GPU)
 * ---------------------------------------------------------------------- */

typedef struct sf_compile_options {
  /* NVRTC arch: "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", ...; NULL or
   * "native" means the context's GPU (which then needs the driver).  The
   * form is sm_<2 or 3 digits> with an optional 'a' or 'f' suffix; for PTX
   * "compute_..." of the same form is accepted too.  An arch this NVRTC
   * does not list (nvrtcGetSupportedArchs) is SF_ERR_INVALID_ARG. */
  const char *arch;
  sf_binary_kind kind;
  /* Extra include directories (NULL-terminated array, or NULL). */
  const char *const *include_dirs;
  /* Extra NVRTC options, passed as given (NULL-terminated, or NULL). */
  const char *const *extra_options;
  /* The CUDA include directory (for cuda_fp16.h and friends).  NULL: the
   * environment's CUDA_HOME or CUDA_PATH (plus "/include"), else the
   * directory found when the library was built, else /usr/local/cuda. */
  const char *cuda_include_dir;
} sf_compile_options;


/*
 * Compiles `source` (CUDA C++, NUL-terminated) with NVRTC.  `program_name`
 * names it in messages (NULL: "kernel.cu").  `opts` may be NULL (native
 * arch, cubin).  The options always passed are, in this order:
 * "--gpu-architecture=<arch>" (or compute_XX for PTX), "-std=c++17",
 * "-default-device", then the include directories, then extra_options.
 * sf_compile_canonical_options() returns that list for hashing.
 *
 * Returns SF_ERR_COMPILE when the source does not compile: the message is
 * "NVRTC could not compile <name> for <arch>:\n<log>", and when the log
 * reports a header it cannot open, "\n(include path: -I... -I...)" follows
 * so that the directories searched are visible.  Other failures:
 * SF_ERR_NVRTC for other NVRTC failures (e.g. an unknown option:
 * "nvrtcCompileProgram(<name>, <arch>) failed: NVRTC_ERROR_INVALID_OPTION"
 * and the log), SF_ERR_INVALID_ARG for a malformed or unsupported arch,
 * SF_ERR_NO_DRIVER / SF_ERR_NO_DEVICE when arch is native and there is no
 * GPU, SF_ERR_NOMEM.  On success `*out` owns the binary; free it with
 * sf_binary_free().
 */
SF_API sf_status sf_compile(sf_context *ctx, const char *source,
                            const char *program_name,
                            const sf_compile_options *opts, sf_binary **out);

/*
 * The canonical option string used to key a binary: the options sf_compile
 * passes, without include directories (machine-specific paths), joined by
 * single spaces.  Resolves a native arch like sf_compile does.  The caller
 * frees *out with sf_free_buffer().
 */
SF_API sf_status sf_compile_canonical_options(sf_context *ctx,
                                              const sf_compile_options *opts,
                                              char **out);

/* The NVRTC version this library uses. */
SF_API sf_status sf_nvrtc_version(int *major, int *minor);

/* ------------------------------------------------------------------------
 * The peers: cuBLAS (dense) and cuSPARSE (Blocked-ELL, CSR), timed by the same
 * protocol
 * ---------------------------------------------------------------------- */

typedef enum sf_dtype {
  SF_DTYPE_FP32 = 0,
  SF_DTYPE_FP16 = 1,
  SF_DTYPE_BF16 = 2
} sf_dtype;

typedef struct sf_gemm_desc {
  sf_dtype dtype;   /* of W, X and Y; accumulation is fp32 (no TF32) */
  int64_t m, n, k;  /* Y (M x N) = W (M x K) X (K x N) */
  int layout;       /* 0 feature-major (X K x N, Y M x N, row-major),
                       1 token-major (X N x K, Y N x M), -1 both: the
                       faster one counts (cuBLAS in its best layout) */
} sf_gemm_desc;

typedef struct sf_gemm_timing {
  sf_timing timing;
  int layout_used;  /* the layout the timing is for */
} sf_gemm_timing;

/*
 * Times a dense cublasGemmEx of the described shape on the context's GPU
 * with the protocol of sf_time_kernel (`opts` as there; NULL: defaults),
 * on inputs filled with values in [-1, 1) (never zeros).  cuBLAS is loaded
 * with dlopen ($SF_CUBLAS, else libcublas.so.13, .so.12, .so): without it,
 * SF_ERR_NOT_FOUND "cuBLAS not found: ...".  Device memory is allocated and
 * freed inside the call.  Other errors: SF_ERR_INVALID_ARG (sizes below 1
 * or above 2^31 - 1, unknown dtype), GPU errors as elsewhere.
 */
SF_API sf_status sf_time_dense_gemm(sf_context *ctx, const sf_gemm_desc *desc,
                                    const sf_timing_options *opts,
                                    sf_gemm_timing *out);

/* A weight matrix W in cuSPARSE's Blocked-ELL format: square blocks of
 * `block` x `block`; block-row i (rows i*block .. i*block + block - 1) holds
 * ell_cols / block slots, each naming one block-column of W or -1 (an empty
 * slot, padding block-rows with fewer blocks than the widest). */
typedef struct sf_blocked_ell_desc {
  sf_dtype dtype;          /* of W, X and Y: SF_DTYPE_FP16 or SF_DTYPE_BF16;
                              accumulation is fp32 */
  int64_t m, n, k;         /* Y (M x N) = W (M x K) X (K x N) */
  int64_t block;           /* the block size; divides M and K */
  int64_t ell_cols;        /* columns of the Blocked-ELL value array: the most
                              blocks in a block-row, times block */
  const int32_t *col_ind;  /* host array of (M / block) x (ell_cols / block)
                              block-column indices, row-major: each in
                              [0, K / block) or -1; copied during the call */
  int layout;              /* 0 feature-major (X K x N, Y M x N, row-major),
                              1 token-major (X N x K, Y N x M, row-major) */
} sf_blocked_ell_desc;

/*
 * Times cusparseSpMM of the described pattern (CUSPARSE_SPMM_BLOCKED_ELL_ALG1,
 * fp32 compute type, A = W not transposed, B = X and C = Y not transposed:
 * row-major in feature-major, column-major views in token-major) on the
 * context's GPU with the protocol of sf_time_kernel (`opts` as there; NULL:
 * defaults).  W's blocks and X hold values in [-1, 1) (never zeros), empty
 * slots included; Y is overwritten (beta = 0).  cuSPARSE is loaded with
 * dlopen ($SF_CUSPARSE, else libcusparse.so.12, libcusparse.so): without it,
 * or without the generic SpMM API, SF_ERR_NOT_FOUND ("cuSPARSE not found:
 * ...").  Device memory is allocated and freed inside the call.
 *
 * What cuSPARSE's documentation states for Blocked-ELL SpMM, and what this
 * call checks before touching the GPU (SF_ERR_INVALID_ARG, naming the
 * field): square blocks (one `block` for rows and columns); block-column
 * indices in [0, K / block) or -1, 32-bit, zero-based; only A not
 * transposed; the value types fp16 (compute capability 7.0 and later) and
 * bf16 (8.0 and later), each with an fp32 compute type and Y of the same
 * type as X; dense operands in either order.  Here also: sizes in [1, 2^31),
 * M and K multiples of the block, ell_cols a multiple of the block in
 * [block, K].  Each block-row's indices should name distinct block-columns
 * (not checked).  The documentation names no alignment requirement; its
 * performance notes ask for power-of-two block sizes, 64 or more being
 * fastest.  A problem that cuSPARSE itself refuses (e.g. bf16 on a GPU
 * before compute capability 8.0) is SF_ERR_INVALID_ARG with cuSPARSE's
 * status in the message ("cusparseSpMM_bufferSize failed:
 * CUSPARSE_STATUS_NOT_SUPPORTED (10)"); a failed SpMM during timing is
 * SF_ERR_LAUNCH; other GPU errors as elsewhere.
 */
SF_API sf_status sf_time_blocked_ell(sf_context *ctx,
                                     const sf_blocked_ell_desc *desc,
                                     const sf_timing_options *opts,
                                     sf_timing *out);

/* A CSR pattern for cuSPARSE's SpMM: W (M x K) holds nnz nonzeros, row by
 * row. */
typedef struct sf_csr_desc {
  sf_dtype dtype;          /* of W, X and Y: SF_DTYPE_FP32, SF_DTYPE_FP16 or
                              SF_DTYPE_BF16; accumulation is fp32 */
  int64_t m, n, k;         /* Y (M x N) = W (M x K) X (K x N) */
  int64_t nnz;             /* stored nonzeros, in [0, 2^31) */
  const int32_t *row_ptr;  /* host array of M + 1 row offsets, 0 .. nnz,
                              non-decreasing; copied during the call */
  const int32_t *col_ind;  /* host array of nnz column indices in [0, K)
                              (sorted within a row, as CSR has them);
                              copied during the call */
  int layout;              /* 0 feature-major (X K x N, Y M x N, row-major),
                              1 token-major (X N x K, Y N x M, row-major) */
  int alg;                 /* a cusparseSpMMAlg_t for CSR (0 default, 4
                              CSR_ALG1, 6 CSR_ALG2, 12 CSR_ALG3), or -1: each
                              of them, the fastest counts */
} sf_csr_desc;

typedef struct sf_csr_timing {
  sf_timing timing;
  int alg_used;            /* the algorithm the timing is for */
} sf_csr_timing;

/*
 * Times cusparseSpMM on the described CSR pattern (fp32 compute type, A = W
 * not transposed, B = X and C = Y not transposed: row-major in
 * feature-major, column-major views in token-major) on the context's GPU
 * with the protocol of sf_time_kernel (`opts` as there, rotate_bytes
 * included: the row offsets, column indices, values, X and Y are copied
 * that many times over, each copy with its own descriptors and workspace,
 * and the launches rotate through the copies).  W's values and X are drawn
 * in [-1, 1); Y is overwritten (beta = 0).  With alg -1 every CSR
 * algorithm is timed and the fastest counts (alg_used says which): an
 * algorithm cuSPARSE refuses for the problem is passed over, and when it
 * refuses all of them the call fails with the last refusal.  Workspaces
 * are preprocessed (cusparseSpMM_preprocess, where the library has it)
 * before timing.  cuSPARSE is loaded with dlopen ($SF_CUSPARSE, else
 * libcusparse.so.12, libcusparse.so): without it SF_ERR_NOT_FOUND.
 * Checked before touching the GPU (SF_ERR_INVALID_ARG, naming the field):
 * sizes in [1, 2^31), the dtype, the layout, nnz, row_ptr from 0 to nnz
 * and non-decreasing, column indices in [0, K), the algorithm.  A refusal
 * by cuSPARSE is SF_ERR_INVALID_ARG with its status in the message; a
 * failed SpMM during timing SF_ERR_LAUNCH.  Device memory is allocated and
 * freed inside the call.
 */
SF_API sf_status sf_time_csr(sf_context *ctx, const sf_csr_desc *desc,
                             const sf_timing_options *opts, sf_csr_timing *out);

/* A 2:4 matmul for cuSPARSELt: W (M x K, row-major) keeps 2 of every 4
 * values along K. */
typedef struct sf_sparselt_desc {
  sf_dtype dtype;   /* of W, X and Y: SF_DTYPE_FP16 or SF_DTYPE_BF16;
                       accumulation is fp32 */
  int64_t m, n, k;  /* Y (M x N) = W (M x K) X (K x N) */
  int layout;       /* 0 feature-major (X K x N, Y M x N, row-major),
                       1 token-major (X N x K, Y N x M) */
} sf_sparselt_desc;

typedef struct sf_sparselt_timing {
  sf_timing timing;
  int alg_id;       /* the configuration cusparseLtMatmulSearch chose (-1
                       where the library does not say) */
} sf_sparselt_timing;

/*
 * Times cuSPARSELt's 2:4 matmul (cusparseLtMatmul, fp32 compute) on the
 * described problem with the protocol of sf_time_kernel (`opts` as there,
 * rotate_bytes included: W, X and Y are copied that many times over and
 * the launches rotate through the copies).  W is drawn in [-1, 1), pruned
 * to 2:4 by cusparseLtSpMMAPrune and compressed by cusparseLtSpMMACompress;
 * before timing, cusparseLtMatmulSearch picks the library's best
 * configuration for this problem on this GPU, so that the peer is at its
 * best.  Feature-major: W is the structured A, X the dense B, both
 * row-major.  Token-major: Y (N x M) = X W^T, X the dense A and W the
 * structured B (transposed), all row-major.  cuSPARSELt is loaded with
 * dlopen ($SF_CUSPARSELT, else libcusparseLt.so.0, libcusparseLt.so):
 * without it SF_ERR_NOT_FOUND ("cuSPARSELt not found: ...").  Sizes must be
 * multiples of 16 (2:4 pruning needs K % 4 == 0, the library asks for
 * aligned leading dimensions): else SF_ERR_INVALID_ARG.  A problem the
 * library refuses is SF_ERR_INVALID_ARG with its status; device memory is
 * allocated and freed inside the call.
 */
SF_API sf_status sf_time_sparselt(sf_context *ctx, const sf_sparselt_desc *desc,
                                  const sf_timing_options *opts,
                                  sf_sparselt_timing *out);

/* ------------------------------------------------------------------------
 * The cache (SQLite)
 * ---------------------------------------------------------------------- */

typedef struct sf_cache sf_cache;

#define SF_CACHE_SCHEMA_VERSION 1
/* PRAGMA application_id of every sparseforge cache ("SFor"): a SQLite file
 * without it is another program's and is never touched. */
#define SF_CACHE_APPLICATION_ID 0x53466F72

enum {
  SF_CACHE_READONLY = 1, /* open for reading only; never creates */
  SF_CACHE_CREATE = 2    /* create the file if it does not exist */
};

/*
 * Opens (or with SF_CACHE_CREATE creates) the cache at `path`: WAL mode, a
 * busy timeout of 30 s, schema version in PRAGMA user_version.
 *
 * A file that is not a SQLite database, or a SQLite database that is not a
 * sparseforge cache, gives SF_ERR_NOT_A_DB; one whose user_version is newer
 * than SF_CACHE_SCHEMA_VERSION gives SF_ERR_DB_VERSION.  Either way the
 * file is not modified.  A missing file without SF_CACHE_CREATE gives
 * SF_ERR_NOT_FOUND.  On failure *out is still set (unless NOMEM or NULL
 * out) so that sf_cache_errmsg() can tell what happened; close it.
 *
 * In detail: the file's first bytes, then (through a read-only connection)
 * its PRAGMA application_id (SF_CACHE_APPLICATION_ID), user_version and
 * schema are checked before anything is written; only then is the file
 * switched to WAL and, when new, given its schema.  An empty file (0 bytes,
 * or a SQLite database with no schema objects and no application_id) is
 * initialized by a writable open and refused (SF_ERR_NOT_A_DB) by a
 * read-only one; an existing empty file is initialized even without
 * SF_CACHE_CREATE.  SF_CACHE_READONLY never writes: any write call on such
 * a cache gives SF_ERR_DB ("... opened read-only").  A file SQLite can only
 * open for reading, opened without SF_CACHE_READONLY, gives SF_ERR_IO.
 * Unknown flags or a NULL/empty path give SF_ERR_INVALID_ARG.  Messages
 * name the path and the reason.  Several processes may open and write the
 * same file at once: writes take the write lock up front (BEGIN IMMEDIATE),
 * wait up to 30 s for it and retry; busy beyond that gives SF_ERR_BUSY.
 *
 * Read-only opens (SF_CACHE_READONLY, and the checks above) work on a file
 * in a directory this process cannot write (permissions, or read-only
 * media), in WAL mode or not.  The file's header (bytes 18-19: 2 is WAL)
 * says which side file may hold changes not yet in the database file: the
 * -wal file in WAL mode, the -journal file (an interrupted write)
 * otherwise.  Then:
 *   - the directory is writable: SQLite's mode=ro.  The database file is
 *     never written, and the connection sees what other processes commit
 *     later; in WAL mode SQLite may create (and leave) an empty -wal and a
 *     -shm file beside it, as it does to share a WAL database.
 *   - the directory is not writable and that side file is missing or
 *     empty: URI parameter immutable=1.  No lock is taken and no side file
 *     is created (none appears); the file is read as it is, so such a
 *     connection does not see later writes by other processes (a file
 *     shipped read-only is not expected to change; one that does change
 *     under it may read as damaged).
 *   - the directory is not writable and the side file has content: mode=ro,
 *     which reads the changes when a -shm file is already there; when
 *     SQLite cannot create the -shm (or roll the journal back) the open
 *     fails with SF_ERR_IO: "cache <path>: cannot open read-only: the
 *     database has un-checkpointed changes in its -wal file (<path>-wal),
 *     and SQLite cannot create the -shm file it needs to read them because
 *     the directory <dir> is not writable; open it writable once, where it
 *     can be written, to fold them into the database file" (for a journal:
 *     "... its journal (<path>-journal) holds an interrupted write that
 *     must be rolled back ...").
 * "Writable" is access(W_OK) of the directory: a process running as root
 * may write anywhere but on read-only media, so for it a directory with
 * mode 0555 is writable and the first case applies.
 */
SF_API sf_status sf_cache_open(const char *path, int flags, sf_cache **out);
SF_API void sf_cache_close(sf_cache *cache);
/* Last error message on the cache ("" if none).  "NULL cache" for NULL. */
SF_API const char *sf_cache_errmsg(const sf_cache *cache);
/* Status of the last failed call on the cache (SF_OK if none;
 * SF_ERR_INVALID_ARG for NULL). */
SF_API sf_status sf_cache_errcode(const sf_cache *cache);

/* --- binaries ---------------------------------------------------------- */

/* What identifies a compiled binary.  The key is the SHA-256 of all of
 * these fields (sf_binary_key_hex). */
typedef struct sf_binary_key {
  const char *source;            /* the complete source compiled */
  const char *options;           /* sf_compile_canonical_options() */
  const char *arch;              /* exact arch string, e.g. "sm_90a" */
  const char *nvrtc_version;     /* e.g. "13.0" */
  const char *generator_version; /* the generator that wrote the source */
  sf_binary_kind kind;
} sf_binary_key;

/* The hex key of a binary (65 bytes with the NUL).  Precisely: SHA-256 of
 * "sparseforge-binary-key-v1\n" followed, for source, options, arch,
 * nvrtc_version, generator_version and then "cubin" or "ptx" (the kind),
 * by "<decimal byte length>:<bytes>\n".  SF_ERR_INVALID_ARG for a NULL key,
 * out or field, an empty arch, or an unknown kind. */
SF_API sf_status sf_binary_key_hex(const sf_binary_key *key, char out[65]);

/* Stores a binary (and its source) under its key; storing the same key
 * again replaces nothing and succeeds (except that a stored copy whose
 * bytes fail their sha256 is replaced by the new bytes).  The binary's
 * kind must be key->kind and it must not be empty (SF_ERR_INVALID_ARG). */
SF_API sf_status sf_cache_put_binary(sf_cache *cache, const sf_binary_key *key,
                                     const sf_binary *bin);
/* Fetches the binary for `key`: SF_ERR_NOT_FOUND if absent, SF_ERR_CORRUPT
 * if its bytes no longer match their stored sha256.  *out is freed with
 * sf_binary_free(). */
SF_API sf_status sf_cache_get_binary(sf_cache *cache, const sf_binary_key *key,
                                     sf_binary **out);

/* --- environments and matrices ---------------------------------------- */

/* Records the GPU environment (name, compute capability, SM count, driver
 * version) and writes its key (hex SHA-256 of those) into env_key.  The
 * key hashes the text "<name>|<cc_major>.<cc_minor>|<sm_count>|
 * <driver_version>" (e.g. "NVIDIA H100 80GB HBM3|9.0|132|13000"); the other
 * fields of dev are stored beside it (and updated on a second put). */
SF_API sf_status sf_cache_put_env(sf_cache *cache, const sf_device_info *dev,
                                  char env_key[65]);

typedef struct sf_matrix_record {
  const char *fingerprint; /* hash of pattern, permutation and values */
  int64_t rows, cols, nnz;
  const char *dtype;       /* "fp32", "fp16", "bf16" */
  const char *info;        /* free text (JSON): source file, pattern... */
} sf_matrix_record;
/* Calls `cb` with every stored environment (ordered by name, driver
 * version), its key and the sf_device_info fields stored with it (valid
 * only during the call).  A nonzero return stops the walk. */
typedef int (*sf_env_cb)(const char *env_key, const sf_device_info *dev,
                         void *user);
SF_API sf_status sf_cache_envs(sf_cache *cache, sf_env_cb cb, void *user);

/* Stores (or updates) a matrix by fingerprint.  SF_ERR_INVALID_ARG for a
 * NULL/empty fingerprint or dtype, rows or cols <= 0, nnz outside
 * 0..rows*cols. */
SF_API sf_status sf_cache_put_matrix(sf_cache *cache,
                                     const sf_matrix_record *m);
/* Calls `cb` with the matrix `fingerprint` (NULL: every matrix, ordered
 * by fingerprint); valid only during the call, nonzero stops.  An unknown
 * fingerprint is SF_OK with no call. */
typedef int (*sf_matrix_cb)(const sf_matrix_record *m, void *user);
SF_API sf_status sf_cache_matrices(sf_cache *cache, const char *fingerprint,
                                   sf_matrix_cb cb, void *user);

/* --- trials ------------------------------------------------------------- */

typedef enum sf_trial_status {
  SF_TRIAL_OK = 0,
  SF_TRIAL_COMPILE_FAIL = 1,
  SF_TRIAL_LAUNCH_FAIL = 2,
  SF_TRIAL_WRONG = 3,
  SF_TRIAL_TIMEOUT = 4
} sf_trial_status;

/* One configuration tried on one GPU, matrix, operation and N. */
typedef struct sf_trial {
  const char *env_key;      /* sf_cache_put_env */
  const char *matrix_fp;    /* sf_matrix_record.fingerprint */
  const char *op;           /* the operation: family, dtype, layout,
                               epilogue, e.g. "shflbw64.fp16.fm.bias_gelu" */
  int64_t n;                /* columns of X */
  const char *config;       /* the configuration, canonical JSON */
  int status;               /* sf_trial_status */
  double median_ms, p20_ms, p80_ms, min_ms;
  int reps;
  double max_error;         /* against the reference (relative) */
  const char *binary_key;   /* may be NULL */
  const char *message;      /* why it failed; may be NULL */
  double created;           /* unix time; filled by the cache on read */
} sf_trial;

/* Records a trial; a trial with the same (env, matrix, op, n, config)
 * replaces the earlier one.  NaN timings and errors are stored as SQL NULL
 * and read back as NaN.  SF_ERR_INVALID_ARG for NULL env_key, matrix_fp, op
 * or config, a status outside sf_trial_status, n < 0 or reps < 0.  The
 * `winners` view of the database holds the best ok trial (lowest median)
 * per (env_key, matrix_fp, op, n). */
SF_API sf_status sf_cache_put_trial(sf_cache *cache, const sf_trial *t);

/* Filter for sf_cache_trials: NULL fields and n < 0 match anything. */
typedef struct sf_trial_filter {
  const char *env_key;
  const char *matrix_fp;
  const char *op;
  int64_t n;
} sf_trial_filter;

/* Calls `cb` for every trial matching `filter` (NULL: all), best first
 * within each (env, matrix, op, n).  The record and its strings are valid
 * only during the call.  A nonzero return from cb stops the walk (and
 * sf_cache_trials returns SF_OK).  Groups come in the order of env_key,
 * matrix_fp, op, n; within a group ok trials by median (NaN medians last),
 * then failures by status and config, so the first of a group is its
 * winner when it is ok.  cb must not write to the same cache. */
typedef int (*sf_trial_cb)(const sf_trial *t, void *user);
SF_API sf_status sf_cache_trials(sf_cache *cache, const sf_trial_filter *filter,
                                 sf_trial_cb cb, void *user);

/* --- layers ------------------------------------------------------------ */

/* One tuned kernel of a layer, for one N bucket, as the cache keeps it:
 * its source (compiled for the GPU at hand when opened), its launch record
 * and its packed weights. */
typedef struct sf_layer_variant {
  int64_t n_bucket;          /* the N it was tuned for */
  const char *source;        /* complete CUDA source */
  const char *kernel_name;
  const char *options;       /* NVRTC options beyond the canonical ones,
                                one per line ("" for none) */
  const char *generator_version;
  sf_launch_record launch;
  const void *packed;        /* packed weights, tables and bias */
  size_t packed_size;
  const char *config;        /* the configuration, JSON (informational) */
} sf_layer_variant;

typedef struct sf_layer_record {
  const char *name;          /* what sf_layer_open takes */
  const char *gpu_name;      /* the GPU it was tuned on */
  const char *matrix_fp;
  const char *op;
  int64_t rows, cols;        /* M and K */
  int x_elem_size;           /* bytes per element of X */
  int y_elem_size;           /* bytes per element of Y */
  int n_variants;
  const sf_layer_variant *variants;
  /* NULL, or why this record cannot be used (e.g. "the packed weights of
   * variant 2 (n_bucket 4096) failed their sha256"): sf_cache_layers hands
   * such a record out with no variants instead of failing the walk. */
  const char *problem;
} sf_layer_record;

/* Stores (replaces) the layer `rec->name` tuned on `rec->gpu_name`, in one
 * transaction: on failure the previous record stays whole.  Packed bytes
 * are stored once per distinct sha256, shared between variants and layers,
 * and removed when no variant uses them.  A NULL options or
 * generator_version is stored as "".  SF_ERR_INVALID_ARG (naming the
 * field and variant) for NULL name/gpu_name/matrix_fp/op, non-positive
 * rows, cols or element sizes, no variants, a NULL/empty source or
 * kernel_name, n_bucket <= 0, two variants with one n_bucket, a launch
 * record sf_launch_record_problem refuses, NULL packed with packed_size > 0.
 * `problem` is ignored. */
SF_API sf_status sf_cache_put_layer(sf_cache *cache,
                                    const sf_layer_record *rec);

/* Calls `cb` with each stored layer (variants included) whose name equals
 * `name` (NULL: all layers).  Valid only during the call; nonzero stops.
 * Layers come ordered by name then gpu_name, variants by n_bucket.  Each
 * layer is read in its own read transaction and copied out before cb runs,
 * so cb may write to the cache.  Every variant's packed bytes are checked
 * against their sha256 before the layer is handed out: a layer with a
 * mismatch (or missing bytes) comes with `problem` set, naming the
 * variant, and no variants (n_variants 0, variants NULL), and the walk
 * goes on, so one bad blob never hides the other layers; so does a layer
 * row left with no variants at all ("it has no variants").  No layer (or no such name) is SF_OK with no
 * call. */
typedef int (*sf_layer_cb)(const sf_layer_record *rec, void *user);
SF_API sf_status sf_cache_layers(sf_cache *cache, const char *name,
                                 sf_layer_cb cb, void *user);

/* Deletes every record of layer `name` (all GPUs).  SF_ERR_NOT_FOUND if
 * there was none. */
SF_API sf_status sf_cache_delete_layer(sf_cache *cache, const char *name);

/* Receives one message per record that sf_cache_merge or sf_cache_export
 * skipped because it is damaged (valid only during the call). */
typedef void (*sf_skip_cb)(const char *message, void *user);

/* Copies every record of the cache at `other_path` into `cache`, keeping
 * what is already there (no duplicates).  `*added` (may be NULL) receives
 * the number of rows added.
 *
 * The other file is checked like a read-only sf_cache_open (SF_ERR_NOT_FOUND,
 * SF_ERR_NOT_A_DB, SF_ERR_DB_VERSION) and attached read-only the same way
 * (so it may lie in a read-only directory): it is never modified.  All of
 * it is copied in one transaction.  A layer (name, GPU) that `cache`
 * already holds keeps all of its own variants.  Merging the same file
 * twice adds nothing the second time.  `cache` must be writable.
 *
 * Damage stays in its record: every good record is copied, and each
 * damaged one is skipped and reported through `skipped(message, user)`
 * (`skipped` may be NULL).  Damaged records are: a binary whose bytes fail
 * their sha256; a layer (name, GPU) any of whose variants' packed weights
 * are missing or fail their sha256 (or that has no variants): the whole
 * layer is skipped, while the same packed bytes used by a layer that is
 * whole are copied with it.  Matrices, trials and environments have no
 * blobs and are always copied.  A damaged record the destination already
 * holds (a binary it has intact, a layer it has) is not reported: nothing
 * is lost.  The messages name the source file and the record:
 *   "<other_path>: binary <key> (<arch>) skipped: its bytes failed their
 *    sha256: <n> bytes hash to <sha256>, not the stored <sha256>"
 *   "<other_path>: layer \"<name>\" (<gpu>) skipped: <problem>"
 * where <problem> is the text sf_cache_layers gives the record (e.g. "the
 * packed weights of variant 1 (n_bucket 256) failed their sha256: 23 bytes
 * hash to ..., not the stored ...", "the packed weights of variant 0
 * (n_bucket 16) are missing (sha256 ...)", "it has no variants").  They
 * come after the copy has committed, binaries by key, then layers by name
 * and GPU, so the callback may use the cache; the number of calls is the
 * number of records skipped.  The return is SF_OK when every good record
 * was copied, records skipped or not.  Any other failure (the other file
 * refused, SQLite errors, busy) writes nothing, makes no callback and
 * returns its status; the message names the file it is about: the source
 * for what was read from it, `cache` for what could not be written.
 * Repairing the source and merging again adds what was skipped. */
SF_API sf_status sf_cache_merge(sf_cache *cache, const char *other_path,
                                int64_t *added, sf_skip_cb skipped,
                                void *user);

/* Writes the layers named in `layer_names` (a NULL-terminated array; NULL:
 * every layer) into the cache file `dest_path`, with their packed weights,
 * their matrices' records and the binaries whose source is one of their
 * variants' sources (no trials or environments).  `cache` may be
 * read-only.  A name with no layer gives SF_ERR_NOT_FOUND before anything
 * is written.  `*added` (may be NULL) receives the number of rows written.
 * Damaged records are skipped and reported through `skipped` (may be NULL)
 * exactly as sf_cache_merge does, the messages naming `cache`'s path as
 * the source.
 *
 * When `dest_path` does not exist, the export is written to a temporary
 * file beside it ("<dest_path>.<pid>-<n>.export-tmp") and linked into place
 * once complete: any failure removes the temporary file and its side files
 * and leaves no file at `dest_path`.  A file that appeared at `dest_path`
 * meanwhile is not replaced (SF_ERR_IO), except on file systems without
 * hard links, where the temporary file is renamed over it.  When it exists, it must be a sparseforge cache
 * and gains the records it lacks in one transaction (as sf_cache_merge): a
 * failure leaves it as it was.  Either way the written file is then
 * switched to journal_mode DELETE and closed, so it is one self-contained
 * file (no -wal or -shm) that opens read-only anywhere, read-only
 * directories and media included; an existing file that another process
 * holds open stays in WAL mode (its users share it so).  Messages about
 * the destination name `dest_path`, never the temporary file. */
SF_API sf_status sf_cache_export(sf_cache *cache, const char *dest_path,
                                 const char *const *layer_names,
                                 int64_t *added, sf_skip_cb skipped,
                                 void *user);

/* Rows per table (and the bytes of all binaries and packed blobs). */
typedef struct sf_cache_counts {
  int64_t binaries, envs, matrices, trials;
  int64_t winners;            /* rows of the winners view */
  int64_t layers, layer_variants, blobs;
  int64_t blob_bytes;
} sf_cache_counts;
SF_API sf_status sf_cache_count(sf_cache *cache, sf_cache_counts *out);

/* ------------------------------------------------------------------------
 * Layers opened from the cache
 * ---------------------------------------------------------------------- */

/*
 * Opens layer `name` for the context's GPU: prefers the records tuned on
 * this GPU's name, else those of any GPU (the first without a `problem`,
 * else the first).  A record with a problem gives SF_ERR_CORRUPT with the
 * problem in the message: this GPU's record is never passed over for
 * another GPU's because of one.  For each variant the cubin for
 * this GPU's arch is fetched from the cache; if the cache has the source
 * but no cubin, it is compiled with NVRTC and the cubin is stored (the
 * cache must then be writable).  Packed weights are uploaded once.
 *
 * The cubin's key (sf_binary_key) is: the variant's source; options =
 * sf_compile_canonical_options() for this GPU's arch, kind cubin, and the
 * variant's options split into lines (blank lines dropped, surrounding
 * blanks trimmed) as extra options; arch = this GPU's arch (as in
 * sf_device_info); nvrtc_version = "<major>.<minor>" of sf_nvrtc_version();
 * the variant's generator_version; kind SF_BINARY_CUBIN.  Whoever fills the
 * cache ahead of time computes the same key.  Variants whose packed bytes
 * are equal share one device buffer.
 *
 * Returns SF_ERR_NOT_FOUND (no such layer, or a variant's kernel is not in
 * its cubin), SF_ERR_NO_BINARY (no cubin and compiling failed: the message
 * holds the compiler's), SF_ERR_CORRUPT (a stored blob failed its checksum,
 * or a variant is unusable: no kernel name, n_bucket < 1, ...), the cache's
 * status when storing a compiled cubin fails (e.g. a read-only cache), GPU
 * errors.  The variants are then loaded as sf_layer_load does.  Errors go
 * to ctx.  The layer belongs to ctx (closed by
 * sf_context_destroy if still open).
 */
SF_API sf_status sf_layer_open(sf_context *ctx, sf_cache *cache,
                               const char *name, sf_layer **out);

#ifdef __cplusplus
}
#endif
#endif /* SPARSEFORGE_H */
