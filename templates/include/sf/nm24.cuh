// nm24.cuh -- 2:4 semi-structured sparse W (M x K) times dense X on Sparse
// Tensor Cores: mma.sp::ordered_metadata m16n8k32, fp16 or bf16 in, fp32
// accumulate (sm_80 and later).
//
// W arrives compressed and pre-shuffled by generator/families/nm24.py, so
// that every load the kernel makes is contiguous:
//   values: for each 16-row tile `mt` and each 32-wide dense K step `s`,
//           512 bytes at ((mt * KSTEPS + s) * 512); lane L's 16 bytes at
//           L * 16 are exactly its four A registers for that mma.sp.
//   meta:   for each (mt, s), 64 bytes at ((mt * KSTEPS + s) * 64): word
//           g * 2 + h is the metadata register of lane 4g + h (g = groupID,
//           h = 0, 1; sparsity selector 0).  For two consecutive steps the
//           128 bytes hold both, so that with BK = 64 one word per lane
//           serves both steps: lanes 4g+0/1 read step 2p (selector 0),
//           lanes 4g+2/3 read step 2p+1 (selector 1).
//   bias:   fp32, padded to MP rows.
// Each metadata word: bits [4j, 4j+4) = row g, chunk (4h + j) of the step;
// bits [16 + 4j, 20 + 4j) = row g + 8, same chunk; a chunk's nibble is
// idx0 | idx1 << 2 with idx0 < idx1 (ordered metadata).
//
// Pieces, in the order the kernel calls them: Config (every constraint),
// load_a (compressed tile -> shared, cp.async), load_b_fm / load_b_tm (dense
// X tile -> shared, cp.async with zero fill or a scalar residue path),
// compute_stage (ldmatrix + mma.sp), store_tile (epilogue through shared
// memory, 16-byte stores), gemm_body() (the pipeline) and gemm(), which picks
// the load path once per launch.
#pragma once

#include "sf/common.cuh"
#include "sf/mma_sm80.cuh"

namespace sf {
namespace nm24 {

constexpr int KSTEP = 32;        // dense K of one mma.sp m16n8k32
constexpr int FRAG_BYTES = 512;  // compressed A of one (16-row tile, step)
constexpr int META_BYTES = 64;   // metadata of one (16-row tile, step)

__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

// ---- configuration ----------------------------------------------------------
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, bool TM_>
struct Config {
  static constexpr int BM = BM_;          // rows of W (and Y) per CTA
  static constexpr int BN = BN_;          // columns of Y (tokens) per CTA
  static constexpr int BK = BK_;          // dense K per pipeline stage
  static constexpr int WM = WM_;          // warps along M
  static constexpr int WN = WN_;          // warps along N
  static constexpr int STAGES = STAGES_;  // cp.async pipeline depth
  static constexpr bool TOKEN_MAJOR = TM_;  // X is N x K, Y is N x M

  static constexpr int WARPS = WM * WN;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int WTM = BM / WM;     // warp tile rows
  static constexpr int WTN = BN / WN;     // warp tile columns
  static constexpr int MI = WTM / 16;     // m16 tiles per warp
  static constexpr int NI = WTN / 8;      // n8 tiles per warp
  static constexpr int KSTEPS = BK / KSTEP;
  static constexpr int MTILES = BM / 16;

