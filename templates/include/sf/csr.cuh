// csr.cuh -- unstructured sparse W (fp32, CSR) times dense X (fp32) on CUDA
// cores, specialized to one matrix in the manner of SparseRT: the generated
// source fixes M, K, the schedule (rows sorted by their nonzero count) and,
// depending on the configuration, where the index lists and values live:
//
//   TABLES_GLOBAL  packed CSR in the `packed` device buffer;
//   TABLES_CONST   index lists and values in __constant__ arrays of the
//                  generated source (small matrices);
//   TABLES_IMM     straight-line code: every nonzero is an immediate column
//                  and an immediate value in a switch over row slots.
//
// Work decomposition (both layouts): SPLIT warps compute one row of W for
// BN = 32 * VEC output columns (fm) or tokens (tm), each over a contiguous
// share of the row's nonzeros (split along K for long rows; the shares are
// added in shared memory).  A block holds ROWS consecutive row slots of the
// schedule, ROWS * SPLIT warps.  Grid: x = row blocks, y = tiles of N.
// Every row slot writes its row, so empty rows get epilogue(0) and nothing
// needs zeroing beforehand.
//
// Packed buffer (all sections 16-byte aligned, offsets baked in):
//   header int32[4]   {magic 'SFCS', M, K, nnz}
//   order  int32[M]   row slot -> original row (rows by nnz, descending)
//   ptr    int32[M+1] nonzero offsets, in slot order
//   col    int32[nnz] column of each nonzero, sorted within a row
//   val    fp32[nnz]  value of each nonzero
//   bias   fp32[M]    bias in ORIGINAL row order (only with a bias)
// The packed CSR is always present: TABLES_IMM falls back on it when the
// vector path does not apply (N not a multiple of VEC, or X / Y misaligned).
//
// Compiles under NVRTC with -I templates/include; no host headers.
#pragma once

#include "sf/common.cuh"

namespace sf {
namespace csr {

enum Layout { LAYOUT_FM = 0, LAYOUT_TM = 1 };
enum TableKind { TABLES_GLOBAL = 0, TABLES_CONST = 1, TABLES_IMM = 2 };

constexpr int WARP = 32;

// ---- configuration ------------------------------------------------------
// The generated source derives its Cfg from this and adds SCALE (a float
// cannot be a template parameter in C++17).
template <int M_, int K_, int NNZ_, int LAYOUT_, int TABLES_, int VEC_, int ROWS_,
          int SPLIT_, int UNROLL_, bool HAS_BIAS_, int ACT_, int RB_ = 0>
struct Config {
  static constexpr int M = M_;            // rows of W (and of Y, fm)
  static constexpr int K = K_;            // columns of W = rows of X (fm)
  static constexpr int NNZ = NNZ_;        // stored nonzeros
  static constexpr int LAYOUT = LAYOUT_;  // LAYOUT_FM or LAYOUT_TM
  static constexpr int TABLES = TABLES_;  // where the index lists live
  static constexpr int VEC = VEC_;        // columns (fm) / tokens (tm) per thread
  static constexpr int ROWS = ROWS_;      // row slots per block
  static constexpr int SPLIT = SPLIT_;    // warps per row (split along K)
  static constexpr int UNROLL = UNROLL_;  // nonzeros per step of the table loops
  static constexpr bool HAS_BIAS = HAS_BIAS_;
  static constexpr int ACT = ACT_;        // sf::Activation
  static constexpr int RB = RB_;          // tm: row groups a block over its staged X tile (0: none)
  static constexpr int WARPS = ROWS * SPLIT;
  static constexpr int THREADS = WARP * WARPS;
  static constexpr int BN = WARP * VEC;   // columns / tokens of one block
  // Blocks per SM the register allocation must allow: at least 1024
  // resident threads (64 registers a thread); 512 (128 registers) for the
  // straight-line code, whose loads ptxas hoists far ahead, and for 8
  // columns a thread (8 accumulators, 8 loaded values a nonzero in flight).
  // Without a bound ptxas may aim for full occupancy and spill.
  static constexpr int MIN_THREADS_PER_SM = TABLES_ == 2 || VEC_ == 8 ? 512 : 1024;
  static constexpr int MIN_BLOCKS = THREADS >= MIN_THREADS_PER_SM ? 1 : MIN_THREADS_PER_SM / THREADS;
  // Shared memory of the split reduction: (SPLIT - 1) x ROWS x VEC x 32.
  static constexpr int SMEM_FLOATS = (SPLIT - 1) * ROWS * VEC * WARP;
  // The staged X tile (RB > 0): K rows of BN tokens, XS_STRIDE floats apart
  // (an odd number of words for VEC 1, 2 mod 4 for VEC 2: the copy's
  // column writes spread over the banks, the rows' reads stay aligned).
  static constexpr int XS_STRIDE = BN + (VEC == 1 ? 1 : 2);
  static constexpr unsigned long long XS_BYTES = RB > 0 ? 4ull * K * XS_STRIDE : 0;

