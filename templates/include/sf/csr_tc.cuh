// csr_tc.cuh -- unstructured sparse W (fp16 or bf16) times dense X on tensor
// cores, fp32 accumulation: "load as sparse, compute as dense".  W travels
// as tiled bitmaps in the order the mma fragments consume it and is decoded
// straight into A-fragment registers (no dense copy of W anywhere); X tiles
// are staged in shared memory by cp.async; mma.sync m16n8k16 (sm_80 and
// newer) or, WG, wgmma m64nBNk16 with A from registers (sm_90a).
// Feature-major (X is K x N, Y is M x N) or token-major (X is N x K, Y is
// N x M), row-major.  The plan is generator/families/csr/tc.py.
//
// The format.  W (padded to whole 16 x 16 tiles) is cut into row blocks of
// BM rows (MS = BM / 16 strips of 16 rows).  A block's k-steps (16-column
// slices of K) that hold no nonzero in any of its rows are dropped; the
// others, in order, form the block's stages of KS k-steps (the last one
// padded with empty tiles).  Per stage the packed buffer holds
//     kid     int32[KS]              the k-step of each entry (-> rows of X)
//     records [KS][MS] x 48 bytes    one per 16 x 16 tile (entry j, strip s):
//         w[8]  u32  bitmap in fragment order: byte (lane % 4) of word
//                    (lane / 4) is lane's 8-bit slot mask, slot i = 2 reg + half
//                    of the A fragment (reg 0: row g, k 2t..; 1: row g+8;
//                    2: k 2t+8..; 3: row g+8, k 2t+8..; g = lane/4, t = lane%4)
//         p[8]  u8   p[q] = nonzeros of words 0..q-1 (exclusive prefix)
//         base  u32  the tile's first value, from the stage's first
//         count u32  its nonzeros
//     values  fp16/bf16, from voff[stage] to voff[stage + 1]: each tile's
//             nonzeros in fragment order (lane, then slot)
// A lane's first value is base + p[lane/4] + popc(its word's bits below
// its byte), and its slots take the following values in slot order.
// Register values (RV, mma.sync): the values are each nonzero A register
// whole (a zero in an empty half), in tile, lane, register order; p and
// base count registers (base in 16-bit values), and a lane's first
// register is base + 2 (p[lane/4] + the registers of the lanes before it
// in its word), each read by one 4-byte load (lane_regvals).
//
// Sections (16-byte aligned, offsets in Problem): blocks int4[NUM_BLOCKS]
// {first stage, stages, first row, 0} in schedule order (the most stages
// first), kid, records, voff u32[stages + 1], values (16 bytes of slack at
// the end), bias fp32[MP] (HAS_BIAS).
//
// Work: a CTA owns one row block (a slot of the schedule) and BN columns of
// N; with CK > 1 (sm_90, a cluster of CK CTAs) each CTA of the cluster takes
// a share of the block's stages and finishes a share of its rows, the
// others' partial sums of them pushed into its shared memory
// (finish_split).  Inside a CTA, WM warps along M (MF strips each; WG: a
// warpgroup per 4 of them) and WK along K: warp (wm, wk) computes entries
// wk*KSW .. wk*KSW+KSW-1 of every stage.  Per stage: cp.async of X's rows
// (the entries' k-steps), the records and the values; per entry and strip:
// decode (decode_tile), then the MMAs.  Epilogue: without a split, the
// fragments go through the epilogue to a 16-bit tile in shared memory and
// out in 16-byte stores; with WK > 1 or CK > 1 the fp32 partials are added
// in shared memory first.
//
// TMA (sm_90a, WG, WK = 1): the stages are whole windows of KS
// consecutive k-steps (the packer's `windows` layout), and one more warp,
// the producer, fills them: X's tile by tensor-map boxes (tm: one of BN
// tokens x BK columns, swizzled to the row; fm: BN / 64 of BK rows x 64
// columns, the 64-column atoms), the records and the values by bulk
// copies, completing on the slot's `full` mbarrier; the compute warps wait
// on it, decode and issue their wgmma, and release the slot on its `empty`
// mbarrier.  No copy instruction and no CTA barrier in their loop.  (fm
// with N % 8 != 0: X's rows are not 16-byte aligned and the runtime maps
// no X; the producer warp copies the tile element by element instead.)
// With CK > 1 (decode tiles of a few tokens) the CTAs of a cluster split
// each block's stages and add their partials as the cp.async kernels'
// clusters do; the producer warp stays for that last step.
//
// Compiles under NVRTC with -I templates/include; no host headers.
#pragma once

#include "sf/common.cuh"
#include "sf/mma_sm80.cuh"
#include "sf/mma_sm90.cuh"
#include "sf/tma_sm90.cuh"

namespace sf {
namespace csr_tc {

// A tile's record: the bitmap format's (48 bytes), the lane-record
// variant's (a u32 a lane: the slot mask above LANE_SHIFT, the offset of
// the lane's first register below).  (Members of a struct: a kernel that
// reads one format leaves the other's constants unused without a warning.)
struct Rec {
  static constexpr int BYTES = 48;
  static constexpr int P = 32;       // offset of p[8]
  static constexpr int BASE = 40;    // offset of base
  static constexpr int LANE_BYTES = 128;
  static constexpr unsigned LANE_SHIFT = 24;
};

__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

// ---- configuration -----------------------------------------------------------------

template <typename T, int MF_, int WM_, int WK_, int KSW_, int BN_, int STAGES_, bool TM_,
          bool WG_, int CK_, int VMAX_, int TABS_, bool TMA_ = false, bool SA_ = false,
          bool LR_ = false, bool RV_ = false>
struct Config {
  using elem_t = T;
  static constexpr int MF = MF_;          // 16-row strips per warp (WG: 1)
  static constexpr int WM = WM_;          // warps along M (WG: 4 per warpgroup)
  static constexpr int WK = WK_;          // warps (WG: warpgroups) along K
  static constexpr int KSW = KSW_;        // k-steps per warp and stage
  static constexpr int BN = BN_;          // columns of N per CTA
  static constexpr int STAGES = STAGES_;  // cp.async pipeline depth
  static constexpr bool TM = TM_;         // token-major X and Y
  static constexpr bool WG = WG_;         // wgmma (sm_90a) instead of mma.sync
  static constexpr int CK = CK_;          // CTAs of a cluster splitting a block's stages
  static constexpr int VMAX = VMAX_;      // values of the largest stage (the plan's)
  static constexpr int TABS = TABS_;      // the most stages one CTA runs (the plan's)
  static constexpr bool TMA = TMA_;       // a producer warp fills the stages (TMA, bulk copies)
  static constexpr bool SA = SA_;         // TMA: A decoded into shared memory, wgmma from there
  static constexpr bool LR = LR_;         // TMA: W as lane records (a u32 a lane and tile)
  static constexpr bool RV = RV_;         // mma.sync: the bitmaps, values as whole registers

  static constexpr int WARPS = WM * WK;   // the warps that compute
  static constexpr int THREADS = 32 * WARPS + (TMA ? 32 : 0);
  static constexpr int BM = 16 * MF * WM;  // rows of a block
  static constexpr int MS = BM / 16;       // strips of a block
  static constexpr int KS = KSW * WK;      // k-steps of a stage
  static constexpr int BK = 16 * KS;       // columns of K of a stage
  static constexpr int NF = BN / 8;        // n8 fragments of a warp's tile

