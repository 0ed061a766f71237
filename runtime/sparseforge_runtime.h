/*
 * sparseforge_runtime.h -- the driver-only runtime of sparseforge.
 *
 * libsparseforge_rt loads the CUDA driver at run time, loads and launches
 * kernels, times them, and runs tuned layers held in memory (a deployment
 * bundle's, or ones read from the cache by libsparseforge).  It needs the
 * CUDA driver alone: no NVRTC, no SQLite, no cuBLAS.  A deployment program
 * that only runs exported layers links libsparseforge_rt; everything that
 * compiles, caches or compares with the peers is in sparseforge.h
 * (libsparseforge), which includes this header.
 *
 * Conventions, for every function below and in sparseforge.h:
 *   - Every call that can fail returns an sf_status (SF_OK is 0).  The
 *     message of the last failure is kept on the handle the call was given:
 *     sf_errmsg() for an sf_context, sf_cache_errmsg() for an sf_cache.
 *     sf_errstr() names a status code.
 *   - The library never exits and never prints.
 *   - NULL where a handle or an output pointer is required gives
 *     SF_ERR_INVALID_ARG (and, where there is a handle, a message on it).
 *   - Every create/open has a destroy/close that accepts NULL.
 *   - Strings passed in are copied; the caller keeps ownership of them.
 *     Strings handed out stay owned by the library unless the function says
 *     the caller frees them (then with sf_free_buffer()).
 *   - Device pointers are plain 64-bit integers (sf_devptr), as the CUDA
 *     driver's CUdeviceptr.
 *
 * Threads: an sf_context may be used by one thread at a time.
 *
 * This header and sparseforge.h are the only hand-written definitions of
 * the records they declare: the Python binding's layouts and constants are
 * generated from them (generator/tools/abi.py) and checked by a test.
 */
#ifndef SPARSEFORGE_RUNTIME_H
#define SPARSEFORGE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SF_BUILDING_LIBRARY) && defined(__GNUC__)
#define SF_API __attribute__((visibility("default")))
#else
#define SF_API
#endif

/* ------------------------------------------------------------------------
 * Versions and status codes
 * ---------------------------------------------------------------------- */

#define SF_VERSION_MAJOR 0
#define SF_VERSION_MINOR 1
#define SF_VERSION_PATCH 0
#define SF_VERSION_STRING "0.1.0"

/* The library's version string, e.g. "0.1.0".  Never fails. */
SF_API const char *sf_version(void);

/*
 * Status codes.  The table is the single source of both the enum and the
 * names returned by sf_errstr(): X(name, value, description).
 */
#define SF_STATUS_TABLE(X)                                                     \
  X(SF_OK, 0, "success")                                                       \
  X(SF_ERR_INVALID_ARG, 1, "invalid argument")                                 \
  X(SF_ERR_NOMEM, 2, "out of host memory")                                     \
  X(SF_ERR_IO, 3, "input/output error")                                        \
  X(SF_ERR_NO_DRIVER, 4, "no CUDA driver found")                               \
  X(SF_ERR_NO_DEVICE, 5, "no CUDA device")                                     \
  X(SF_ERR_CUDA, 6, "CUDA driver error")                                       \
  X(SF_ERR_COMPILE, 7, "compilation failed")                                   \
  X(SF_ERR_NVRTC, 8, "NVRTC error")                                            \
  X(SF_ERR_NOT_FOUND, 9, "not found")                                          \
  X(SF_ERR_DB, 10, "database error")                                           \
  X(SF_ERR_NOT_A_DB, 11, "file is not a sparseforge database")                 \
  X(SF_ERR_DB_VERSION, 12, "database is from a newer sparseforge")             \
  X(SF_ERR_CORRUPT, 13, "stored data failed its checksum")                     \
  X(SF_ERR_LAUNCH, 14, "kernel launch failed")                                 \
  X(SF_ERR_NO_BINARY, 15, "no binary for this GPU and no way to compile one")  \
  X(SF_ERR_BUSY, 16, "database is busy")                                     \
  X(SF_ERR_FAULT, 17, "a kernel faulted: the context is unusable")

