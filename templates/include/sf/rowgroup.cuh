// rowgroup.cuh -- the row-group gather GEMM behind the `bsr` and `shflbw`
// families: fp16 or bf16 operands, fp32 accumulation, mma.sync m16n8k16
// (sm_80 and newer).  Feature-major (X is K x N, Y is M x N, row-major) or
// token-major (X is N x K, Y is N x M).
//
// The weight matrix is cut into row groups of at most BM rows.  Group g owns
// a list of k_g column indices (padded with zero-weight entries to a
// multiple of BK) and a dense BM x k_g weight tile, so that
//     Y[rows of g, :] = epilogue(W_g . X[cols of g, :]).
// shflbw: a group is V consecutive rows of the permuted matrix and its list
// is the group's column support.  bsr: a group is one block-row (or several
// short ones) and its list is its nonzero blocks' columns, in runs of bc.
//
// One CTA computes one group x BN columns of N.  The kernel body reads:
//     slot = the group this CTA owns (longest groups first)
//     row map -> shared memory
//     prologue: the first chunks' row indices (one round trip), then
//               STAGES-1 chunks in flight (cp.async)
//     main loop: wait for chunk c; issue chunk c+STAGES-1; MMAs on chunk c
//     epilogue: scale, bias, activation in registers -> shared tile ->
//               16-byte stores into the group's original rows
// Streamed tiles (TN > 1, wgmma path): the CTA computes TN tiles of BN
// columns in turn, its copies running on from one tile's chunks into the
// next's, so that the next tile's first chunks load during this tile's
// epilogue (whose shared tile sits in the two stages just consumed); the
// slot, row map and bias are read once for all of them.  The planner may
// give a long group fewer tiles per CTA (its span: TN, TN/2, ... 1; the
// group then has TN/span slots, each starting `span` tiles further along),
// so that no CTA runs much more than TN times the mean group's chunks.
//
// Packed sections (their byte offsets are Problem constants; all 16-byte
// aligned):
//     weights  T[chunks][BM][BK]   one BK-chunk of a group: one contiguous run
//     indices  int32[chunks][BK]   the rows of X that chunk gathers
//     slots    int4[NUM_SLOTS]     {first chunk, chunks, first row, rows}
//                                  (TN > 1: rows | code << 16, code bits 0-3:
//                                  log2(TN / span), 4-11: first tile of the span)
//     rows     int32[M]            permuted position -> original row
//                                  (only when PERMUTED)
//     bias     float32[M]          in the order of positions (the rows section's; only
//                                  when HAS_BIAS), so a tile row's bias needs no row map
//
// The Problem type (generated per matrix) provides:
//     M, K, NUM_SLOTS, W_OFF, IDX_OFF, SLOT_OFF, ROWS_OFF, BIAS_OFF,
//     PERMUTED, HAS_BIAS, ACT, SCALE, RESIDENT (CTAs an SM holds), CLASSES and
//     class_end (the runs of equal-cost slots: tail_first; absent for persistent CTAs),
//     RUNS8 (token-major: every aligned run of 8 indices is 8 consecutive,
//     8-aligned columns and K % 8 == 0, so one 16-byte load gathers a run).
//
// The wgmma path (WG, sm_90a) keeps the loaders, the schedule and the
// epilogue and swaps the compute: each warpgroup issues wgmma.m64nNk16
// straight from shared memory, A = the weight chunk (K-major, swizzled to
// its row width: 32, 64 or 128 bytes for BK = 16, 32, 64) and B = the
// gathered X tile: feature-major MN-major (128-byte swizzle) stored as
// columns of 64-wide atoms; token-major the BN x BK tile of the mma.sync
// path, K-major with A's swizzle.  The tile has BM = 64 x (warpgroups
// along M) rows; a group of AM < 64 rows leaves the rest of the A tile
// zero.  The pipeline keeps
// STAGES-2 chunks in flight and one wgmma group running behind the one
// being issued.
//
// The shared-gather path (XR > 0, feature-major, mma.sync) gives a CTA XR
// groups and gathers the union of their columns once per chunk: a chunk
// holds BK entries of every group and at most U rows of X (slot s holds
// row indices[s], -1: not loaded); each group entry names its slot in a
// per-chunk byte table, and the group's warps read their B fragments from
// those slots (ldmatrix.trans with per-lane row addresses).  The packing
// is generator/families/xshare.py.  Its slots table gives each set's first
// row in the rows section, which then holds original rows directly.
//
// The TMA-fed path (TMA, sm_90a, token-major, wgmma; chunks that are one
// run of X's columns: bsr): a producer warp copies each chunk's weights
// (stored in the A tile's swizzled order) by one bulk copy and X's BN x BK
// box by one tensor load, the consumer warpgroups run wgmma between full
// and empty mbarriers (gemm_group_tma); optionally streamed tiles (TN) or
// persistent CTAs (PC: the grid, each CTA running items k * PC + b, in
// rounds of alternating direction: gemm_persistent), the output tile
// then in shared memory of its own so the copies run on across tiles.
//
// Split K (KS > 1, mma.sync, sm_90a; for few columns of N, where the
// groups alone give too few CTAs to fill the GPU): the grid gains a z axis
// of KS, a cluster (1, 1, KS) shares one (group, tile of N), CTA z runs
// chunks [z * chunks / KS, (z + 1) * chunks / KS) and the partial tiles
// meet in rank 0's shared memory (reduce_split) before its epilogue.
//
// Token-major differs in three pieces only: the B loader (a 16-byte run of
// one token's row per load, or element loads), the B fragments (ldmatrix
// without .trans from an N x BK tile) and the output tile (N-major, stored
// as runs of 8 consecutive rows of one token when the rows are contiguous).
#pragma once

#include "sf/common.cuh"
#include "sf/mma_sm80.cuh"
#include "sf/mma_sm90.cuh"
#include "sf/tma_sm90.cuh"

namespace sf {
namespace rowgroup {

// ---- configuration ------------------------------------------------------------

template <typename T, int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, bool TM_ = false,
          bool WG_ = false, int AM_ = BM_, int XR_ = 0, int U_ = 0, int TN_ = 1, int KS_ = 1,
          bool TMA_ = false, int PC_ = 0>
struct Config {
  using elem_t = T;
  static constexpr bool TM = TM_;         // token-major X and Y
  static constexpr bool WG = WG_;         // wgmma (sm_90a) instead of mma.sync
  static constexpr int BM = BM_;          // rows of a CTA tile = rows of a group, padded to 16 (to 64: WG)
  static constexpr int AM = AM_;          // rows of a packed weight chunk (the group's, padded to 16)
  static constexpr int BN = BN_;          // columns of N per CTA
  static constexpr int BK = BK_;          // K depth of one stage = one packed chunk
  static constexpr int WM = WM_;          // warps along M
  static constexpr int WN = WN_;          // warps along N
  static constexpr int STAGES = STAGES_;  // cp.async pipeline depth
  static constexpr int XR = XR_;          // shared gather: groups per CTA (0: one group)
  static constexpr bool XS = XR_ > 0;
  static constexpr int U = U_;            // shared gather: rows of X a chunk holds
  static constexpr int B_ROWS = XS ? U : BK;  // fm B tile rows
  // the B tile is token-major (BN x BK) on the tm gather; the shared gather
  // stores even token-major X as the feature-major union tile (U x BN)
  static constexpr bool TMB = TM && !XS;
  static constexpr int TN = TN_;          // tiles of N one CTA computes in turn (streamed)
  static constexpr int KS = KS_;          // split K: CTAs of a cluster (along z) sharing a group
  static constexpr bool TMA = TMA_;       // stages fed by TMA from a producer warp (WG, TM)
  static constexpr int PC = PC_;          // TMA: persistent CTAs (the grid), each running a
                                          // share of the (group, tile of N) items; 0: one a CTA

  static constexpr int WARPS = WM * WN;   // the warps that compute (TMA: the consumers)
  static constexpr int THREADS = 32 * WARPS + (TMA ? 32 : 0);
  static constexpr int WTM = BM / WM;     // rows of one warp's tile
  static constexpr int WTN = BN / WN;     // columns of one warp's tile
  static constexpr int MF = WTM / 16;     // m16 fragments per warp
  static constexpr int NF = WTN / 8;      // n8 fragments per warp
  static constexpr int A_ROW_CH = BK / 8;  // 16-byte chunks in a row of the A tile
  // B tile: BK x BN (fm, rows are k) or BN x BK (tm, rows are tokens)
  static constexpr int B_ROW_CH = TMB ? BK / 8 : BN / 8;
  static constexpr int A_CHUNKS = AM * A_ROW_CH;
  static constexpr int B_CHUNKS = B_ROWS * BN / 8;
  static constexpr int A_ITERS = (A_CHUNKS + THREADS - 1) / THREADS;
  static constexpr int B_ITERS = (B_CHUNKS + THREADS - 1) / THREADS;
  static constexpr int A_BYTES = BM * BK * 2;
  static constexpr int B_BYTES = B_ROWS * BN * 2;
  static constexpr int LOC_BYTES = XS ? XR * BK : 0;  // shared gather: each entry's slot
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES + LOC_BYTES;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
  // output tile: BM x BN (fm) or BN x BM (tm), rows padded by 16 bytes
  static constexpr int C_LD = TM ? BM + 8 : BN + 8;
  static constexpr int C_ROWS = TM ? BN : BM;
  static constexpr int C_ROW_CH = (C_LD - 8) / 8;  // 16-byte chunks of a tile row
  static constexpr int C_BYTES = C_ROWS * C_LD * 2;
  static constexpr int C_HALF = C_ROWS / 2;             // the tile's rows come in two halves
  static constexpr int C_HALF_BYTES = C_HALF * C_LD * 2;
  // TMA with streamed tiles: the output tile has its own shared memory, so
  // the producer fills the stages with the next tile's chunks during an
  // epilogue; otherwise it takes the drained stages
  static constexpr bool C_APART = TMA_ && (TN_ > 1 || PC_ > 0);
  static constexpr int C_OFF = C_APART ? PIPE_BYTES : 0;
  static constexpr int TILE_BYTES =
      C_APART ? PIPE_BYTES + C_BYTES : (PIPE_BYTES > C_BYTES ? PIPE_BYTES : C_BYTES);
  static constexpr int ROWMAP_OFF = TILE_BYTES;
  // the row map: BM original rows, then their BM biases (persistent: two,
  // one an item in turn, so an item's map is written while the one
  // before's stores read theirs)
  static constexpr int ROWMAP_BYTES = BM * 8 * (PC_ > 0 ? 2 : 1);
  // TMA: each stage's `full` and `empty` mbarriers (8 bytes each)
  static constexpr int BAR_OFF = ROWMAP_OFF + ROWMAP_BYTES;
  static constexpr int BAR_BYTES = TMA ? 16 * STAGES : 0;
  // WG: the base is rounded up to 1024 bytes in the kernel (the swizzle
  // repeat), so 1 KB more is asked for
  static constexpr int ALIGN_PAD = WG ? 1024 : 0;
  // split K: the fp32 partial tiles the cluster's other CTAs push to rank
  // 0 ([KS - 1][BM * BN / 4 / THREADS][THREADS] float4s; never reused, as
  // they may come while rank 0 still computes) and the barrier counting them
  static constexpr int RECV_OFF = BAR_OFF + BAR_BYTES;
  static constexpr int RECV_BYTES = KS > 1 ? (KS - 1) * BM * BN * 4 : 0;
  static constexpr int RBAR_OFF = RECV_OFF + RECV_BYTES;
  static constexpr int SMEM_BYTES = RBAR_OFF + (KS > 1 ? 16 : 0) + ALIGN_PAD;  // dynamic shared memory
  static constexpr int WG_M = BM / 64;    // WG: warpgroups along M
  static constexpr int WG_N = BN / WN;    // WG: the N of each warpgroup's wgmma