  // The configuration's constraints are asserted by the generated source,
  // from the table the search space filters with
  // (generator/families/csr/__init__.py).
  static_assert(ACT == ACT_NONE || ACT == ACT_RELU || ACT == ACT_GELU, "known activation");
};

// Byte offsets of the packed sections (baked in by the template).
template <unsigned long long ORDER_, unsigned long long PTR_, unsigned long long COL_,
          unsigned long long VAL_, unsigned long long BIAS_>
struct Offsets {
  static constexpr unsigned long long ORDER = ORDER_, PTR = PTR_, COL = COL_, VAL = VAL_,
                                      BIAS = BIAS_;
  static_assert(ORDER % 16 == 0 && PTR % 16 == 0 && COL % 16 == 0 && VAL % 16 == 0 &&
                    BIAS % 16 == 0,
                "packed sections are 16-byte aligned");
};

// ---- vector helpers ---------------------------------------------------------
template <int VEC> struct Vec;
template <> struct Vec<1> {
  using type = float;
  __device__ static void load(const float *p, float (&v)[1]) { v[0] = __ldg(p); }
  __device__ static void store(float *p, const float (&v)[1]) { *p = v[0]; }
};
template <> struct Vec<2> {
  using type = float2;
  __device__ static void load(const float *p, float (&v)[2]) {
    float2 t = __ldg(reinterpret_cast<const float2 *>(p));
    v[0] = t.x; v[1] = t.y;
  }
  __device__ static void store(float *p, const float (&v)[2]) {
    *reinterpret_cast<float2 *>(p) = make_float2(v[0], v[1]);
  }
};
template <> struct Vec<4> {
  using type = float4;
  __device__ static void load(const float *p, float (&v)[4]) {
    float4 t = __ldg(reinterpret_cast<const float4 *>(p));
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
  }
  __device__ static void store(float *p, const float (&v)[4]) {
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
};
template <> struct Vec<8> {  // two float4: the shuffles and address of a nonzero serve 8 columns
  __device__ static void load(const float *p, float (&v)[8]) {
    const float4 t = __ldg(reinterpret_cast<const float4 *>(p));
    const float4 u = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    v[4] = u.x; v[5] = u.y; v[6] = u.z; v[7] = u.w;
  }
  __device__ static void store(float *p, const float (&v)[8]) {
    reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
};

// ---- accumulators: acc(col, value) adds value * X[col, this thread's n] ----
// Feature-major: row `col` of X starts col * 4N bytes in, one 32 x 32 -> 64
// bit multiply-add (IMAD.WIDE.U32) off the thread's base.  4N fits 32 bits:
// the grid's N axis (at most 65535 tiles of at most 256 columns) bounds N.
// (A 64-bit `col * N` took seven instructions and a reload of N and X from
// the constant bank per nonzero.)
__device__ __forceinline__ const float *row_at(const char *base, int col, unsigned ldb) {
  return reinterpret_cast<const float *>(
      base + static_cast<unsigned long long>(static_cast<unsigned>(col)) * ldb);
}

// Vector path: VEC consecutive columns n0..n0+VEC-1 of X row `col`, one
// VEC-wide load.  Threads past N load column 0 (valid: N >= VEC) and store
// nothing.
template <int VEC> struct FmVecAcc {
  static constexpr bool WHOLE_CHUNKS = true;  // row_sum_staged: whole chunks unmasked
  const char *xp;       // X + n0 (or X for an idle thread)
  unsigned ldb;         // 4 N: a row of X in bytes
  float acc[VEC];
  __device__ FmVecAcc(const float *X, int N, int n0)
      : xp(reinterpret_cast<const char *>(X + (n0 < N ? n0 : 0))), ldb(4u * N) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
  }
  __device__ __forceinline__ void operator()(int col, float w) {
    float x[VEC];
    Vec<VEC>::load(row_at(xp, col, ldb), x);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = fmaf(w, x[i], acc[i]);
  }
};

// Feature-major, scalar path (any N and alignment): VEC scalar loads with
// the column clamped to N - 1.
template <int VEC> struct FmScalarAcc {
  static constexpr bool WHOLE_CHUNKS = false;  // (the rare path: one loop, no spills)
  const char *X;
  unsigned ldb;         // 4 N
  int nc[VEC];          // clamped columns
  float acc[VEC];
  __device__ FmScalarAcc(const float *X_, int N, int n0)
      : X(reinterpret_cast<const char *>(X_)), ldb(4u * N) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      nc[i] = min(n0 + i, N - 1);
      acc[i] = 0.0f;
    }
  }
  __device__ __forceinline__ void operator()(int col, float w) {
    const float *row = row_at(X, col, ldb);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = fmaf(w, __ldg(row + nc[i]), acc[i]);
  }
};

// Token-major: X is N x K; this thread's tokens are t0 + 32 i (i < VEC), so
// that the lanes of a warp read consecutive tokens.  Tokens past N are
// clamped to N - 1 for loading and not stored.
template <int K, int VEC> struct TmAcc {
  static constexpr bool WHOLE_CHUNKS = true;
  const float *xr[VEC];  // X row of each token
  float acc[VEC];
  __device__ TmAcc(const float *X, int N, int t0) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      xr[i] = X + static_cast<long long>(min(t0 + WARP * i, N - 1)) * K;
      acc[i] = 0.0f;
    }
  }
  __device__ __forceinline__ void operator()(int col, float w) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = fmaf(w, __ldg(xr[i] + col), acc[i]);
  }
};