typedef enum sf_status {
#define SF_STATUS_ENUM_(name, value, text) name = value,
  SF_STATUS_TABLE(SF_STATUS_ENUM_)
#undef SF_STATUS_ENUM_
} sf_status;

/* A short description of a status code ("no CUDA driver found"); an unknown
 * code gives "unknown status".  Never NULL. */
SF_API const char *sf_errstr(int status);

/* The symbolic name of a status code ("SF_ERR_NO_DRIVER"); an unknown code
 * gives "SF_UNKNOWN".  Never NULL. */
SF_API const char *sf_status_name(int status);

/* Frees a buffer that a function of this library handed to the caller.
 * Accepts NULL. */
SF_API void sf_free_buffer(void *buffer);

/* SHA-256 of `size` bytes at `data`, written as 64 lowercase hex digits and
 * a NUL into `hex_out` (65 bytes).  `data` may be NULL when size is 0.
 * Returns SF_ERR_INVALID_ARG for a NULL hex_out or NULL data with size > 0. */
SF_API sf_status sf_sha256_hex(const void *data, size_t size, char hex_out[65]);

/* ------------------------------------------------------------------------
 * Activations of the fused epilogue
 * ---------------------------------------------------------------------- */

/* The activation a generated kernel applies after scale and bias: the
 * generator bakes the code into the kernel, the device code tests it.
 * X(name, value, the word the command line and the Python side use). */
#define SF_ACTIVATION_TABLE(X) \
  X(SF_ACT_NONE, 0, "none")    \
  X(SF_ACT_RELU, 1, "relu")    \
  X(SF_ACT_GELU, 2, "gelu")

typedef enum sf_activation {
#define SF_ACTIVATION_ENUM_(name, value, word) name = value,
  SF_ACTIVATION_TABLE(SF_ACTIVATION_ENUM_)
#undef SF_ACTIVATION_ENUM_
} sf_activation;

/* The word of an activation code ("gelu"); NULL for an unknown code. */
SF_API const char *sf_activation_name(int activation);

/* ------------------------------------------------------------------------
 * Context: the CUDA driver, one device, and the last error message
 * ---------------------------------------------------------------------- */

typedef struct sf_context sf_context;
typedef uint64_t sf_devptr;

/*
 * Creates a context for device `device_ordinal` (0 for the first GPU).
 * Creating a context never touches the GPU: the driver (libcuda) is loaded
 * with dlopen on the first call that needs it, so a context is enough to
 * compile on a machine with no GPU and no driver.  GPU calls on such a
 * machine return SF_ERR_NO_DRIVER ("no CUDA driver found: ...") or
 * SF_ERR_NO_DEVICE ("no CUDA device ...").
 *
 * The driver is "libcuda.so.1", or the file named by the environment
 * variable SF_CUDA_DRIVER (tests point it at a missing file to get the
 * no-driver behaviour on any machine).  It is loaded once per process; a
 * failed load is tried again by the next call.  Any failure of cuInit (no
 * device, a stub or mismatched driver) is SF_ERR_NO_DEVICE with cuInit's
 * error name in the message.  Each GPU call makes the device's primary
 * context current on the calling thread, so a context may move between
 * threads (used by one at a time).
 *
 * `*out` receives the context.  Returns SF_ERR_INVALID_ARG for a NULL out
 * or a negative ordinal (then *out is NULL), SF_ERR_NOMEM.
 */
SF_API sf_status sf_context_create(int device_ordinal, sf_context **out);

/* Destroys a context, its loaded modules, its open layers and the device
 * memory it still tracks (after waiting for the GPU).  Those modules,
 * kernels and layers are invalid afterwards: do not unload or close them
 * again.  Accepts NULL. */
SF_API void sf_context_destroy(sf_context *ctx);

/* The message of the last failed call on `ctx` ("" if none; "NULL
 * context" for a NULL ctx).  Owned by the context, valid until its next
 * call.  NVRTC failures carry the compiler log; CUDA failures carry the
 * driver's error name (e.g. CUDA_ERROR_ILLEGAL_ADDRESS). */
SF_API const char *sf_errmsg(const sf_context *ctx);

/* The status of the last failed call on `ctx` (SF_OK if none;
 * SF_ERR_INVALID_ARG for NULL).  A successful call clears neither this nor
 * the message. */