  // One stage of shared memory: compressed A, metadata, dense B tile.
  static constexpr int A_BYTES = MTILES * KSTEPS * FRAG_BYTES;
  static constexpr int E_BYTES = MTILES * KSTEPS * META_BYTES;
  static constexpr int B_BYTES = BK * BN * 2;
  static constexpr int STAGE_BYTES = A_BYTES + E_BYTES + B_BYTES;
  // B tile as rows of 16-byte chunks: feature-major rows are k (BN / 8
  // chunks), token-major rows are n (BK / 8 chunks).  Swizzled (b_chunk).
  static constexpr int B_CPR = TOKEN_MAJOR ? BK / 8 : BN / 8;
  // Output tile staged in shared memory after the main loop (padded rows):
  // [BM][BN] feature-major, [BN][BM] token-major.
  static constexpr int C_ROWS = TOKEN_MAJOR ? BN : BM;
  static constexpr int C_COLS = TOKEN_MAJOR ? BM : BN;
  static constexpr int C_LD = C_COLS + 8;
  static constexpr int C_BYTES = C_ROWS * C_LD * 2;
  static constexpr int SMEM_BYTES = cmax(STAGES * STAGE_BYTES, C_BYTES);
  // the first row of warp `warp_m`'s m16 tile `mi` in the CTA tile
  __device__ __forceinline__ static int row_of(int warp_m, int mi) { return warp_m * WTM + mi * 16; }

  // The configuration's constraints are asserted by the generated source,
  // from the table the search space filters with
  // (generator/families/nm24/__init__.py).
};

// ---- PTX wrappers (the sm_80 ones shared with the row-group kernel) ---------------
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::ldmatrix_x4;
using sm80::ldmatrix_x4_trans;
using sm80::smem_addr;

__device__ __forceinline__ void lds128(unsigned (&r)[4], unsigned addr) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ unsigned lds32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(unsigned addr, unsigned a, unsigned b, unsigned c,
                                       unsigned d) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d));
}

// D += A(2:4, 16x32) * B(32x8); SEL picks the thread pair holding metadata.
template <typename T, int SEL>
__device__ __forceinline__ void mma_sp(float (&d)[4], const unsigned (&a)[4],
                                       const unsigned (&b)[4], unsigned e);

template <>
__device__ __forceinline__ void mma_sp<__half, 0>(float (&d)[4], const unsigned (&a)[4],
                                                  const unsigned (&b)[4], unsigned e) {
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]),
        "r"(e));
}
template <>
__device__ __forceinline__ void mma_sp<__half, 1>(float (&d)[4], const unsigned (&a)[4],
                                                  const unsigned (&b)[4], unsigned e) {
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]),
        "r"(e));
}
template <>
__device__ __forceinline__ void mma_sp<__nv_bfloat16, 0>(float (&d)[4], const unsigned (&a)[4],
                                                         const unsigned (&b)[4], unsigned e) {
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]),
        "r"(e));
}
template <>
__device__ __forceinline__ void mma_sp<__nv_bfloat16, 1>(float (&d)[4], const unsigned (&a)[4],
                                                         const unsigned (&b)[4], unsigned e) {
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]),
        "r"(e));
}

// ---- shared-memory layout of the B tile -------------------------------------
// Chunk `c` (16 bytes) of row `row`, XOR-swizzled so that the 8 rows one
// ldmatrix phase reads (and the 8 chunks one cp.async phase writes) fall in
// 8 different bank groups.
template <int CPR>
__device__ __forceinline__ int b_chunk(int row, int c) {
  if constexpr (CPR >= 8) {
    return row * CPR + (c ^ (row & 7));
  } else {  // 4 chunks a row: two rows share a 128-byte line
    return row * CPR + (c ^ ((row >> 1) & 3));
  }
}

