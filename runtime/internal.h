/*
 * internal.h -- private declarations shared by the runtime and the cache.
 * Nothing here is part of the public interface (sparseforge_runtime.h,
 * sparseforge.h).
 *
 * Layers: the driver-only runtime (libsparseforge_rt: status.c, driver.c,
 * context.c, binary.c, module.c, launch.c, layer.c) sees only
 * sparseforge_runtime.h through this header and calls nothing above it.
 * The sources of libsparseforge alone (compile.c, peer.c, layer_open.c and
 * the cache) include sparseforge.h themselves.
 */
#ifndef SF_INTERNAL_H
#define SF_INTERNAL_H

#include "sparseforge_runtime.h"

#include <stdarg.h>
#include <stddef.h>

#define SF_MSG_MAX 16384

/* printf-style into a fixed message buffer of SF_MSG_MAX bytes (truncates). */
void sf__vformat(char *buf, const char *fmt, va_list ap);

/* strdup that returns NULL on NULL. */
char *sf__strdup(const char *s);

/* SHA-256 streaming interface. */
typedef struct sf__sha256 {
  uint32_t state[8];
  uint64_t bitlen;
  unsigned char buf[64];
  size_t buflen;
} sf__sha256;
void sf__sha256_init(sf__sha256 *c);
void sf__sha256_update(sf__sha256 *c, const void *data, size_t n);
void sf__sha256_final_hex(sf__sha256 *c, char hex_out[65]);

/* Records a failure on ctx (code + printf-style message) and returns code;
 * a NULL ctx gives the code alone.  Messages of any length are kept (NVRTC
 * logs).  context.c. */
sf_status sf__fail(sf_context *ctx, sf_status code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Which of `names` (n of them, at most 32) a cubin's symbol table holds,
 * one bit each (bit i: names[i]) into *found: 1 where `data` (`size`
 * bytes) is a 64-bit little-endian ELF whose section and symbol tables lie
 * inside it, else 0 with *found 0 (PTX, or a damaged image).  module.c:
 * the runtime asks the driver only for the optional symbols a module has,
 * so that a sanitizer sees no failed look-ups. */
int sf__cubin_symbols(const void *data, size_t size, const char *const *names, size_t n,
                      unsigned *found);

/* A binary made of `data` (`size` bytes, NUL-terminated one byte past size)
 * and `log`, both malloc'd: the binary takes them over, and frees them
 * itself when it cannot be made (SF_ERR_NOMEM).  binary.c; compile.c makes
 * its binaries with it. */
sf_status sf__binary_new(sf_binary_kind kind, char *data, size_t size,
                         char *log, sf_binary **out);

/* The launch record in words for messages: "grid 96 x 1 x 1, block 128 x 1
 * x 1, n_axis 1, n_tile 16, 4096 bytes shared memory" (launch.c). */
void sf__launch_describe(const sf_launch_record *launch, char *buf,
                         size_t size);

/* Why the layer `desc` cannot be loaded, written into msg (size bytes)
 * and returned, or NULL when it can (layer.c; the checks sf_layer_load
 * documents).  need_binaries 0 leaves the variants' binary fields out, for
 * records whose binaries are still to be fetched (sf_layer_open) or that
 * keep sources instead (sf_cache_put_layer).  A variant's message starts
 * "layer \"<name>\" variant <i> (n_bucket <n>): ". */
const char *sf__layer_desc_problem(const sf_layer_desc *desc,
                                   int need_binaries, char *msg, size_t size);

/* Records, on a layer sf_layer_load made, how many of its variants had to
 * be compiled (sf_layer_compiled_count; layer.c, for sf_layer_open). */
void sf__layer_set_compiled(sf_layer *layer, int compiled);

/* ------------------------------------------------------------------------
 * The runtime's private side (driver.c, context.c, module.c, layer.c, and
 * above them compile.c and peer.c).  cuda.h is used for its types only:
 * libcuda is loaded with dlopen and every entry point goes through
 * sf__driver.
 * ---------------------------------------------------------------------- */
#ifdef SF_RUNTIME_INTERNAL
#include <cuda.h>

/* The CUDA driver entry points the runtime uses, with their CUDA 12.0 ABI
 * (the version asked of cuGetProcAddress).  Members are named without the
 * "cu" prefix so that cuda.h's versioning macros (cuMemAlloc ->
 * cuMemAlloc_v2, ...) leave them alone. */
typedef struct sf__driver {
  CUresult (*Init)(unsigned int);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*DeviceTotalMem)(size_t *, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxSynchronize)(void);
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*ModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *);
  CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t,
                                   void *, const cuuint64_t *, const cuuint64_t *,
                                   const cuuint32_t *, const cuuint32_t *,
                                   CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
  CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
  CUresult (*StreamCreate)(CUstream *, unsigned int);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*EventCreate)(CUevent *, unsigned int);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
  CUresult (*StreamEndCapture)(CUstream, CUgraph *);
  CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
} sf__driver;

/*
 * Loads libcuda (once per process; $SF_CUDA_DRIVER names another file) and
 * runs cuInit.  On success *out is the entry-point table.  On failure the
 * status is SF_ERR_NO_DRIVER ("no CUDA driver found: <why>") or
 * SF_ERR_NO_DEVICE ("no CUDA device: ..."), with the message written into
 * msg (SF_MSG_MAX bytes); *init_result then holds cuInit's result when the
 * library loaded but cuInit failed (else CUDA_SUCCESS).  Thread-safe.
 */