// Token-major, X staged: the block's tokens' rows of X sit transposed in
// shared memory (xs[k * XS_STRIDE + t], t < BN), so a nonzero's column is
// one row of VEC-wide reads, as in feature-major.  This thread's tokens are
// t0 + lane * VEC + i.
template <int VEC, int STRIDE> struct TmStagedAcc {
  static constexpr bool WHOLE_CHUNKS = true;
  const char *xs;  // xs + lane * VEC, in bytes: a column's address is one multiply-add
  float acc[VEC];
  __device__ TmStagedAcc(const float *xs_, int lane)
      : xs(reinterpret_cast<const char *>(xs_ + lane * VEC)) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
  }
  __device__ __forceinline__ void operator()(int col, float w) {
    const float *p = reinterpret_cast<const float *>(xs + col * (4 * STRIDE));
    if (VEC == 2) {
      const float2 x = *reinterpret_cast<const float2 *>(p);
      acc[0] = fmaf(w, x.x, acc[0]);
      acc[VEC - 1] = fmaf(w, x.y, acc[VEC - 1]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = fmaf(w, p[i], acc[i]);
    }
  }
};

// ---- row sums over tables ------------------------------------------------------
// Global tables: the warp stages 32 nonzeros at a time (one coalesced load
// of columns and of values, a lane each) and broadcasts them by shuffle.
// All lanes run the loop together: `hi - lo` is uniform over the warp.
// Whole chunks of 32 run without the per-nonzero mask (Acc::WHOLE_CHUNKS:
// a row's last, partial chunk keeps it).
template <int UNROLL, class Acc>
__device__ __forceinline__ void row_sum_staged(const int *__restrict__ col,
                                               const float *__restrict__ val, int lo, int hi,
                                               int lane, Acc &acc) {
  constexpr unsigned FULL_MASK = 0xffffffffu;
  for (int base = lo; base < hi; base += WARP) {
    const int count = min(WARP, hi - base);
    const int my_col = lane < count ? __ldg(col + base + lane) : 0;
    const float my_val = lane < count ? __ldg(val + base + lane) : 0.0f;
    if (Acc::WHOLE_CHUNKS && count == WARP) {  // a whole chunk: no nonzero to mask off
#pragma unroll 1
      for (int j0 = 0; j0 < WARP; j0 += UNROLL) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          acc(__shfl_sync(FULL_MASK, my_col, j0 + u), __shfl_sync(FULL_MASK, my_val, j0 + u));
      }
      continue;
    }
    for (int j0 = 0; j0 < count; j0 += UNROLL) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int j = j0 + u;  // < 32: UNROLL divides 32
        const int c = __shfl_sync(FULL_MASK, my_col, j);
        const float w = __shfl_sync(FULL_MASK, my_val, j);
        if (j < count) acc(c, w);
      }
    }
  }
}