// ---- loaders ---------------------------------------------------------------------
// Compressed A and metadata of one stage: tiles mt0 .. mt0 + MTILES - 1,
// steps s0 .. s0 + KSTEPS - 1.  Contiguous per 16-row tile, no guards (the
// plan padded M and K).
template <class C, class P>
__device__ __forceinline__ void load_a(unsigned sA, unsigned sE, const unsigned char *packed,
                                       int mt0, int s0, int tid) {
  constexpr int VCH = C::KSTEPS * FRAG_BYTES / 16;  // 16-byte chunks per tile
  constexpr int VCOUNT = C::MTILES * VCH;
  const unsigned char *gv = packed + P::VALUES_OFFSET;
#pragma unroll
  for (int it = 0; it < (VCOUNT + C::THREADS - 1) / C::THREADS; ++it) {
    const int i = it * C::THREADS + tid;
    if (VCOUNT % C::THREADS == 0 || i < VCOUNT) {
      const int mt = i / VCH, c = i % VCH;
      const unsigned char *src =
          gv + ((size_t)(mt0 + mt) * P::KSTEPS + s0) * FRAG_BYTES + (size_t)c * 16;
      sm80::cp_async_16(sA + i * 16, src, true);
    }
  }
  constexpr int ECH = C::KSTEPS * META_BYTES / 16;
  constexpr int ECOUNT = C::MTILES * ECH;
  const unsigned char *ge = packed + P::META_OFFSET;
#pragma unroll
  for (int it = 0; it < (ECOUNT + C::THREADS - 1) / C::THREADS; ++it) {
    const int i = it * C::THREADS + tid;
    if (ECOUNT % C::THREADS == 0 || i < ECOUNT) {
      const int mt = i / ECH, c = i % ECH;
      const unsigned char *src =
          ge + ((size_t)(mt0 + mt) * P::KSTEPS + s0) * META_BYTES + (size_t)c * 16;
      sm80::cp_async_16(sE + i * 16, src, true);
    }
  }
}

// Feature-major X (K x N): rows k0 .. k0 + BK - 1, columns n0 .. n0 + BN - 1.
// VEC (N % 8 == 0, chosen once per launch): 16-byte cp.async, zero fill past
// K and N; otherwise a scalar path that zero-fills element by element.
template <class C, class P, bool VEC>
__device__ __forceinline__ void load_b_fm(unsigned sB, const unsigned short *X, int k0, int n0,
                                          int N, int tid) {
  constexpr int CPR = C::B_CPR;
  constexpr int COUNT = C::BK * CPR;
  constexpr int ITERS = (COUNT + C::THREADS - 1) / C::THREADS;
  if constexpr (VEC) {
    // THREADS is a multiple of CPR: each thread keeps its chunk column and
    // steps down ROWS_PER_IT rows per iteration.
    static_assert(C::THREADS % CPR == 0 && COUNT % C::THREADS == 0,
                  "threads must cover whole B rows");
    constexpr int ROWS_PER_IT = C::THREADS / CPR;
    const int row0 = tid / CPR, c = tid % CPR;
    const int gn = n0 + c * 8;
    const unsigned short *src = X + (size_t)(k0 + row0) * N + gn;
    const size_t step = (size_t)ROWS_PER_IT * N;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int row = row0 + it * ROWS_PER_IT;
      const bool ok = k0 + row < P::K && gn < N;
      sm80::cp_async_16(sB + b_chunk<CPR>(row, c) * 16, ok ? src : X, ok);
      src += step;
    }
  } else {
#pragma unroll 1
    for (int i = tid; i < COUNT; i += C::THREADS) {
      const int row = i / CPR, c = i % CPR;
      const int gk = k0 + row, gn = n0 + c * 8;
      unsigned w[4];
      load8_bounded(X, gk, gn, P::K, N, w);
      sts128(sB + b_chunk<CPR>(row, c) * 16, w[0], w[1], w[2], w[3]);
    }
  }
}

// Token-major X (N x K): rows n0 .. n0 + BN - 1, columns k0 .. k0 + BK - 1.
// 16-byte cp.async when K % 8 == 0 (known when generating), else scalar.
template <class C, class P>
__device__ __forceinline__ void load_b_tm(unsigned sB, const unsigned short *X, int k0, int n0,
                                          int N, int tid) {
  constexpr int CPR = C::B_CPR;
  constexpr int COUNT = C::BN * CPR;
  constexpr int ITERS = (COUNT + C::THREADS - 1) / C::THREADS;
  if constexpr (P::K % 8 == 0) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int i = it * C::THREADS + tid;
      if (COUNT % C::THREADS == 0 || i < COUNT) {
        const int row = i / CPR, c = i % CPR;
        const int gn = n0 + row, gk = k0 + c * 8;
        const bool ok = gn < N && gk < P::K;
        const unsigned short *src = ok ? X + (size_t)gn * P::K + gk : X;
        sm80::cp_async_16(sB + b_chunk<CPR>(row, c) * 16, src, ok);
      }
    }
  } else {
#pragma unroll 1
    for (int i = tid; i < COUNT; i += C::THREADS) {
      const int row = i / CPR, c = i % CPR;
      const int gn = n0 + row, gk = k0 + c * 8;
      unsigned w[4];
      load8_bounded(X, gn, gk, N, P::K, w);
      sts128(sB + b_chunk<CPR>(row, c) * 16, w[0], w[1], w[2], w[3]);
    }
  }
}