SF_API sf_status sf_errcode(const sf_context *ctx);

/* Records a failure on `ctx` as the library's own calls do: `code` and a
 * copy of `message` become what sf_errcode() and sf_errmsg() return.  For
 * code built on the runtime (a deployment bundle's open, say) that reports
 * through the caller's context.  Returns `code`; a NULL ctx is ignored and
 * a NULL message is "". */
SF_API sf_status sf_context_fail(sf_context *ctx, sf_status code,
                                 const char *message);

/* ------------------------------------------------------------------------
 * Device description
 * ---------------------------------------------------------------------- */

typedef struct sf_device_info {
  char name[256];            /* e.g. "NVIDIA H100 80GB HBM3" */
  int cc_major, cc_minor;    /* compute capability, e.g. 9, 0 */
  char arch[16];             /* NVRTC arch for this GPU: "sm_90a" on 9.0,
                                else "sm_<major><minor>" */
  int sm_count;              /* multiprocessors */
  int l2_bytes;              /* L2 cache size */
  int smem_per_block_optin;  /* largest dynamic shared memory a block can
                                opt into, bytes */
  int smem_per_sm;           /* shared memory per multiprocessor, bytes */
  int regs_per_block;        /* 32-bit registers per block */
  int max_threads_per_block;
  int clock_khz;             /* peak SM clock */
  int driver_version;        /* cuDriverGetVersion, e.g. 13000 */
  uint64_t total_mem_bytes;
} sf_device_info;

/* Fills `*out` for the context's device.  Initializes the driver on first
 * use.  Returns SF_ERR_NO_DRIVER, SF_ERR_NO_DEVICE (no device, or the
 * ordinal is out of range), SF_ERR_CUDA, SF_ERR_INVALID_ARG. */
SF_API sf_status sf_device_info_get(sf_context *ctx, sf_device_info *out);

/* Number of CUDA devices, into *count.  SF_ERR_NO_DRIVER where there is no
 * driver (then *count is 0); a driver with no device gives SF_OK and 0
 * (other cuInit failures give SF_ERR_NO_DEVICE and 0). */
SF_API sf_status sf_device_count(sf_context *ctx, int *count);


/* ------------------------------------------------------------------------
 * Binaries: compiled code held in memory
 * ---------------------------------------------------------------------- */

typedef enum sf_binary_kind {
  SF_BINARY_CUBIN = 0, /* machine code for one arch */
  SF_BINARY_PTX = 1    /* PTX; the driver JIT-compiles it at load */
} sf_binary_kind;

/* A compiled program: its binary (cubin or PTX) and, when libsparseforge
 * compiled it, the compiler's log. */
typedef struct sf_binary sf_binary;

/* Wraps bytes (a cubin or PTX read from a cache or file) in an sf_binary;
 * the bytes are copied.  PTX is NUL-terminated text: a NUL is appended
 * (and counted in the size) when the last byte is not one.
 * SF_ERR_INVALID_ARG (no message: there is no handle) for NULL data or
 * out, size 0 or an unknown kind. */
SF_API sf_status sf_binary_from_memory(const void *data, size_t size,
                                       sf_binary_kind kind, sf_binary **out);

/* The binary's bytes and size; owned by the binary.  NULL (and size 0)
 * for NULL.  A PTX binary's size counts its terminating NUL. */
SF_API const void *sf_binary_data(const sf_binary *bin, size_t *size);
/* The binary's kind (SF_BINARY_CUBIN for NULL). */
SF_API sf_binary_kind sf_binary_get_kind(const sf_binary *bin);
/* The compiler's log ("" when empty or not compiled here).  Owned by bin. */
SF_API const char *sf_binary_log(const sf_binary *bin);
SF_API void sf_binary_free(sf_binary *bin);

/* ------------------------------------------------------------------------
 * Modules, kernels and launches
 * ---------------------------------------------------------------------- */

typedef struct sf_module sf_module;
typedef struct sf_kernel sf_kernel;

/* Loads a binary on the context's device.  SF_ERR_CUDA for an image the
 * driver refuses (e.g. a cubin for another arch: message carries
 * CUDA_ERROR_NO_BINARY_FOR_GPU).  Free with sf_module_unload(). */