  static_assert(sizeof(T) == 2, "tensor-core path takes 16-bit elements");
  static_assert(KS == 1 || (!WG && !XS && TN == 1), "split K is on the mma.sync path alone");
  static_assert(!TMA || (WG && TM && !XS && KS == 1), "the TMA path is token-major wgmma");
  static_assert(PC == 0 || (TMA && TN == 1), "persistent CTAs are the TMA path's, one tile an item");
  // The configuration's constraints are asserted by the generated source,
  // from the table the search space filters with
  // (generator/families/rowgroup/space.py).
};

// ---- shared-memory swizzle --------------------------------------------------------

// Index (in 16-byte chunks) of chunk `ch` of row `row` in a tile whose rows
// hold ROW_CH chunks (a power of two).  The XOR spreads the 8 rows an
// ldmatrix phase reads at one logical chunk over the 8 distinct 16-byte
// bank groups of a 128-byte line, for any row width.
template <int ROW_CH>
__device__ __forceinline__ int swizzle(int row, int ch) {
  constexpr int LINE_ROWS = ROW_CH >= 8 ? 1 : 8 / ROW_CH;  // rows sharing a 128-byte line
  constexpr int MASK = ROW_CH >= 8 ? 7 : ROW_CH - 1;
  return row * ROW_CH + (ch ^ ((row / LINE_ROWS) & MASK));
}

// ---- the group a CTA owns -------------------------------------------------------------

struct Slot {
  int first_chunk;  // of the group's packed weights and indices
  int chunks;       // BK-chunks (0 for an empty group)
  int first_row;    // permuted position (or row) of the group's row 0
  int rows;         // rows that exist (<= BM)
};

template <class P>
__device__ __forceinline__ Slot load_slot(const unsigned char *packed, int s) {
  const int4 v = section<int4>(packed, P::SLOT_OFF)[s];
  return Slot{v.x, v.y, v.z, v.w};
}

// Original row of each of the group's BM tile rows (-1 past its last row)
// into s_rows[0, BM), and, HAS_BIAS, its bias into the BM floats after
// them.  Both loads depend on the slot only (the bias is stored by
// position), and the caller issues them behind the first chunks' copies,
// so the epilogue reads shared memory only.
// One tile row's entry of the map: its original row (-1 past the group's
// end) and bias, read (row_entry) and stored (store_row_entry) apart so a
// caller can hide the read's latency.
struct RowEntry {
  int orig = -1;
  float bias = 0.0f;
};

template <class Cfg, class P>
__device__ __forceinline__ RowEntry row_entry(const unsigned char *packed, const Slot &slot,
                                              int r) {
  RowEntry e;
  if (r < slot.rows) {
    e.orig = Cfg::XS || P::PERMUTED ? __ldg(section<int>(packed, P::ROWS_OFF) + slot.first_row + r)
                                    : slot.first_row + r;
    if (P::HAS_BIAS) e.bias = __ldg(section<float>(packed, P::BIAS_OFF) + slot.first_row + r);
  }
  return e;
}

template <class Cfg, class P>
__device__ __forceinline__ void store_row_entry(int *s_rows, int r, const RowEntry &e) {
  s_rows[r] = e.orig;
  if (P::HAS_BIAS) reinterpret_cast<float *>(s_rows)[Cfg::BM + r] = e.bias;
}

template <class Cfg, class P>
__device__ __forceinline__ void load_row_map(const unsigned char *packed, const Slot &slot,
                                             int *s_rows) {
  for (int r = threadIdx.x; r < Cfg::BM; r += Cfg::THREADS)
    store_row_entry<Cfg, P>(s_rows, r, row_entry<Cfg, P>(packed, slot, r));
}

// ---- tile loaders ---------------------------------------------------------------------

// The 16-byte slots of a ROWS x ROW_CH-chunk shared tile that one thread
// fills: rows row0, row0 + STEP, ... (ITERS of them) at one chunk column.
// With STEP a multiple of 8 the swizzle repeats, so slot i sits at a
// constant offset from slot 0.
//
// ATOMS (the wgmma B tile): the ROWS x ROW_CH tile is stored as ROW_CH/8
// columns of 8-chunk-wide (64-element) atoms, each ROWS rows of 128 bytes
// with the 128-byte swizzle: chunk (row, ch) sits at
//     (ch / 8) * ROWS * 8 + row * 8 + ((ch % 8) ^ (row % 8)).
template <int ROW_CH, int ROWS, int THREADS, bool ATOMS = false>
struct TileSlots {
  static constexpr int CHUNKS = ROWS * ROW_CH;
  static constexpr int ITERS = (CHUNKS + THREADS - 1) / THREADS;
  static constexpr int STEP = THREADS / ROW_CH;
  static constexpr int ROW_STRIDE = ATOMS ? 8 : ROW_CH;  // chunks from a row to the next
  static_assert(THREADS % ROW_CH == 0, "a thread keeps one chunk column");
  static_assert(!ATOMS || ROW_CH % 8 == 0, "atoms are 8 chunks wide");

  __device__ __forceinline__ static int chunk(int row, int ch) {
    if (ATOMS) return (ch >> 3) * (ROWS * 8) + row * 8 + ((ch & 7) ^ (row & 7));
    return swizzle<ROW_CH>(row, ch);
  }

  int row0, col;

  __device__ __forceinline__ TileSlots()
      : row0(static_cast<int>(threadIdx.x) / ROW_CH), col(static_cast<int>(threadIdx.x) % ROW_CH) {}

  __device__ __forceinline__ static bool owns(int i) {
    return CHUNKS % THREADS == 0 || static_cast<int>(threadIdx.x) + i * THREADS < CHUNKS;
  }
  __device__ __forceinline__ int row(int i) const { return row0 + i * STEP; }
  __device__ __forceinline__ unsigned offset(int i) const {  // bytes into the tile
    if (STEP % 8 == 0) return 16u * (chunk(row0, col) + i * STEP * ROW_STRIDE);
    return 16u * chunk(row(i), col);
  }
};

// A: one packed chunk (AM x BK, contiguous) -> the stage's A tile.
template <class Cfg>
__device__ __forceinline__ void load_a_tile(unsigned s_a, const unsigned short *w_chunk) {
  using S = TileSlots<Cfg::A_ROW_CH, Cfg::AM, Cfg::THREADS>;
  const S slots;
#pragma unroll
  for (int i = 0; i < S::ITERS; ++i) {
    if (S::owns(i))
      sm80::cp_async_16(s_a + slots.offset(i), w_chunk + 8 * (threadIdx.x + i * Cfg::THREADS), true);
  }
}

// B, feature-major: BK gathered rows of X, columns [n0, n0 + BN), into a
// BK x BN tile.  A thread owns one 16-byte column chunk of ITERS rows; the
// row indices of the next chunk are fetched into registers one iteration
// early so that their latency hides behind the MMAs.  VEC: N % 8 == 0 and X
// 16-byte aligned (cp.async, zero-filled past N); else element loads.
template <class Cfg, bool VEC>
struct BLoaderFM {
  using S = TileSlots<Cfg::B_ROW_CH, Cfg::B_ROWS, Cfg::THREADS, Cfg::WG>;
  struct Idx {              // the rows of X one chunk gathers, this thread's
    int row[S::ITERS];
  };
  static constexpr int DEPTH = 1;  // chunks whose indices (and loads) are in flight at once
  S slots;
  Idx next[DEPTH];          // the chunk issued next
  const unsigned short *x0; // X
  const unsigned char *xc;  // X + this thread's first column (X itself past N: nothing is read)
  unsigned pitch;           // bytes from a row of X to the next
  int n_len;                // N
  int col;                  // this thread's first column (absolute)

  __device__ __forceinline__ void flush(int = 0) {}  // (its loads are copies: nothing held)

  __device__ __forceinline__ BLoaderFM(const unsigned short *x, int n, int n0)
      : x0(x), pitch(2u * static_cast<unsigned>(n)), n_len(n) {
    col = n0 + 8 * slots.col;
    xc = reinterpret_cast<const unsigned char *>(col < n_len ? x + col : x);
#pragma unroll
    for (int i = 0; i < S::ITERS; ++i) next[0].row[i] = 0;
  }

  // streamed tiles: the copies from here on fill the next tile of N
  __device__ __forceinline__ void advance() {
    col += Cfg::BN;
    xc = reinterpret_cast<const unsigned char *>(col < n_len ? x0 + col : x0);
  }

  __device__ __forceinline__ void fetch(Idx &dst, const int *chunk_idx) const {
    const int *p = chunk_idx + slots.row0;  // this thread's rows sit at immediate offsets
#pragma unroll
    for (int i = 0; i < S::ITERS; ++i)
      if (S::owns(i)) dst.row[i] = __ldg(p + i * S::STEP);
  }

