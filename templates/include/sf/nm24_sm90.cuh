// nm24_sm90.cuh -- the sm_90a path of the 2:4 family: Hopper's sparse
// warpgroup MMA, wgmma.mma_async.sp m64nNk32 (fp16 or bf16 in, fp32
// accumulate), operands in shared memory.
//
// Each warpgroup owns a 64 x WG_N tile of Y (WG_N = BN / WN); a CTA is WM x
// WN warpgroups.  Per stage of BK dense columns of K it issues BK / 32
// sparse wgmma, A = the compressed weights (64 x 16 values per 32 columns)
// and B = the X tile, with each warp's metadata register read from shared
// memory.
//
// W arrives compressed and pre-shuffled by generator/families/nm24 so that
// every copy is a contiguous run:
//   values: for each 64-row tile `t` and 32-wide K step `s`, 2048 bytes at
//           ((t * KSTEPS + s) * 2048): the 64 x 16 compressed values in the
//           no-swizzle ("interleaved") K-major layout of a wgmma operand,
//           value (r, c) at 256 * (r / 8) + 128 * (c / 8) + 16 * (r % 8) +
//           2 * (c % 8), so the descriptor's LBO is 128 and its SBO 256.
//   meta:   as for mma.sp (sf/nm24.cuh): per 16-row tile and step, 64
//           bytes; warp w of a warpgroup reads the tile of its 16 rows (the
//           metadata of sparse wgmma is mma.sp m16n8k32's, per warp).
//   bias:   fp32, padded to MP rows.
//
// The X tile (B) is stored as wgmma's canonical 128-byte-swizzled layout:
//   feature-major (X is K x N, B is MN-major): columns of 64-wide atoms,
//     each BK rows of 128 bytes; chunk (k, c) of 8 columns at
//     (c / 8) * BK * 8 + k * 8 + ((c % 8) ^ (k % 8)) (16-byte units);
//   token-major (X is N x K, B is K-major): BK / 64 atoms along K, each BN
//     rows (tokens) of 128 bytes; chunk (n, c) of 8 K columns at
//     (c / 8) * BN * 8 + n * 8 + ((c % 8) ^ (n % 8)).
//
// The pipeline is the row-group wgmma path's: STAGES-2 stages in flight
// ahead of the one computed, one wgmma group running behind the one issued
// (so the stage refilled is two behind), every thread copying with
// cp.async, one barrier per stage.  The metadata registers of a stage live
// until its wgmma group is known done (two stages on), so that no later
// load reuses them while the tensor cores may still read them.
//
// The epilogue (scale, bias, activation, 16-byte stores through a shared
// tile) is the mma.sp path's store_tile: a warp's part of the accumulator
// is one 16 x WG_N slice, laid out as mma.sync m16n8 fragments.
#pragma once

#include "sf/mma_sm90.cuh"
#include "sf/nm24.cuh"

namespace sf {
namespace nm24 {

constexpr int WG_A_BYTES = 2048;  // compressed A of one (64-row tile, K step)

// ---- configuration -----------------------------------------------------------------
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, bool TM_>
struct WgConfig {
  static constexpr int BM = BM_;          // rows of W (and Y) per CTA: 64 x WM
  static constexpr int BN = BN_;          // columns of Y (tokens) per CTA
  static constexpr int BK = BK_;          // dense K per pipeline stage
  static constexpr int WM = WM_;          // warpgroups along M
  static constexpr int WN = WN_;          // warpgroups along N
  static constexpr int STAGES = STAGES_;  // pipeline depth
  static constexpr bool TOKEN_MAJOR = TM_;

  static constexpr int WG_N = BN / WN;    // the N of each warpgroup's wgmma
  static constexpr int THREADS = 128 * WM * WN;
  static constexpr int KSTEPS = BK / KSTEP;
  static constexpr int MTILES = BM / 16;

  // One stage: the X tile first (1024-byte aligned for the swizzle), then
  // the compressed weights, then the metadata.
  static constexpr int B_BYTES = BK * BN * 2;
  static constexpr int A_BYTES = (BM / 64) * KSTEPS * WG_A_BYTES;
  static constexpr int E_BYTES = MTILES * KSTEPS * META_BYTES;
  // whole kilobytes, so that every stage's X tile stays 1024-byte aligned
  static constexpr int STAGE_BYTES = (B_BYTES + A_BYTES + E_BYTES + 1023) / 1024 * 1024;