SF_API sf_status sf_module_load(sf_context *ctx, const sf_binary *bin,
                                sf_module **out);
SF_API void sf_module_unload(sf_module *mod);

/* Finds a kernel by its (extern "C" or mangled) name.  The kernel belongs
 * to the module and is valid until the module is unloaded; asking twice
 * gives the same handle.  SF_ERR_NOT_FOUND if the module has no such
 * kernel ("no kernel named \"<name>\" in the module ..."). */
SF_API sf_status sf_kernel_get(sf_context *ctx, sf_module *mod,
                               const char *name, sf_kernel **out);

/* Registers, static shared memory and local memory of a kernel, as the
 * driver reports them. */
typedef struct sf_kernel_attrs {
  int num_regs;
  int shared_bytes;      /* static shared memory */
  int local_bytes;       /* local memory per thread (spills, stack) */
  int max_threads;       /* largest block it can launch */
} sf_kernel_attrs;
SF_API sf_status sf_kernel_attributes(sf_context *ctx, sf_kernel *k,
                                      sf_kernel_attrs *out);

typedef struct sf_launch_config {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared_bytes; /* dynamic shared memory; above 48 KB the kernel's
                            limit is raised first */
  void *stream;          /* a CUstream, or NULL for the default stream */
} sf_launch_config;

/* The arguments of one launch of a generated kernel, made by
 * sf_kernel_args_set: (packed, X, Y, N) and, for a kernel whose module
 * declares TMA tensor maps of X and (or) Y, the maps as the next
 * parameters, X's first.  `ptrs` (what sf_launch and the timers take as
 * `args`) points into the struct itself: fill it in place and do not copy
 * it. */
typedef struct sf_kernel_args {
  void *ptrs[6];
  uint64_t packed, x, y;
  int n;
  int n_args;                /* 4, plus one a map */
  unsigned char x_map[128];  /* the CUtensorMap of X (zeros: none for this N) */
  unsigned char y_map[128];  /* the CUtensorMap of Y (zeros: none for this N) */
} sf_kernel_args;

/* Fills `out` for one launch of `k` on (packed, X, Y, N).  A module may
 * declare, in a global `int sf_x_map[4]` = {layout, K, box width, box
 * rows}, that its kernel reads X through a TMA tensor map (layout 1: X is
 * K x N, row-major; 2: X is N x K), 16-bit elements, box of `box width`
 * (16, 32 or 64) elements along X's contiguous dimension by `box rows`
 * (1..256), swizzled to the box's row (32-, 64- or 128-byte swizzle),
 * zeros outside X: the map of this X and N is then encoded
 * (cuTensorMapEncodeTiled) as the fifth argument.  Likewise `int
 * sf_y_map[4]` = {layout, M, box width, box rows} declares a map of Y
 * (layout 1: Y is M x N; 2: Y is N x M) for the kernel's tensor stores,
 * the argument after X's map (the fifth where there is none).  A matrix
 * of layout 1 with N % 8 != 0 has rows that are not 16-byte aligned: its
 * map is left zero and the kernel, which knows N, does without it.
 * SF_ERR_INVALID_ARG for N outside 1..INT_MAX, a malformed declaration,
 * or a matrix the driver cannot map (its message).  Touches no GPU
 * memory. */
SF_API sf_status sf_kernel_args_set(sf_context *ctx, sf_kernel *k, sf_devptr packed,
                                    sf_devptr x, sf_devptr y, int64_t n,
                                    sf_kernel_args *out);

/* Launches `k` with `args` (an array of pointers to each argument, as
 * cuLaunchKernel takes them; NULL for a kernel without parameters).
 * Returns SF_ERR_LAUNCH when the launch is refused (bad configuration, too
 * much shared memory, ...), with the CUDA error name in the message;
 * SF_ERR_FAULT when the context has faulted before (e.g.
 * CUDA_ERROR_ILLEGAL_ADDRESS from an earlier kernel); SF_ERR_INVALID_ARG
 * for a zero grid or block dimension or a kernel of another context.  Does
 * not wait for the kernel.  A kernel whose module declares `int sf_pdl = 1`
 * (the 2:4 TMA kernels, and the row-group kernels built for sm_90) is
 * launched as a programmatic dependent of the stream's previous work: it
 * may start, and read its constant packed operands, while that work
 * drains, and waits for it (griddepcontrol.wait) before reading X or
 * writing Y; SF_PDL=0 in the environment launches it in plain stream
 * order. */