  // X tile of a stage: fm BK rows (k) x BN, tm BN rows (tokens) x BK; rows
  // of 16-byte chunks.  mma.sync: swizzled by row (swizzle<>).  WG, fm: 64-column
  // atoms of BK rows x 128 bytes, 128-byte swizzle; WG, tm: K-major rows,
  // swizzled to the row width (BK = 16, 32, 64: 32-, 64-, 128-byte swizzle).
  static constexpr int X_ROWS = TM ? BN : BK;
  static constexpr int X_ROW_CH = TM ? BK / 8 : BN / 8;
  static constexpr int X_BYTES = BK * BN * 2;
  static constexpr int REC_STAGE = MS * KS * (LR ? Rec::LANE_BYTES : Rec::BYTES);
  static constexpr int VAL_BYTES = (2 * VMAX + 15) / 16 * 16 + 32;  // + alignment slack
  static constexpr int META_BYTES = 16;    // the stage's first value (u32)
  static constexpr int STAGE_RAW = X_BYTES + REC_STAGE + VAL_BYTES + META_BYTES;
  static constexpr int STAGE_ALIGN = WG ? 1024 : 128;
  static constexpr int STAGE_BYTES = cdiv(STAGE_RAW, STAGE_ALIGN) * STAGE_ALIGN;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
  // The CTA's stage table, read once before the pipeline starts: the
  // k-steps (int32[TABS][KS]) and value offsets (u32[TABS + 1]) of its
  // stages, after the pipeline.
  static constexpr int TAB_BYTES = cdiv((KS * TABS + TABS + 1) * 4, 16) * 16;
  // The epilogue's shared tiles: the 16-bit output tile (fm BM x BN, tm
  // BN x BM, rows padded by 16 bytes) and, split, the fp32 partials
  // [WK][BM][BN + 4].
  static constexpr int C_LD = TM ? BM + 8 : BN + 8;
  static constexpr int C_BYTES = (TM ? BN : BM) * C_LD * 2;
  static constexpr bool SPLIT = WK > 1 || CK > 1;
  static constexpr int R_LD = BN + 4;
  static constexpr int R_BYTES = SPLIT ? WK * BM * R_LD * 4 : 0;
  static constexpr int ALIGN_PAD = WG ? 1024 : 0;  // the base is rounded up to 1024 (WG)
  // SA: two buffers of the decoded A tile (each a 64 x BK K-major tile a
  // warpgroup, swizzled as X's token-major tile), after the stage table
  static constexpr int A_GROUP = 64 * BK * 2;
  static constexpr int A_BUF = (WM / 4) * A_GROUP;
  static constexpr int A_BYTES = SA ? 2 * A_BUF : 0;
  static constexpr int A_OFF = SA ? cdiv(PIPE_BYTES + TAB_BYTES, 1024) * 1024 : PIPE_BYTES + TAB_BYTES;
  // TMA: the stages' mbarriers (full[STAGES], empty[STAGES]) after
  // everything the epilogue reuses
  static constexpr int BAR_OFF = cmax(cmax(A_OFF + A_BYTES, C_BYTES), R_BYTES);
  static constexpr int BAR_BYTES = TMA ? 16 * STAGES : 0;
  // CK > 1: the partial sums the cluster's other CTAs push for this CTA's
  // rows ([CK - 1][BM / CK][R_LD] fp32; never reused, as they may come
  // while this CTA still computes) and the barrier counting their bytes
  static constexpr int RECV_OFF = BAR_OFF + BAR_BYTES;
  static constexpr int RECV_BYTES = CK > 1 ? (CK - 1) * (BM / CK) * R_LD * 4 : 0;
  static constexpr int RECV_TX = CK > 1 ? (CK - 1) * (BM / CK) * BN * 4 : 0;  // bytes pushed
  static constexpr int RBAR_OFF = RECV_OFF + RECV_BYTES;
  static constexpr int SMEM_BYTES = RBAR_OFF + (CK > 1 ? 16 : 0) + ALIGN_PAD;

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit elements");
  static_assert(!WG || (MF == 1 && WM % 4 == 0), "WG: one strip per warp, whole warpgroups");
  static_assert(!WG || KSW % 2 == 0, "WG: the A registers alternate between two sets");
  static_assert(!TMA || (WG && WK == 1), "TMA: wgmma, one warpgroup column");
  static_assert(!SA || (TMA && BK <= 64), "SA: the TMA kernel, A rows of at most 128 bytes");
  static_assert(!LR || TMA, "LR: the TMA kernel");
  static_assert(!RV || !WG, "RV: the mma.sync kernels");
  // The configuration's constraints are asserted by the generated source,
  // from the table the search space filters with
  // (generator/families/csr/tc.py).
};

// ---- shared-memory layout of the X tile --------------------------------------------------

// 16-byte chunk (row, ch) of a tile of rows of RC chunks, XOR-swizzled
// (for RC = 2, 4, 8 the wgmma K-major 32-, 64-, 128-byte swizzle), in
// 16-byte units.
template <int RC>
__device__ __forceinline__ int swizzled_chunk(int row, int ch) {
  constexpr int LINE_ROWS = RC >= 8 ? 1 : 8 / RC;
  constexpr int MASK = RC >= 8 ? 7 : RC - 1;
  return row * RC + (ch ^ ((row / LINE_ROWS) & MASK));
}

// 16-byte chunk (row, ch) of the X tile, in 16-byte units.
template <class C>
__device__ __forceinline__ int x_chunk(int row, int ch) {
  if constexpr (C::WG && !C::TM) {  // 64-column atoms, 128-byte swizzle
    return (ch >> 3) * (C::BK * 8) + row * 8 + ((ch & 7) ^ (row & 7));
  } else {  // rows of X_ROW_CH chunks, XOR-swizzled (the wgmma K-major swizzle too)
    return swizzled_chunk<C::X_ROW_CH>(row, ch);
  }
}

// ---- the block a CTA owns --------------------------------------------------------------------

struct Block {
  int first_stage;  // global index of its first stage
  int stages;       // this CTA's share of them (a cluster splits them)
  int first_row;    // its first row of W (and Y)
};

template <class C, class P>
__device__ __forceinline__ Block load_block(const unsigned char *packed, int slot, int rank) {
  Block b;
  if constexpr (P::FIXED) {  // a regular schedule: blocks in row order, equal stages
    b = Block{slot * P::BLOCK_STAGES, P::BLOCK_STAGES, slot * C::BM};
  } else {
    const int4 v = __ldg(section<int4>(packed, P::BLK_OFF) + slot);
    b = Block{v.x, v.y, v.z};
  }
  if constexpr (C::CK > 1) {  // an even share of the stages per cluster rank
    const int lo = b.stages * rank / C::CK, hi = b.stages * (rank + 1) / C::CK;
    b.first_stage += lo;
    b.stages = hi - lo;
  }
  return b;
}

// ---- loading a stage --------------------------------------------------------------------------

// What the copies of one stage need before they can be issued, fetched one
// stage early from the CTA's stage table in shared memory: the k-steps of
// the X rows this thread copies, and the stage's value range.  The table
// is filled from global memory once (load_table), so that no stage's copies
// wait on a global load of their own (on the H100 decode measured so far the
// time did not change either way).
template <class C, class P>
struct StageLoader {
  // fm: a thread keeps one chunk column and walks rows XSTEP apart (rows
  // of different entries need their own k-steps); tm: one chunk column
  // (one entry) and walks tokens.
  static constexpr int XCH = C::X_ROWS * C::X_ROW_CH;
  static constexpr int XSTEP = C::THREADS / C::X_ROW_CH;
  static constexpr int XITERS = cdiv(XCH, C::THREADS);
  static constexpr int KIDS = C::TM ? 1 : XITERS;
  static_assert(C::THREADS % C::X_ROW_CH == 0, "a thread keeps one chunk column of the X tile");

  struct Ahead {
    int kid[KIDS];
    unsigned v0, v1;  // the stage's values: [v0, v1)
  };