  // store_tile's view: one warp owns 16 rows x WG_N columns as WG_N / 8
  // m16n8 fragments.
  static constexpr int MI = 1;
  static constexpr int NI = WG_N / 8;
  static constexpr int WTM = 16;
  static constexpr int WTN = WG_N;
  __device__ __forceinline__ static int row_of(int warp_m, int mi) { return warp_m * 16; }
  static constexpr int C_ROWS = TOKEN_MAJOR ? BN : BM;
  static constexpr int C_COLS = TOKEN_MAJOR ? BM : BN;
  static constexpr int C_LD = C_COLS + 8;
  static constexpr int C_BYTES = C_ROWS * C_LD * 2;
  // 1 KB of slack: the kernel rounds the shared base up to 1024 bytes
  static constexpr int SMEM_BYTES = cmax(STAGES * STAGE_BYTES, C_BYTES) + 1024;

  // The configuration's constraints are asserted by the generated source,
  // from the table the search space filters with
  // (generator/families/nm24/__init__.py).
};

// ---- the X tile ----------------------------------------------------------------------
// 16-byte chunk index of (row, chunk) in the swizzled tile: feature-major
// rows are k (ROWS = BK) and chunks run along N; token-major rows are n
// (ROWS = BN) and chunks run along K.
template <int ROWS>
__device__ __forceinline__ int atom_chunk(int row, int c) {
  return (c >> 3) * (ROWS * 8) + row * 8 + ((c & 7) ^ (row & 7));
}

// Feature-major X (K x N): rows k0 .. k0 + BK - 1, columns n0 .. n0 + BN -
// 1.  VEC (N % 8 == 0): 16-byte cp.async with zero fill past K and N; else
// element loads, zero-filled, stored with st.shared (made visible to the
// tensor cores by the caller's proxy fence).
template <class C, class P, bool VEC>
__device__ __forceinline__ void wg_load_b_fm(unsigned sB, const unsigned short *X, int k0,
                                             int n0, int N, int tid) {
  constexpr int CPR = C::BN / 8;
  constexpr int COUNT = C::BK * CPR;
  static_assert(COUNT % C::THREADS == 0 && C::THREADS % CPR == 0,
                "threads must cover whole rows of the X tile");
  constexpr int ROWS_PER_IT = C::THREADS / CPR;
  const int row0 = tid / CPR, c = tid % CPR;
  const int gn = n0 + c * 8;
#pragma unroll
  for (int it = 0; it < COUNT / C::THREADS; ++it) {
    const int row = row0 + it * ROWS_PER_IT;
    const int gk = k0 + row;
    const unsigned dst = sB + atom_chunk<C::BK>(row, c) * 16;
    if constexpr (VEC) {
      const bool ok = gk < P::K && gn < N;
      sm80::cp_async_16(dst, ok ? X + (size_t)gk * N + gn : X, ok);
    } else {
      unsigned w[4];
      load8_bounded(X, gk, gn, P::K, N, w);
      sts128(dst, w[0], w[1], w[2], w[3]);
    }
  }
}

// Token-major X (N x K): rows n0 .. n0 + BN - 1, columns k0 .. k0 + BK - 1.
// 16-byte cp.async when K % 8 == 0 (known when generating), else element
// loads.
template <class C, class P>
__device__ __forceinline__ void wg_load_b_tm(unsigned sB, const unsigned short *X, int k0,
                                             int n0, int N, int tid) {
  constexpr int CPR = C::BK / 8;
  constexpr int COUNT = C::BN * CPR;
  static_assert(COUNT % C::THREADS == 0 && C::THREADS % CPR == 0,
                "threads must cover whole rows of the X tile");
  constexpr int ROWS_PER_IT = C::THREADS / CPR;
  const int row0 = tid / CPR, c = tid % CPR;
  const int gk = k0 + c * 8;
#pragma unroll
  for (int it = 0; it < COUNT / C::THREADS; ++it) {
    const int row = row0 + it * ROWS_PER_IT;
    const int gn = n0 + row;
    const unsigned dst = sB + atom_chunk<C::BN>(row, c) * 16;
    if constexpr (P::K % 8 == 0) {
      const bool ok = gn < N && gk < P::K;
      sm80::cp_async_16(dst, ok ? X + (size_t)gn * P::K + gk : X, ok);
    } else {
      unsigned w[4];
      load8_bounded(X, gn, gk, N, P::K, w);
      sts128(dst, w[0], w[1], w[2], w[3]);
    }
  }
}

// The compressed weights and metadata of one stage: 64-row tiles t0 ..
// t0 + BM/64 - 1 and 16-row tiles 4 t0 .., steps s0 .. s0 + KSTEPS - 1;
// each tile's run is contiguous.  No guards (the plan padded M and K).
template <class C, class P>
__device__ __forceinline__ void wg_load_a(unsigned sA, unsigned sE, const unsigned char *packed,
                                          int t0, int s0, int tid) {
  constexpr int VCH = C::KSTEPS * WG_A_BYTES / 16;  // 16-byte chunks per 64-row tile
  constexpr int VCOUNT = (C::BM / 64) * VCH;
  const unsigned char *gv = packed + P::VALUES_OFFSET;
#pragma unroll
  for (int it = 0; it < (VCOUNT + C::THREADS - 1) / C::THREADS; ++it) {
    const int i = it * C::THREADS + tid;
    if (VCOUNT % C::THREADS == 0 || i < VCOUNT) {
      const int t = i / VCH, c = i % VCH;
      sm80::cp_async_16(sA + i * 16,
                        gv + ((size_t)(t0 + t) * P::KSTEPS + s0) * WG_A_BYTES + (size_t)c * 16,
                        true);
    }
  }
  constexpr int ECH = C::KSTEPS * META_BYTES / 16;  // per 16-row tile
  constexpr int ECOUNT = C::MTILES * ECH;
  const unsigned char *ge = packed + P::META_OFFSET;
  const int mt0 = t0 * 4;
#pragma unroll
  for (int it = 0; it < (ECOUNT + C::THREADS - 1) / C::THREADS; ++it) {
    const int i = it * C::THREADS + tid;
    if (ECOUNT % C::THREADS == 0 || i < ECOUNT) {
      const int mt = i / ECH, c = i % ECH;
      sm80::cp_async_16(sE + i * 16,
                        ge + ((size_t)(mt0 + mt) * P::KSTEPS + s0) * META_BYTES + (size_t)c * 16,
                        true);
    }
  }
}

// ---- compute -------------------------------------------------------------------------
// This warp's metadata registers for one stage: one word per pair of steps
// (lanes t < 2 hold the even step, selector 0; lanes t >= 2 the odd one,
// selector 1), or one word for a single step.
template <class C>
constexpr int META_REGS = C::KSTEPS == 1 ? 1 : C::KSTEPS / 2;

template <class C>
__device__ __forceinline__ void wg_load_meta(unsigned (&e)[META_REGS<C>], unsigned sE, int mt,
                                             int lane) {
  const int g = lane >> 2, t = lane & 3;
  if constexpr (C::KSTEPS == 1) {
    e[0] = lds32(sE + mt * META_BYTES + (g * 2 + (t & 1)) * 4);
  } else {
#pragma unroll
    for (int p = 0; p < C::KSTEPS / 2; ++p)
      e[p] = lds32(sE + (mt * C::KSTEPS + 2 * p) * META_BYTES +
                   ((t >> 1) * 16 + g * 2 + (t & 1)) * 4);
  }
}

// acc (this warpgroup's 64 x WG_N tile) += A . B over one stage: KSTEPS
// sparse wgmma in one committed group.  The caller waits for it.
template <class C, typename T>
__device__ __forceinline__ void wg_compute_stage(float (&acc)[C::WG_N / 8][4], unsigned sA,
                                                 unsigned sB, const unsigned (&e)[META_REGS<C>],
                                                 int wg_m, int wg_n) {
  const unsigned a0 = sA + wg_m * C::KSTEPS * WG_A_BYTES;
  sm90::fence();
#pragma unroll
  for (int s = 0; s < C::KSTEPS; ++s) {
    const unsigned long long da =
        sm90::make_desc(a0 + s * WG_A_BYTES, 128, 256, sm90::SWIZZLE_NONE);
    if constexpr (C::TOKEN_MAJOR) {
      // K-major rows of 128 bytes (64 K values): step s is 64 bytes into atom s / 2
      const unsigned b = sB + (s >> 1) * C::BN * 128 + wg_n * C::WG_N * 128 + (s & 1) * 64;
      const unsigned long long db = sm90::make_desc(b, 16, 1024, sm90::SWIZZLE_128B);
      if (C::KSTEPS == 1 || (s & 1) == 0)
        sm90::mma_sp<T, C::WG_N, 0, 0>(acc, da, db, e[s >> 1]);
      else
        sm90::mma_sp<T, C::WG_N, 1, 0>(acc, da, db, e[s >> 1]);
    } else {
      // MN-major atoms of 64 columns; step s is 32 rows of 128 bytes on
      const unsigned b = sB + wg_n * (C::WG_N / 64) * C::BK * 128 + s * KSTEP * 128;
      const unsigned long long db = sm90::make_desc(b, C::BK * 128, 1024, sm90::SWIZZLE_128B);
      if (C::KSTEPS == 1 || (s & 1) == 0)
        sm90::mma_sp<T, C::WG_N, 0, 1>(acc, da, db, e[s >> 1]);
      else
        sm90::mma_sp<T, C::WG_N, 1, 1>(acc, da, db, e[s >> 1]);
    }
  }
  sm90::commit_group();
}

// Keeps registers live (and in place) up to this point: the tensor cores
// may still read them.
template <int R>
__device__ __forceinline__ void keep(unsigned (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i]));
}