SF_API sf_status sf_launch(sf_context *ctx, sf_kernel *k,
                           const sf_launch_config *cfg, void **args);

/* Waits for all work on the context's device.  A kernel's fault surfaces
 * here as SF_ERR_FAULT (the message names it, e.g.
 * CUDA_ERROR_ILLEGAL_ADDRESS); after a fault the context is unusable and
 * must be destroyed (the driver's rule), and every later GPU call on it
 * gives SF_ERR_FAULT too. */
SF_API sf_status sf_synchronize(sf_context *ctx);

typedef struct sf_timing_options {
  int warmup;           /* launches before timing (default 3 if 0;
                           negative: none) */
  int min_reps;         /* at least this many timed launches (default 30) */
  int max_reps;         /* at most (default 1000) */
  double min_total_ms;  /* keep timing until this much time (default 100) */
  int flush_l2;         /* nonzero: overwrite a buffer twice the L2 size
                           between timed launches (not timed) */
  int graph_batch;      /* > 1: capture this many launches in a CUDA graph
                           and time the graph's replays; each sample is the
                           mean per launch.  For very short kernels. */
  uint64_t rotate_bytes; /* > 0: launches rotate through copies of their
                           operands that hold at least this many bytes in
                           all (twice the L2 size makes every launch read
                           its weights from device memory, as in a model's
                           forward pass).  The peers make the copies;
                           sf_time_kernel_sets takes them from the caller.
                           A rotating graph holds a whole number of rounds
                           of the copies (graph_batch is rounded up). */
} sf_timing_options;

typedef struct sf_timing {
  double median_ms, p20_ms, p80_ms, min_ms, mean_ms;
  int reps;
} sf_timing;

/* Times a kernel with CUDA events on cfg->stream: warm-up, then repeated
 * launches as `opts` says (NULL: defaults).  Compilation and module load are
 * outside it by construction.  Each sample is bracketed by its own pair of
 * events (the L2 flush, when asked for, runs before the first event);
 * samples are taken in rounds of up to 64 and stop once min_reps samples
 * and min_total_ms of kernel time are reached, or at max_reps.  Quantiles
 * interpolate linearly between samples.  With graph_batch > 1 on the
 * default stream a private stream is used (the default stream cannot be
 * captured).  A launch or kernel failure returns its status (SF_ERR_LAUNCH,
 * SF_ERR_FAULT or SF_ERR_CUDA); negative options or max_reps < min_reps
 * give SF_ERR_INVALID_ARG. */
SF_API sf_status sf_time_kernel(sf_context *ctx, sf_kernel *k,
                                const sf_launch_config *cfg, void **args,
                                const sf_timing_options *opts,
                                sf_timing *out);

/* sf_time_kernel over `n_sets` argument arrays (arg_sets[i] is one launch's
 * `args`, each naming its own copy of the operands): successive launches
 * take successive sets, round after round, so that a short kernel is timed
 * as it runs in a model's forward pass, its operands not left in L2 by the
 * launch before.  With graph_batch > 1 the graph holds a whole number of
 * rounds (graph_batch is rounded up to a multiple of n_sets).
 * opts->rotate_bytes is not used (the caller made the copies).
 * SF_ERR_INVALID_ARG for n_sets < 1 or a NULL set. */
SF_API sf_status sf_time_kernel_sets(sf_context *ctx, sf_kernel *k,
                                     const sf_launch_config *cfg,
                                     void **const *arg_sets, int n_sets,
                                     const sf_timing_options *opts,
                                     sf_timing *out);

/* ------------------------------------------------------------------------
 * The launch record: how a generated kernel runs for N columns
 * ---------------------------------------------------------------------- */

/*
 * Every generated kernel takes the same four parameters,
 *
 *     (const unsigned char *packed, const void *X, void *Y, int N),
 *
 * and the launch record holds everything else its launch needs.  It is
 * written once, as this table: the struct below, the cache's columns
 * (cache/layers.c), the deployment bundle and the Python binding are all
 * made from it.  S(type, name, text) is one value, A(type, name, count,
 * text) an array.
 */