  const unsigned char *packed;
  const int *s_kid;        // the stage table: k-steps [TABS][KS]
  const unsigned *s_voff;  // and value offsets [TABS + 1]
  int row0, col;  // this thread's first row and its chunk column of the X tile
  int stage0;     // the CTA's first stage (global; P::FIXED computes from it)

  __device__ __forceinline__ StageLoader(const unsigned char *p, const unsigned char *table,
                                         int first_stage = 0)
      : packed(p),
        s_kid(reinterpret_cast<const int *>(table)),
        s_voff(reinterpret_cast<const unsigned *>(table) + C::KS * C::TABS),
        row0(threadIdx.x / C::X_ROW_CH),
        col(threadIdx.x % C::X_ROW_CH),
        stage0(first_stage) {}

  // The k-steps and value offsets of the block's stages [first, first + n)
  // into the table (n <= TABS); the caller synchronizes before fetch().
  __device__ __forceinline__ void load_table(int first, int n) const {
    const int *kid = section<int>(packed, P::KID_OFF) + (size_t)first * C::KS;
    const unsigned *voff = section<unsigned>(packed, P::VOFF_OFF) + first;
    int *t_kid = const_cast<int *>(s_kid);
    unsigned *t_voff = const_cast<unsigned *>(s_voff);
    for (int i = threadIdx.x; i < n * C::KS; i += C::THREADS) t_kid[i] = __ldg(kid + i);
    for (int i = threadIdx.x; i <= n; i += C::THREADS) t_voff[i] = __ldg(voff + i);
  }

  // Stage `local` of the block (0 .. n - 1), from the table; with fixed
  // offsets (P::FIXED) computed from the CTA's first stage instead.
  __device__ __forceinline__ void fetch(Ahead &a, int local) const {
    if constexpr (P::FIXED) {
      const int stage = stage0 + local;                     // global
      const int kstep = (stage % P::BLOCK_STAGES) * C::KS;  // the block's stage: its first k-step
#pragma unroll
      for (int i = 0; i < KIDS; ++i) {
        const int entry = C::TM ? col / 2 : (row0 + i * XSTEP) / 16;
        a.kid[i] = min(kstep + entry, P::KT - 1);  // (a last stage's padding repeats the last)
      }
      a.v0 = static_cast<unsigned>(stage) * P::VSTRIDE;
      a.v1 = a.v0 + P::VSTRIDE;
      return;
    }
    const int *kid = s_kid + local * C::KS;
#pragma unroll
    for (int i = 0; i < KIDS; ++i) {
      const int entry = C::TM ? col / 2 : (row0 + i * XSTEP) / 16;
      a.kid[i] = (C::TM || XCH % C::THREADS == 0 || row0 + i * XSTEP < C::X_ROWS)
                     ? kid[entry] : 0;
    }
    a.v0 = s_voff[local];
    a.v1 = s_voff[local + 1];
  }

  // X rows of the stage: fm, row r of the tile is k = 16 kid[r / 16] + r % 16,
  // columns [n0, n0 + BN); tm, token n0 + r, columns 16 kid + 8 (col % 2) ..
  // + 7.  Past K or N: zeros.  VEC: 16-byte copies (fm: N % 8 == 0 and X
  // aligned; tm: K % 8 == 0 and X aligned), else element loads.
  // Token-major, 16-byte copies: this thread's rows of the X tile, XSTEP
  // apart (shared chunks `step` bytes apart from dst0, sources XSTEP rows of
  // X apart from src).  BOUNDED: rows from `rows_in` on lie outside N (or
  // the k-step outside K) and are zero-filled from a valid address.
  template <bool BOUNDED>
  __device__ __forceinline__ void copy_rows_tm(unsigned dst0, unsigned step,
                                               const unsigned short *src,
                                               const unsigned short *x, int rows_in) const {
#pragma unroll
    for (int i = 0; i < XITERS; ++i) {
      if (XCH % C::THREADS != 0 && row0 + i * XSTEP >= C::X_ROWS) break;
      const bool ok = !BOUNDED || i * XSTEP < rows_in;
      sm80::cp_async_16(dst0 + i * step, ok ? src + (size_t)i * XSTEP * P::K : x, ok);
    }
  }