// Tables every lane reads at the same index (__constant__ arrays: the
// constant cache broadcasts one address to the warp).
template <int UNROLL, class Tab, class Acc>
__device__ __forceinline__ void row_sum_uniform(int lo, int hi, Acc &acc) {
  int j = lo;
  for (; j + UNROLL <= hi; j += UNROLL) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc(Tab::col(j + u), Tab::val(j + u));
  }
  for (; j < hi; ++j) acc(Tab::col(j), Tab::val(j));
}

// ---- schedules: slot -> (original row, sum over its nonzeros, bias) -----------
// Each provides
//   template <bool FAST, class Acc>
//   static int sum(packed, slot, part, lane, acc, bias)
// adding share `part` (of Cfg::SPLIT) of the row's nonzeros into acc and
// returning the original row; FAST selects the fast accumulator's code
// (for TABLES_IMM the immediates; the generic path otherwise).

// Share `part` of [lo, hi).
template <int SPLIT>
__device__ __forceinline__ void share(int &lo, int &hi, int part) {
  if (SPLIT == 1) return;
  const int len = hi - lo;
  const int a = lo + static_cast<int>((static_cast<long long>(len) * part) / SPLIT);
  hi = lo + static_cast<int>((static_cast<long long>(len) * (part + 1)) / SPLIT);
  lo = a;
}

template <class Cfg, class Off>
__device__ __forceinline__ float packed_bias(const unsigned char *packed, int row) {
  return Cfg::HAS_BIAS ? __ldg(section<float>(packed, Off::BIAS) + row) : 0.0f;
}

// Packed CSR in global memory.
template <class Cfg, class Off> struct GlobalSchedule {
  template <bool FAST, class Acc>
  __device__ static __forceinline__ int sum(const unsigned char *packed, int slot, int part,
                                            int lane, Acc &acc, float &bias) {
    const int row = __ldg(section<int>(packed, Off::ORDER) + slot);
    const int *ptr = section<int>(packed, Off::PTR);
    int lo = __ldg(ptr + slot), hi = __ldg(ptr + slot + 1);
    share<Cfg::SPLIT>(lo, hi, part);
    row_sum_staged<Cfg::UNROLL>(section<int>(packed, Off::COL), section<float>(packed, Off::VAL),
                                lo, hi, lane, acc);
    bias = packed_bias<Cfg, Off>(packed, row);
    return row;
  }
};

// __constant__ tables.  Tab (generated) provides static order(s), ptr(s),
// col(j), val(j).
template <class Cfg, class Off, class Tab> struct ConstSchedule {
  template <bool FAST, class Acc>
  __device__ static __forceinline__ int sum(const unsigned char *packed, int slot, int part,
                                            int lane, Acc &acc, float &bias) {
    const int row = Tab::order(slot);
    int lo = Tab::ptr(slot), hi = Tab::ptr(slot + 1);
    share<Cfg::SPLIT>(lo, hi, part);
    row_sum_uniform<Cfg::UNROLL, Tab>(lo, hi, acc);
    bias = packed_bias<Cfg, Off>(packed, row);
    return row;
  }
};