sf_status sf__driver_get(const sf__driver **out, char *msg,
                         CUresult *init_result);

/* "CUDA_ERROR_X (description)" for a driver result, into buf. */
void sf__cu_describe(const sf__driver *drv, CUresult r, char *buf,
                     size_t size);

/* Errors that leave the context unusable (a kernel fault): CUDA_ERROR_
 * ILLEGAL_ADDRESS, LAUNCH_FAILED, ... */
int sf__cu_is_sticky(CUresult r);

/*
 * An object a context owns (a module, a layer), embedded in the object's
 * struct: sf_context_destroy releases what is still owned, newest first,
 * through `release`, so context.c needs to know nothing of the owners.
 * SF__OWNER gives the object back from its member.
 */
typedef struct sf__owned {
  void (*release)(struct sf__owned *self);
  struct sf__owned *prev, *next;
} sf__owned;
#define SF__OWNER(ptr, type, member) \
  ((type *)((char *)(ptr) - offsetof(type, member)))

/* Adds `o` to what ctx owns (it cannot fail), and takes it out again
 * (context.c). */
void sf__own(sf_context *ctx, sf__owned *o, void (*release)(sf__owned *));
void sf__disown(sf_context *ctx, sf__owned *o);

/* The objects module.c owns. */
struct sf_kernel {
  struct sf_module *mod;
  CUfunction fn;
  char *name;
  int dyn_smem_limit;     /* MAX_DYNAMIC_SHARED_SIZE_BYTES set so far */
  /* the module's sf_x_map: {layout (1 feature-major, 2 token-major), K,
   * box width, box rows}; all 0 when it declares none */
  int x_map[4];
  /* the module's sf_y_map, the same for Y: {layout, M, box width, box
   * rows}; all 0 when it declares none */
  int y_map[4];
  /* launched as a programmatic dependent of the stream's previous work
   * (the module declares sf_pdl: its kernels wait for it with
   * griddepcontrol.wait before reading what that work wrote; SF_PDL=0
   * turns it off) */
  int pdl;
  struct sf_kernel *next; /* in the module */
};

struct sf_module {
  sf__owned owned; /* in the context */
  sf_context *ctx;
  CUmodule mod;
  struct sf_kernel *kernels;
  /* which optional symbols (module.c's optional_symbols, one bit each) the
   * cubin's symbol table holds; symbols_known is 0 where it could not be
   * read (PTX), and the driver is then asked for each */
  unsigned symbols;
  int symbols_known;
};

struct sf_context {
  int ordinal;
  sf_status code;       /* last failure */
  char *msg;            /* last failure's message (heap, grows) */
  size_t msg_cap;
  /* GPU state, set by sf__ctx_enter on first use */
  const sf__driver *drv;
  int ready;
  CUdevice dev;
  CUcontext cu;
  int have_info;
  sf_device_info info;
  /* set by the first sticky error (a kernel fault): the context is
   * unusable, and every later GPU call says so with this description */
  int faulted;
  char fault[512];
  /* what the context owns */
  sf_devptr *allocs;
  size_t n_allocs, cap_allocs;
  sf__owned *owned;      /* modules and layers, newest first */
  CUdeviceptr flush_buf; /* L2 flush buffer for sf_time_kernel */
  size_t flush_size;
};


/* Records a failed driver call: "<what> failed: CUDA_ERROR_X (text)".
 * Sticky errors (kernel faults) become SF_ERR_FAULT whatever `code` is,
 * and mark the context faulted. */
sf_status sf__cu_fail(sf_context *ctx, sf_status code, CUresult r,
                      const char *what);

/* Loads the driver, opens the device's primary context on first use and
 * makes it current on this thread.  Every GPU call starts with it.  A
 * faulted context gives SF_ERR_FAULT, naming the fault. */
sf_status sf__ctx_enter(sf_context *ctx);

/* One launch of something timed (a kernel, a cuBLAS call) on `stream`. */
typedef sf_status (*sf__launch_fn)(sf_context *ctx, void *user, CUstream stream);

/* The timing protocol of sf_time_kernel for any launch: warm-up, optional
 * L2 flush and graph capture, event-timed samples, statistics. The context
 * must be current (sf__ctx_enter). */
sf_status sf__time_launches(sf_context *ctx, sf__launch_fn fn, void *user,
                            CUstream stream, const sf_timing_options *opts,
                            sf_timing *out);

/* sf__time_launches for a launch that rotates through `n_sets` copies of its
 * operands (`fn` takes the next copy each call): graph_batch is rounded up
 * to whole rounds of the copies. */
sf_status sf__time_rotating(sf_context *ctx, sf__launch_fn fn, void *user,
                            CUstream stream, int n_sets,
                            const sf_timing_options *opts, sf_timing *out);

/* How many copies of operands of `set_bytes` bytes make opts->rotate_bytes
 * (1 without rotation; at most SF_MAX_ROTATION_SETS). */
#define SF_MAX_ROTATION_SETS 64
int sf__rotation_sets(const sf_timing_options *opts, uint64_t set_bytes);

/* Allocation tracking (context.c). */
sf_status sf__track_alloc(sf_context *ctx, sf_devptr p);
int sf__untrack_alloc(sf_context *ctx, sf_devptr p);
/* Frees device memory the context tracks whatever state the context is in
 * (a faulted one included), ignoring the driver's answer: for owners
 * releasing their buffers.  0 or an untracked pointer does nothing. */
void sf__release_alloc(sf_context *ctx, sf_devptr p);

#endif /* SF_RUNTIME_INTERNAL */

#endif