  __device__ __forceinline__ void load(const Idx &idx, unsigned s_b, int = 0) const {
    const bool in = col < n_len;
#pragma unroll
    for (int i = 0; i < S::ITERS; ++i) {
      if (!S::owns(i) || (Cfg::XS && idx.row[i] < 0)) continue;  // XS: an empty slot
      const unsigned dst = s_b + slots.offset(i);
      // one wide multiply-add: the row index is never negative here
      const unsigned short *src = reinterpret_cast<const unsigned short *>(
          xc + static_cast<size_t>(static_cast<unsigned>(idx.row[i])) * pitch);
      if (VEC) {
        sm80::cp_async_16(dst, src, in);
      } else {
        unsigned w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const unsigned lo = col + 2 * e < n_len ? src[2 * e] : 0u;
          const unsigned hi = col + 2 * e + 1 < n_len ? src[2 * e + 1] : 0u;
          w[e] = lo | (hi << 16);
        }
        sm80::st_shared_16(dst, w);
      }
    }
  }
};

// B, token-major: BN token rows of X (tokens [n0, n0 + BN)), each gathered
// at the chunk's BK columns, into a BN x BK tile.  VEC (RUNS8 and X
// aligned): a thread owns one run of 8 consecutive aligned columns for
// ITERS tokens, one cp.async of 16 bytes per token, zero-filled past N; its
// start is prefetched like the fm row indices.  Otherwise element loads
// with the lanes of a warp along the chunk's columns (min(BK, 32) lanes per
// token, BK / 32 columns a lane when BK = 64): a warp's load reads one
// token's columns, which lie within a few sectors of its row of X (lanes
// along tokens would touch a sector per lane).  A lane's columns are
// prefetched with the chunk (fetch); `load` issues the chunk's loads into
// registers and, where they fit (HOLD: at most 32 a thread), leaves them
// in flight: `flush` stores them at the top of the next main-loop
// iteration, so their latency runs under one stage's MMAs.
template <class Cfg, bool VEC, int K>
struct BLoaderTM {
  using S = TileSlots<Cfg::B_ROW_CH, Cfg::BN, Cfg::THREADS>;
  // element path: lanes per token, columns per lane, tokens per warp and per CTA step
  static constexpr int LPT = Cfg::BK < 32 ? Cfg::BK : 32;
  static constexpr int EPL = Cfg::BK / LPT;
  static constexpr int TPW = 32 / LPT;
  static constexpr int TSTEP = Cfg::THREADS / 32 * TPW;
  static constexpr int TITERS = Cfg::BN / TSTEP;
  static_assert(VEC || Cfg::BN % TSTEP == 0, "the element gather's steps tile BN");
  static constexpr bool HOLD = !VEC && TITERS * EPL <= 32;
  // DEPTH 2 (a few tokens: decode): two chunks' columns and loads in
  // flight, each chunk's held loads stored two main-loop iterations after
  // they are issued and its columns fetched two ahead, so that each
  // latency runs under two stages, not one (the stage a held chunk fills
  // is read AHEAD >= 2 iterations after its issue: mma.sync, 3 stages or
  // more, one tile of N)
  static constexpr int DEPTH =
      HOLD && !Cfg::WG && Cfg::TN == 1 && Cfg::STAGES >= 3 && 2 * TITERS * EPL <= 32 ? 2 : 1;
  struct Idx {
    int run;                 // first column of this thread's run (VEC)
    int cols[VEC ? 1 : EPL]; // this lane's columns (element loads)
  };
  S slots;
  Idx next[DEPTH];           // the chunks issued next (main-loop iteration parity)
  int tok0;                  // VEC: this thread's first token (absolute)
  int tl0;                   // element loads: this lane's first token (in the tile)
  int lc;                    // ... and its first column (in the chunk)
  const unsigned short *x;
  int n_len, n0;
  // element loads over a few tokens (decode): this lane's token rows of X
  // (row 0 past N), fixed for the CTA, kept in registers so that a load is
  // one add off its row (18% fewer instructions a stage, 2-4% faster at
  // N = 16 on an H100); over many tokens they would take the registers
  static constexpr bool ROWS = !VEC && TITERS <= 8;
  const unsigned short *rows[ROWS ? TITERS : 1];
  // HOLD: loaded, not yet stored (one chunk a parity), and their B tiles (0: none)
  unsigned short held[DEPTH][HOLD ? TITERS : 1][HOLD ? EPL : 1];
  unsigned held_dst[DEPTH];

  __device__ __forceinline__ BLoaderTM(const unsigned short *x_, int n, int n0_)
      : next{}, x(x_), n_len(n), n0(n0_), held_dst{} {
    tok0 = n0 + slots.row0;
    const int lane = threadIdx.x & 31;
    tl0 = (threadIdx.x >> 5) * TPW + lane / LPT;
    lc = lane % LPT;
    set_rows();
  }

  __device__ __forceinline__ void set_rows() {
    if constexpr (ROWS) {
#pragma unroll
      for (int i = 0; i < TITERS; ++i) {
        const int tok = n0 + tl0 + i * TSTEP;
        const bool in = tok < n_len;
        // opaque to the compiler, which otherwise recomputes the row in every stage
        unsigned long long r = reinterpret_cast<unsigned long long>(x + (size_t)(in ? tok : 0) * K);
        asm volatile("mov.b64 %0, %0;" : "+l"(r));
        rows[i] = reinterpret_cast<const unsigned short *>(r);
      }
    }
  }

  // streamed tiles: the copies from here on fill the next tile of N
  __device__ __forceinline__ void advance() {
    n0 += Cfg::BN;
    tok0 += Cfg::BN;
    set_rows();
  }

  __device__ __forceinline__ void fetch(Idx &dst, const int *chunk_idx) const {
    if (VEC) {
      dst.run = __ldg(chunk_idx + 8 * slots.col);
    } else {
#pragma unroll
      for (int j = 0; j < EPL; ++j) dst.cols[j] = __ldg(chunk_idx + lc + 32 * j);
    }
  }

  // The byte offset of (token row t, chunk column c) in the B tile.
  __device__ __forceinline__ static unsigned elem_offset(int t, int c) {
    return 16u * S::chunk(t, c >> 3) + 2u * (c & 7);
  }

  // `par` (a constant once inlined): the slot of held loads (DEPTH 2, the
  // main-loop iteration's parity)
  __device__ __forceinline__ void load(const Idx &idx, unsigned s_b, int par = 0) {
    if constexpr (VEC) {
#pragma unroll
      for (int i = 0; i < S::ITERS; ++i) {
        if (!S::owns(i)) continue;
        const int tok = tok0 + i * S::STEP;
        const bool in = tok < n_len;
        sm80::cp_async_16(s_b + slots.offset(i), x + (size_t)(in ? tok : 0) * K + idx.run, in);
      }
    } else {
      unsigned short v[TITERS][EPL];
#pragma unroll
      for (int i = 0; i < TITERS; ++i) {
        const int tok = n0 + tl0 + i * TSTEP;
        const bool in = tok < n_len;
        const unsigned short *row = ROWS ? rows[ROWS ? i : 0] : x + (size_t)(in ? tok : 0) * K;
#pragma unroll
        for (int j = 0; j < EPL; ++j)  // (ROWS: the opaque rows lost the global space: __ldg)
          v[i][j] = in ? (ROWS ? __ldg(row + idx.cols[j]) : row[idx.cols[j]]) : (unsigned short)0;
      }
      if constexpr (HOLD) {
        const int h = DEPTH == 1 ? 0 : par;
        flush(h);  // the prologue's chunk before, while these loads fly: one held a slot
#pragma unroll
        for (int i = 0; i < TITERS; ++i)
#pragma unroll
          for (int j = 0; j < EPL; ++j) held[h][i][j] = v[i][j];
        held_dst[h] = s_b;
      } else {
        store(s_b, v);
      }
    }
  }

  template <class V>
  __device__ __forceinline__ void store(unsigned s_b, const V &v) const {
#pragma unroll
    for (int i = 0; i < TITERS; ++i)
#pragma unroll
      for (int j = 0; j < EPL; ++j)
        sm80::st_shared_u16(s_b + elem_offset(tl0 + i * TSTEP, lc + 32 * j), v[i][j]);
  }

  // Stores the chunk held in slot `par` (if any) into its B tile: before
  // the barrier that publishes the stage it fills.
  __device__ __forceinline__ void flush(int par = 0) {
    if constexpr (HOLD) {
      const int h = DEPTH == 1 ? 0 : par;
      if (held_dst[h] != 0) {
        store(held_dst[h], held[h]);
        held_dst[h] = 0;
      }
    }
  }
};

// B, token-major, shared gather: the chunk's U union columns of X for BN
// tokens, stored transposed into the feature-major union tile (U rows of BN
// tokens, BLoaderFM's layout), so that each group's B fragments are read
// as in feature-major (ldmatrix.trans at each entry's slot) and every
// column of X the CTA's XR groups share is read once.  A lane owns one
// union column of a block of 32 and runs of 8 tokens: its 8 element loads
// (each a warp's 32 columns of one token, a few sectors of its row of X)
// become one 16-byte shared store (a token per lane and 2-byte stores met
// 4-way bank conflicts).  A lane's columns are prefetched with the chunk
// (-1: an empty slot, not loaded).  Loads held in registers across a stage
// where they fit (HOLD: at most 32 registers), as in BLoaderTM.
template <class Cfg, int K>
struct BLoaderTMXS {
  using S = TileSlots<Cfg::B_ROW_CH, Cfg::B_ROWS, Cfg::THREADS>;
  static constexpr int CB = (Cfg::U + 31) / 32;  // 32-column blocks of the union
  static constexpr int WARPS = Cfg::THREADS / 32;
  static constexpr int TB = Cfg::BN / 8;          // runs of 8 tokens
  static constexpr int TJ = (TB + WARPS - 1) / WARPS;  // runs a lane loads per block
  static constexpr bool HOLD = CB * TJ * 4 <= 32;
  static constexpr int DEPTH = 1;
  struct Idx {
    int cols[CB];          // this lane's union columns (-1: empty, or past U)
  };
  Idx next[DEPTH];         // the chunk issued next
  const unsigned short *x;
  int n_len, n0, warp, lane;
  unsigned held[HOLD ? CB : 1][HOLD ? TJ : 1][4];
  int held_cols[HOLD ? CB : 1];
  unsigned held_dst;

  __device__ __forceinline__ BLoaderTMXS(const unsigned short *x_, int n, int n0_)
      : next{}, x(x_), n_len(n), n0(n0_), held_dst(0) {
    warp = threadIdx.x >> 5;
    lane = threadIdx.x & 31;
  }

  __device__ __forceinline__ void fetch(Idx &dst, const int *chunk_idx) const {
#pragma unroll
    for (int b = 0; b < CB; ++b) {
      const int u = 32 * b + lane;
      dst.cols[b] = u < Cfg::U ? __ldg(chunk_idx + u) : -1;
    }
  }