  template <bool VEC>
  __device__ __forceinline__ void load_x(unsigned s_x, const Ahead &a,
                                         const unsigned short *x, int n_len, int n0) const {
    if constexpr (VEC && XSTEP % 8 == 0) {
      // the thread's rows are XSTEP apart: their swizzled chunks sit at
      // constant offsets from the first (the swizzle repeats every 8 rows),
      // and tm their sources at constant strides; one address computed a
      // stage, not one per chunk
      constexpr unsigned DST_STEP = 16u * XSTEP * (C::WG && !C::TM ? 8 : C::X_ROW_CH);
      const unsigned dst0 = s_x + 16u * x_chunk<C>(row0, col);
      if constexpr (C::TM) {
        const int gk = 16 * a.kid[0] + 8 * (col & 1);
        const int rows_in = gk < P::K ? n_len - n0 - row0 : 0;  // rows of this thread in N
        const unsigned short *src = x + ((size_t)(n0 + row0) * P::K + gk);
        // every row of the thread's inside N (all but the last tile of N): no bounds
        if (rows_in > (XITERS - 1) * XSTEP)
          copy_rows_tm<false>(dst0, DST_STEP, src, x, rows_in);
        else
          copy_rows_tm<true>(dst0, DST_STEP, src, x, rows_in);
      } else {
        const int gn = n0 + 8 * col;
        const bool nok = gn < n_len;
        const unsigned short *xcol = x + gn;
#pragma unroll
        for (int i = 0; i < XITERS; ++i) {
          const int row = row0 + i * XSTEP;
          if (XCH % C::THREADS != 0 && row >= C::X_ROWS) break;
          const int gk = 16 * a.kid[i] + (row & 15);
          const bool ok = nok && gk < P::K;
          sm80::cp_async_16(dst0 + i * DST_STEP, ok ? xcol + (size_t)gk * n_len : x, ok);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < XITERS; ++i) {
        const int row = row0 + i * XSTEP;
        if (XCH % C::THREADS != 0 && row >= C::X_ROWS) break;
        const unsigned dst = s_x + 16u * x_chunk<C>(row, col);
        int gk, gn;  // the chunk's first element of X: row gk, column gn (fm) / token gn, column gk (tm)
        if constexpr (C::TM) {
          gn = n0 + row;
          gk = 16 * a.kid[0] + 8 * (col & 1);
        } else {
          gk = 16 * a.kid[i] + (row & 15);
          gn = n0 + 8 * col;
        }
        if constexpr (VEC) {
          const bool ok = gk < P::K && gn < n_len;
          const unsigned short *src =
              ok ? (C::TM ? x + (size_t)gn * P::K + gk : x + (size_t)gk * n_len + gn) : x;
          sm80::cp_async_16(dst, src, ok);
        } else {
          unsigned w[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            unsigned h[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const int k = C::TM ? gk + 2 * e + u : gk;
              const int n = C::TM ? gn : gn + 2 * e + u;
              h[u] = (k < P::K && n < n_len)
                         ? (C::TM ? x[(size_t)n * P::K + k] : x[(size_t)k * n_len + n]) : 0u;
            }
            w[e] = h[0] | (h[1] << 16);
          }
          sm80::st_shared_16(dst, w);
        }
      }
    }
  }

  // The stage's records (contiguous) and values: the 16-byte chunks that
  // cover [v0, v1), from v0 rounded down to 8 values; the meta slot keeps
  // v0 % 8, where the stage's first value sits.
  __device__ __forceinline__ void load_tables(unsigned s_stage, const Ahead &a, int stage) const {
    const unsigned s_rec = s_stage + C::X_BYTES;
    const unsigned char *rec = packed + P::REC_OFF + (size_t)stage * C::REC_STAGE;
    constexpr int RCH = C::REC_STAGE / 16;
#pragma unroll
    for (int i = 0; i < cdiv(RCH, C::THREADS); ++i) {
      const int c = threadIdx.x + i * C::THREADS;
      if (RCH % C::THREADS == 0 || c < RCH) sm80::cp_async_16(s_rec + 16 * c, rec + 16 * c, true);
    }
    const unsigned s_val = s_rec + C::REC_STAGE;
    const unsigned first = a.v0 & ~7u;
    const int chunks = static_cast<int>((a.v1 + 7 - first) / 8);
    // at most VCH chunks (the largest stage's values, from a multiple of 8):
    // a fixed number of predicated copies a thread, at constant offsets
    constexpr int VCH = (C::VMAX + 14) / 8;
    const unsigned short *val =
        section<unsigned short>(packed, P::VAL_OFF) + first + 8 * threadIdx.x;
    const unsigned dst = s_val + 16u * threadIdx.x;
#pragma unroll
    for (int i = 0; i < cdiv(VCH, C::THREADS); ++i)
      if (static_cast<int>(threadIdx.x) + i * C::THREADS < chunks)
        sm80::cp_async_16(dst + 16u * i * C::THREADS, val + 8 * i * C::THREADS, true);
    if (threadIdx.x == 0) sm80::st_shared_u32(s_val + C::VAL_BYTES, a.v0 & 7u);
  }
};

// ---- decode: one tile's A fragment --------------------------------------------------------------

// What a lane decodes with in every tile: its bitmap word (q), the bits
// of the lanes before it in that word (`below`), and where its own byte
// starts (`shift`).
struct LaneBits {
  int q;
  unsigned below, shift;
  __device__ __forceinline__ explicit LaneBits(int lane)
      : q(lane >> 2), below((1u << (8 * (lane & 3))) - 1u), shift(8u * (lane & 3)) {}
};

// The stage's values as the decode reads them: the copy starts at the
// stage's first value rounded down to 8 (load_tables), so the first value
// sits `meta` values in.
template <class C>
__device__ __forceinline__ const unsigned short *stage_values(const unsigned char *stage) {
  const unsigned char *val = stage + C::X_BYTES + C::REC_STAGE;
  return reinterpret_cast<const unsigned short *>(val) +
         *reinterpret_cast<const unsigned *>(val + C::VAL_BYTES);
}

// A lane's part of tile (entry j, strip s) of the stage at `stage` (shared
// memory): its slot mask and its first value (the tile's base, the word's
// prefix, the popcount of the lanes before it in the word).
struct LaneTile {
  unsigned mask, first;
};

template <class C>
__device__ __forceinline__ LaneTile lane_tile(const unsigned char *stage, int j, int s,
                                              const LaneBits &lb) {
  const unsigned char *rec = stage + C::X_BYTES + (j * C::MS + s) * Rec::BYTES;
  const unsigned word = reinterpret_cast<const unsigned *>(rec)[lb.q];
  LaneTile lt;
  lt.first = *reinterpret_cast<const unsigned *>(rec + Rec::BASE) + rec[Rec::P + lb.q] +
             __popc(word & lb.below);
  lt.mask = word >> lb.shift;
  return lt;
}

// The four A registers of a lane's tile: its values, taken in slot order.
__device__ __forceinline__ void tile_values(unsigned (&a)[4], const unsigned short *vals,
                                            const LaneTile &lt) {
  const unsigned mask = lt.mask;
  const unsigned short *v = vals + lt.first;
  unsigned h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    h[i] = 0u;
    if (mask & (1u << i)) {
      h[i] = *v;
      ++v;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = __byte_perm(h[2 * i], h[2 * i + 1], 0x5410);
}

// The lane-record variant: the lane's record of tile (entry j, strip s),
// (slot mask << 24) | where its registers start (16-bit values from the
// stage's first).
template <class C>
__device__ __forceinline__ LaneTile lane_record(const unsigned char *stage, int j, int s,
                                                int lane) {
  const unsigned r = reinterpret_cast<const unsigned *>(
      stage + C::X_BYTES + (j * C::MS + s) * Rec::LANE_BYTES)[lane];
  return LaneTile{r >> Rec::LANE_SHIFT, r & ((1u << Rec::LANE_SHIFT) - 1u)};
}

// Its four A registers: each register with a set slot is the next aligned
// 4-byte word of its values (the stage's values start 4-byte aligned).
__device__ __forceinline__ void lane_registers(unsigned (&a)[4], const unsigned short *vals,
                                               const LaneTile &lt) {
  const unsigned *v = reinterpret_cast<const unsigned *>(vals + lt.first);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a[i] = 0u;
    if (lt.mask & (3u << (2 * i))) {
      a[i] = *v;
      ++v;
    }
  }
}

// A lane's tile of the TMA kernels, in either format.
template <class C>
__device__ __forceinline__ LaneTile tma_lane_tile(const unsigned char *stage, int j, int s,
                                                  const LaneBits &lb, int lane) {
  if constexpr (C::LR)
    return lane_record<C>(stage, j, s, lane);
  else
    return lane_tile<C>(stage, j, s, lb);
}

template <class C>
__device__ __forceinline__ void tma_tile_values(unsigned (&a)[4], const unsigned short *vals,
                                                const LaneTile &lt) {
  if constexpr (C::LR)
    lane_registers(a, vals, lt);
  else
    tile_values(a, vals, lt);
}

// The register-values variant: the lane's bitmap word as lane_tile reads
// it, its first register from the registers of the lanes before it in the
// word (a register is nonzero where either of its slots is set; p and
// base count registers, base in 16-bit values), its slot mask for
// lane_registers.
template <class C>
__device__ __forceinline__ LaneTile lane_regvals(const unsigned char *stage, int j, int s,
                                                 const LaneBits &lb) {
  const unsigned char *rec = stage + C::X_BYTES + (j * C::MS + s) * Rec::BYTES;
  const unsigned word = reinterpret_cast<const unsigned *>(rec)[lb.q];
  const unsigned regs = (word | (word >> 1)) & 0x55555555u;
  LaneTile lt;
  lt.first = *reinterpret_cast<const unsigned *>(rec + Rec::BASE) +
             2u * (rec[Rec::P + lb.q] + __popc(regs & lb.below));
  lt.mask = word >> lb.shift;
  return lt;
}

// The four A registers of tile (entry j, strip s) of the stage at `stage`.
template <class C>
__device__ __forceinline__ void decode_tile(unsigned (&a)[4], const unsigned char *stage,
                                            const unsigned short *vals, int j, int s,
                                            const LaneBits &lb) {
  if constexpr (C::RV)
    lane_registers(a, vals, lane_regvals<C>(stage, j, s, lb));
  else
    tile_values(a, vals, lane_tile<C>(stage, j, s, lb));
}

// ---- compute ------------------------------------------------------------------------------------

// mma.sync: entry j of the stage for this warp's MF strips and all BN columns.
template <class C>
__device__ __forceinline__ void mma_entry(float (&acc)[C::MF][C::NF][4], const unsigned char *stage,
                                          const unsigned short *vals, unsigned s_stage, int j,
                                          int wm, int lane, const LaneBits &lb) {
  using T = typename C::elem_t;
  unsigned a[C::MF][4];
#pragma unroll
  for (int mi = 0; mi < C::MF; ++mi) decode_tile<C>(a[mi], stage, vals, j, wm * C::MF + mi, lb);
#pragma unroll
  for (int nj = 0; nj < C::NF / 2; ++nj) {
    unsigned r[4];
    if constexpr (C::TM) {
      // BN x BK tile: lanes 0-7 tokens 0-7 at k 0-7, 8-15 at k 8-15, 16-31 tokens 8-15
      const int row = nj * 16 + (lane & 7) + ((lane >> 4) << 3);
      const int ch = 2 * j + ((lane >> 3) & 1);
      sm80::ldmatrix_x4(r, s_stage + 16 * x_chunk<C>(row, ch));
    } else {
      // BK x BN tile: lanes 0-15 k 0-15 at columns 0-7, 16-31 at columns 8-15
      const int row = 16 * j + (lane & 15);
      const int ch = 2 * nj + (lane >> 4);
      sm80::ldmatrix_x4_trans(r, s_stage + 16 * x_chunk<C>(row, ch));
    }
    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
    for (int mi = 0; mi < C::MF; ++mi) {
      sm80::mma_16816<T>(acc[mi][2 * nj], a[mi], b0);
      sm80::mma_16816<T>(acc[mi][2 * nj + 1], a[mi], b1);
    }
  }
}

// wgmma: the descriptor of entry j (16 columns of k) of a K-major tile of
// rows of BK elements, swizzled to the row width (swizzled_chunk).
template <class C>
__device__ __forceinline__ unsigned long long kmajor_desc(unsigned s_tile, int j) {
  constexpr sm90::Swizzle SW = C::BK == 64 ? sm90::SWIZZLE_128B
                                           : (C::BK == 32 ? sm90::SWIZZLE_64B : sm90::SWIZZLE_32B);
  return sm90::make_desc(s_tile + 32 * j, 16, 8 * C::BK * 2, SW);
}

// wgmma: the B descriptor of entry j (16 rows of k) of the stage's X tile.
template <class C>
__device__ __forceinline__ unsigned long long x_desc(unsigned s_stage, int j) {
  if constexpr (C::TM) {  // K-major: rows of BK elements, swizzled to the row width
    return kmajor_desc<C>(s_stage, j);
  } else {  // MN-major 64-column atoms: from one atom to the next BK * 128 bytes
    return sm90::make_desc(s_stage + 2048 * j, C::BK * 128, 1024, sm90::SWIZZLE_128B);
  }
}

// From one entry's descriptor to the next's: the address field counts 16
// bytes (K-major tiles, X's token-major one and SA's A: an entry is 32
// bytes along the rows; X feature-major: 16 rows of 128 bytes).
constexpr unsigned long long KMAJOR_DESC_STEP = 32 / 16;
template <class C>
constexpr unsigned long long X_DESC_STEP = C::TM ? KMAJOR_DESC_STEP : 2048 / 16;

// wgmma: the warp's KSW entries of the stage (its warpgroup's 64 rows, all
// BN columns), one wgmma each, the A registers alternating between two
// sets: a set is written again only after the wgmma that read it is done.
template <class C>
__device__ __forceinline__ void wg_stage(float (&acc)[C::NF][4], unsigned (&a)[2][4],
                                         const unsigned char *stage, unsigned s_stage, int wk,
                                         int strip, const LaneBits &lb) {
  using T = typename C::elem_t;
  const unsigned short *vals = stage_values<C>(stage);
  // the descriptor of the warp's first entry; the next ones are a constant
  // step further in its address field (the stage lies below 256 KB: no
  // carry out of the field's 14 bits)
  const unsigned long long d0 = x_desc<C>(s_stage, wk * C::KSW);
#pragma unroll
  for (int jj = 0; jj < C::KSW; ++jj) {
    const int j = wk * C::KSW + jj;
    decode_tile<C>(a[jj & 1], stage, vals, j, strip, lb);
    sm90::fence();
    sm90::mma_rs<T, C::BN, C::TM ? 0 : 1>(acc, a[jj & 1], d0 + X_DESC_STEP<C> * jj);
    sm90::commit_group();
    sm90::wait_group<1>();
  }
}

// ---- epilogue -------------------------------------------------------------------------------------

// Where a warp's fragments sit: its first strip and rows.
template <class C>
__device__ __forceinline__ int warp_row0(int wm) { return wm * C::MF * 16; }

// Fragments -> act(scale acc + bias) in T -> the 16-bit output tile (fm
// [BM][C_LD], tm [BN][C_LD]).
template <class C, class P>
__device__ __forceinline__ void fragments_to_tile(const float (&acc)[C::MF][C::NF][4],
                                                  unsigned short *s_c, const unsigned char *packed,
                                                  int m0, int wm, int lane) {
  using T = typename C::elem_t;
  const float *bias = section<float>(packed, P::BIAS_OFF);
#pragma unroll
  for (int mi = 0; mi < C::MF; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0<C>(wm) + mi * 16 + (lane >> 2) + 8 * h;
      const float bv = P::HAS_BIAS ? __ldg(bias + m0 + row) : 0.0f;
#pragma unroll
      for (int ni = 0; ni < C::NF; ++ni) {
        const int col = ni * 8 + 2 * (lane & 3);
        const unsigned pair = sm80::epilogue_pair<T, P::HAS_BIAS, P::ACT>(
            acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], P::SCALE, bv, (ni & 1) != 0);
        if constexpr (C::TM) {
          s_c[col * C::C_LD + row] = static_cast<unsigned short>(pair & 0xffffu);
          s_c[(col + 1) * C::C_LD + row] = static_cast<unsigned short>(pair >> 16);
        } else {
          *reinterpret_cast<unsigned *>(s_c + row * C::C_LD + col) = pair;
        }
      }
    }
  }
}

// The output tile -> Y: rows m0 .. m0 + BM - 1 (those below M), columns
// n0 .. n0 + BN - 1 (those below N); 16-byte stores where the rows allow;
// by the first NT threads.
template <class C, class P, int NT = C::THREADS>
__device__ __forceinline__ void store_tile(const unsigned short *s_c, unsigned short *y, int n_len,
                                           int m0, int n0) {
  constexpr int ROWS = C::TM ? C::BN : C::BM;      // tile rows: tokens (tm) or rows of W (fm)
  constexpr int COLS = C::TM ? C::BM : C::BN;
  constexpr int CPR = COLS / 8;
  const int rows_valid = C::TM ? n_len - n0 : P::M - m0;
  const int cols_valid = C::TM ? P::M - m0 : n_len - n0;
  const size_t ld = C::TM ? (size_t)P::M : (size_t)n_len;
  unsigned short *ybase = y + (C::TM ? (size_t)n0 * P::M + m0 : (size_t)m0 * n_len + n0);
  const bool vec = (C::TM ? P::M % 8 == 0 : n_len % 8 == 0) &&
                   (reinterpret_cast<unsigned long long>(y) & 15) == 0;
  for (int i = threadIdx.x; i < ROWS * CPR; i += NT) {
    const int row = i / CPR, c = i % CPR;
    if (row >= rows_valid || 8 * c >= cols_valid) continue;
    const unsigned short *src = s_c + row * C::C_LD + 8 * c;
    unsigned short *dst = ybase + (size_t)row * ld + 8 * c;
    if (vec && 8 * c + 8 <= cols_valid) {
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (8 * c + e < cols_valid) dst[e] = src[e];
    }
  }
}

// Split: the warp's fp32 partials -> R[wk][row][col].
template <class C>
__device__ __forceinline__ void fragments_to_partials(const float (&acc)[C::MF][C::NF][4],
                                                      float *s_r, int wm, int wk, int lane) {
  float *r = s_r + (size_t)wk * C::BM * C::R_LD;
#pragma unroll
  for (int mi = 0; mi < C::MF; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0<C>(wm) + mi * 16 + (lane >> 2) + 8 * h;
#pragma unroll
      for (int ni = 0; ni < C::NF; ++ni) {
        const int col = ni * 8 + 2 * (lane & 3);
        *reinterpret_cast<float2 *>(r + row * C::R_LD + col) =
            make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }
    }
}

// This CTA's rank in its cluster (sm_90; 0 below).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

// CK > 1, at the block's start (every thread): the barrier that counts the
// partial sums the cluster's other CTAs push for this CTA's rows, armed for
// their bytes, and the cluster's arrival that lets them push (they wait
// for it in finish_split, long after).
template <class C>
__device__ __forceinline__ void split_recv_init(unsigned s_base) {
  sm90::recv_init(s_base + C::RBAR_OFF, C::RECV_TX, true);  // (rows of BN, not R_LD)
}

// Split: the partials added (over WK, then over the cluster's CK CTAs),
// through the epilogue, into Y.  Each CTA of a cluster finishes a share of
// the rows: it pushes its sums of the other CTAs' rows into their shared
// memory (st.async, counted on their barriers) and waits on its own for
// theirs.  No cluster-wide fence and no meeting at the end: the barrier
// pair with release and acquire that this replaced, and the one that kept
// each CTA alive until the others had read it, waited on every CTA's
// stores (bench/RESULTS.md, 2026-11-27).  Element stores (decode-sized
// tiles).
template <class C, class P>
__device__ __forceinline__ void finish_split(float *s_r, const unsigned char *packed,
                                             unsigned short *y, int n_len, int m0, int n0) {
  using T = typename C::elem_t;
  constexpr int ELEMS = C::BM * C::BN;
  if constexpr (C::WK > 1) {  // into R[0]
    for (int i = threadIdx.x; i < ELEMS; i += C::THREADS) {
      const int row = i / C::BN, col = i % C::BN;
      float v = s_r[row * C::R_LD + col];
#pragma unroll
      for (int w = 1; w < C::WK; ++w) v += s_r[(w * C::BM + row) * C::R_LD + col];
      s_r[row * C::R_LD + col] = v;
    }
  }
  __syncthreads();
  const float *bias = section<float>(packed, P::BIAS_OFF);
  // fm: threads run along N (Y rows contiguous); tm: along M
  auto store = [&](int row, int col, float v) {
    const int m = m0 + row, n = n0 + col;
    if (m >= P::M || n >= n_len) return;
    const float bv = P::HAS_BIAS ? __ldg(bias + m) : 0.0f;
    const float out = epilogue<P::HAS_BIAS, P::ACT, true>(v, P::SCALE, bv);
    const unsigned short bits = static_cast<unsigned short>(sm80::pack2<T>(out, 0.0f) & 0xffffu);
    y[C::TM ? (size_t)n * P::M + m : (size_t)m * n_len + n] = bits;
  };
  if constexpr (C::CK > 1) {
    static_assert(C::BM % C::CK == 0 && C::BN % 4 == 0,
                  "a cluster's CTAs finish equal shares of the rows, pushed 4 floats at a time");
    constexpr int ROWS = C::BM / C::CK, V4 = C::BN / 4;
    const unsigned rank = cluster_rank();
    const int row_lo = ROWS * static_cast<int>(rank);
    const unsigned base = sm80::smem_addr(s_r);
    const unsigned bar = base + C::RBAR_OFF;
    sm90::cluster_wait();  // every CTA's barrier is armed
    // the other CTAs' rows: to their owners, into this CTA's slot there
    // (slot k of an owner holds the sums of rank owner + 1 + k)
    for (int i = threadIdx.x; i < (C::BM - ROWS) * V4; i += C::THREADS) {
      const int j = i / V4, c4 = i % V4;
      const int row = j < row_lo ? j : j + ROWS;
      const unsigned owner = static_cast<unsigned>(row / ROWS);
      const unsigned slot = (rank + C::CK - owner - 1) % C::CK;
      const float4 v = *reinterpret_cast<const float4 *>(s_r + row * C::R_LD + 4 * c4);
      sm90::st_async_v4(base + C::RECV_OFF +
                            16u * ((slot * ROWS + (row - owner * ROWS)) * (C::R_LD / 4) + c4),
                        owner, v, bar);
    }
    sm90::mbar_wait(bar, 0);  // the others' sums of this CTA's rows are here
    const float *in =
        reinterpret_cast<const float *>(reinterpret_cast<const unsigned char *>(s_r) + C::RECV_OFF);
    for (int i = threadIdx.x; i < ROWS * C::BN; i += C::THREADS) {
      const int r = C::TM ? i % ROWS : i / C::BN, col = C::TM ? i / ROWS : i % C::BN;
      float v = s_r[(row_lo + r) * C::R_LD + col];  // in rank order from this CTA's own
#pragma unroll
      for (int k = 0; k < C::CK - 1; ++k) v += in[(k * ROWS + r) * C::R_LD + col];
      store(row_lo + r, col, v);
    }
  } else {
    for (int i = threadIdx.x; i < C::BM * C::BN; i += C::THREADS) {
      const int row = C::TM ? i % C::BM : i / C::BN;
      const int col = C::TM ? i / C::BM : i % C::BN;
      store(row, col, s_r[row * C::R_LD + col]);
    }
  }
}

// ---- the kernel body ----------------------------------------------------------------------------

template <class C, class P, bool VEC>
__device__ __forceinline__ void gemm_block(const unsigned char *__restrict__ packed,
                                           const unsigned short *__restrict__ x,
                                           unsigned short *__restrict__ y, int n_len, int n0,
                                           const Block &blk, unsigned char *smem) {
  constexpr int S = C::STAGES;
  constexpr int AHEAD = C::WG ? S - 2 : S - 1;  // stages in flight ahead of the one computed
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm = warp % C::WM, wk = warp / C::WM;
  const unsigned s_base = sm80::smem_addr(smem);
  const int n = blk.stages;
  if constexpr (C::CK > 1) split_recv_init<C>(s_base);

  using L = StageLoader<C, P>;
  const L ld(packed, smem + C::PIPE_BYTES, blk.first_stage);
  if constexpr (!P::FIXED) {
    ld.load_table(blk.first_stage, n);
    __syncthreads();  // the stage table is complete
  }
  typename L::Ahead first[AHEAD > 0 ? AHEAD : 1], next;
  if (n > 0) {
#pragma unroll
    for (int s = 0; s < AHEAD; ++s)
      if (s < n) ld.fetch(first[s], s);
    if (AHEAD < n) ld.fetch(next, AHEAD);
  }
#pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < n) {
      const unsigned st = s_base + s * C::STAGE_BYTES;
      ld.template load_x<VEC>(st, first[s], x, n_len, n0);
      ld.load_tables(st, first[s], blk.first_stage + s);
    }
    sm80::cp_async_commit();
  }

  // mma.sync: MF x NF fragments a warp; WG: the warpgroup's 64 x BN tile (MF = 1)
  float acc[C::MF][C::NF][4];