// ---- compute ------------------------------------------------------------------
// One stage: KSTEPS mma.sp steps over the warp's MI x NI tiles.
template <class C, typename T>
__device__ __forceinline__ void compute_stage(unsigned sA, unsigned sE, unsigned sB,
                                              float (&acc)[C::MI][C::NI][4], int warp_m,
                                              int warp_n, int lane) {
  const int g = lane >> 2, t = lane & 3;
  unsigned e[C::MI];
  if constexpr (C::KSTEPS == 2) {
    // One word serves both steps: lanes t < 2 hold step 0 (selector 0),
    // lanes t >= 2 hold step 1 (selector 1).
#pragma unroll
    for (int mi = 0; mi < C::MI; ++mi) {
      const int mt = warp_m * C::MI + mi;
      e[mi] = lds32(sE + mt * 2 * META_BYTES + ((t >> 1) * 16 + g * 2 + (t & 1)) * 4);
    }
  }
#pragma unroll
  for (int s = 0; s < C::KSTEPS; ++s) {
    unsigned a[C::MI][4];
#pragma unroll
    for (int mi = 0; mi < C::MI; ++mi) {
      const int mt = warp_m * C::MI + mi;
      lds128(a[mi], sA + (mt * C::KSTEPS + s) * FRAG_BYTES + lane * 16);
      if constexpr (C::KSTEPS == 1) e[mi] = lds32(sE + mt * META_BYTES + (g * 2 + (t & 1)) * 4);
    }
#pragma unroll
    for (int ni = 0; ni < C::NI; ++ni) {
      const int n = warp_n * C::WTN + ni * 8;
      unsigned b[4];
      if constexpr (C::TOKEN_MAJOR) {
        // Four 8x8 matrices: rows n .. n+7, k chunks 4s .. 4s+3.
        ldmatrix_x4(b, sB + b_chunk<C::B_CPR>(n + (lane & 7), s * 4 + (lane >> 3)) * 16);
      } else {
        // Four 8x8 matrices: k rows 32s + 8j .. +7, n chunk n / 8; transposed.
        ldmatrix_x4_trans(b, sB + b_chunk<C::B_CPR>(s * KSTEP + lane, n >> 3) * 16);
      }
#pragma unroll
      for (int mi = 0; mi < C::MI; ++mi) {
        if (C::KSTEPS == 2 && s == 1)
          mma_sp<T, 1>(acc[mi][ni], a[mi], b, e[mi]);
        else
          mma_sp<T, 0>(acc[mi][ni], a[mi], b, e[mi]);
      }
    }
  }
}

// ---- epilogue and store -------------------------------------------------------
// The barrier between writing the staged tile and reading it back: the
// whole CTA, or (warp-specialized kernels) the threads that store.
struct CtaSync {
  __device__ __forceinline__ static void sync() { __syncthreads(); }
};

// Element (row r, column c) of a staged tile: rows C::C_LD apart, or (SW
// = 128 or 64) as a tensor map's box of rows of SW bytes lands, swizzled
// to the row (the 16-byte chunks of row r permuted by r % 8, or by (r / 2)
// % 4).
template <class C, int SW>
__device__ __forceinline__ int staged_at(int r, int c) {
  if constexpr (SW == 128)
    return r * 64 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7);
  else if constexpr (SW == 64)
    return r * 32 + (((c >> 3) ^ ((r >> 1) & 3)) << 3) + (c & 7);
  else
    return r * C::C_LD + c;
}