  __device__ __forceinline__ void load(const Idx &idx, unsigned s_b, int = 0) {
    unsigned v[CB][TJ][4];
#pragma unroll
    for (int b = 0; b < CB; ++b)
#pragma unroll
      for (int j = 0; j < TJ; ++j) {
        const int t0 = 8 * (warp + WARPS * j);  // the run's first token (in the tile)
        const bool run = (TB % WARPS == 0 || warp + WARPS * j < TB) && idx.cols[b] >= 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = n0 + t0 + 2 * e;
          const unsigned short *p = x + (size_t)tok * K + idx.cols[b];
          const unsigned lo = run && tok < n_len ? p[0] : 0u;
          const unsigned hi = run && tok + 1 < n_len ? p[K] : 0u;
          v[b][j][e] = lo | (hi << 16);
        }
      }
    if constexpr (HOLD) {
      flush();  // the prologue's chunk before, while these loads fly: one held at a time
#pragma unroll
      for (int b = 0; b < CB; ++b) {
        held_cols[b] = idx.cols[b];
#pragma unroll
        for (int j = 0; j < TJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) held[b][j][e] = v[b][j][e];
      }
      held_dst = s_b;
    } else {
      store(s_b, v, idx.cols);
    }
  }

  template <class V>
  __device__ __forceinline__ void store(unsigned s_b, const V &v, const int (&cols)[CB]) const {
#pragma unroll
    for (int b = 0; b < CB; ++b) {
      if (cols[b] < 0) continue;  // an empty slot (or past U): never read
      const int u = 32 * b + lane;
#pragma unroll
      for (int j = 0; j < TJ; ++j) {
        const int tb = warp + WARPS * j;
        if (TB % WARPS == 0 || tb < TB) sm80::st_shared_16(s_b + 16u * S::chunk(u, tb), v[b][j]);
      }
    }
  }

  __device__ __forceinline__ void flush(int = 0) {
    if constexpr (HOLD) {
      if (held_dst != 0) {
        store(held_dst, held, held_cols);
        held_dst = 0;
      }
    }
  }
};

// 0: feature-major; 1: token-major, its own groups' columns; 2: token-major, shared gather
template <class Cfg, bool VEC, int K, int KIND = Cfg::TM ? (Cfg::XS ? 2 : 1) : 0>
struct BLoaderOf;
template <class Cfg, bool VEC, int K> struct BLoaderOf<Cfg, VEC, K, 0> {
  using type = BLoaderFM<Cfg, VEC>;
};
template <class Cfg, bool VEC, int K> struct BLoaderOf<Cfg, VEC, K, 1> {
  using type = BLoaderTM<Cfg, VEC, K>;
};
template <class Cfg, bool VEC, int K> struct BLoaderOf<Cfg, VEC, K, 2> {
  using type = BLoaderTMXS<Cfg, K>;
};

// ---- compute --------------------------------------------------------------------------

// acc += A tile (rows of this warp) . B tile (columns of this warp), one
// stage: BK/16 steps of ldmatrix (A), ldmatrix.trans (B) and MF x NF mma.
template <class Cfg>
__device__ __forceinline__ void mma_stage(float (&acc)[Cfg::MF][Cfg::NF][4], unsigned s_a,
                                          unsigned s_b, int warp_m, int warp_n, int lane) {
  // XS: the slots of this warp's group's entries (the group is warp_m)
  const unsigned s_loc = s_b + Cfg::B_BYTES + warp_m * Cfg::BK;
  using T = typename Cfg::elem_t;
#pragma unroll
  for (int kk = 0; kk < Cfg::BK / 16; ++kk) {
    unsigned a[Cfg::MF][4];
    unsigned b[Cfg::NF][2];
#pragma unroll
    for (int mi = 0; mi < Cfg::MF; ++mi) {
      // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15
      const int row = warp_m * Cfg::WTM + mi * 16 + (lane & 15);
      const int ch = 2 * kk + (lane >> 4);
      sm80::ldmatrix_x4(a[mi], s_a + 16 * swizzle<Cfg::A_ROW_CH>(row, ch));
    }
#pragma unroll
    for (int nj = 0; nj < Cfg::NF / 2; ++nj) {
      unsigned r[4];
      if (Cfg::TMB) {
        // N x BK tile: lanes 0-7 tokens 0-7 at k 0-7, 8-15 tokens 0-7 at
        // k 8-15, 16-23 tokens 8-15 at k 0-7, 24-31 tokens 8-15 at k 8-15
        const int row = warp_n * Cfg::WTN + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int ch = 2 * kk + ((lane >> 3) & 1);
        sm80::ldmatrix_x4(r, s_b + 16 * swizzle<Cfg::B_ROW_CH>(row, ch));
      } else {
        // BK x N tile: lanes 0-15 k 0-15 at columns 0-7, 16-31 at columns 8-15;
        // XS: the U x N union tile, k-th entry at its slot
        const int row = Cfg::XS ? static_cast<int>(sm80::ld_shared_u8(s_loc + 16 * kk + (lane & 15)))
                                : 16 * kk + (lane & 15);
        const int ch = (warp_n * Cfg::WTN + nj * 16) / 8 + (lane >> 4);
        sm80::ldmatrix_x4_trans(r, s_b + 16 * swizzle<Cfg::B_ROW_CH>(row, ch));
      }
      b[2 * nj][0] = r[0];
      b[2 * nj][1] = r[1];
      b[2 * nj + 1][0] = r[2];
      b[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < Cfg::MF; ++mi) {
#pragma unroll
      for (int ni = 0; ni < Cfg::NF; ++ni) sm80::mma_16816<T>(acc[mi][ni], a[mi], b[ni]);
    }
  }
}

// ---- compute, wgmma (sm_90a) ------------------------------------------------------------

// Descriptor constants of the two shared tiles of a stage.
template <class Cfg>
struct WgTiles {
  // A: AM (of BM) rows of BK elements, K-major, swizzled to the row width;
  // 8-row core-matrix groups are 8 rows apart (SBO); LBO is unused.
  static constexpr sm90::Swizzle A_SWIZZLE =
      Cfg::BK == 64 ? sm90::SWIZZLE_128B : (Cfg::BK == 32 ? sm90::SWIZZLE_64B : sm90::SWIZZLE_32B);
  static constexpr unsigned A_SBO = 8 * Cfg::BK * 2;
  // B, feature-major: BK rows of k, MN-major, 64-element atoms; LBO = from
  // one atom column to the next along N, SBO = from 8 rows of k to the next.
  // Token-major: BN token rows of BK elements, K-major, laid out as A (the
  // loaders' swizzle<BK / 8> is the hardware's 32, 64 or 128-byte swizzle
  // on a 1024-byte aligned stage), so A's constants describe it.
  static constexpr unsigned B_LBO = Cfg::BK * 128;
  static constexpr unsigned B_SBO = 1024;
};

// acc (this warpgroup's 64 x WG_N tile) += A . B over one stage: BK/16
// wgmma in one committed group.  The caller waits for it.
template <class Cfg>
__device__ __forceinline__ void wgmma_stage(float (&acc)[Cfg::WG_N / 8][4], unsigned s_a,
                                            unsigned s_b, int wg_m, int wg_n) {
  using T = typename Cfg::elem_t;
  using W = WgTiles<Cfg>;
  const unsigned a0 = s_a + wg_m * 64 * Cfg::BK * 2;
  // tm: the warpgroup's WG_N token rows; fm: its WG_N / 64 atom columns
  const unsigned b0 = s_b + (Cfg::TMB ? wg_n * Cfg::WG_N * Cfg::BK * 2
                                      : wg_n * (Cfg::WG_N / 64) * Cfg::BK * 128);
  sm90::fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::BK / 16; ++kk) {
    const unsigned long long da = sm90::make_desc(a0 + 32 * kk, 16, W::A_SBO, W::A_SWIZZLE);
    if constexpr (Cfg::TMB) {  // BN x BK, K-major: the A tile's layout
      const unsigned long long db = sm90::make_desc(b0 + 32 * kk, 16, W::A_SBO, W::A_SWIZZLE);
      sm90::mma<T, Cfg::WG_N, 0, 0>(acc, da, db);
    } else {
      const unsigned long long db =
          sm90::make_desc(b0 + 2048 * kk, W::B_LBO, W::B_SBO, sm90::SWIZZLE_128B);
      sm90::mma<T, Cfg::WG_N, 0, 1>(acc, da, db);
    }
  }
  sm90::commit_group();
}

// ---- epilogue -------------------------------------------------------------------------

// The shared output tile: rows [0, C_HALF) from lo, the rest from hi.  One
// tile per CTA: one run (hi = lo + C_HALF_BYTES).  Streamed tiles: the two
// stages the tile's last two chunks used, while the next tile's first
// chunks land in the others.
struct CTile {
  unsigned char *lo, *hi;
};

template <class Cfg>
__device__ __forceinline__ CTile contiguous_tile(unsigned char *smem) {
  return CTile{smem, smem + Cfg::C_HALF_BYTES};
}

// Accumulators -> act(scale * acc + bias) in T -> the shared output tile
// (BM x BN, rows padded to C_LD so the fragment stores do not conflict).
template <class Cfg, class P>
__device__ __forceinline__ void epilogue_to_smem(const float (&acc)[Cfg::MF][Cfg::NF][4],
                                                 const int *s_rows, const CTile &ct,
                                                 int warp_m, int warp_n, int lane) {
  using T = typename Cfg::elem_t;
  // row r sits at base(r) + 2 (r C_LD + column), base(r) = lo or hi - C_HALF rows
  // (tm: the tile's rows are tokens)
  const unsigned c_lo = sm80::smem_addr(ct.lo);
  const unsigned c_hi = sm80::smem_addr(ct.hi) - Cfg::C_HALF_BYTES;
#pragma unroll
  for (int mi = 0; mi < Cfg::MF; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_m * Cfg::WTM + mi * 16 + (lane >> 2) + 8 * h;
      const int col0 = warp_n * Cfg::WTN + 2 * (lane & 3);  // + 8 ni
      const float bias = P::HAS_BIAS ? reinterpret_cast<const float *>(s_rows)[Cfg::BM + row] : 0.0f;
      // fm: the row's pairs sit 16 bytes apart (immediate offsets from one address)
      const unsigned fm_addr =
          (row < Cfg::C_HALF ? c_lo : c_hi) + 2u * static_cast<unsigned>(row * Cfg::C_LD + col0);
#pragma unroll
      for (int ni = 0; ni < Cfg::NF; ++ni) {
        // GELU: every other pair on the FMA pipe (the unrolled ni is a constant)
        const unsigned pair = sm80::epilogue_pair<T, P::HAS_BIAS, P::ACT>(
            acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], P::SCALE, bias, (ni & 1) != 0);
        if (Cfg::TM) {  // N-major tile: the two values sit in consecutive token rows
          const int col = col0 + ni * 8;  // (even, as C_HALF is: both rows in one half)
          const unsigned addr = (col < Cfg::C_HALF ? c_lo : c_hi) +
                                2u * static_cast<unsigned>(col * Cfg::C_LD + row);
          sm80::st_shared_u16(addr, static_cast<unsigned short>(pair & 0xffffu));
          sm80::st_shared_u16(addr + 2u * Cfg::C_LD, static_cast<unsigned short>(pair >> 16));
        } else {
          sm80::st_shared_u32(fm_addr + 16u * ni, pair);
        }
      }
    }
  }
}