// Immediates.  Imm (generated) provides
//   template <class Acc> static int rows(int piece, Acc &acc, float &bias)
// a switch over pieces (piece = slot * SPLIT + part: share `part` of the
// row in slot `slot`) whose cases are straight-line sums.  The generic path
// (FAST = false) reads the packed CSR instead, so the straight-line code is
// instantiated once.
template <class Cfg, class Off, class Imm> struct ImmSchedule {
  template <bool FAST, class Acc>
  __device__ static __forceinline__ int sum(const unsigned char *packed, int slot, int part,
                                            int lane, Acc &acc, float &bias) {
    if (FAST) return Imm::rows(slot * Cfg::SPLIT + part, acc, bias);
    return GlobalSchedule<Cfg, Off>::template sum<false>(packed, slot, part, lane, acc, bias);
  }
};

// ---- stores -----------------------------------------------------------------
template <class Cfg>
__device__ __forceinline__ float finish(float acc, float bias) {
  return epilogue<Cfg::HAS_BIAS, Cfg::ACT>(acc, Cfg::SCALE, bias);
}

template <class Cfg>
__device__ __forceinline__ void store_fm_vec(float *Y, int N, int row, int n0,
                                             const float (&acc)[Cfg::VEC], float bias) {
  if (n0 >= N) return;
  float y[Cfg::VEC];
#pragma unroll
  for (int i = 0; i < Cfg::VEC; ++i) y[i] = finish<Cfg>(acc[i], bias);
  Vec<Cfg::VEC>::store(Y + static_cast<long long>(row) * N + n0, y);
}

template <class Cfg>
__device__ __forceinline__ void store_fm_scalar(float *Y, int N, int row, int n0,
                                                const float (&acc)[Cfg::VEC], float bias) {
  float *yr = Y + static_cast<long long>(row) * N;
#pragma unroll
  for (int i = 0; i < Cfg::VEC; ++i)
    if (n0 + i < N) yr[n0 + i] = finish<Cfg>(acc[i], bias);
}

// Token-major: a lane's tokens t0 + STEP i (STEP: WARP as the lanes read
// X, 1 from a staged tile).
template <class Cfg, int STEP = WARP>
__device__ __forceinline__ void store_tm(float *Y, int N, int row, int t0,
                                         const float (&acc)[Cfg::VEC], float bias) {
#pragma unroll
  for (int i = 0; i < Cfg::VEC; ++i) {
    const int t = t0 + STEP * i;
    if (t < N) Y[static_cast<long long>(t) * Cfg::M + row] = finish<Cfg>(acc[i], bias);
  }
}

// ---- split reduction -----------------------------------------------------------
// Warps with part > 0 leave their partial sums in shared memory; part 0
// adds them.  Every warp of the block calls it (it synchronizes the block).
template <class Cfg>
__device__ __forceinline__ void reduce_split(float *smem, int part, int r, int lane,
                                             float (&acc)[Cfg::VEC]) {
  if (Cfg::SPLIT == 1) return;
  // layout [part - 1][r][i][lane]: conflict-free
  if (part > 0) {
#pragma unroll
    for (int i = 0; i < Cfg::VEC; ++i)
      smem[(((part - 1) * Cfg::ROWS + r) * Cfg::VEC + i) * WARP + lane] = acc[i];
  }
  __syncthreads();
  if (part == 0) {
#pragma unroll
    for (int p = 1; p < Cfg::SPLIT; ++p)
#pragma unroll
      for (int i = 0; i < Cfg::VEC; ++i)
        acc[i] += smem[(((p - 1) * Cfg::ROWS + r) * Cfg::VEC + i) * WARP + lane];
  }
}

// ---- kernel bodies ----------------------------------------------------------
template <int VEC>
__device__ __forceinline__ bool vector_ok(const void *X, const void *Y, int N) {
  if (VEC == 1) return true;
  const unsigned long long a = reinterpret_cast<unsigned long long>(X) |
                               reinterpret_cast<unsigned long long>(Y);
  return N % VEC == 0 && a % (VEC >= 4 ? 16 : 4 * VEC) == 0;  // (vec 8: two 16-byte loads)
}

