// out (cols x rows) = in (rows x cols)^T, row-major, for the feature-major
// route of sparseforge.torch (X transposed before a feature-major kernel, Y
// after it).  One block a 64 x 64 tile through shared memory: its warps read
// the tile's rows and write the output's rows, 64 consecutive elements a
// warp row (whole 32-byte sectors both ways).  Edges are masked; no
// alignment is assumed.  Element sizes 2 and 4 (fp16/bf16, fp32): only the
// bits move.
//
// On sm_90 the module declares sf_pdl (programmatic dependent launch, as
// the layers' kernels do): a block waits for the stream's previous work
// before it reads or writes anything, and lets the next kernel (the
// feature-major layer, whose weights do not depend on this one) start once
// its tile is read.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
extern "C" __device__ const int sf_pdl = 1;
#define SF_GRIDDEP_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#define SF_GRIDDEP_LAUNCH() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#else
#define SF_GRIDDEP_WAIT()
#define SF_GRIDDEP_LAUNCH()
#endif

#define SF_TILE 64
#define SF_ROWS 16  // block (32, 16): each thread moves two columns x four rows

template <typename T>
__device__ __forceinline__ void sf_transpose(const T *__restrict__ in, T *__restrict__ out,
                                             int rows, int cols) {
  // rows an odd number of 4-byte words apart: no bank conflicts either way
  __shared__ T tile[SF_TILE][SF_TILE + 4 / sizeof(T)];
  const int c0 = blockIdx.x * SF_TILE, r0 = blockIdx.y * SF_TILE;
  const int tx = threadIdx.x, ty = threadIdx.y;
  SF_GRIDDEP_WAIT();
#pragma unroll
  for (int i = 0; i < SF_TILE; i += SF_ROWS) {
    const int r = r0 + ty + i;
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const int c = c0 + tx + 32 * j;
      if (r < rows && c < cols) tile[ty + i][tx + 32 * j] = in[(size_t)r * cols + c];
    }
  }
  __syncthreads();
  SF_GRIDDEP_LAUNCH();
#pragma unroll
  for (int i = 0; i < SF_TILE; i += SF_ROWS) {
    const int c = c0 + ty + i;  // the output's row
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const int r = r0 + tx + 32 * j;
      if (c < cols && r < rows) out[(size_t)c * rows + r] = tile[tx + 32 * j][ty + i];
    }
  }
}

extern "C" __global__ void __launch_bounds__(32 * SF_ROWS)
    sf_transpose_2(const unsigned short *in, unsigned short *out, int rows, int cols) {
  sf_transpose(in, out, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * SF_ROWS)
    sf_transpose_4(const unsigned int *in, unsigned int *out, int rows, int cols) {
  sf_transpose(in, out, rows, cols);
}