// The shared output tile -> Y rows (original order), columns [n0, n0+BN)
// clipped to N; rows past the group's end are skipped.
// A thread keeps one 16-byte column chunk and walks the rows THREADS /
// C_ROW_CH apart: the shared reads sit at immediate offsets, each store
// address is one wide multiply-add.
template <class Cfg, bool VEC>
__device__ __forceinline__ void store_tile_fm(const CTile &ct, const int *s_rows,
                                              unsigned short *y, int n_len, int n0) {
  constexpr int RSTEP = Cfg::THREADS / Cfg::C_ROW_CH;  // rows from one of a thread's to the next
  constexpr int ITERS = (Cfg::BM + RSTEP - 1) / RSTEP;
  static_assert(Cfg::THREADS % Cfg::C_ROW_CH == 0, "a thread keeps one chunk column");
  const int c = threadIdx.x % Cfg::C_ROW_CH, r0 = threadIdx.x / Cfg::C_ROW_CH;
  const int n = n0 + 8 * c;
  if (n >= n_len) return;
  const int off0 = 2 * (r0 * Cfg::C_LD + 8 * c);
  const unsigned char *src_lo = ct.lo + off0, *src_hi = ct.hi - Cfg::C_HALF_BYTES + off0;
  unsigned char *ycol = reinterpret_cast<unsigned char *>(y + n);
  const unsigned pitch = 2u * static_cast<unsigned>(n_len);
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int r = r0 + i * RSTEP;
    if (Cfg::BM % RSTEP != 0 && r >= Cfg::BM) break;
    const int orig = s_rows[r];
    if (orig < 0) continue;
    // the half is known at compile time where RSTEP divides it
    const bool low = Cfg::C_HALF % RSTEP == 0 ? i < Cfg::C_HALF / RSTEP : r < Cfg::C_HALF;
    const unsigned char *src = (low ? src_lo : src_hi) + 2 * i * RSTEP * Cfg::C_LD;
    unsigned short *dst = reinterpret_cast<unsigned short *>(
        ycol + static_cast<size_t>(static_cast<unsigned>(orig)) * pitch);
    if (VEC) {
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    } else {
      const unsigned short *s16 = reinterpret_cast<const unsigned short *>(src);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (n + e < n_len) dst[e] = s16[e];
    }
  }
}

// Token-major: Y[token, original row].  VEC (rows contiguous in M, M % 8
// == 0, Y aligned): a run of 8 rows whose first original row is a multiple
// of 8 is one 16-byte store; anything else goes element by element.
// NT: the threads that store (the first NT of the CTA).
template <class Cfg, class P, bool VEC, int NT = Cfg::THREADS>
__device__ __forceinline__ void store_tile_tm(const CTile &ct, const int *s_rows,
                                              unsigned short *y, int n_len, int n0) {
  constexpr int CHUNKS = Cfg::BN * Cfg::C_ROW_CH;
#pragma unroll 4
  for (int ch = threadIdx.x; ch < CHUNKS; ch += NT) {
    const int t = ch / Cfg::C_ROW_CH, c = ch % Cfg::C_ROW_CH;
    const int tok = n0 + t;
    if (tok >= n_len) continue;
    const unsigned short *src = reinterpret_cast<const unsigned short *>(
                                    t < Cfg::C_HALF ? ct.lo : ct.hi - Cfg::C_HALF_BYTES) +
                                t * Cfg::C_LD + 8 * c;
    unsigned short *dst = y + (size_t)tok * P::M;
    const int first = s_rows[8 * c];
    if (VEC && !P::PERMUTED && P::M % 8 == 0 && first >= 0 && (first & 7) == 0 &&
        s_rows[8 * c + 7] >= 0) {
      *reinterpret_cast<uint4 *>(dst + first) = *reinterpret_cast<const uint4 *>(src);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int orig = s_rows[8 * c + e];
        if (orig >= 0) dst[orig] = src[e];
      }
    }
  }
}

// ---- split K ---------------------------------------------------------------------------

// Split K, at the CTA's start (every thread of every rank): rank 0's
// barrier for the partial tiles the other ranks will push, armed for their
// bytes, and the cluster's arrival that lets them push (they wait for it
// in reduce_split, long after).
template <class Cfg>
__device__ __forceinline__ void split_recv_init(unsigned char *smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  sm90::recv_init(sm80::smem_addr(smem) + Cfg::RBAR_OFF, Cfg::RECV_BYTES, blockIdx.z == 0);
#endif
}

// The KS CTAs of a cluster (1, 1, KS) ran a share of one group's chunks
// each.  Ranks 1.. push their fp32 accumulators into rank 0's receive
// buffer (st.async, 16 bytes a thread at a time, counted on rank 0's
// barrier: float4 j of thread t of rank z at [z - 1][j][t], a warp's 512
// consecutive bytes) and leave; rank 0 waits on its barrier, adds them in
// rank order and alone runs the epilogue.  No cluster-wide fence and no
// meeting at the end (the pull this replaced needed both: bench/RESULTS.md,
// 2026-11-27).  Called after the pipeline has drained.  Returns whether
// this CTA runs the epilogue.
template <class Cfg>
__device__ __forceinline__ bool reduce_split(float (&acc)[Cfg::MF][Cfg::NF][4],
                                             unsigned char *smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int V = Cfg::MF * Cfg::NF;  // float4s a thread
  static_assert(V * 4 * Cfg::THREADS == Cfg::BM * Cfg::BN, "the accumulators hold the tile once");
  float *flat = &acc[0][0][0];
  const unsigned base = sm80::smem_addr(smem);
  const unsigned rank = blockIdx.z;  // the cluster spans z: its rank is blockIdx.z
  sm90::cluster_wait();              // rank 0's barrier is armed
  if (rank != 0) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      sm90::st_async_v4(base + Cfg::RECV_OFF + 16u * (((rank - 1) * V + j) * Cfg::THREADS +
                                                      threadIdx.x),
                        0, make_float4(flat[4 * j], flat[4 * j + 1], flat[4 * j + 2],
                                       flat[4 * j + 3]),
                        base + Cfg::RBAR_OFF);
    return false;
  }
  sm90::mbar_wait(base + Cfg::RBAR_OFF, 0);  // every other rank's tile is here
  const float4 *in = reinterpret_cast<const float4 *>(smem + Cfg::RECV_OFF);
#pragma unroll
  for (int z = 1; z < Cfg::KS; ++z)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float4 v = in[((z - 1) * V + j) * Cfg::THREADS + threadIdx.x];
      flat[4 * j] += v.x;
      flat[4 * j + 1] += v.y;
      flat[4 * j + 2] += v.z;
      flat[4 * j + 3] += v.w;
    }
  return true;
#else
  return true;  // (KS > 1 is built for sm_90a alone)
#endif
}

// ---- the kernel body ------------------------------------------------------------------

template <int V>
struct Int {  // a compile-time int as a value (the main loop's iteration parity)
  static constexpr int value = V;
};

// A chunk's constant copies into the stage at s_a: its weights (w_chunk)
// and, XS, its slot table (loc_chunk).
template <class Cfg>
__device__ __forceinline__ void issue_chunk_weights(unsigned s_a, const unsigned short *w_chunk,
                                                    const unsigned char *loc_chunk) {
  load_a_tile<Cfg>(s_a, w_chunk);
  if constexpr (Cfg::XS) {  // 16 bytes a thread
    if (threadIdx.x < Cfg::LOC_BYTES / 16)
      sm80::cp_async_16(s_a + Cfg::A_BYTES + Cfg::B_BYTES + 16 * threadIdx.x,
                        loc_chunk + 16 * threadIdx.x, true);
  }
}

// A chunk's copies into the stage at s_a: issue_chunk_weights's and the
// rows of X that `idx` names.
template <class Cfg, class BL>
__device__ __forceinline__ void issue_chunk(BL &bl, const typename BL::Idx &idx,
                                            unsigned s_a, const unsigned short *w_chunk,
                                            const unsigned char *loc_chunk, int par = 0) {
  issue_chunk_weights<Cfg>(s_a, w_chunk, loc_chunk);
  bl.load(idx, s_a + Cfg::A_BYTES, par);
}