#pragma unroll
  for (int mi = 0; mi < C::MF; ++mi)
#pragma unroll
    for (int ni = 0; ni < C::NF; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  unsigned a_wg[2][4];  // WG: the two sets of A registers
  const LaneBits lb(lane);

  int read_stage = 0, write_stage = AHEAD % S;
  for (int it = 0; it < n; ++it) {
    sm80::cp_async_wait<AHEAD - 1>();
    if constexpr (C::WG) {
      sm90::fence_proxy_async();  // this thread's copies -> the wgmma's proxy
      sm90::wait_group<1>();
    }
    __syncthreads();  // stage `it` landed for everyone; the stage to refill is free
    if (it + AHEAD < n) {
      const unsigned st = s_base + write_stage * C::STAGE_BYTES;
      ld.template load_x<VEC>(st, next, x, n_len, n0);
      ld.load_tables(st, next, blk.first_stage + it + AHEAD);
      if (it + AHEAD + 1 < n) ld.fetch(next, it + AHEAD + 1);
    }
    sm80::cp_async_commit();
    const unsigned st = s_base + read_stage * C::STAGE_BYTES;
    const unsigned char *stage = smem + read_stage * C::STAGE_BYTES;
    if constexpr (C::WG) {
      wg_stage<C>(acc[0], a_wg, stage, st, wk, wm, lb);
    } else {
      const unsigned short *vals = stage_values<C>(stage);
#pragma unroll
      for (int jj = 0; jj < C::KSW; ++jj)
        mma_entry<C>(acc, stage, vals, st, wk * C::KSW + jj, wm, lane, lb);
    }
    read_stage = read_stage + 1 == S ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == S ? 0 : write_stage + 1;
  }
  if constexpr (C::WG) {
    sm90::wait_group<0>();
    sm90::fence_accumulators(acc[0]);  // no read of them above the wait
  }
  sm80::cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory is free for the epilogue

  const int m0 = blk.first_row;
  if constexpr (C::SPLIT) {
    float *s_r = reinterpret_cast<float *>(smem);
    fragments_to_partials<C>(acc, s_r, wm, wk, lane);
    __syncthreads();
    finish_split<C, P>(s_r, packed, y, n_len, m0, n0);
  } else {
    unsigned short *s_c = reinterpret_cast<unsigned short *>(smem);
    fragments_to_tile<C, P>(acc, s_c, packed, m0, wm, lane);
    __syncthreads();
    store_tile<C, P>(s_c, y, n_len, m0, n0);
  }
}

