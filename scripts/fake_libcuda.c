// A stand-in for libcuda.so.1, for scripts/mosaic_ptxas.py: just enough driver for the CUDA PJRT
// plugin's MosaicGpuCompile to learn the compute capability it compiles for (FAKE_CUDA_CC, e.g.
// 90 -> sm_90a; default 90). Loading a module fails: by then the PTX has been printed.
//
//     cc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o libcuda.so.1 fake_libcuda.c
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_SUPPORTED = 801 };
enum { CC_MAJOR = 75, CC_MINOR = 76 };   // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}

static int compute_capability(void) {
  const char *s = getenv("FAKE_CUDA_CC");
  return s ? atoi(s) : 90;
}

CUresult cuInit(unsigned flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { (void)ordinal; *d = 0; return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x1; return CUDA_SUCCESS; }

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  (void)d;
  *v = attr == CC_MAJOR ? compute_capability() / 10
     : attr == CC_MINOR ? compute_capability() % 10 : 0;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char **s) {
  (void)e; *s = "fake libcuda.so.1 (scripts/fake_libcuda.c): not a driver"; return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
  (void)e; *s = "CUDA_ERROR_NOT_SUPPORTED"; return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(void **m, const void *image) {
  (void)m; (void)image; return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  (void)f; (void)m; (void)name; return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuModuleUnload(void *m) { (void)m; return CUDA_SUCCESS; }