// One group x BN columns.  Both compute paths share the schedule, loaders
// and epilogue; they differ in how far the loads run ahead (mma.sync:
// STAGES-1 chunks; wgmma: STAGES-2, since chunk c-1's wgmma may still read
// its stage while chunk c is issued) and in the compute of a stage.  WG:
// `smem` is 1024-byte aligned.
template <class Cfg, class P, bool VEC>
__device__ __forceinline__ void gemm_group(const unsigned char *__restrict__ packed,
                                           const unsigned short *__restrict__ x,
                                           unsigned short *__restrict__ y, int n_len, int n0,
                                           const Slot &slot, unsigned char *smem, int span) {
  constexpr int S = Cfg::STAGES;
  constexpr int AHEAD = Cfg::WG ? S - 2 : S - 1;  // chunks in flight ahead of the one computed
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_m = warp % Cfg::WM;
  const int warp_n = warp / Cfg::WM;
  const unsigned s_base = sm80::smem_addr(smem);
  int *s_rows = reinterpret_cast<int *>(smem + Cfg::ROWMAP_OFF);

  if constexpr (Cfg::AM < Cfg::BM) {  // WG: A-tile rows past the chunk's, zero once, never loaded
    constexpr int PAD_CH = (Cfg::BM - Cfg::AM) * Cfg::BK / 8;
    const unsigned zero[4] = {0u, 0u, 0u, 0u};
    for (int i = threadIdx.x; i < S * PAD_CH; i += Cfg::THREADS) {
      const int s = i / PAD_CH, j = i % PAD_CH;
      sm80::st_shared_16(s_base + s * Cfg::STAGE_BYTES + Cfg::AM * Cfg::BK * 2 + 16 * j, zero);
    }
  }

  const unsigned short *w = section<unsigned short>(packed, P::W_OFF) +
                            (size_t)slot.first_chunk * (Cfg::AM * Cfg::BK);
  const int *ind = section<int>(packed, P::IDX_OFF) + (size_t)slot.first_chunk * Cfg::B_ROWS;
  const unsigned char *loc =  // XS: the slot tables
      section<unsigned char>(packed, P::LOC_OFF) + (size_t)slot.first_chunk * Cfg::LOC_BYTES;
  const int chunks = slot.chunks;
  // streamed tiles (TN > 1): this CTA's tiles of N from n0 that start inside N,
  // computed in turn; the copies run on across a tile's end, so the next
  // tile's first chunks land while this one's epilogue runs.  An item is a
  // (tile, chunk) pair, tile-major; item i sits in stage i % STAGES.
  const int tiles = Cfg::TN == 1 ? 1 : min(span, (n_len - n0 + Cfg::BN - 1) / Cfg::BN);
  const int items = chunks * tiles;
  // the chunk of item i: TN = 1, items past the group's last read its last
  const auto chunk_of = [chunks](int i) {
    return Cfg::TN == 1 ? min(i, chunks - 1) : (i < chunks ? i : i % chunks);
  };

  // WG: MF = 1 and NF = WG_N / 8, so acc[0] is the warpgroup's wgmma tile
  // (zeroed at each tile's start)
  float acc[Cfg::MF][Cfg::NF][4];

  using BL = typename BLoaderOf<Cfg, VEC, P::K>::type;
  constexpr int DEPTH = BL::DEPTH;  // main-loop iterations from a chunk's index fetch to its issue
  static_assert(DEPTH == 1 || (AHEAD >= 2 && Cfg::TN == 1), "a chunk held two iterations is "
                "stored before the iteration that reads it");
  BL bl(x, n_len, n0);

  // prologue: the row indices of items 0 .. AHEAD+DEPTH-1 fetched at once
  // (one round trip, not one per chunk: the copies of a chunk wait for its
  // indices), then items 0 .. AHEAD-1 in flight (one block of loads with
  // no branch between them, so none waits for another; DEPTH 2: item s's
  // held loads in slot s % 2, which iteration s % 2 <= s stores)
  typename BL::Idx first[AHEAD];
  if (chunks > 0) {
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) bl.fetch(first[s], ind + chunk_of(s) * Cfg::B_ROWS);
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
      bl.fetch(bl.next[d], ind + chunk_of(AHEAD + d) * Cfg::B_ROWS);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // launched as a programmatic dependent (SF_DECLARE_PDL, sm_90): the
  // schedule, the first chunks' indices, weights and slot tables are
  // constant, X is not.  The weights of items 0 .. AHEAD-1 are copied
  // before the wait (uncommitted: they join item 0's group, which the
  // main loop waits for first), their rows of X after it.
#pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < items) {
      const int c = Cfg::TN == 1 ? s : chunk_of(s);
      issue_chunk_weights<Cfg>(s_base + s * Cfg::STAGE_BYTES, w + c * (Cfg::AM * Cfg::BK),
                               loc + c * Cfg::LOC_BYTES);
    }
  }
  sm90::griddep_wait();
#pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < items) {
      const int c = Cfg::TN == 1 ? s : chunk_of(s);
      bl.load(first[s], s_base + s * Cfg::STAGE_BYTES + Cfg::A_BYTES, s & 1);
      if constexpr (Cfg::TN > 1)
        if (c == chunks - 1) bl.advance();
    }
    sm80::cp_async_commit();
  }
#else
#pragma unroll
  for (int s = 0; s < AHEAD; ++s) {
    if (s < items) {
      const int c = Cfg::TN == 1 ? s : chunk_of(s);
      issue_chunk<Cfg>(bl, first[s], s_base + s * Cfg::STAGE_BYTES, w + c * (Cfg::AM * Cfg::BK),
                       loc + c * Cfg::LOC_BYTES, s & 1);
      if constexpr (Cfg::TN > 1)
        if (c == chunks - 1) bl.advance();
    }
    sm80::cp_async_commit();
  }
#endif
  load_row_map<Cfg, P>(packed, slot, s_rows);  // behind the copies; the main loop's barriers
                                               // (or the epilogue's) publish it

  // main loop: the stage of item i-(S-AHEAD) is refilled with item i+AHEAD
  int read_stage = 0, write_stage = AHEAD;
  // item i+AHEAD's weights and slot table, item i+AHEAD+DEPTH's indices:
  // each steps by a constant (one add, not a wide multiply, per iteration)
  // and, streamed, wraps to the group's first chunk at a tile's end
  int w_chunk = Cfg::TN == 1 ? AHEAD : (chunks > 0 ? chunk_of(AHEAD) : 0);
  int i_chunk = Cfg::TN == 1 ? AHEAD + DEPTH : (chunks > 0 ? chunk_of(AHEAD + 1) : 0);
  const unsigned short *w_next = w + w_chunk * (Cfg::AM * Cfg::BK);
  const unsigned char *loc_next = loc + w_chunk * Cfg::LOC_BYTES;
  const int *ind_next = ind + i_chunk * Cfg::B_ROWS;
  int item = 0;
  for (int tile = 0; tile < tiles; ++tile) {
#pragma unroll
    for (int mi = 0; mi < Cfg::MF; ++mi)
#pragma unroll
      for (int ni = 0; ni < Cfg::NF; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    int c = 0;
    // one iteration; `par_c` (Int<0> or Int<1>): its parity, DEPTH 2's slot
    const auto step = [&](auto par_c) {
      constexpr int par = decltype(par_c)::value;
      // element loads of the chunk issued DEPTH iterations ago: into its
      // stage, before the barrier
      bl.flush(par);
      sm80::cp_async_wait<AHEAD - 1>();
      if constexpr (Cfg::WG) {
        sm90::fence_proxy_async();  // this thread's copies (and the zero rows) -> wgmma's proxy
        sm90::wait_group<1>();      // this warpgroup's wgmma on item i-2 is done
      }
      __syncthreads();  // item i landed for everyone; the stage to refill is free
      const int next = item + AHEAD;
      if (next < items) {  // then item next+DEPTH's indices, DEPTH stages ahead of their use
        issue_chunk<Cfg>(bl, bl.next[par], s_base + write_stage * Cfg::STAGE_BYTES, w_next,
                         loc_next, par);
        if (next + DEPTH < items) bl.fetch(bl.next[par], ind_next);
      }
      if constexpr (Cfg::TN == 1) {
        w_next += Cfg::AM * Cfg::BK;
        loc_next += Cfg::LOC_BYTES;
        ind_next += Cfg::B_ROWS;
      } else {
        if (++w_chunk == chunks) {  // item next was its tile's last
          w_chunk = 0;
          w_next = w;
          bl.advance();
        } else {
          w_next += Cfg::AM * Cfg::BK;
        }
        if (++i_chunk == chunks) {
          i_chunk = 0;
          ind_next = ind;
        } else {
          ind_next += Cfg::B_ROWS;
        }
      }
      sm80::cp_async_commit();
      const unsigned s_a = s_base + read_stage * Cfg::STAGE_BYTES;
      if constexpr (Cfg::WG)
        wgmma_stage<Cfg>(acc[0], s_a, s_a + Cfg::A_BYTES, (warp >> 2) % Cfg::WG_M,
                         (warp >> 2) / Cfg::WG_M);
      else
        mma_stage<Cfg>(acc, s_a, s_a + Cfg::A_BYTES, warp_m, warp_n, lane);
      read_stage = read_stage + 1 == S ? 0 : read_stage + 1;
      write_stage = write_stage + 1 == S ? 0 : write_stage + 1;
      ++c;
      ++item;
    };
    if constexpr (DEPTH == 1) {
      while (c < chunks) step(Int<0>{});
    } else {  // unrolled by two: each slot's registers are named, never moved
      while (c + 1 < chunks) {
        step(Int<0>{});
        step(Int<1>{});
      }
      if (c < chunks) step(Int<0>{});
    }

    if constexpr (Cfg::WG) sm90::wait_group<0>();
    if (Cfg::TN == 1) sm80::cp_async_wait<0>();  // streamed: the next tile's copies fly on
    __syncthreads();  // the tile's stages are free for the output tile; row map visible
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (tile + 1 == tiles) sm90::griddep_launch_dependents();  // the next kernel may start
#endif
    if constexpr (Cfg::KS > 1)
      if (!reduce_split<Cfg>(acc, smem)) return;  // rank 0 holds the sum
    CTile ct;
    if constexpr (Cfg::TN == 1) {
      ct = contiguous_tile<Cfg>(smem);
    } else {
      // items item-2 and item-1 (the tile's last two) used the two stages
      // before read_stage; no copy in flight writes them (WG: AHEAD = S-2)
      const int s1 = read_stage == 0 ? S - 1 : read_stage - 1;
      const int s0 = s1 == 0 ? S - 1 : s1 - 1;
      ct = CTile{smem + s0 * Cfg::STAGE_BYTES, smem + s1 * Cfg::STAGE_BYTES};
    }
    epilogue_to_smem<Cfg, P>(acc, s_rows, ct, warp_m, warp_n, lane);
    __syncthreads();
    if (Cfg::TM)
      store_tile_tm<Cfg, P, VEC>(ct, s_rows, y, n_len, n0 + tile * Cfg::BN);
    else
      store_tile_fm<Cfg, VEC>(ct, s_rows, y, n_len, n0 + tile * Cfg::BN);
    // streamed: the next refill of these stages waits for the barrier at
    // the top of its iteration; an empty group rewrites them next
    if (Cfg::TN > 1 && chunks == 0) __syncthreads();
  }
}

// The (slot, column of N) a CTA computes.  The grid is NUM_SLOTS x
// columns and the hardware starts CTAs in linear order (x fastest), each
// as an earlier one ends, so the order is a dynamic schedule.  Group-fast
// (slot = blockIdx.x, column = blockIdx.y) keeps the CTAs in flight on a
// few columns of X; but when the last CTAs started are long ones, the
// kernel waits for them alone.  So the last TAIL columns, enough to fill
// the GPU once (P::RESIDENT CTAs on each of %nsmid SMs),
// are taken by cost instead: the planner sorts the slots longest first, so
// its runs of equal cost (P::class_end, at most 16) are classes, and the
// tail runs class by class, each group-fast over the tail's columns (a
// class takes the tail's columns whole; across classes, longest first).
struct Work {
  int slot, col;
};