// acc -> act(scale * acc + bias) -> T, staged in shared memory (rows m in
// feature-major, n in token-major, laid out by staged_at).  Warp (warp_m,
// warp_n)'s fragment row mi starts at row C::row_of(warp_m, mi) of the
// tile.  (NI0, NACC: the tile's fragments are acc[.][NI0 .. NI0 + C::NI -
// 1] of a wider accumulator, one slice of it.)
template <class C, class P, typename T, int NI0 = 0, int NACC = C::NI, int SW = 0>
__device__ __forceinline__ void stage_tile(unsigned char *smem, float (&acc)[C::MI][NACC][4],
                                           const unsigned char *packed, int m0, int warp_m,
                                           int warp_n, int lane) {
  const int g = lane >> 2, t = lane & 3;
  unsigned short *sc = reinterpret_cast<unsigned short *>(smem);
  const float *bias = section<float>(packed, P::BIAS_OFFSET);
#pragma unroll
  for (int mi = 0; mi < C::MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int ml = C::row_of(warp_m, mi) + g + half * 8;
      const float bv = P::HAS_BIAS ? bias[m0 + ml] : 0.0f;
#pragma unroll
      for (int ni = 0; ni < C::NI; ++ni) {
        const int nl = warp_n * C::WTN + ni * 8 + 2 * t;
        const unsigned pair = sm80::epilogue_pair<T, P::HAS_BIAS, P::ACT>(  // GELU: alternate pipes
            acc[mi][NI0 + ni][half * 2 + 0], acc[mi][NI0 + ni][half * 2 + 1], P::SCALE, bv,
            (ni & 1) != 0);
        if constexpr (C::TOKEN_MAJOR) {
          sc[staged_at<C, SW>(nl, ml)] = static_cast<unsigned short>(pair & 0xffffu);
          sc[staged_at<C, SW>(nl + 1, ml)] = static_cast<unsigned short>(pair >> 16);
        } else {
          *reinterpret_cast<unsigned *>(sc + staged_at<C, SW>(ml, nl)) = pair;
        }
      }
    }
  }
}

// The staged tile -> Y by C::THREADS threads (tid < C::THREADS): 16-byte
// stores where the row alignment allows, else element by element.
template <class C, class P, int UNROLL = 4>
__device__ __forceinline__ void copy_tile(const unsigned char *smem, unsigned short *Y, int m0,
                                          int n0, int N, int tid) {
  const unsigned short *sc = reinterpret_cast<const unsigned short *>(smem);
  // Rows of the staged tile: m (fm) or n (tm); 8-element chunks along them.
  constexpr int CPR = C::C_COLS / 8;
  constexpr int COUNT = C::C_ROWS * CPR;
  const int rows_valid = C::TOKEN_MAJOR ? N - n0 : P::M - m0;
  const int cols_valid = C::TOKEN_MAJOR ? P::M - m0 : N - n0;
  const size_t ld = C::TOKEN_MAJOR ? (size_t)P::M : (size_t)N;
  const bool vec = C::TOKEN_MAJOR ? (P::M % 8 == 0) : (N % 8 == 0);
  unsigned short *ybase =
      Y + (C::TOKEN_MAJOR ? (size_t)n0 * P::M + m0 : (size_t)m0 * N + n0);
#pragma unroll UNROLL
  for (int it = 0; it < (COUNT + C::THREADS - 1) / C::THREADS; ++it) {
    const int i = it * C::THREADS + tid;
    if (COUNT % C::THREADS == 0 || i < COUNT) {
      const int row = i / CPR, c = i % CPR;
      if (row < rows_valid) {
        const unsigned short *src = sc + row * C::C_LD + c * 8;
        unsigned short *dst = ybase + (size_t)row * ld + c * 8;
        if (vec && c * 8 + 8 <= cols_valid) {
          *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (c * 8 + j < cols_valid) dst[j] = src[j];
        }
      }
    }
  }
}