#define SF_LAUNCH_RECORD_FIELDS(S, A)                                        \
  A(unsigned, grid, 3, "the grid for N <= n_tile")                           \
  S(int, n_axis, "grid axis multiplied by ceil(N / n_tile); -1: none")       \
  S(int, n_tile, "columns of N one step along n_axis covers")                \
  A(unsigned, block, 3, "threads per block")                                 \
  S(unsigned, shared_bytes, "dynamic shared memory per block, bytes")        \
  S(int, zero_output, "nonzero: Y is zeroed before each launch (split-K)")

#define SF_LAUNCH_SCALAR_(type, name, text) type name;
#define SF_LAUNCH_ARRAY_(type, name, count, text) type name[count];
typedef struct sf_launch_record {
  SF_LAUNCH_RECORD_FIELDS(SF_LAUNCH_SCALAR_, SF_LAUNCH_ARRAY_)
} sf_launch_record;
#undef SF_LAUNCH_SCALAR_
#undef SF_LAUNCH_ARRAY_

/* Why `launch` cannot run ("a grid or block dimension is 0", "n_axis is
 * outside -1..2", "n_tile is below 1 while n_axis names an axis", and "no
 * launch record" for NULL), or NULL when the record is well formed.  A
 * static string; never fails. */
SF_API const char *sf_launch_record_problem(const sf_launch_record *launch);

/*
 * The launch configuration of `launch` for N columns on `stream`: the grid
 * with grid[n_axis] multiplied by ceil(N / n_tile), the block and the
 * dynamic shared memory as recorded.  This is the one grid rule: the tuner
 * measures and the runtime runs what it computes.  SF_ERR_INVALID_ARG for
 * a malformed record (sf_launch_record_problem), N outside 1..INT_MAX, or
 * a grid dimension past CUDA's limits (2^31 - 1, 65535, 65535 blocks), with a
 * message naming N and the axis on ctx (which may be NULL: then the status
 * alone).
 */
SF_API sf_status sf_launch_config_for(sf_context *ctx,
                                      const sf_launch_record *launch,
                                      int64_t n, void *stream,
                                      sf_launch_config *out);

/* ------------------------------------------------------------------------
 * Device memory (enough for tests and the tuner)
 * ---------------------------------------------------------------------- */

/* Memory from sf_mem_alloc is tracked by the context and freed with it.
 * Size 0 is SF_ERR_INVALID_ARG; failures are SF_ERR_CUDA (e.g.
 * CUDA_ERROR_OUT_OF_MEMORY in the message). */
SF_API sf_status sf_mem_alloc(sf_context *ctx, size_t size, sf_devptr *out);
/* Frees device memory; 0 is accepted and ignored.  A pointer this context
 * did not allocate (or freed already) is SF_ERR_INVALID_ARG. */
SF_API sf_status sf_mem_free(sf_context *ctx, sf_devptr ptr);
/* Synchronous copies and memset.  The device pointer may come from
 * anywhere on the context's device.  Size 0 does nothing (SF_OK); a NULL
 * host pointer or a 0 device pointer with size > 0 is SF_ERR_INVALID_ARG. */
SF_API sf_status sf_memcpy_htod(sf_context *ctx, sf_devptr dst,
                                const void *src, size_t size);
SF_API sf_status sf_memcpy_dtoh(sf_context *ctx, void *dst, sf_devptr src,
                                size_t size);
SF_API sf_status sf_memset_d8(sf_context *ctx, sf_devptr dst,
                              unsigned char value, size_t size);

/* ------------------------------------------------------------------------
 * Layers: tuned kernels held in memory, run on device pointers
 * ---------------------------------------------------------------------- */

typedef struct sf_layer sf_layer;

/* One variant of a layer, as code: a binary for the GPU's architecture,
 * the kernel in it, its launch and its packed weights. */
typedef struct sf_layer_code {
  int64_t n_bucket;          /* the N it was tuned for (>= 1) */
  const char *kernel_name;
  sf_launch_record launch;
  const void *binary;        /* cubin, or NUL-terminated PTX */
  size_t binary_size;
  sf_binary_kind binary_kind;
  const void *packed;        /* packed weights, tables and bias (may be
                                NULL with packed_size 0) */
  size_t packed_size;
} sf_layer_code;