template <class P, int KS>
__device__ __forceinline__ Work tail_first() {
  Work w{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)};
  unsigned sms;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  const int cols = static_cast<int>(gridDim.y);
  // (split K: a (slot, column) takes KS CTAs)
  const int tail = min(cols, static_cast<int>((sms * P::RESIDENT / KS + P::NUM_SLOTS - 1) /
                                              P::NUM_SLOTS));
  const int j = w.slot + (w.col - (cols - tail)) * P::NUM_SLOTS;  // index into the tail
  if (j >= 0) {
    const int s = j / tail;  // slot-major: a slot of the class we want
    int c0 = 0, c1 = P::NUM_SLOTS;  // that class's slots
#pragma unroll
    for (int c = 0; c < P::CLASSES - 1; ++c) {
      const int e = P::class_end(c);
      if (e <= s) c0 = e;
      else c1 = min(c1, e);
    }
    const int size = c1 - c0, r = j - c0 * tail;
    w.slot = c0 + r % size;
    w.col = cols - tail + r / size;
  }
  return w;
}

// Streamed tiles (TN > 1): the span code above the slot's rows -> the
// tiles of N this CTA computes (at most) and its first tile (n0 moves on to
// it); false for a slot whose span starts past N.  One tile otherwise.
template <class Cfg>
__device__ __forceinline__ bool take_span(Slot &slot, int &n0, int &span, int n_len) {
  span = Cfg::TN;
  if constexpr (Cfg::TN > 1) {
    const int code = slot.rows >> 16;
    span = Cfg::TN >> (code & 15);
    n0 += (code >> 4) * Cfg::BN;
    slot.rows &= 0xffff;
    if (n0 >= n_len) return false;
  }
  return true;
}