// acc -> the staged tile -> Y (stage_tile, the barrier, copy_tile).
template <class C, class P, typename T, class Sync = CtaSync>
__device__ __forceinline__ void store_tile(unsigned char *smem, float (&acc)[C::MI][C::NI][4],
                                           const unsigned char *packed, unsigned short *Y,
                                           int m0, int n0, int N, int warp_m, int warp_n,
                                           int lane, int tid) {
  stage_tile<C, P, T>(smem, acc, packed, m0, warp_m, warp_n, lane);
  Sync::sync();
  copy_tile<C, P>(smem, Y, m0, n0, N, tid);
}

// ---- kernel body --------------------------------------------------------------
// C: Config; P: the problem (M, K, padded sizes, section offsets, epilogue);
// T: __half or __nv_bfloat16; VEC_FM: feature-major X rows are 16-byte
// aligned (N % 8 == 0).  Grid: x = N tiles, y = M tiles.
template <class C, class P, typename T, bool VEC_FM>
__device__ __forceinline__ void gemm_body(const unsigned char *__restrict__ packed,
                                          const unsigned short *__restrict__ X,
                                          unsigned short *__restrict__ Y, int N) {
  static_assert(P::MP % C::BM == 0 && P::KP % C::BK == 0, "plan must pad M and K to the tile");
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / C::WN, warp_n = warp % C::WN;
  const int n0 = blockIdx.x * C::BN, m0 = blockIdx.y * C::BM;
  const int mt0 = m0 / 16;
  const unsigned s0 = smem_addr(smem);
  constexpr int KT = P::KP / C::BK;

  auto stage_a = [&](int st) { return s0 + st * C::STAGE_BYTES; };
  auto stage_e = [&](int st) { return s0 + st * C::STAGE_BYTES + C::A_BYTES; };
  auto stage_b = [&](int st) { return s0 + st * C::STAGE_BYTES + C::A_BYTES + C::E_BYTES; };
  auto load_stage = [&](int st, int kt) {
    load_a<C, P>(stage_a(st), stage_e(st), packed, mt0, kt * C::KSTEPS, tid);
    if constexpr (C::TOKEN_MAJOR)
      load_b_tm<C, P>(stage_b(st), X, kt * C::BK, n0, N, tid);
    else
      load_b_fm<C, P, VEC_FM>(stage_b(st), X, kt * C::BK, n0, N, tid);
  };

  float acc[C::MI][C::NI][4];
#pragma unroll
  for (int mi = 0; mi < C::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < C::NI; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;

#pragma unroll
  for (int st = 0; st < C::STAGES - 1; ++st) {
    if (st < KT) load_stage(st, st);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<C::STAGES - 2>();
    __syncthreads();
    const int next = kt + C::STAGES - 1;
    if (next < KT) load_stage(next % C::STAGES, next);
    cp_async_commit();
    const int st = kt % C::STAGES;
    compute_stage<C, T>(stage_a(st), stage_e(st), stage_b(st), acc, warp_m, warp_n, lane);
  }
  cp_async_wait<0>();
  __syncthreads();
  store_tile<C, P, T>(smem, acc, packed, Y, m0, n0, N, warp_m, warp_n, lane, tid);
}

// The kernel: picks the feature-major load path once per launch (token-major
// decides it from K, known when generating).
template <class C, class P, typename T>
__device__ __forceinline__ void gemm(const unsigned char *__restrict__ packed,
                                     const void *__restrict__ Xv, void *__restrict__ Yv, int N) {
  const unsigned short *X = static_cast<const unsigned short *>(Xv);
  unsigned short *Y = static_cast<unsigned short *>(Yv);
  if constexpr (C::TOKEN_MAJOR) {
    gemm_body<C, P, T, true>(packed, X, Y, N);
  } else {
    if ((N & 7) == 0)
      gemm_body<C, P, T, true>(packed, X, Y, N);
    else
      gemm_body<C, P, T, false>(packed, X, Y, N);
  }
}

}  // namespace nm24
}  // namespace sf
