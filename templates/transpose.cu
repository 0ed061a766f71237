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
// its tile is read.  (Compiled amalgamated: generator/kernel.py, amalgamate.)

#include "sf/tma_sm90.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
SF_DECLARE_PDL();
#define SF_GRIDDEP_WAIT() sf::sm90::griddep_wait()
#define SF_GRIDDEP_LAUNCH() sf::sm90::griddep_launch_dependents()
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
// and pushes its sums into every block's shared memory (distributed
// shared memory): one cluster barrier after them, no remote read.
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

// *slot of block `rank` of the cluster = v
__device__ __forceinline__ void sf_push(float *slot, int rank, float v) {
  unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(slot)), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}

// x and h move as 16-byte pieces of a token's features (k % 8 == 0); Y^T
// and X^T as 16-byte pieces of a feature's 8 tokens where n % 8 == 0
// (SF_NORM_YVEC), else an element at a time.  A thread's loads are issued
// together before any is used (one round trip to memory).
#define SF_NORM_YVEC 4
#define SF_NORM_Q (SF_NORM_SLICE / SF_NORM_THREADS)          // features a thread
#define SF_NORM_V (SF_NORM_T * SF_NORM_SLICE / 8 / SF_NORM_THREADS)  // 16-byte pieces of x a thread