// Entry: blockIdx.x = schedule slot (group), blockIdx.y = TN tiles of N
// (tokens).  Group-fast: the CTAs in flight cover every group for a few
// tiles of N, so all of W and those tiles of X stay in L2 (tile-fast, a
// wave covered a few groups for all of N: all of X, once per wave, which
// made the large S1 problems 6-14% slower on an H200).
template <class Cfg, class P>
__device__ __forceinline__ void kernel(const unsigned char *__restrict__ packed,
                                       const void *__restrict__ x_, void *__restrict__ y_,
                                       int n_len) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  if (P::NUM_SLOTS == 0 || blockIdx.x >= P::NUM_SLOTS) return;
  const Work work = tail_first<P, Cfg::KS>();
  const int slot_id = work.slot;
  int n0 = work.col * (Cfg::BN * Cfg::TN);
  // WG: the swizzled tiles need a 1024-byte aligned base (1 KB is reserved)
  unsigned char *smem =
      Cfg::WG ? smem_raw + ((1024u - (sm80::smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;
  Slot slot = load_slot<P>(packed, slot_id);
  if constexpr (Cfg::KS > 1) {  // split K: this CTA's share of the group's chunks
    const int z = static_cast<int>(blockIdx.z);
    const int c0 = slot.chunks * z / Cfg::KS, c1 = slot.chunks * (z + 1) / Cfg::KS;
    slot.first_chunk += c0;
    slot.chunks = c1 - c0;
  }
  int span;  // tiles of N this CTA computes (at most)
  if (!take_span<Cfg>(slot, n0, span, n_len)) return;
  if constexpr (Cfg::KS > 1) split_recv_init<Cfg>(smem);
  const unsigned short *x = static_cast<const unsigned short *>(x_);
  unsigned short *y = static_cast<unsigned short *>(y_);
  const bool aligned = ((reinterpret_cast<unsigned long long>(x_) |
                         reinterpret_cast<unsigned long long>(y_)) & 15) == 0;
  // fm: 16-byte runs along N need N % 8 == 0; tm: runs along K need RUNS8
  // (the tm shared gather loads elements: VEC is Y's 16-byte stores alone)
  const bool vec = aligned && (Cfg::TMB ? P::RUNS8 : Cfg::TM || (n_len & 7) == 0);
  if (vec)
    gemm_group<Cfg, P, true>(packed, x, y, n_len, n0, slot, smem, span);
  else
    gemm_group<Cfg, P, false>(packed, x, y, n_len, n0, slot, smem, span);
}

// ---- the TMA-fed path (TMA: sm_90a, token-major, wgmma) ---------------------------------
//
// A CTA of WARPS consumer warps (the wgmma path's warpgroups) and one
// producer warp.  Work comes as items, each one group x one tile of BN
// tokens: the CTA's TN tiles of one group (gemm_group_tma) or, persistent,
// its share of every (group, tile) pair (gemm_persistent).  The chunks of
// the items run through the stages in turn (chunk i of the CTA in stage
// i % STAGES, its parity i / STAGES), so the producer copies the next
// item's chunks while the consumers finish one.  The producer's lane 0
// copies a chunk once the consumers have released its stage's previous
// one: the packed weight chunk (stored in the tile's swizzled order:
// plan.swizzled) by one bulk copy, and X's BN x BK box at the chunk's first
// column (its columns are one run: the table's `xrun`; zeros past N and K)
// by one tensor load, both completing on the stage's `full` barrier.  The
// consumers wait for it, issue the stage's wgmma (wgmma_stage) and release
// the chunk before (one arrival a warp on its stage's `empty` barrier) once
// the wait for its wgmma group returns; an item's last chunk is released
// when the item's wgmma are done.  No CTA-wide barrier in the main loop,
// no address work in the consumers; the epilogue is the wgmma path's over
// the consumers alone (named barriers of their count), into an output tile
// of its own when the CTA has several items (C_APART).  Launched as a
// programmatic dependent: the first chunks' weights are copied before the
// wait for the stream's previous work, X's boxes after it.

// The stages' shared memory and barriers, and where the chunks run.
template <class Cfg>
struct TmaRing {
  unsigned base, full, empty;  // shared addresses: the stages, their full and empty barriers
  int s = 0, round = 0;        // the next chunk's stage and its round (parity)

  __device__ __forceinline__ explicit TmaRing(unsigned char *smem)
      : base(sm80::smem_addr(smem)),
        full(base + Cfg::BAR_OFF),
        empty(base + Cfg::BAR_OFF + 8 * Cfg::STAGES) {}
  __device__ __forceinline__ unsigned stage(int st) const { return base + st * Cfg::STAGE_BYTES; }
  __device__ __forceinline__ void advance() {
    if (++s == Cfg::STAGES) {
      s = 0;
      ++round;
    }
  }
};

// Every thread: the A-tile rows past a chunk's (zeros, never copied) and,
// thread 0, the barriers.  The caller's __syncthreads publishes them.
template <class Cfg>
__device__ __forceinline__ void tma_setup(const TmaRing<Cfg> &r) {
  constexpr int S = Cfg::STAGES;
  if constexpr (Cfg::AM < Cfg::BM) {
    constexpr int PAD_CH = (Cfg::BM - Cfg::AM) * Cfg::BK / 8;
    const unsigned zero[4] = {0u, 0u, 0u, 0u};
    for (int i = threadIdx.x; i < S * PAD_CH; i += Cfg::THREADS) {
      const int st = i / PAD_CH, j = i % PAD_CH;
      sm80::st_shared_16(r.stage(st) + Cfg::AM * Cfg::BK * 2 + 16 * j, zero);
    }
    sm90::fence_proxy_async();  // the zeros -> the wgmma's proxy
  }
  if (threadIdx.x == 0) {
    for (int st = 0; st < S; ++st) {
      sm90::mbar_init(r.full + 8 * st, 1);
      sm90::mbar_init(r.empty + 8 * st, Cfg::WARPS);
    }
    sm90::fence_mbar_init();
  }
}

// The producer warp's copies.  `col`: lane j holds the first column of
// the slot's chunk 32 `block` + j.
template <class Cfg, class P>
struct TmaProducer {
  static constexpr unsigned A_COPY = Cfg::AM * Cfg::BK * 2;  // a packed chunk's bytes
  static constexpr unsigned B_COPY = Cfg::BN * Cfg::BK * 2;  // a box of X's (zeros included)
  const unsigned short *w;
  const int *ind;
  const sm90::TensorMap *map;
  int lane, it = 0, early = 0, block = 0, col = 0;

  __device__ __forceinline__ TmaProducer(const unsigned char *packed, const sm90::TensorMap *m)
      : w(section<unsigned short>(packed, P::W_OFF)), ind(section<int>(packed, P::IDX_OFF)),
        map(m), lane(static_cast<int>(threadIdx.x & 31)) {}

  // the first columns of the slot's chunks 32 b .. 32 b + 31 (every lane)
  __device__ __forceinline__ void columns(const Slot &sl, int b) {
    const int j = 32 * b + lane;
    block = b;
    col = j < sl.chunks ? __ldg(ind + (size_t)(sl.first_chunk + j) * Cfg::BK) : 0;
  }

  // (lane 0) absolute chunk `chunk`'s weights into stage st, the barrier
  // armed with its box's bytes too
  __device__ __forceinline__ void weights(const TmaRing<Cfg> &r, int chunk, int st) const {
    sm90::mbar_arrive_expect(r.full + 8 * st, A_COPY + B_COPY);
    sm90::bulk_load(r.stage(st), w + (size_t)chunk * (Cfg::AM * Cfg::BK), A_COPY, r.full + 8 * st);
  }

  // the first item's first chunks' weights (constant: before the wait
  // for the stream's previous work)
  __device__ __forceinline__ void start(const TmaRing<Cfg> &r, const Slot &sl) {
    early = sl.chunks < Cfg::STAGES ? sl.chunks : Cfg::STAGES;
    if (lane == 0)
      for (int c = 0; c < early; ++c) weights(r, sl.first_chunk + c, c);
  }

  // one item: the slot's chunks with X's boxes at tokens n0
  __device__ __forceinline__ void item(TmaRing<Cfg> &r, const Slot &sl, int n0) {
#pragma unroll 1
    for (int c = 0; c < sl.chunks; ++c, ++it) {
      if ((c >> 5) != block) columns(sl, c >> 5);  // (every lane alike)
      const int k0 = __shfl_sync(0xffffffffu, col, c & 31);
      if (it >= Cfg::STAGES) sm90::mbar_wait(r.empty + 8 * r.s, (r.round - 1) & 1);
      if (lane == 0) {
        if (it >= early) weights(r, sl.first_chunk + c, r.s);
        sm90::tma_load_2d(r.stage(r.s) + Cfg::A_BYTES, map, k0, n0, r.full + 8 * r.s);
      }
      __syncwarp();
      r.advance();
    }
  }
};

// The CTA's start: the producer reads the first item's first columns
// (their latency runs under the rest), every thread sets up the stages
// (tma_setup), and the barrier publishes them.
template <class Cfg, class P>
__device__ __forceinline__ void tma_start(const TmaRing<Cfg> &r, TmaProducer<Cfg, P> &pr,
                                          const Slot &first, bool producer) {
  if (producer) pr.columns(first, 0);
  tma_setup<Cfg>(r);
  __syncthreads();  // the barriers and the zero rows are ready
}

// The consumers: acc = one item's product over its `chunks` chunks, each
// stage released once its wgmma is done.
template <class Cfg>
__device__ __forceinline__ void consume_item(float (&acc)[1][Cfg::NF][4], TmaRing<Cfg> &r,
                                             int chunks, int lane) {
  const int warp = threadIdx.x >> 5;
  const int wg_m = (warp >> 2) % Cfg::WG_M, wg_n = (warp >> 2) / Cfg::WG_M;
#pragma unroll
  for (int ni = 0; ni < Cfg::NF; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][ni][e] = 0.0f;
  int prev = 0;  // the stage of the chunk before
#pragma unroll 1
  for (int c = 0; c < chunks; ++c) {
    sm90::mbar_wait(r.full + 8 * r.s, r.round & 1);
    const unsigned s_a = r.stage(r.s);
    wgmma_stage<Cfg>(acc[0], s_a, s_a + Cfg::A_BYTES, wg_m, wg_n);
    sm90::wait_group<1>();
    // the chunk before's wgmma is done: release its stage (no branch
    // among the wgmma: ptxas would serialize them)
    __syncwarp();
    if (c > 0 && lane == 0) sm90::mbar_arrive(r.empty + 8 * prev);
    prev = r.s;
    r.advance();
  }
  sm90::wait_group<0>();
  sm90::fence_accumulators(acc[0]);  // no read of them above the wait
  __syncwarp();
  if (chunks > 0 && lane == 0) sm90::mbar_arrive(r.empty + 8 * prev);  // the item's last chunk
}

// The consumers: one item's epilogue into the output tile and Y (tokens
// [n0, n0 + BN)).  The first barrier: the item's row map is written and,
// when the CTA had an item before, its stores have read the output tile.
template <class Cfg, class P, bool VEC>
__device__ __forceinline__ void finish_item(const float (&acc)[1][Cfg::NF][4], const int *rows,
                                            const CTile &ct, unsigned short *y, int n_len, int n0,
                                            int lane) {
  constexpr int CONSUMERS = 32 * Cfg::WARPS;
  const int warp = threadIdx.x >> 5;
  sm90::named_sync(1, CONSUMERS);
  epilogue_to_smem<Cfg, P>(acc, rows, ct, warp % Cfg::WM, warp / Cfg::WM, lane);
  sm90::named_sync(1, CONSUMERS);  // the output tile is complete
  store_tile_tm<Cfg, P, VEC, CONSUMERS>(ct, rows, y, n_len, n0);
}

// One group x `tiles` tiles of BN tokens (tiles > 1: streamed, TN).
template <class Cfg, class P, bool VEC>
__device__ __forceinline__ void gemm_group_tma(const unsigned char *__restrict__ packed,
                                               const sm90::TensorMap *map,
                                               unsigned short *__restrict__ y, int n_len, int n0,
                                               const Slot &slot, int tiles, unsigned char *smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31;
  const bool producer = threadIdx.x >> 5 == Cfg::WARPS;
  TmaRing<Cfg> ring(smem);
  TmaProducer<Cfg, P> pr(packed, map);
  tma_start<Cfg, P>(ring, pr, slot, producer);

  if (producer) {
    pr.start(ring, slot);
    sm90::griddep_wait();
    for (int t = 0; t < tiles; ++t) pr.item(ring, slot, n0 + t * Cfg::BN);
    sm90::griddep_launch_dependents();  // its last copy is issued: the next kernel may start
    return;
  }
  // the consumers (the accumulators live in this branch alone: ptxas
  // serializes the wgmma when another path defines them).  The row map
  // (and biases) are theirs alone, read here, off the producer's path to
  // the first copies; the epilogue's first barrier publishes them.
  int *s_rows = reinterpret_cast<int *>(smem + Cfg::ROWMAP_OFF);
  load_row_map<Cfg, P>(packed, slot, s_rows);
  float acc[1][Cfg::NF][4];
  const CTile ct = CTile{smem + Cfg::C_OFF, smem + Cfg::C_OFF + Cfg::C_HALF_BYTES};
#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    consume_item<Cfg>(acc, ring, slot.chunks, lane);
    if (t + 1 == tiles) {
      sm90::griddep_launch_dependents();
      // the stream's previous kernel is done before Y is written (the
      // producer's wait saw it; this warp's own wait makes it so here)
      sm90::griddep_wait();
    }
    // (one tile: every stage is consumed, every copy into it landed, so
    // the stages take the output tile)
    finish_item<Cfg, P, VEC>(acc, s_rows, ct, y, n_len, n0 + t * Cfg::BN, lane);
  }
#endif
}

// ---- persistent CTAs (TMA, PC > 0) ------------------------------------------------------

// Item k of this CTA: the (slot, tile of N) pairs in group-fast order
// (slot fastest: the items in flight share a few tiles of X) dealt to the
// PC CTAs in rounds of alternating direction, so that the slots' unequal
// costs (longest first) spread over the CTAs; its slot (zeros past the
// last item: an empty slot).  False past the last item.
template <class Cfg, class P>
__device__ __forceinline__ bool pc_item(const unsigned char *packed, int k, int total, Slot &slot,
                                        int &tile) {
  const int b = static_cast<int>(blockIdx.x);
  const int j = k * Cfg::PC + ((k & 1) ? Cfg::PC - 1 - b : b);
  const bool have = j < total;
  slot = have ? load_slot<P>(packed, j % P::NUM_SLOTS) : Slot{0, 0, 0, 0};
  tile = have ? j / P::NUM_SLOTS : 0;
  return have;
}

// A persistent CTA: the producer and consumers over the CTA's items.  Each
// role reads the next item's slot while it works on one; the producer
// reads the next item's first columns once it has issued an item's last
// chunk, and the consumers each item's row map entries (one a thread, into
// the buffer of the item's parity) before its wgmma.
template <class Cfg, class P, bool VEC>
__device__ __forceinline__ void gemm_persistent(const unsigned char *__restrict__ packed,
                                                const sm90::TensorMap *map,
                                                unsigned short *__restrict__ y, int n_len,
                                                unsigned char *smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31;
  const int total = P::NUM_SLOTS * ((n_len + Cfg::BN - 1) / Cfg::BN);
  const bool producer = threadIdx.x >> 5 == Cfg::WARPS;
  Slot cur, nxt;
  int tile = 0, ntile = 0;
  bool have = pc_item<Cfg, P>(packed, 0, total, cur, tile);
  TmaRing<Cfg> ring(smem);
  TmaProducer<Cfg, P> pr(packed, map);
  tma_start<Cfg, P>(ring, pr, cur, producer);

  if (producer) {
    if (have) pr.start(ring, cur);
    sm90::griddep_wait();
#pragma unroll 1
    for (int k = 0; have; ++k) {
      const bool next = pc_item<Cfg, P>(packed, k + 1, total, nxt, ntile);
      pr.item(ring, cur, tile * Cfg::BN);
      pr.columns(nxt, 0);
      cur = nxt;
      tile = ntile;
      have = next;
    }
    sm90::griddep_launch_dependents();
    return;
  }

  float acc[1][Cfg::NF][4];
  const CTile ct = CTile{smem + Cfg::C_OFF, smem + Cfg::C_OFF + Cfg::C_HALF_BYTES};
  int *const s_maps = reinterpret_cast<int *>(smem + Cfg::ROWMAP_OFF);
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll 1
  for (int k = 0; have; ++k) {
    const bool next = pc_item<Cfg, P>(packed, k + 1, total, nxt, ntile);
    // this thread's row of the item's map (stored before the epilogue)
    const RowEntry entry = tid < Cfg::BM ? row_entry<Cfg, P>(packed, cur, tid) : RowEntry{};
    consume_item<Cfg>(acc, ring, cur.chunks, lane);
    if (!next) sm90::griddep_launch_dependents();
    if (k == 0) sm90::griddep_wait();  // the stream's previous kernel is done before Y is written
    int *map_k = s_maps + (k & 1) * (2 * Cfg::BM);  // BM rows, then BM biases
    if (tid < Cfg::BM) store_row_entry<Cfg, P>(map_k, tid, entry);
    finish_item<Cfg, P, VEC>(acc, map_k, ct, y, n_len, tile * Cfg::BN, lane);
    cur = nxt;
    tile = ntile;
    have = next;
  }
#endif
}

// Entry of the TMA kernels: as kernel(), with X's tensor map (no split K).
template <class Cfg, class P>
__device__ __forceinline__ void kernel_tma(const unsigned char *__restrict__ packed,
                                           const void *__restrict__ x_, void *__restrict__ y_,
                                           int n_len, const sm90::TensorMap *map) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  (void)x_;  // read through the map alone
  static_assert(P::RUNS8, "a chunk is one run of X's columns, so runs of 8 too");
  static_assert(P::LOC_OFF == 0, "one group a CTA: no shared-gather slot tables");
  if (P::NUM_SLOTS == 0 || n_len <= 0) return;
  unsigned char *smem = smem_raw + ((1024u - (sm80::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned short *y = static_cast<unsigned short *>(y_);
  const bool vec = (reinterpret_cast<unsigned long long>(y_) & 15) == 0;
  if constexpr (Cfg::PC > 0) {  // the grid is PC CTAs, each running its share of the items
    if (vec)
      gemm_persistent<Cfg, P, true>(packed, map, y, n_len, smem);
    else
      gemm_persistent<Cfg, P, false>(packed, map, y, n_len, smem);
  } else {  // (only here: a persistent kernel does not build this path)
    if (blockIdx.x >= P::NUM_SLOTS) return;
    const Work work = tail_first<P, 1>();
    Slot slot = load_slot<P>(packed, work.slot);
    int n0 = work.col * (Cfg::BN * Cfg::TN);
    int span;  // tiles of N this CTA computes (at most)
    if (!take_span<Cfg>(slot, n0, span, n_len)) return;
    const int tiles = min(span, (n_len - n0 + Cfg::BN - 1) / Cfg::BN);
    if (vec)
      gemm_group_tma<Cfg, P, true>(packed, map, y, n_len, n0, slot, tiles, smem);
    else
      gemm_group_tma<Cfg, P, false>(packed, map, y, n_len, n0, slot, tiles, smem);
  }
}

}  // namespace rowgroup
}  // namespace sf
