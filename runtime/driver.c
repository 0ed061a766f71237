/*
 * driver.c -- the CUDA driver, loaded at run time.
 *
 * libcuda is never linked: it is opened with dlopen on the first call that
 * needs the GPU, so the library loads (and compiles with NVRTC) on a
 * machine with no driver.  Entry points come from cuGetProcAddress (asked
 * for their CUDA 12.0 ABI, which every newer driver still serves), falling
 * back to dlsym of the versioned export names.
 */
#define SF_RUNTIME_INTERNAL
#include "internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ABI asked of cuGetProcAddress for every symbol: the signatures in
 * sf__driver are those of CUDA 12.0. */
#define SF_DRIVER_ABI_VERSION 12000

/* One entry point: its base name for cuGetProcAddress and up to two export
 * names for dlsym (newest first). */
typedef struct symbol_spec {
  size_t offset;
  const char *base;
  const char *export1;
  const char *export2;
} symbol_spec;

#define SYM(field, base, e1, e2) {offsetof(sf__driver, field), base, e1, e2}
static const symbol_spec kSymbols[] = {
    SYM(Init, "cuInit", "cuInit", NULL),
    SYM(DriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion", NULL),
    SYM(DeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", NULL),
    SYM(DeviceGet, "cuDeviceGet", "cuDeviceGet", NULL),
    SYM(DeviceGetName, "cuDeviceGetName", "cuDeviceGetName", NULL),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute",
        NULL),
    SYM(DeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2", NULL),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRetain", NULL),
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
    SYM(CtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", NULL),
    SYM(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", NULL),
    SYM(GetErrorName, "cuGetErrorName", "cuGetErrorName", NULL),
    SYM(GetErrorString, "cuGetErrorString", "cuGetErrorString", NULL),
    SYM(MemAlloc, "cuMemAlloc", "cuMemAlloc_v2", NULL),
    SYM(MemFree, "cuMemFree", "cuMemFree_v2", NULL),
    SYM(MemcpyHtoD, "cuMemcpyHtoD", "cuMemcpyHtoD_v2", NULL),
    SYM(MemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2", NULL),
    SYM(MemsetD8, "cuMemsetD8", "cuMemsetD8_v2", NULL),
    SYM(MemsetD8Async, "cuMemsetD8Async", "cuMemsetD8Async", NULL),
    SYM(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", NULL),
    SYM(ModuleUnload, "cuModuleUnload", "cuModuleUnload", NULL),
    SYM(ModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction",
        NULL),
    SYM(ModuleGetGlobal, "cuModuleGetGlobal", "cuModuleGetGlobal_v2", NULL),
    SYM(TensorMapEncodeTiled, "cuTensorMapEncodeTiled", "cuTensorMapEncodeTiled",
        NULL),
    SYM(FuncGetAttribute, "cuFuncGetAttribute", "cuFuncGetAttribute", NULL),
    SYM(FuncSetAttribute, "cuFuncSetAttribute", "cuFuncSetAttribute", NULL),
    SYM(LaunchKernel, "cuLaunchKernel", "cuLaunchKernel", NULL),
    SYM(LaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx", NULL),
    SYM(StreamCreate, "cuStreamCreate", "cuStreamCreate", NULL),
    SYM(StreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2",
        "cuStreamDestroy"),
    SYM(StreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize",
        NULL),
    SYM(EventCreate, "cuEventCreate", "cuEventCreate", NULL),
    SYM(EventDestroy, "cuEventDestroy", "cuEventDestroy_v2", "cuEventDestroy"),
    SYM(EventRecord, "cuEventRecord", "cuEventRecord", NULL),
    SYM(EventSynchronize, "cuEventSynchronize", "cuEventSynchronize", NULL),
    /* CUDA 12.8 added _v2 (same signature); CUDA 13 headers only name it. */
    SYM(EventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime_v2",
        "cuEventElapsedTime"),
    SYM(StreamBeginCapture, "cuStreamBeginCapture", "cuStreamBeginCapture_v2",
        NULL),
    SYM(StreamEndCapture, "cuStreamEndCapture", "cuStreamEndCapture", NULL),
    SYM(GraphInstantiate, "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithFlags", NULL),
    SYM(GraphLaunch, "cuGraphLaunch", "cuGraphLaunch", NULL),
    SYM(GraphExecDestroy, "cuGraphExecDestroy", "cuGraphExecDestroy", NULL),
    SYM(GraphDestroy, "cuGraphDestroy", "cuGraphDestroy", NULL),
};
#undef SYM

/* cuGetProcAddress: _v2 (CUDA 12.5+) reports a per-symbol status; the
 * first version does not. */
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);

/* Process-wide state: the library handle and table once loaded, and
 * cuInit's result.  A failed dlopen is not remembered (a later call tries
 * again); a loaded library and cuInit's result are. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_handle = NULL;
static sf__driver g_driver;
static int g_inited = 0;
static CUresult g_init_result = CUDA_SUCCESS;

static void *lookup(void *handle, get_proc_v2_fn gp2, get_proc_v1_fn gp1,
                    const symbol_spec *s) {
  void *fn = NULL;
  if (gp2) {
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (gp2(s->base, &fn, SF_DRIVER_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
            &q) == CUDA_SUCCESS &&
        q == CU_GET_PROC_ADDRESS_SUCCESS && fn)
      return fn;
    fn = NULL;
  } else if (gp1) {
    if (gp1(s->base, &fn, SF_DRIVER_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT) ==
            CUDA_SUCCESS &&
        fn)
      return fn;
    fn = NULL;
  }
  if (s->export1 && (fn = dlsym(handle, s->export1))) return fn;
  if (s->export2 && (fn = dlsym(handle, s->export2))) return fn;
  return NULL;
}

/* Opens libcuda and fills g_driver.  Called with g_lock held. */
static sf_status load_locked(char *msg) {
  const char *path = getenv("SF_CUDA_DRIVER");
  if (!path || !*path) path = "libcuda.so.1";
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    snprintf(msg, SF_MSG_MAX, "no CUDA driver found: %s",
             why ? why : path);
    return SF_ERR_NO_DRIVER;
  }
  get_proc_v2_fn gp2 = (get_proc_v2_fn)dlsym(h, "cuGetProcAddress_v2");
  get_proc_v1_fn gp1 =
      gp2 ? NULL : (get_proc_v1_fn)dlsym(h, "cuGetProcAddress");
  sf__driver d;
  memset(&d, 0, sizeof d);
  for (size_t i = 0; i < sizeof kSymbols / sizeof kSymbols[0]; i++) {
    void *fn = lookup(h, gp2, gp1, &kSymbols[i]);
    if (!fn) {
      snprintf(msg, SF_MSG_MAX,
               "no CUDA driver found: %s lacks %s (driver too old?)", path,
               kSymbols[i].base);
      dlclose(h);
      return SF_ERR_NO_DRIVER;
    }
    memcpy((char *)&d + kSymbols[i].offset, &fn, sizeof fn);
  }
  g_driver = d;
  g_handle = h;
  return SF_OK;
}

sf_status sf__driver_get(const sf__driver **out, char *msg,
                         CUresult *init_result) {
  sf_status st = SF_OK;
  *out = NULL;
  if (init_result) *init_result = CUDA_SUCCESS;
  pthread_mutex_lock(&g_lock);
  if (!g_handle) st = load_locked(msg);
  if (st == SF_OK && !g_inited) {
    g_init_result = g_driver.Init(0);
    g_inited = 1;
  }
  CUresult ir = g_inited ? g_init_result : CUDA_SUCCESS;
  pthread_mutex_unlock(&g_lock);
  if (st != SF_OK) return st;
  if (ir != CUDA_SUCCESS) {
    char what[512];
    sf__cu_describe(&g_driver, ir, what, sizeof what);
    snprintf(msg, SF_MSG_MAX, "no CUDA device: cuInit failed with %s", what);
    if (init_result) *init_result = ir;
    return SF_ERR_NO_DEVICE;
  }
  *out = &g_driver;
  return SF_OK;
}

void sf__cu_describe(const sf__driver *drv, CUresult r, char *buf,
                     size_t size) {
  const char *name = NULL, *text = NULL;
  if (drv && drv->GetErrorName && drv->GetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  if (drv && drv->GetErrorString &&
      drv->GetErrorString(r, &text) != CUDA_SUCCESS)
    text = NULL;
  if (name && text)
    snprintf(buf, size, "%s (%s)", name, text);
  else if (name)
    snprintf(buf, size, "%s", name);
  else
    snprintf(buf, size, "CUDA error %d", (int)r);
}

int sf__cu_is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
      return 1;
    default:
      return 0;
  }
}