/* A layer as code: every variant (N bucket) and the shape of Y = W X. */
typedef struct sf_layer_desc {
  const char *name;          /* for messages */
  int64_t rows, cols;        /* M and K */
  int x_elem_size;           /* bytes per element of X */
  int y_elem_size;           /* bytes per element of Y */
  int n_variants;
  const sf_layer_code *variants;
} sf_layer_desc;

/*
 * Loads a layer held in memory on the context's GPU: each variant's binary
 * is loaded and its kernel looked up, and each distinct packed blob is
 * uploaded once (variants whose packed bytes are equal share one device
 * buffer).  Nothing is compiled.  The descriptor and its bytes may be freed
 * once this returns.  SF_ERR_INVALID_ARG for a malformed descriptor (no
 * variants, a variant with no binary or kernel name, n_bucket < 1, two
 * variants with one n_bucket, a launch record sf_launch_record_problem
 * refuses, NULL packed with packed_size > 0, non-positive rows, cols or
 * element sizes), naming the layer and the variant, before the driver is
 * touched; SF_ERR_CUDA for a binary the driver refuses (e.g.
 * CUDA_ERROR_NO_BINARY_FOR_GPU), SF_ERR_NOT_FOUND for a kernel missing from
 * its binary, GPU errors as elsewhere.  On failure nothing stays loaded.
 * The layer belongs to ctx (closed by sf_context_destroy if still open).
 */
SF_API sf_status sf_layer_load(sf_context *ctx, const sf_layer_desc *desc,
                               sf_layer **out);
SF_API void sf_layer_close(sf_layer *layer);

/* Runs Y = layer(X) for N columns on `stream` (NULL: default stream).  X
 * and Y are device pointers in the layout of the layer's op.  The variant
 * whose n_bucket is nearest to N (in ratio: smallest |log(N / n_bucket)|,
 * the first on a tie) runs with the arguments (packed, X, Y, (int)N) and
 * the configuration sf_launch_config_for gives; with zero_output, rows * N
 * * y_elem_size bytes of Y are zeroed first on the same stream.
 * SF_ERR_INVALID_ARG for N outside 1..INT_MAX, a 0 X or Y, or a grid that
 * N makes too large.  Does not wait, allocates nothing and copies nothing,
 * so a run on a capturing stream is captured into a CUDA graph. */
SF_API sf_status sf_layer_run(sf_context *ctx, sf_layer *layer, sf_devptr x,
                              sf_devptr y, int64_t n, void *stream);

/* sf_layer_run with the packed weights in memory the caller owns: variant
 * i (in the descriptor's order) runs with packed[i], a device pointer on
 * the layer's GPU, in place of the buffer sf_layer_load uploaded.  For a
 * framework that keeps the packed weights as its own tensors: load the
 * layer with NULL packed bytes (nothing is uploaded) and pass the tensors'
 * addresses here.  A 0 entry reaches the kernel as is (a variant without
 * packed bytes).  The variant, the zeroing of Y and the launch are
 * sf_layer_run's; so is what it refuses, and SF_ERR_INVALID_ARG for a NULL
 * packed or n_packed other than the layer's variant count.  Does not wait,
 * allocates nothing and copies nothing (capturable, as sf_layer_run). */
SF_API sf_status sf_layer_run_packed(sf_context *ctx, sf_layer *layer,
                                     const sf_devptr *packed, int n_packed,
                                     sf_devptr x, sf_devptr y, int64_t n,
                                     void *stream);

/* Shape and variant count of an open layer; any output may be NULL.
 * SF_ERR_INVALID_ARG for a NULL layer. */
SF_API sf_status sf_layer_shape(const sf_layer *layer, int64_t *rows,
                                int64_t *cols, int *n_variants);

/* How many of the layer's variants sf_layer_open had to compile (0 when
 * every cubin came from the cache, and for sf_layer_load); -1 for NULL. */
SF_API int sf_layer_compiled_count(const sf_layer *layer);

#ifdef __cplusplus
}
#endif
#endif /* SPARSEFORGE_RUNTIME_H */