// Where a warp works: row slot, share of the row, lane.
template <class Cfg> struct WarpPlace {
  int r, part, slot, lane;
  bool live;  // the slot exists (whole warps agree)
  __device__ WarpPlace() {
    const int w = threadIdx.x / WARP;
    lane = threadIdx.x % WARP;
    r = w % Cfg::ROWS;
    part = w / Cfg::ROWS;
    slot = blockIdx.x * Cfg::ROWS + r;
    live = slot < Cfg::M;
  }
};

// One row slot's sum with accumulator Acc, reduced over the split; true
// for the warp that stores.
template <class Cfg, class Schedule, bool FAST, class Acc>
__device__ __forceinline__ bool row_result(const unsigned char *packed, float *smem,
                                           const WarpPlace<Cfg> &at, Acc &acc, int &row,
                                           float &bias) {
  if (at.live) row = Schedule::template sum<FAST>(packed, at.slot, at.part, at.lane, acc, bias);
  reduce_split<Cfg>(smem, at.part, at.r, at.lane, acc.acc);
  return at.live && at.part == 0;
}

// Y (M x N) = epilogue(W X), X K x N.
template <class Cfg, class Schedule>
__device__ __forceinline__ void spmm_fm(const unsigned char *__restrict__ packed,
                                        const float *__restrict__ X, float *__restrict__ Y,
                                        int N, float *smem) {
  const WarpPlace<Cfg> at;
  if (Cfg::SPLIT == 1 && !at.live) return;  // whole warps leave
  const int n0 = blockIdx.y * Cfg::BN + at.lane * Cfg::VEC;
  float bias = 0.0f;
  int row = 0;
  if (vector_ok<Cfg::VEC>(X, Y, N)) {  // uniform over the grid
    FmVecAcc<Cfg::VEC> acc(X, N, n0);
    if (row_result<Cfg, Schedule, true>(packed, smem, at, acc, row, bias))
      store_fm_vec<Cfg>(Y, N, row, n0, acc.acc, bias);
  } else {
    FmScalarAcc<Cfg::VEC> acc(X, N, n0);
    if (row_result<Cfg, Schedule, false>(packed, smem, at, acc, row, bias))
      store_fm_scalar<Cfg>(Y, N, row, n0, acc.acc, bias);
  }
}

// Y (N x M) = epilogue(X W^T), X N x K.
template <class Cfg, class Schedule>
__device__ __forceinline__ void spmm_tm(const unsigned char *__restrict__ packed,
                                        const float *__restrict__ X, float *__restrict__ Y,
                                        int N, float *smem) {
  const WarpPlace<Cfg> at;
  if (Cfg::SPLIT == 1 && !at.live) return;
  const int t0 = blockIdx.y * Cfg::BN + at.lane;
  float bias = 0.0f;
  int row = 0;
  TmAcc<Cfg::K, Cfg::VEC> acc(X, N, t0);
  if (row_result<Cfg, Schedule, true>(packed, smem, at, acc, row, bias))
    store_tm<Cfg>(Y, N, row, t0, acc.acc, bias);
}

