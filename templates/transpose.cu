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

// ---- RMSNorm writing X^T (sm_90: a cluster of 8 blocks) ------------------
// xt (k x n) = norm(x)^T for the graph pass (_passes.py), where a norm's
// output is read only by feature-major layers: x (n x k, token-major) is
// a, or a + yt^T (the residual sum with a feature-major layer's Y^T, k x
// n, rounded to the element type as the model's sum is; written to h, n x
// k, where h is given).  norm(x) = round(round(x r) w) (FLAG_ROUND_FIRST:
// `(x.float() * r).to(dtype) * w`) or round(x r w), r = rsqrt(mean(x^2) +
// eps) a token, in fp32.  A cluster takes 8 tokens; each of its 8 blocks
// a slice of the features (k <= 8 * SF_NORM_SLICE), sums their squares,
// and reads the others' sums through distributed shared memory.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SF_NORM_CTAS 8
#define SF_NORM_T 8
#define SF_NORM_SLICE 1024
#define SF_NORM_THREADS 256
#define SF_NORM_BF16 1
#define SF_NORM_ROUND_FIRST 2

__device__ __forceinline__ float sf_to_f(unsigned short v, bool bf) {
  float f;
  if (bf) {
    f = __int_as_float(static_cast<int>(v) << 16);
  } else {
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(v));
  }
  return f;
}

__device__ __forceinline__ unsigned short sf_from_f(float f, bool bf) {
  unsigned short v;
  if (bf) {
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(v) : "f"(f));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(v) : "f"(f));
  }
  return v;
}

__device__ __forceinline__ void sf_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// part[i] of block `rank` of the cluster
__device__ __forceinline__ float sf_remote(const float *part, int rank) {
  unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(part)), remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// A thread's share of a block's elements, loaded all at once before any
// is used (the loads of one thread overlap: a loop that used each load
// before the next waited a round trip to memory an element).
#define SF_NORM_PER (SF_NORM_T * SF_NORM_SLICE / SF_NORM_THREADS)

extern "C" __global__ void __cluster_dims__(SF_NORM_CTAS, 1, 1) __launch_bounds__(SF_NORM_THREADS)
    sf_rmsnorm_t_2(const unsigned short *__restrict__ a, const unsigned short *__restrict__ yt,
                   const unsigned short *__restrict__ w, unsigned short *__restrict__ h,
                   unsigned short *__restrict__ xt, int n, int k, float eps, int flags) {
  // the block's tokens by features, rows an odd number of words apart
  __shared__ unsigned short hs[SF_NORM_T][SF_NORM_SLICE + 2];
  __shared__ unsigned short ws[SF_NORM_SLICE];
  __shared__ float part[SF_NORM_T], rstd[SF_NORM_T];
  const bool bf = flags & SF_NORM_BF16;
  const int slice = ((k + SF_NORM_CTAS - 1) / SF_NORM_CTAS + 7) & ~7;
  const int f0 = blockIdx.x * slice, nf = max(0, min(k, f0 + slice) - f0);
  const int t0 = blockIdx.y * SF_NORM_T, nt = min(SF_NORM_T, n - t0);
  const int tid = threadIdx.x, total = nt * nf;
  unsigned short r[SF_NORM_PER];
  for (int f = tid; f < nf; f += SF_NORM_THREADS) ws[f] = w[f0 + f];   // (a constant operand)
  SF_GRIDDEP_WAIT();
#pragma unroll
  for (int j = 0; j < SF_NORM_PER; ++j) {   // x, along features
    const int i = tid + j * SF_NORM_THREADS, t = i / max(nf, 1), f = i - t * nf;
    if (i < total) r[j] = a[(size_t)(t0 + t) * k + f0 + f];
  }
#pragma unroll
  for (int j = 0; j < SF_NORM_PER; ++j) {
    const int i = tid + j * SF_NORM_THREADS, t = i / max(nf, 1), f = i - t * nf;
    if (i < total) hs[t][f] = r[j];
  }
  __syncthreads();
  if (yt != nullptr) {   // + Y^T, along tokens
#pragma unroll
    for (int j = 0; j < SF_NORM_PER; ++j) {
      const int i = tid + j * SF_NORM_THREADS, f = i / max(nt, 1), t = i - f * nt;
      if (i < total) r[j] = yt[(size_t)(f0 + f) * n + t0 + t];
    }
#pragma unroll
    for (int j = 0; j < SF_NORM_PER; ++j) {
      const int i = tid + j * SF_NORM_THREADS, f = i / max(nt, 1), t = i - f * nt;
      if (i < total) hs[t][f] = sf_from_f(sf_to_f(hs[t][f], bf) + sf_to_f(r[j], bf), bf);
    }
    __syncthreads();
  }
  SF_GRIDDEP_LAUNCH();
  {  // the slice's sums of squares: 32 lanes (a warp) a token
    const int t = tid >> 5, l = tid & 31;
    float s = 0.0f;
    if (t < nt)
      for (int f = l; f < nf; f += 32) {
        const float v = sf_to_f(hs[t][f], bf);
        s = fmaf(v, v, s);
      }
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (l == 0) part[t] = s;
  }
  sf_cluster_sync();  // every block's sums are written
  if (tid < SF_NORM_T) {
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < SF_NORM_CTAS; ++q) s += sf_remote(&part[tid], q);
    rstd[tid] = rsqrtf(s / static_cast<float>(k) + eps);
  }
  sf_cluster_sync();  // no block leaves while another reads its sums; rstd is seen
  const bool round_first = flags & SF_NORM_ROUND_FIRST;
  for (int i = tid; i < total; i += SF_NORM_THREADS) {   // X^T, along tokens
    const int f = i / nt, t = i - f * nt;
    const float v = sf_to_f(hs[t][f], bf) * rstd[t], wf = sf_to_f(ws[f], bf);
    const float o = round_first ? sf_to_f(sf_from_f(v, bf), bf) * wf : v * wf;
    xt[(size_t)(f0 + f) * n + t0 + t] = sf_from_f(o, bf);
  }
  if (h != nullptr)
    for (int i = tid; i < total; i += SF_NORM_THREADS) {   // the sum, along features
      const int t = i / nf, f = i - t * nf;
      h[(size_t)(t0 + t) * k + f0 + f] = hs[t][f];
    }
}
#endif