// ---- the TMA pipeline (C::TMA) ----------------------------------------------------------------

// The producer warp: stage `it` of the block into slot it % STAGES once
// every consumer warp has released the slot's previous stage: X's tile as
// one TMA box (BN tokens x BK columns from the stage's first k-step: a TMA
// configuration's stages are whole windows of KS consecutive k-steps,
// bitmap.py; zeros past N and K), the records and the values (from a
// 16-byte boundary) by bulk copies, all completing on the slot's `full`
// barrier.
template <class C, class P>
__device__ __forceinline__ void tma_produce(const unsigned char *__restrict__ packed,
                                            const sm90::TensorMap *map, bool use_map,
                                            const unsigned short *__restrict__ x, int n_len,
                                            unsigned s_base, const int *s_kid,
                                            const unsigned *s_voff, unsigned bars,
                                            const Block &blk, int n0, int lane) {
  constexpr int S = C::STAGES;
  const unsigned full = bars, empty = bars + 8 * S;
  // stage `it`'s records and values (constant), armed on its slot's barrier
  // with X's bytes too
  auto produce_weights = [&](int it, int s) {
    const unsigned st = s_base + s * C::STAGE_BYTES;
    const unsigned v0 = s_voff[it], v1 = s_voff[it + 1];
    const unsigned first = v0 & ~7u;  // from a 16-byte boundary (the consumers skip v0 % 8)
    const unsigned vbytes = (v1 + 7u - first) / 8u * 16u;
    const unsigned s_rec = st + C::X_BYTES, s_val = s_rec + C::REC_STAGE;
    sm90::mbar_arrive_expect(full + 8 * s, (use_map ? C::X_BYTES : 0) + C::REC_STAGE + vbytes);
    sm90::bulk_load(s_rec, packed + P::REC_OFF + (size_t)(blk.first_stage + it) * C::REC_STAGE,
                    C::REC_STAGE, full + 8 * s);
    if (vbytes)
      sm90::bulk_load(s_val, section<unsigned short>(packed, P::VAL_OFF) + first, vbytes,
                      full + 8 * s);
  };
  // launched as a programmatic dependent (SF_DECLARE_PDL): the weights of
  // the first stages (as many as the slots hold) while the stream's
  // previous kernel drains; X only after the wait
  const int early = blk.stages < S ? blk.stages : S;
  if (lane == 0)
    for (int it = 0; it < early; ++it) produce_weights(it, it);
  sm90::griddep_wait();
#pragma unroll 1
  for (int it = 0, s = 0, round = 0; it < blk.stages; ++it) {
    if (it >= S) sm90::mbar_wait(empty + 8 * s, (round - 1) & 1);
    if (lane == 0) {
      const unsigned st = s_base + s * C::STAGE_BYTES;
      const int k0 = 16 * s_kid[it * C::KS];
      if (it >= early) produce_weights(it, s);
      if (use_map) {
        if constexpr (C::TM) {
          sm90::tma_load_2d(st, map, k0, n0, full + 8 * s);
        } else {
#pragma unroll
          for (int a = 0; a < C::BN / 64; ++a)
            sm90::tma_load_2d(st + a * C::BK * 128, map, n0 + 64 * a, k0, full + 8 * s);
        }
      }
    }
    if constexpr (!C::TM) {
      if (!use_map) {  // fm, N % 8 != 0: the warp copies X's tile element by element
        const int k0 = 16 * s_kid[it * C::KS];
        const unsigned st = s_base + s * C::STAGE_BYTES;
        constexpr int CPR = C::BN / 8;
#pragma unroll 1
        for (int i = lane; i < C::BK * CPR; i += 32) {
          const int row = i / CPR, ch = i % CPR, gk = k0 + row;
          unsigned w[4];
          load8_bounded(x, gk, n0 + 8 * ch, P::K, n_len, w);
          sm80::st_shared_16(st + 16u * x_chunk<C>(row, ch), w);
        }
        sm90::fence_proxy_async();  // the stores -> the wgmma's proxy
        sm90::mbar_arrive(full + 8 * s);
      }
    }
    __syncwarp();
    if (++s == S) {
      s = 0;
      ++round;
    }
  }
}