extern "C" __global__ void __cluster_dims__(SF_NORM_CTAS, 1, 1) __launch_bounds__(SF_NORM_THREADS)
    sf_rmsnorm_t_2(const unsigned short *__restrict__ a, const unsigned short *__restrict__ yt,
                   const unsigned short *__restrict__ w, unsigned short *__restrict__ h,
                   unsigned short *__restrict__ xt, int n, int k, float eps, int flags) {
  // x (then h) of the block's tokens by features; Y^T's 8 tokens a feature
  __shared__ __align__(16) unsigned short hs[SF_NORM_T][SF_NORM_SLICE + 8];
  __shared__ __align__(16) unsigned short ys[SF_NORM_SLICE][SF_NORM_T];
  __shared__ float wsum[SF_NORM_T][SF_NORM_THREADS / 32], part[SF_NORM_CTAS][SF_NORM_T],
      rstd[SF_NORM_T];
  const bool bf = flags & SF_NORM_BF16, yvec = flags & SF_NORM_YVEC;
  const int slice = ((k + SF_NORM_CTAS - 1) / SF_NORM_CTAS + 7) & ~7;
  const int f0 = blockIdx.x * slice, nf = max(0, min(k, f0 + slice) - f0), nv = nf / 8;
  const int t0 = blockIdx.y * SF_NORM_T, nt = min(SF_NORM_T, n - t0);
  const int tid = threadIdx.x;
  // every block of the cluster has started before any writes into another's
  // shared memory: arrive now, wait just before the sums are pushed
  sf::sm90::cluster_arrive_relaxed();
  unsigned short wr[SF_NORM_Q];
#pragma unroll
  for (int q = 0; q < SF_NORM_Q; ++q) {   // the weights: a constant operand
    const int f = tid + q * SF_NORM_THREADS;
    wr[q] = f < nf ? w[f0 + f] : 0;
  }
  SF_GRIDDEP_WAIT();
  uint4 xv[SF_NORM_V], yv[SF_NORM_Q];
#pragma unroll
  for (int j = 0; j < SF_NORM_V; ++j) {   // x: 16-byte pieces along a token's features
    const int v = tid + j * SF_NORM_THREADS, t = v / max(nv, 1), c = v - t * nv;
    if (t < nt)
      xv[j] = *reinterpret_cast<const uint4 *>(a + (size_t)(t0 + t) * k + f0 + 8 * c);
  }
  if (yt != nullptr) {
#pragma unroll
    for (int q = 0; q < SF_NORM_Q; ++q) {   // Y^T: a feature's 8 tokens
      const int f = tid + q * SF_NORM_THREADS;
      if (f >= nf) continue;
      const unsigned short *row = yt + (size_t)(f0 + f) * n + t0;
      if (yvec) {
        yv[q] = *reinterpret_cast<const uint4 *>(row);
      } else {
        unsigned short e[SF_NORM_T];
#pragma unroll
        for (int t = 0; t < SF_NORM_T; ++t) e[t] = t < nt ? row[t] : 0;
        yv[q] = make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16),
                           e[6] | (e[7] << 16));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < SF_NORM_V; ++j) {
    const int v = tid + j * SF_NORM_THREADS, t = v / max(nv, 1), c = v - t * nv;
    if (t < nt) *reinterpret_cast<uint4 *>(&hs[t][8 * c]) = xv[j];
  }
  if (yt != nullptr)
#pragma unroll
    for (int q = 0; q < SF_NORM_Q; ++q) {
      const int f = tid + q * SF_NORM_THREADS;
      if (f < nf) *reinterpret_cast<uint4 *>(&ys[f][0]) = yv[q];
    }
  __syncthreads();
  SF_GRIDDEP_LAUNCH();
  // h = x + Y (rounded, as the model's sum) and the slice's sums of squares
  float s[SF_NORM_T];
#pragma unroll
  for (int t = 0; t < SF_NORM_T; ++t) s[t] = 0.0f;
#pragma unroll
  for (int q = 0; q < SF_NORM_Q; ++q) {
    const int f = tid + q * SF_NORM_THREADS;
    if (f >= nf) continue;
#pragma unroll
    for (int t = 0; t < SF_NORM_T; ++t) {
      if (t >= nt) continue;
      float v = sf_to_f(hs[t][f], bf);
      if (yt != nullptr) {
        const unsigned short x16 = sf_from_f(v + sf_to_f(ys[f][t], bf), bf);
        hs[t][f] = x16;
        v = sf_to_f(x16, bf);
      }
      s[t] = fmaf(v, v, s[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < SF_NORM_T; ++t) {
#pragma unroll
    for (int o = 16; o; o >>= 1) s[t] += __shfl_xor_sync(0xffffffffu, s[t], o);
    if ((tid & 31) == 0) wsum[t][tid >> 5] = s[t];
  }
  __syncthreads();
  sf::sm90::cluster_wait();  // (the arrival at the start: every block has started)
  if (tid < SF_NORM_T) {   // the block's sums pushed into every block's part[rank]
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < SF_NORM_THREADS / 32; ++q) sum += wsum[tid][q];
#pragma unroll
    for (int q = 0; q < SF_NORM_CTAS; ++q) sf_push(&part[blockIdx.x][tid], q, sum);
  }
  sf::sm90::cluster_sync();  // every block's sums are in every block (no remote access after it)
  if (tid < SF_NORM_T) {
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < SF_NORM_CTAS; ++q) sum += part[q][tid];
    rstd[tid] = rsqrtf(sum / static_cast<float>(k) + eps);
  }
  __syncthreads();
  const bool round_first = flags & SF_NORM_ROUND_FIRST;
#pragma unroll
  for (int q = 0; q < SF_NORM_Q; ++q) {   // X^T: a feature's 8 tokens
    const int f = tid + q * SF_NORM_THREADS;
    if (f >= nf) continue;
    const float wf = sf_to_f(wr[q], bf);
    unsigned short e[SF_NORM_T];
#pragma unroll
    for (int t = 0; t < SF_NORM_T; ++t) {
      const float v = sf_to_f(hs[t][f], bf) * rstd[t];
      e[t] = sf_from_f(round_first ? sf_to_f(sf_from_f(v, bf), bf) * wf : v * wf, bf);
    }
    unsigned short *row = xt + (size_t)(f0 + f) * n + t0;
    if (yvec) {
      *reinterpret_cast<uint4 *>(row) = make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16),
                                                   e[4] | (e[5] << 16), e[6] | (e[7] << 16));
    } else {
#pragma unroll
      for (int t = 0; t < SF_NORM_T; ++t)
        if (t < nt) row[t] = e[t];
    }
  }
  if (h != nullptr)
#pragma unroll
    for (int j = 0; j < SF_NORM_V; ++j) {   // h: 16-byte pieces along a token's features
      const int v = tid + j * SF_NORM_THREADS, t = v / max(nv, 1), c = v - t * nv;
      if (t < nt)
        *reinterpret_cast<uint4 *>(h + (size_t)(t0 + t) * k + f0 + 8 * c) =
            *reinterpret_cast<const uint4 *>(&hs[t][8 * c]);
    }
}
#endif