// ---- kernel body ------------------------------------------------------------------------
// C: WgConfig; P: the problem (as for gemm_body); T: __half or
// __nv_bfloat16; VEC_FM: feature-major X rows are 16-byte aligned (N % 8
// == 0).  Grid: x = N tiles, y = M tiles.
template <class C, class P, typename T, bool VEC_FM>
__device__ __forceinline__ void wg_gemm_body(const unsigned char *__restrict__ packed,
                                             const unsigned short *__restrict__ X,
                                             unsigned short *__restrict__ Y, int N) {
  static_assert(P::MP % C::BM == 0 && P::KP % C::BK == 0, "plan must pad M and K to the tile");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char *smem = smem_raw + ((1024u - (sm80::smem_addr(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;
  const int wg_m = wg % C::WM, wg_n = wg / C::WM;
  const int mt = wg_m * 4 + (warp & 3);  // this warp's 16-row tile within the CTA
  const int n0 = blockIdx.x * C::BN, m0 = blockIdx.y * C::BM;
  const unsigned s0 = sm80::smem_addr(smem);
  constexpr int KT = P::KP / C::BK;
  constexpr int S = C::STAGES;
  constexpr int AHEAD = S - 2;

  auto stage_b = [&](int st) { return s0 + st * C::STAGE_BYTES; };
  auto stage_a = [&](int st) { return s0 + st * C::STAGE_BYTES + C::B_BYTES; };
  auto stage_e = [&](int st) { return s0 + st * C::STAGE_BYTES + C::B_BYTES + C::A_BYTES; };
  auto load_stage = [&](int st, int kt) {
    wg_load_a<C, P>(stage_a(st), stage_e(st), packed, m0 / 64, kt * C::KSTEPS, tid);
    if constexpr (C::TOKEN_MAJOR)
      wg_load_b_tm<C, P>(stage_b(st), X, kt * C::BK, n0, N, tid);
    else
      wg_load_b_fm<C, P, VEC_FM>(stage_b(st), X, kt * C::BK, n0, N, tid);
  };

  float acc[1][C::WG_N / 8][4];  // store_tile's shape: one m16 row of fragments
#pragma unroll
  for (int j = 0; j < C::WG_N / 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[0][j][r] = 0.0f;

#pragma unroll
  for (int st = 0; st < AHEAD; ++st) {
    if (st < KT) load_stage(st, st);
    sm80::cp_async_commit();
  }
  // One iteration per stage; the metadata of even stages in e0, of odd
  // ones in e1 (an array indexed at run time would live in local memory).
  unsigned e0[META_REGS<C>], e1[META_REGS<C>];
  auto iteration = [&](int kt, unsigned(&e)[META_REGS<C>]) {
    sm80::cp_async_wait<AHEAD - 1>();
    sm90::fence_proxy_async();  // this thread's copies and stores -> the tensor cores' proxy
    sm90::wait_group<1>();      // this warpgroup's wgmma of stage kt-2 is done
    keep(e);                    // ... and with it the last use of e (stage kt-2's)
    __syncthreads();            // stage kt landed for everyone; stage kt-2's slot is free
    const int next = kt + AHEAD;
    if (next < KT) load_stage(next % S, next);
    sm80::cp_async_commit();
    const int st = kt % S;
    wg_load_meta<C>(e, stage_e(st), mt, lane);
    wg_compute_stage<C, T>(acc[0], stage_a(st), stage_b(st), e, wg_m, wg_n);
  };
  int kt = 0;
  for (; kt + 1 < KT; kt += 2) {
    iteration(kt, e0);
    iteration(kt + 1, e1);
  }
  if (kt < KT) iteration(kt, e0);
  sm90::wait_group<0>();
  keep(e0);
  keep(e1);
  sm80::cp_async_wait<0>();
  __syncthreads();
  store_tile<C, P, T>(smem, acc, packed, Y, m0, n0, N, mt, wg_n, lane, tid);
}

// The kernel: picks the feature-major load path once per launch.
template <class C, class P, typename T>
__device__ __forceinline__ void wg_gemm(const unsigned char *__restrict__ packed,
                                        const void *__restrict__ Xv, void *__restrict__ Yv,
                                        int N) {
  const unsigned short *X = static_cast<const unsigned short *>(Xv);
  unsigned short *Y = static_cast<unsigned short *>(Yv);
  if constexpr (C::TOKEN_MAJOR) {
    wg_gemm_body<C, P, T, true>(packed, X, Y, N);
  } else {
    if ((N & 7) == 0)
      wg_gemm_body<C, P, T, true>(packed, X, Y, N);
    else
      wg_gemm_body<C, P, T, false>(packed, X, Y, N);
  }
}

}  // namespace nm24
}  // namespace sf