// A CTA of WARPS consumer warps (WM / 4 warpgroups, one strip a warp) and
// a producer warp.  The consumers wait for each stage's `full` barrier,
// decode and issue their wgmma as wg_stage does, and release the stage
// (one arrival a warp on its `empty` barrier) at the end of the next
// stage, whose first wait saw the stage's last wgmma done.  No CTA-wide
// barrier inside the main loop.
template <class C, class P>
__device__ __forceinline__ void gemm_block_tma(const unsigned char *__restrict__ packed,
                                               const sm90::TensorMap *map,
                                               const unsigned short *__restrict__ x,
                                               unsigned short *__restrict__ y, int n_len, int n0,
                                               const Block &blk, unsigned char *smem) {
  using T = typename C::elem_t;
  constexpr int S = C::STAGES;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const unsigned s_base = sm80::smem_addr(smem);
  const unsigned bars = s_base + C::BAR_OFF;
  const unsigned full = bars, empty = bars + 8 * S;
  const int n = blk.stages;
  if constexpr (C::CK > 1) split_recv_init<C>(s_base);

  using L = StageLoader<C, P>;
  const L ld(packed, smem + C::PIPE_BYTES);
  ld.load_table(blk.first_stage, n);
  const unsigned *s_voff = ld.s_voff;
  // the runtime maps X unless its rows are not 16-byte aligned (fm, N % 8 != 0)
  const bool use_map = C::TM || (n_len & 7) == 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      sm90::mbar_init(full + 8 * s, use_map ? 1 : 33);  // without the map, the warp's 32 too
      sm90::mbar_init(empty + 8 * s, C::WARPS);
    }
    sm90::fence_mbar_init();
  }
  __syncthreads();  // the stage table and the barriers are ready

  if (warp == C::WARPS) {  // the producer; its copies land before the consumers finish
    tma_produce<C, P>(packed, map, use_map, x, n_len, s_base, ld.s_kid, ld.s_voff, bars, blk,
                      n0, lane);
    sm90::griddep_launch_dependents();  // its last copy is issued: the next kernel may start
    if constexpr (!C::SPLIT) return;  // (a split's sums meet with every thread: stay)
  } else {
    // (the accumulators live in this branch alone: ptxas serializes the
    // wgmma when another path defines them)
    float acc[1][C::NF][4];
#pragma unroll
    for (int ni = 0; ni < C::NF; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
    unsigned a[2][4];  // the two sets of A registers (!SA)
    const LaneBits lb(lane);
    // SA: this lane's row of the stmatrix that stores a tile's A fragment
    // (matrix lane / 8: rows +8 for odd ones, the second 8 columns for the
    // upper two), in its warpgroup's A tile of the buffer
    const int g = warp >> 2, q = lane >> 3;
    const int a_row = 16 * (warp & 3) + (lane & 7) + 8 * (q & 1);
    const unsigned a_tile = s_base + C::A_OFF + g * C::A_GROUP;
    // (entry jj's chunk is 2 jj + q / 2: 2 jj XOR the lane's constant part)
    const unsigned a_lane = a_tile + 16u * swizzled_chunk<C::BK / 8>(a_row, q >> 1);
    const unsigned long long a_desc0 = kmajor_desc<C>(a_tile, 0);
#pragma unroll 1
    for (int it = 0, s = 0, round = 0; it < n; ++it) {
      sm90::mbar_wait(full + 8 * s, round & 1);
      const unsigned st = s_base + s * C::STAGE_BYTES;
      const unsigned char *stage = smem + s * C::STAGE_BYTES;
      // the copy starts at the stage's first value rounded down to 8
      const unsigned short *vals =
          reinterpret_cast<const unsigned short *>(stage + C::X_BYTES + C::REC_STAGE) +
          (s_voff[it] & 7u);
      const unsigned long long d0 = x_desc<C>(st, 0);
      // every tile's mask and first value first (their loads overlap), then
      // each tile's values
      LaneTile lt[C::KSW];
#pragma unroll
      for (int jj = 0; jj < C::KSW; ++jj) lt[jj] = tma_lane_tile<C>(stage, jj, warp, lb, lane);
      if constexpr (C::SA) {
        // the stage's tiles into A buffer it % 2 (its wgmma two stages ago
        // is done: the last stage's wait_group), the warpgroup's four warps
        // meet, then the stage's wgmma, all from shared memory
        const unsigned buf = (it & 1) * C::A_BUF;
#pragma unroll
        for (int jj = 0; jj < C::KSW; ++jj) {
          unsigned v[4];
          tma_tile_values<C>(v, vals, lt[jj]);
          // the swizzle XORs the chunk with the row: entry jj's chunk 2 jj + q / 2
          // is the lane's chunk for jj = 0 XOR 2 jj
          sm90::stmatrix_x4((a_lane ^ (32u * jj)) + buf, v);
        }
        sm90::fence_proxy_async();  // the stores -> the wgmma's proxy
        sm90::named_sync(2 + g, 128);
        sm90::fence();
        const unsigned long long da = a_desc0 + (buf >> 4);
#pragma unroll
        for (int jj = 0; jj < C::KSW; ++jj)
          sm90::mma<T, C::BN, 0, C::TM ? 0 : 1>(acc[0], da + KMAJOR_DESC_STEP * jj,
                                               d0 + X_DESC_STEP<C> * jj);
        sm90::commit_group();
        sm90::wait_group<1>();
      } else {
        // each tile's values before its wgmma
#pragma unroll
        for (int jj = 0; jj < C::KSW; ++jj) {
          tma_tile_values<C>(a[jj & 1], vals, lt[jj]);
          sm90::fence();
          sm90::mma_rs<T, C::BN, C::TM ? 0 : 1>(acc[0], a[jj & 1], d0 + X_DESC_STEP<C> * jj);
          sm90::commit_group();
          sm90::wait_group<1>();
        }
      }
      // the previous stage's last wgmma is done (this stage's first wait):
      // release its slot (no branch among the wgmma: ptxas would serialize them)
      __syncwarp();
      if (it > 0 && lane == 0) sm90::mbar_arrive(empty + 8 * (s == 0 ? S - 1 : s - 1));
      if (++s == S) {
        s = 0;
        ++round;
      }
    }
    sm90::wait_group<0>();
    sm90::fence_accumulators(acc[0]);  // no read of them above the wait
    sm90::griddep_launch_dependents();
    // the stream's previous kernel is done before Y is written (here it
    // is: X's copies waited for it; not so for a block of no stage)
    sm90::griddep_wait();
    // every stage is consumed (and every copy into it landed): the
    // pipeline's shared memory takes the output tile or, split (CK > 1),
    // the fp32 partials (the consumers alone: named barriers of their count)
    const int m0 = blk.first_row;
    sm90::named_sync(1, 32 * C::WARPS);
    if constexpr (C::SPLIT) {
      fragments_to_partials<C>(acc, reinterpret_cast<float *>(smem), warp, 0, lane);
    } else {
      unsigned short *s_c = reinterpret_cast<unsigned short *>(smem);
      fragments_to_tile<C, P>(acc, s_c, packed, m0, warp, lane);
      sm90::named_sync(1, 32 * C::WARPS);  // the output tile is complete
      store_tile<C, P, 32 * C::WARPS>(s_c, y, n_len, m0, n0);
    }
  }
  if constexpr (C::SPLIT) {
    // split K over a cluster: the CTAs' partials added in distributed
    // shared memory, each CTA finishing a share of the rows (every thread)
    __syncthreads();
    finish_split<C, P>(reinterpret_cast<float *>(smem), packed, y, n_len, blk.first_row, n0);
  }
}