// Token-major with X staged (Cfg::RB > 0): the block copies X[t0 .. t0 + BN)
// (all K columns; tokens past N clamped to N - 1) into xs transposed, then
// its warps run RB groups of ROWS row slots over it: slot (blockIdx.x * RB
// + g) * ROWS + r.  Stores as spmm_tm's (lane i's tokens t0 + lane * VEC
// + i).
template <class Cfg>
__device__ __forceinline__ void stage_x(const float *__restrict__ X, int N, int t0, float *xs) {
  // A warp moves 4 tokens x 32 columns a step: lane = 4 * (column quad) +
  // token, so it reads 128 contiguous bytes of each of 4 rows of X (16 bytes
  // a lane) and each of its four shared stores hits 32 distinct banks (XS
  // row stride 33 words; 2-way for vec 2's 66); 8 steps in flight a
  // thread.  Where K is not a multiple of 32 or X is not 16-byte aligned,
  // one column at a time (consecutive threads, consecutive columns).
  constexpr int S = Cfg::XS_STRIDE;
  if (Cfg::K % 32 == 0 && reinterpret_cast<unsigned long long>(X) % 16 == 0) {
    constexpr int KQ8 = Cfg::K / 32, TOTAL = Cfg::K / 4 * Cfg::BN;
    const int lane = threadIdx.x % WARP;
    const int kq_lo = lane / 4, t_lo = lane % 4;
#pragma unroll 8
    for (int i = threadIdx.x; i < TOTAL; i += Cfg::THREADS) {
      const int step = i / WARP;                  // (token quad, column octet of quads)
      const int t = step / KQ8 * 4 + t_lo;
      const int k = ((step % KQ8) * 8 + kq_lo) * 4;
      const int token = min(t0 + t, N - 1);
      const float4 v =
          __ldg(reinterpret_cast<const float4 *>(X + static_cast<long long>(token) * Cfg::K + k));
      xs[k * S + t] = v.x;
      xs[(k + 1) * S + t] = v.y;
      xs[(k + 2) * S + t] = v.z;
      xs[(k + 3) * S + t] = v.w;
    }
  } else {
    constexpr int TOTAL = Cfg::K * Cfg::BN;
#pragma unroll 4
    for (int i = threadIdx.x; i < TOTAL; i += Cfg::THREADS) {
      const int t = i / Cfg::K, k = i - t * Cfg::K;
      const int token = min(t0 + t, N - 1);
      xs[k * S + t] = __ldg(X + static_cast<long long>(token) * Cfg::K + k);
    }
  }
}

template <class Cfg, class Schedule>
__device__ __forceinline__ void spmm_tm_staged(const unsigned char *__restrict__ packed,
                                               const float *__restrict__ X,
                                               float *__restrict__ Y, int N, float *smem,
                                               float *xs) {
  const int t_block = blockIdx.y * Cfg::BN;
  stage_x<Cfg>(X, N, t_block, xs);
  __syncthreads();
  const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  const int r = w % Cfg::ROWS, part = w / Cfg::ROWS;
  const int t0 = t_block + lane * Cfg::VEC;
#pragma unroll 1
  for (int g = 0; g < Cfg::RB; ++g) {
    const int slot = (blockIdx.x * Cfg::RB + g) * Cfg::ROWS + r;
    if ((blockIdx.x * Cfg::RB + g) * Cfg::ROWS >= Cfg::M) break;  // uniform over the block
    const bool live = slot < Cfg::M;
    TmStagedAcc<Cfg::VEC, Cfg::XS_STRIDE> acc(xs, lane);
    float bias = 0.0f;
    int row = 0;
    if (live) row = Schedule::template sum<true>(packed, slot, part, lane, acc, bias);
    reduce_split<Cfg>(smem, part, r, lane, acc.acc);
    if (live && part == 0) store_tm<Cfg, 1>(Y, N, row, t0, acc.acc, bias);  // a lane's tokens are consecutive
    if (Cfg::SPLIT > 1) __syncthreads();  // the split's shared memory is reused by g + 1
  }
}

template <class Cfg, class Schedule>
__device__ __forceinline__ void spmm(const unsigned char *__restrict__ packed, const void *X,
                                     void *Y, int N) {
  if (N <= 0) return;
  __shared__ float smem[Cfg::SMEM_FLOATS > 0 ? Cfg::SMEM_FLOATS : 1];
  if (Cfg::LAYOUT == LAYOUT_FM) {
    spmm_fm<Cfg, Schedule>(packed, static_cast<const float *>(X), static_cast<float *>(Y), N,
                           smem);
  } else if (Cfg::RB > 0) {
    extern __shared__ __align__(16) float xs[];
    spmm_tm_staged<Cfg, Schedule>(packed, static_cast<const float *>(X),
                                  static_cast<float *>(Y), N, smem, xs);
  } else {
    spmm_tm<Cfg, Schedule>(packed, static_cast<const float *>(X), static_cast<float *>(Y), N,
                           smem);
  }
}

}  // namespace csr
}  // namespace sf
