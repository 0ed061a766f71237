/*
 * internal.h -- private declarations shared by the runtime and the cache.
 * Nothing here is part of the public interface (sparseforge.h).
 */
#ifndef SF_INTERNAL_H
#define SF_INTERNAL_H

#include "sparseforge.h"

#include <stdarg.h>

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

/* ------------------------------------------------------------------------
 * The runtime's private side (driver.c, context.c, compile.c, module.c,
 * layer.c).  cuda.h is used for its types only: libcuda is loaded with
 * dlopen and every entry point goes through sf__driver.
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
  CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
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

/* The objects a context owns (module.c and layer.c). */
struct sf_kernel {
  struct sf_module *mod;
  CUfunction fn;
  char *name;
  int dyn_smem_limit;     /* MAX_DYNAMIC_SHARED_SIZE_BYTES set so far */
  struct sf_kernel *next; /* in the module */
};

struct sf_module {
  sf_context *ctx;
  CUmodule mod;
  struct sf_kernel *kernels;
  struct sf_module *prev, *next; /* in the context */
};

struct sf_layer_variant_rt;
struct sf_layer {
  sf_context *ctx;
  int64_t rows, cols;
  int y_elem_size;
  int n_variants;
  int compiled;
  struct sf_layer_variant_rt *variants;
  struct sf_layer *prev, *next; /* in the context */
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
  /* what the context owns */
  sf_devptr *allocs;
  size_t n_allocs, cap_allocs;
  struct sf_module *modules;
  struct sf_layer *layers;
  CUdeviceptr flush_buf; /* L2 flush buffer for sf_time_kernel */
  size_t flush_size;
};

/* Records a failure on ctx (code + printf-style message) and returns code.
 * Messages of any length are kept (NVRTC logs). */
sf_status sf__fail(sf_context *ctx, sf_status code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Records a failed driver call: "<what> failed: CUDA_ERROR_X (text)".
 * Sticky errors (kernel faults) become SF_ERR_CUDA whatever `code` is. */
sf_status sf__cu_fail(sf_context *ctx, sf_status code, CUresult r,
                      const char *what);

/* Loads the driver, opens the device's primary context on first use and
 * makes it current on this thread.  Every GPU call starts with it. */
sf_status sf__ctx_enter(sf_context *ctx);

/* One launch of something timed (a kernel, a cuBLAS call) on `stream`. */
typedef sf_status (*sf__launch_fn)(sf_context *ctx, void *user, CUstream stream);

/* The timing protocol of sf_time_kernel for any launch: warm-up, optional
 * L2 flush and graph capture, event-timed samples, statistics. The context
 * must be current (sf__ctx_enter). */
sf_status sf__time_launches(sf_context *ctx, sf__launch_fn fn, void *user,
                            CUstream stream, const sf_timing_options *opts,
                            sf_timing *out);

/* Allocation tracking (context.c). */
sf_status sf__track_alloc(sf_context *ctx, sf_devptr p);
int sf__untrack_alloc(sf_context *ctx, sf_devptr p);

/* Frees a module's host and device side without touching the context's
 * list (module.c); used by sf_context_destroy. */
void sf__module_release(struct sf_module *m);
/* Frees a layer's variants (layer.c); used by sf_context_destroy. */
void sf__layer_release(struct sf_layer *l);

#endif /* SF_RUNTIME_INTERNAL */

#endif