// The block this CTA computes (blockIdx.x = schedule slot * CK + cluster
// rank); false when it has none.
template <class C, class P>
__device__ __forceinline__ bool cta_block(const unsigned char *packed, int n_len, Block &blk) {
  const int slot = blockIdx.x / C::CK;
  if (P::NUM_BLOCKS == 0 || slot >= P::NUM_BLOCKS || n_len <= 0) return false;
  const int rank = C::CK > 1 ? static_cast<int>(cluster_rank()) : 0;
  blk = load_block<C, P>(packed, slot, rank);
  return true;
}

// Entry of the TMA kernels: as kernel(), with X's tensor map.
template <class C, class P>
__device__ __forceinline__ void kernel_tma(const unsigned char *__restrict__ packed,
                                           const void *__restrict__ x_, void *__restrict__ y_,
                                           int n_len, const sm90::TensorMap *map) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Block blk;
  if (!cta_block<C, P>(packed, n_len, blk)) return;
  unsigned char *smem = smem_raw + ((1024u - (sm80::smem_addr(smem_raw) & 1023u)) & 1023u);
  gemm_block_tma<C, P>(packed, map, static_cast<const unsigned short *>(x_),
                       static_cast<unsigned short *>(y_), n_len,
                       static_cast<int>(blockIdx.y) * C::BN, blk, smem);
}

// Entry: blockIdx.x = schedule slot * CK + cluster rank, blockIdx.y = tile of N.
template <class C, class P>
__device__ __forceinline__ void kernel(const unsigned char *__restrict__ packed,
                                       const void *__restrict__ x_, void *__restrict__ y_,
                                       int n_len) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Block blk;
  if (!cta_block<C, P>(packed, n_len, blk)) return;
  const int n0 = blockIdx.y * C::BN;
  // WG: the swizzled tiles need a 1024-byte aligned base (1 KB is reserved)
  unsigned char *smem =
      C::WG ? smem_raw + ((1024u - (sm80::smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;
  const unsigned short *x = static_cast<const unsigned short *>(x_);
  unsigned short *y = static_cast<unsigned short *>(y_);
  const bool aligned = (reinterpret_cast<unsigned long long>(x_) & 15) == 0;
  const bool vec = aligned && (C::TM ? P::K % 8 == 0 : (n_len & 7) == 0);
  if (vec)
    gemm_block<C, P, true>(packed, x, y, n_len, n0, blk, smem);
  else
    gemm_block<C, P, false>(packed, x, y, n_len, n0, blk, smem);
}

}  // namespace csr_tc
}  // namespace sf
