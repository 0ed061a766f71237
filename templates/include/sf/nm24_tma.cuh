// nm24_tma.cuh -- the warp-specialized sm_90a path of the 2:4 family:
// sparse wgmma fed by the tensor-memory accelerator, the X tile shared by
// the CTAs of a cluster.
//
// A CTA is WM x WN consumer warpgroups (each MW 64-row wgmma tiles x WG_N
// columns of Y, WG_N = BN / WN; MW = 2 halves the X tile's reads per row of
// W) and one producer warp.  The producer keeps
// STAGES stages of shared memory filled, each stage one mbarrier `full`:
//   - the compressed weights and their metadata: one 1-D bulk copy per
//     64-row tile (the packing interleaves them, AE_STEP = 2048 bytes of
//     values and 256 of metadata per 64 rows x 32 columns of K);
//   - the X tile through the tensor map of X (the fifth kernel parameter,
//     encoded by the runtime for each launch: sf_kernel_args_set), in the
//     128-byte swizzle the B descriptors read.  With CM = 2 CTAs in a
//     cluster along M (the same columns of N, rows two tiles apart) each
//     CTA loads half of the tile and multicasts it to both, so X crosses L2
//     once per pair.
// Consumers wait on `full`, issue the stage's sparse wgmma, and once the
// wgmma of the stage before is done release that stage by arriving on the
// `empty` barrier of every CTA of the cluster (a multicast refills both).
//
// Feature-major X whose rows are not 16-byte aligned (N % 8 != 0) cannot
// be mapped: the runtime passes a zero map and the producer warp loads the
// tile itself, element by element, into the same swizzled layout (no
// multicast; the `full` barrier then also counts its 32 lanes).
//
// Split K (KS > 1, for few columns of N: decode): the KS CTAs of a cluster
// along z each take 1/KS of K; each CTA finishes one slice of the tile's
// rows: it pushes its partial sums of the other slices into their owners'
// shared memory (st.async, counted on the owner's barrier), waits for the
// others' sums of its own, adds them in rank order, applies the epilogue
// and stores it.
//
// Several tiles a CTA (MT > 1, prefill): the CTA takes MT tiles along M in
// turn (the same columns of N), the producer running on into the next
// tile's stages while the consumers store the last one, so that neither
// the pipeline's fill nor the store is paid once a tile.  A static split
// (the launch record's grid is fixed per N tile): the tuner picks MT so
// that the CTAs fill whole waves of the GPU (bench/RESULTS.md: short K,
// -7 to -10% a tile).  Rows of Y by one-dimensional bulk copies were
// slower: they queue behind the producer's loads.  With one 64-row wgmma
// tile a warpgroup (the 128 x 256 tile) each warpgroup stores its rows in
// slices of 64 columns of N through a small buffer of its own
// (store_sliced), so that 5 stages fit beside it.  Where Y can be mapped
// the slices go to Y by tensor stores instead, in halves of 32 columns
// through the buffer's two halves (store_halves): 1-4% faster than the
// warpgroup's own copies on S1, and the halves 1-3% more (bench/RESULTS.md,
// 2026-11-28).
//
// The order of the tiles (RA): the hardware starts CTAs (clusters) in the
// order of blockIdx, x first.  RA 0 takes x along N (consecutive CTAs read
// the same rows of W and different columns of X); RA 1 remaps the index so
// that consecutive CTAs go down M (the same columns of X, each read from
// device memory once while the CTAs of a wave share it in L2: for X larger
// than L2, RA 0 reads it once a wave of M tiles).
//
// Shared memory (from a 1024-byte aligned base): the barriers in the first
// 1 KB, then the stages (X tile, then the weight and metadata runs), reused
// at the end for the output tile (or the partial tile); with MT > 1 the
// output tile (or the warpgroups' slices) has its own buffer after the
// stages.
#pragma once

#include "sf/nm24_sm90.cuh"
#include "sf/tma_sm90.cuh"

namespace sf {
namespace nm24 {

constexpr int AE_STEP = WG_A_BYTES + 4 * META_BYTES;  // one 64-row tile x one K step

template <int BM_, int BN_, int BK_, int WM_, int WN_, int MW_, int STAGES_, int CM_, int KS_,
          bool TM_, int MT_ = 1, int RA_ = 0, int RS_ = 0, int YS_ = 0>
struct TmaConfig {
  static constexpr int BM = BM_;          // 64 x MW x WM
  static constexpr int BN = BN_;
  static constexpr int BK = BK_;
  static constexpr int WM = WM_;          // consumer warpgroups along M
  static constexpr int MW = MW_;          // 64-row wgmma tiles of each
  static constexpr int WN = WN_;          // ... and along N
  static constexpr int STAGES = STAGES_;
  static constexpr int CM = CM_;          // CTAs of a cluster along M sharing the X tile
  static constexpr int KS = KS_;          // CTAs of a cluster along z splitting K
  static constexpr bool TOKEN_MAJOR = TM_;
  static constexpr int MT = MT_;          // tiles along M a CTA takes in turn (1: one tile)
  static constexpr bool RA = RA_ != 0;    // consecutive CTAs go down M (else along N)
  static constexpr bool RS = RS_ != 0;    // csr's split 2:4 residual in steps (see below)
  // (sliced output) the slices go to Y by tensor stores through the map of
  // Y (the generator sets it where the runtime can map Y), in halves of 32
  // columns of N: the map's box (store_halves)
  static constexpr bool YS = YS_ != 0;
  static constexpr int YBOX_W = TOKEN_MAJOR ? 64 : 32;
  static constexpr int YBOX_ROWS = TOKEN_MAJOR ? 32 : 64;

  static constexpr int WG_N = BN / WN;
  static constexpr int THREADS = 128 * WM * WN;      // the consumers (store_tile's threads)
  static constexpr int BLOCK_THREADS = THREADS + 32;  // and the producer warp
  static constexpr int PRODUCER_WARP = THREADS / 32;
  static constexpr int KSTEPS = BK / KSTEP;
  static constexpr int MTILES = BM / 16;

  static constexpr int B_BYTES = BK * BN * 2;
  static constexpr int AE_BYTES = (BM / 64) * KSTEPS * AE_STEP;
  // (RS) each stage also holds its K tile's list of residual columns
  static constexpr int LIST_BYTES = RS ? 64 : 0;
  static constexpr int STAGE_BYTES = (B_BYTES + AE_BYTES + LIST_BYTES + 1023) / 1024 * 1024;
  // the X tile a CTA loads itself and multicasts: feature-major, columns of
  // 64 (one box each) taken in turn by the CM ranks, or a narrower tile of
  // 16 or 32 columns (decode) as one box; token-major, rows split in CM
  // boxes per 64-column atom of K.  Each box is swizzled to its row: 128
  // bytes, or 32 and 64 for the narrow feature-major tiles (the runtime's
  // map follows the box width).
  static constexpr int BOX_W = TOKEN_MAJOR || BN >= 64 ? 64 : BN;
  static constexpr int BOX_ROWS = TOKEN_MAJOR ? BN / CM : BK;
  static constexpr int ROW_BYTES = 2 * BOX_W;  // of the X tile (token-major: 128)
  static_assert(TOKEN_MAJOR || BN % 64 == 0 || (BN < 64 && WN == 1),
                "a narrow feature-major X tile is one swizzle atom, read by one warpgroup");
  static constexpr sm90::Swizzle B_SWIZZLE = ROW_BYTES == 128  ? sm90::SWIZZLE_128B
                                             : ROW_BYTES == 64 ? sm90::SWIZZLE_64B
                                                               : sm90::SWIZZLE_32B;

  // store_tile's view: warp w of warpgroup (wg_m, wg_n), passed as warp_m =
  // 4 wg_m + w, owns 16 rows of each of its MW wgmma tiles
  static constexpr int MI = MW;
  static constexpr int NI = WG_N / 8;
  static constexpr int WTN = WG_N;
  __device__ __forceinline__ static int row_of(int warp_m, int mi) {
    return ((warp_m >> 2) * MW + mi) * 64 + (warp_m & 3) * 16;
  }
  static constexpr int C_ROWS = TOKEN_MAJOR ? BN : BM;
  static constexpr int C_COLS = TOKEN_MAJOR ? BM : BN;
  static constexpr int C_LD = C_COLS + 8;
  static constexpr int C_BYTES = C_ROWS * C_LD * 2;
  // MT > 1 with one 64-row wgmma tile a warpgroup: each warpgroup stores
  // its tile in slices of SN columns of N through a buffer of its own
  // (store_sliced), so that the stages keep the room a whole output tile
  // would take.  (MW = 2 keeps the whole tile's buffer: with slices, the
  // accumulators of the slices still to store are live during the copies,
  // and ptxas spilled and serialized the wgmma.)
  // A slice is 64 x 64 (the warpgroup's rows by 64 columns of N; several
  // tiles a CTA take tiles of 128 columns or more, so WG_N >= 64), staged
  // with rows 16 bytes apart.
  static constexpr bool SLICED = MT > 1 && MW == 1;
  static_assert(!YS || SLICED, "tensor stores of Y only for the sliced output");
  static constexpr int SN = 64;
  static constexpr int SLICE_LD = 64 + 8;
  static constexpr int SLICE_BYTES = 64 * SLICE_LD * 2;
  static constexpr int OUT_BYTES = SLICED ? WM * WN * SLICE_BYTES : C_BYTES;
  static_assert(!SLICED || WG_N % SN == 0, "slices of 64 columns of N");
  // split K: the fp32 partial tile, rows padded by 4 floats
  // (feature-major [BM][BN + 4], rows of Y; token-major [BN][BM + 4],
  // columns of Y: its reduction reads down M, the way its stores run,
  // without bank conflicts, and a warp's scalar writes of its fragments
  // fall on 32 banks, 2 (BM + 4) being 8 modulo 32)
  static constexpr int P_LD = TOKEN_MAJOR ? BM + 4 : BN + 4;
  static constexpr int P_BYTES = KS > 1 ? (TOKEN_MAJOR ? BN : BM) * P_LD * 4 : 0;
  // the float of element (row r, column c) of the partial tile
  __device__ __forceinline__ static int part_at(int r, int c) {
    return TOKEN_MAJOR ? c * P_LD + r : r * P_LD + c;
  }
  // 1 KB of alignment slack, 1 KB of barriers, then the stages; with MT > 1
  // the output tile has its own buffer after them (the producer fills the
  // next tile's stages while the consumers store this one)
  static constexpr int C_OFFSET = MT > 1 ? STAGES * STAGE_BYTES : 0;  // from the stages
  // split K: after them, the partial sums of this CTA's slice of rows the
  // cluster's other CTAs push ([KS - 1][BM / KS * BN] fp32 in the
  // reduction's element order; never reused, as they may come while this
  // CTA still computes), counted on the barrier at RBAR (in the barriers' KB)
  static constexpr int RECV_OFFSET = MT > 1 ? STAGES * STAGE_BYTES + OUT_BYTES
                                            : cmax(cmax(STAGES * STAGE_BYTES, C_BYTES), P_BYTES);
  static constexpr int RECV_BYTES = KS > 1 ? (KS - 1) * (BM / KS) * BN * 4 : 0;
  static constexpr int RBAR = 512;  // from the base (the stages' barriers take at most 8 * 2 * 12)
  // (RS) after them, two halves of the residual's X columns (a step's
  // RS_SLOTS rows of the X tile, laid out as a stage's) and two slots of
  // its compressed weights (one 64-row run a warpgroup), the barriers at
  // RSBAR: afull[2] (the producer's copy of a step's weights), bfull[2]
  // (every consumer warp's copies of its columns), rfree[2] (each
  // warpgroup's wgmma of the step done: both halves free again)
  static constexpr int RS_SLOTS = 32;
  static constexpr int RS_OFFSET = RECV_OFFSET + RECV_BYTES;
  static constexpr int RS_HALF = RS ? BN * RS_SLOTS * 2 : 0;
  static constexpr int RS_A_BYTES = RS ? (BM / 64) * AE_STEP : 0;
  static constexpr int RS_BYTES = 2 * (RS_HALF + RS_A_BYTES);
  static constexpr int RSBAR = 256;
  static_assert(!RS || (!TOKEN_MAJOR && KS == 1 && MT == 1 && WN == 1 && MW == 1 &&
                        BN % 64 == 0 && BK <= 128),
                "the residual in steps: feature-major, one tile a CTA, no split K, one 64-row "
                "wgmma tile a warpgroup, whole 64-column X boxes");
  static constexpr int SMEM_BYTES = 2048 + RECV_OFFSET + RECV_BYTES + RS_BYTES;
  static_assert(16 * STAGES <= RSBAR, "the stages' full and empty barriers end before RSBAR");

  // The configuration's constraints are asserted by the generated source,
  // from the table the search space filters with
  // (generator/families/nm24/__init__.py).
};

// The consumers' barrier between the staged output tile's writes and reads.
template <int THREADS>
struct ConsumerSync {
  __device__ __forceinline__ static void sync() { sm90::named_sync(1, THREADS); }
};

// 16-byte chunk `c` (along N) of row `row` of a feature-major X tile, as
// the TMA unit swizzles it (to the tile's row: 128, 64 or 32 bytes).
template <class C>
__device__ __forceinline__ int fm_chunk(int row, int c) {
  if constexpr (C::ROW_BYTES == 128)
    return atom_chunk<C::BK>(row, c);
  else if constexpr (C::ROW_BYTES == 64)
    return row * 4 + (c ^ ((row >> 1) & 3));
  else
    return row * 2 + (c ^ ((row >> 2) & 1));
}

// Feature-major X (K x N) with N % 8 != 0, by the producer warp's 32 lanes:
// element loads, zero past K and N, stored in the swizzled layout.
template <class C, class P>
__device__ __forceinline__ void tma_fallback_b_fm(unsigned sB, const unsigned short *X, int k0,
                                                  int n0, int N, int lane) {
  constexpr int CPR = C::BN / 8;
#pragma unroll 1
  for (int i = lane; i < C::BK * CPR; i += 32) {
    const int row = i / CPR, c = i % CPR;
    const int gk = k0 + row, gn = n0 + c * 8;
    unsigned w[4];
    load8_bounded(X, gk, gn, P::K, N, w);
    sts128(sB + fm_chunk<C>(row, c) * 16, w[0], w[1], w[2], w[3]);
  }
}

// ---- the residual in steps (RS: csr's split 2:4 format on prefill tiles) ---------------
// The nonzeros beyond the 2:4 part, for a tile of BM rows: the columns
// holding any of them (its residual columns) are numbered in K order into
// steps of RS_SLOTS slots, each step the columns of whole K tiles.  A
// step's weights are a BM x RS_SLOTS 2:4 matrix (the residual's values of
// its columns, their slots ordered so that no row holds more than 2 of
// any 4 consecutive slots), packed as the 2:4 part is (one AE_STEP run per
// 64 rows) at P::RS_A, the tile's first step at int32 P::RS_PTR[tile].
// Each K tile of a tile has a list of LIST_BYTES: byte 0 its residual
// columns' count, byte 1 bit 0 set where it holds its step's last
// column, then 2 bytes a column (its column within the K tile, its slot);
// the same ends as bits at P::RS_ENDS (rs_end_words).  The 2:4 part's
// runs of a stage and its list are one block at P::AE_OFFSET (block
// [tile][K tile], the stage's layout: one bulk copy a stage).
// The consumer warps copy those columns' rows of the stage's X tile into
// the step's half (a warp a column, 16 bytes a lane); once a step's last
// columns are copied, the next stage's group of wgmma adds the step's
// sparse wgmma (its weights copied by the producer into a slot of their
// own).  Two halves and two slots: a step is copied while the one before
// is multiplied.

// Words of a tile's step ends (bit kt % 32 of word kt / 32: K tile kt
// holds its step's last column) at P::RS_ENDS, for the producer.
template <class C, class P>
constexpr int rs_end_words() {
  return (P::KP / C::BK + 31) / 32;
}

template <class C, class P>
__device__ __forceinline__ const unsigned *rs_end_ptr(const unsigned char *packed, int m0) {
  return reinterpret_cast<const unsigned *>(packed + P::RS_ENDS) +
         (size_t)(m0 / C::BM) * rs_end_words<C, P>();
}

// The producer warp's weights for stage `it` (lane 0): the stage's
// `full` barrier armed for all of its bytes, and the bulk copies of the
// compressed weights and metadata of its 64-row tiles.
template <class C, class P>
__device__ __forceinline__ void tma_produce_weights(const unsigned char *__restrict__ packed,
                                                    bool use_map, unsigned stages, unsigned full,
                                                    int m0, int step, int it, int kz) {
  constexpr int KT = P::KP / C::BK / C::KS;
  const int kt = it % KT, t0 = (m0 + it / KT * step) / 64, s = it % C::STAGES;
  const unsigned sAE = stages + s * C::STAGE_BYTES + C::B_BYTES;
  const unsigned char *ae = packed + P::AE_OFFSET;
  sm90::mbar_arrive_expect(full + 8 * s, (use_map ? C::B_BYTES : 0) + C::AE_BYTES + C::LIST_BYTES);
  if constexpr (C::RS) {  // the stage's runs and list as one block (rs_block)
    constexpr int BLOCK = C::AE_BYTES + C::LIST_BYTES;
    sm90::bulk_load(sAE, ae + ((size_t)(t0 * 64 / C::BM) * (P::KP / C::BK) + kz + kt) * BLOCK,
                    BLOCK, full + 8 * s);
  } else {
#pragma unroll
    for (int t = 0; t < C::BM / 64; ++t)
      sm90::bulk_load(sAE + t * C::KSTEPS * AE_STEP,
                      ae + ((size_t)(t0 + t) * P::KSTEPS + (size_t)(kz + kt) * C::KSTEPS) * AE_STEP,
                      C::KSTEPS * AE_STEP, full + 8 * s);
  }
}

// The producer warp: for each of the CTA's `tiles` tiles along M (rows m0,
// m0 + step, ...) and each of its K tiles, fills stage it % STAGES (`it`
// counting over the tiles), reusing a stage once every consumer of the
// cluster has released it.  The weights of the first `early` stages are
// already on their way (tma_produce_weights, before griddep_wait).
template <class C, class P>
__device__ __forceinline__ void tma_produce(const unsigned char *__restrict__ packed,
                                            const unsigned short *__restrict__ X, int N,
                                            const sm90::TensorMap *map, bool use_map,
                                            unsigned stages, unsigned full, unsigned empty,
                                            int m0, int step, int tiles, int n0, unsigned rank,
                                            int kz, int lane, int early, unsigned rs_first,
                                            int rs_base) {
  constexpr int KT = P::KP / C::BK / C::KS;  // this CTA's stages: K tiles kz .. kz + KT - 1
  constexpr int S = C::STAGES;
  // (RS, one tile) the residual's steps whose weights are on their way
  // (the tile's first step is rs_base); the tile's step ends, 32 K tiles a
  // word: the current word and the next (loaded a word ahead: the producer
  // never waits on device memory)
  int rs_j = 0;
  unsigned rs_ends = rs_first, rs_next = 0;
  const unsigned *rs_words = nullptr;
  if constexpr (C::RS) {
    rs_words = rs_end_ptr<C, P>(packed, m0);
    rs_next = rs_end_words<C, P>() > 1 ? __ldg(rs_words + 1) : 0u;
  }
#pragma unroll 1
  for (int it = 0; it < tiles * KT; ++it) {
    const int kt = it % KT;
    const int s = it % S;
    if (it >= S) sm90::mbar_wait(empty + 8 * s, ((it / S) - 1) & 1);
    const unsigned sB = stages + s * C::STAGE_BYTES;
    const int kg = kz + kt;
    if (lane == 0) {
      if (it >= early) tma_produce_weights<C, P>(packed, use_map, stages, full, m0, step, it, kz);
      if (use_map) {
        const int k0 = kg * C::BK;
        if constexpr (C::TOKEN_MAJOR) {
#pragma unroll
          for (int a = 0; a < C::BK / 64; ++a) {
            const unsigned dst = sB + a * C::BN * 128 + rank * C::BOX_ROWS * 128;
            const int c0 = k0 + 64 * a, c1 = n0 + rank * C::BOX_ROWS;
            if constexpr (C::CM > 1)
              sm90::tma_load_2d_multicast(dst, map, c0, c1, full + 8 * s, (1u << C::CM) - 1);
            else
              sm90::tma_load_2d(dst, map, c0, c1, full + 8 * s);
          }
        } else {
#pragma unroll
          for (int c = rank; c < C::BN / C::BOX_W; c += C::CM) {
            const unsigned dst = sB + c * C::BK * C::ROW_BYTES;
            if constexpr (C::CM > 1)
              sm90::tma_load_2d_multicast(dst, map, n0 + C::BOX_W * c, k0, full + 8 * s,
                                          (1u << C::CM) - 1);
            else
              sm90::tma_load_2d(dst, map, n0 + C::BOX_W * c, k0, full + 8 * s);
          }
        }
      }
    }
    if (!use_map) {
      if constexpr (!C::TOKEN_MAJOR)
        tma_fallback_b_fm<C, P>(sB, X, kg * C::BK, n0, N, lane);
      sm90::fence_proxy_async();  // the stores -> the tensor cores' proxy
      sm90::mbar_arrive(full + 8 * s);
    }
    // (RS) this K tile ends a step: its weights into slot rs_j % 2, once the stage is
    // on its way whole (the wait for the slot needs the consumers past this stage).
    // The whole warp follows the steps and waits for the slot; lane 0 alone
    // copies.  (With lane 0 waiting alone, while the other lanes waited at
    // the branch's reconvergence point, the kernel hung on some whole prefill
    // problems: bench/RESULTS.md, 2026-11-28.  Every mbarrier wait of these
    // kernels is now made by whole warps.)
    if constexpr (C::RS) {
      if (kt > 0 && kt % 32 == 0) {
        rs_ends = rs_next;
        rs_next = kt / 32 + 1 < rs_end_words<C, P>() ? __ldg(rs_words + kt / 32 + 1) : 0u;
      }
      if ((rs_ends >> (kt % 32)) & 1) {
        const int h = rs_j & 1;
        const unsigned bar = full + C::RSBAR;
        if (rs_j >= 2) sm90::mbar_wait(bar + 32 + 8 * h, ((rs_j >> 1) - 1) & 1);  // rfree
        if (lane == 0) {
          sm90::mbar_arrive_expect(bar + 8 * h, C::RS_A_BYTES);  // afull
          sm90::bulk_load(stages + C::RS_OFFSET + 2 * C::RS_HALF + h * C::RS_A_BYTES,
                          packed + P::RS_A + (size_t)(rs_base + rs_j) * C::RS_A_BYTES,
                          C::RS_A_BYTES, bar + 8 * h);
        }
        ++rs_j;
        __syncwarp();
      }
    }
  }
}

// This warp's metadata registers for one stage (see wg_load_meta), for
// each of its warpgroup's MW tiles, read from the interleaved runs.
template <class C>
constexpr int TMA_META_REGS = C::MW * META_REGS<C>;

template <class C>
__device__ __forceinline__ void tma_load_meta(unsigned (&e)[TMA_META_REGS<C>], unsigned sAE,
                                              int wg_m, int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < C::MW; ++i) {
    const unsigned base = sAE + (wg_m * C::MW + i) * C::KSTEPS * AE_STEP + WG_A_BYTES +
                          (warp & 3) * META_BYTES;
    if constexpr (C::KSTEPS == 1) {
      e[i] = lds32(base + (g * 2 + (t & 1)) * 4);
    } else {
#pragma unroll
      for (int p = 0; p < C::KSTEPS / 2; ++p)
        e[i * (C::KSTEPS / 2) + p] =
            lds32(base + (2 * p + (t >> 1)) * AE_STEP + (g * 2 + (t & 1)) * 4);
    }
  }
}

// One stage's sparse wgmma of this warpgroup, every K step of each of its
// MW tiles (one committed group; COMMIT false: the caller adds to the
// group and commits it).
template <class C, typename T, bool COMMIT = true>
__device__ __forceinline__ void tma_compute_stage(float (&acc)[C::MW][C::WG_N / 8][4], unsigned sAE,
                                                  unsigned sB,
                                                  const unsigned (&e)[TMA_META_REGS<C>], int wg_m,
                                                  int wg_n) {
  sm90::fence();
#pragma unroll
  for (int s = 0; s < C::KSTEPS; ++s) {
    unsigned long long db;
    if constexpr (C::TOKEN_MAJOR)
      db = sm90::make_desc(sB + (s >> 1) * C::BN * 128 + wg_n * C::WG_N * 128 + (s & 1) * 64, 16,
                           1024, sm90::SWIZZLE_128B);
    else  // MN-major: atoms of BOX_W columns x 8 rows of K, LBO apart along N
      db = sm90::make_desc(
          sB + wg_n * (C::WG_N / C::BOX_W) * C::BK * C::ROW_BYTES + s * KSTEP * C::ROW_BYTES,
          C::BK * C::ROW_BYTES, 8 * C::ROW_BYTES, C::B_SWIZZLE);
#pragma unroll
    for (int i = 0; i < C::MW; ++i) {
      const unsigned a = sAE + ((wg_m * C::MW + i) * C::KSTEPS + s) * AE_STEP;
      const unsigned long long da = sm90::make_desc(a, 128, 256, sm90::SWIZZLE_NONE);
      const unsigned meta = e[i * META_REGS<C> + (s >> 1)];
      constexpr int TB = C::TOKEN_MAJOR ? 0 : 1;
      if (C::KSTEPS == 1 || (s & 1) == 0)
        sm90::mma_sp<T, C::WG_N, 0, TB>(acc[i], da, db, meta);
      else
        sm90::mma_sp<T, C::WG_N, 1, TB>(acc[i], da, db, meta);
    }
  }
  if constexpr (COMMIT) sm90::commit_group();
}

// The consumers' release of stage `s`: one thread of each warpgroup (or,
// PER_WARP, of each warp) arrives on `empty` of every CTA of the cluster.
// A warpgroup's wgmma_wait covers its other warps' metadata loads: they
// come before their part of the stage's wgmma, which completes for the
// whole warpgroup or not at all.  It does not cover loads a warp makes
// after its part of the wgmma (the residual's X in res_stage, the step
// columns and list in rs_copy): another warp of the warpgroup may still be
// making them when the wgmma is done, so those kernels release per warp,
// each warp after its own loads (with one arrival a warpgroup, the producer
// could refill a stage under a late warp's reads).
// (compute-sanitizer's racecheck reports the ordered loads racing the
// producer's refill too: it does not follow the order an mbarrier gives the
// bulk copies; bench/RESULTS.md, 2026-11-26.)
template <class C, bool PER_WARP>
__device__ __forceinline__ void tma_release(unsigned empty, int s) {
  if ((threadIdx.x & (PER_WARP ? 31 : 127)) == 0) {
    if constexpr (C::CM > 1) {
#pragma unroll
      for (int c = 0; c < C::CM; ++c) sm90::mbar_arrive_cluster(empty + 8 * s, c);
    } else {
      sm90::mbar_arrive(empty + 8 * s);
    }
  }
}

// (RS) A warpgroup's sparse wgmma of step j: its weights (slot j % 2) times
// its columns of X (half j % 2), once both are in shared memory.  Issued
// after a stage's wgmma, a group of its own (they run while it waits).
template <class C, typename T>
__device__ __forceinline__ void rs_mma(float (&acc)[C::MW][C::WG_N / 8][4], unsigned stages,
                                       unsigned bar, int j, int wg_m, int warp, int lane) {
  const int h = j & 1;
  sm90::mbar_wait(bar + 16 + 8 * h, (j >> 1) & 1);  // bfull: every warp's columns copied
  sm90::mbar_wait(bar + 8 * h, (j >> 1) & 1);       // afull: its weights here
  const unsigned a = stages + C::RS_OFFSET + 2 * C::RS_HALF + h * C::RS_A_BYTES + wg_m * AE_STEP;
  const unsigned meta =
      lds32(a + WG_A_BYTES + (warp & 3) * META_BYTES + ((lane >> 2) * 2 + (lane & 1)) * 4);
  const unsigned long long da = sm90::make_desc(a, 128, 256, sm90::SWIZZLE_NONE);
  const unsigned long long db =
      sm90::make_desc(stages + C::RS_OFFSET + h * C::RS_HALF, C::RS_SLOTS * C::ROW_BYTES,
                      8 * C::ROW_BYTES, C::B_SWIZZLE);
  sm90::fence();
  sm90::mma_sp<T, C::WG_N, 0, 1>(acc[0], da, db, meta);
}

// (RS) A consumer warp's reads of a stage's list (at lst) ahead of its
// copies: the head and the warp's first entry, right after the stage's full
// wait, so that their latency overlaps the stage's wgmma issue (each was a
// round trip to shared memory on the consumers' path: bench/RESULTS.md,
// 2026-11-28).  (Reading the entry's X row ahead too kept 4 registers more
// across the issue: 168, a spill on the cm 1 tile.)
struct RsAhead {
  unsigned head, ent;
};

template <class C>
__device__ __forceinline__ void rs_read_list(RsAhead &a, unsigned lst, int warp) {
  a.head = lds32(lst);
  a.ent = lds32(lst + 4 + 4 * (warp >> 1)) >> (16 * (warp & 1));
}

// (RS) This warp's share of a stage's residual columns (the list at lst,
// its head and the warp's first entry read ahead in `a`): each its row of the X tile at
// sB into its slot of step j's half, 16 bytes a lane.  The step's first
// copy waits until its half is free (the wgmma of step j - 2 done in
// every warpgroup).  Returns whether the stage ends the step (every warp
// then arrives on bfull).
template <class C>
__device__ __forceinline__ bool rs_copy(unsigned stages, unsigned bar, unsigned sB, unsigned lst,
                                        const RsAhead &a, int j, int &waited, int warp,
                                        int lane) {
  const unsigned head = a.head;
  const int count = head & 0xff;
  const unsigned half = stages + C::RS_OFFSET + (j & 1) * C::RS_HALF;
#pragma unroll 1
  for (int e = warp; e < count; e += C::THREADS / 32) {
    if (j >= 2 && waited != j) {
      sm90::mbar_wait(bar + 32 + 8 * (j & 1), ((j >> 1) - 1) & 1);  // rfree
      waited = j;
    }
    const unsigned ent = e == warp ? a.ent : lds32(lst + 4 + 4 * (e >> 1)) >> (16 * (e & 1));
    const int kk = ent & 0xff, slot = (ent >> 8) & 0xff;
    if (lane < C::BN / 8) {
      unsigned w[4];
      lds128(w, sB + fm_chunk<C>(kk, lane) * 16);
      sts128(half + atom_chunk<C::RS_SLOTS>(slot, lane) * 16, w[0], w[1], w[2], w[3]);
    }
  }
  const bool last = (head >> 8) & 1;
  if (last) {
    sm90::fence_proxy_async();  // the copies -> the tensor cores' proxy
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bar + 16 + 8 * (j & 1));  // bfull
  }
  return last;
}

// ---- the residual (csr's split 2:4 format) ---------------------------------------------
// Unstructured W stored as a 2:4 part (the packed weights above) plus the
// nonzeros that did not fit it (P::HAS_RES): records {column, value} at
// P::RES_REC, sorted by row and, within a row, by column; int32
// ptr[MP][KS + 1] at P::RES_PTR, where ptr[m][z] is row m's first record in
// K slice z (columns from z KP / KS) and ptr[m][KS] its end.  A consumer
// thread adds its rows' records stage by stage, reading X from the stage's
// tile in shared memory while the stage's wgmma run (they cannot touch the
// wgmma accumulators: the records' sums have registers of their own,
// added to the accumulators once the tile's last wgmma is done).  Each row
// keeps a cursor and its next RES_AHEAD records in registers: a record is
// loaded RES_AHEAD records before it is used, so that its load's latency
// spreads over the stages between.
struct ResRec {
  int col;
  float val;
};

constexpr int RES_AHEAD = 4;

template <class C>
struct ResRows {
  static constexpr int R = 2 * C::MW;  // this thread's rows: g and g + 8 of each 16-row slice
  int e[R], hi[R];                     // e: the record after the window
  int2 q[R][RES_AHEAD];                // the window: q[r][0] next
  float acc[C::MW][C::WG_N / 8][4];
};

// Byte offset of X element (token n of the tile, feature kk of the stage)
// in a stage's X tile, as the TMA unit swizzles it (see tma_produce).
template <class C>
__device__ __forceinline__ unsigned res_x_offset(int n, int kk) {
  if constexpr (C::TOKEN_MAJOR)  // 64-feature atoms of BN rows of 128 bytes
    return atom_chunk<C::BN>(n, kk >> 3) * 16 + (kk & 7) * 2;
  else
    return fm_chunk<C>(kk, n >> 3) * 16 + (n & 7) * 2;
}

__device__ __forceinline__ int2 res_load(const ResRec *rec, int e, int hi) {
  return e < hi ? __ldg(reinterpret_cast<const int2 *>(rec + e)) : make_int2(0x7fffffff, 0);
}

// A tile's start: the cursors of this thread's rows at K slice zrank.
template <class C, class P>
__device__ __forceinline__ void res_begin(ResRows<C> &rs, const unsigned char *packed, int m0,
                                          int warp_m, int lane, int zrank) {
  const int *ptr = section<int>(packed, P::RES_PTR);
  const ResRec *rec = section<ResRec>(packed, P::RES_REC);
#pragma unroll
  for (int i = 0; i < C::MW; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + C::row_of(warp_m, i) + (lane >> 2) + 8 * half;  // < MP
      const int r = 2 * i + half;
      rs.e[r] = __ldg(ptr + m * (C::KS + 1) + zrank);
      rs.hi[r] = __ldg(ptr + m * (C::KS + 1) + zrank + 1);
    }
#pragma unroll
  for (int r = 0; r < ResRows<C>::R; ++r)
#pragma unroll
    for (int a = 0; a < RES_AHEAD; ++a) rs.q[r][a] = res_load(rec, rs.e[r]++, rs.hi[r]);
#pragma unroll
  for (int i = 0; i < C::MW; ++i)
#pragma unroll
    for (int j = 0; j < C::WG_N / 8; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) rs.acc[i][j][v] = 0.0f;
}

// The records of this thread's rows whose columns fall in the stage at sB
// (features k0 .. k0 + BK - 1), times the stage's X tile.
template <class C, class P, typename T>
__device__ __forceinline__ void res_stage(ResRows<C> &rs, const unsigned char *packed,
                                          unsigned sB, int k0, int wg_n, int lane) {
  const ResRec *rec = section<ResRec>(packed, P::RES_REC);
  const int nb = wg_n * C::WG_N + 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < C::MW; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 2 * i + half;
#pragma unroll 1
      while (rs.q[r][0].x < k0 + C::BK) {  // past the row's end: a column no stage reaches
        const int kk = rs.q[r][0].x - k0;
        const float v = __int_as_float(rs.q[r][0].y);
#pragma unroll
        for (int a = 0; a + 1 < RES_AHEAD; ++a) rs.q[r][a] = rs.q[r][a + 1];
        rs.q[r][RES_AHEAD - 1] = res_load(rec, rs.e[r]++, rs.hi[r]);
#pragma unroll
        for (int j = 0; j < C::WG_N / 8; ++j)
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            unsigned short h;
            asm volatile("ld.shared.u16 %0, [%1];\n"
                         : "=h"(h)
                         : "r"(sB + res_x_offset<C>(nb + 8 * j + b, kk)));
            rs.acc[i][j][2 * half + b] =
                fmaf(v, to_float(*reinterpret_cast<const T *>(&h)), rs.acc[i][j][2 * half + b]);
          }
      }
    }
}

// The tile's records' sums into its accumulators (its wgmma are done).
template <class C>
__device__ __forceinline__ void res_end(const ResRows<C> &rs,
                                        float (&acc)[C::MW][C::WG_N / 8][4]) {
#pragma unroll
  for (int i = 0; i < C::MW; ++i)
#pragma unroll
    for (int j = 0; j < C::WG_N / 8; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] += rs.acc[i][j][v];
}

// ---- several tiles a CTA: the output in slices ---------------------------------------------
// store_tile's view of one warpgroup's slice: its 64-row wgmma tile by SN
// columns of N, staged [SN][64 + 8] (token-major) or [64][SN + 8].
template <class C>
struct SliceView {
  static constexpr bool TOKEN_MAJOR = C::TOKEN_MAJOR;
  static constexpr int MI = 1;
  static constexpr int NI = C::SN / 8;
  static constexpr int WTN = C::SN;
  static constexpr int THREADS = 128;
  __device__ __forceinline__ static int row_of(int warp_m, int) { return (warp_m & 3) * 16; }
  static constexpr int C_ROWS = 64;
  static constexpr int C_COLS = 64;
  static constexpr int C_LD = C::SLICE_LD;
};

// A half slice, for the tensor stores: the warpgroup's 64 rows by SN / 2
// columns of N, staged as the map of Y's box lands (token-major: 32 rows
// of 64 values, 128-byte swizzle; feature-major: 64 rows of 32, 64-byte).
template <class C>
struct HalfView : SliceView<C> {
  static constexpr int NI = C::SN / 16;
  static constexpr int WTN = C::SN / 2;
  static constexpr int SWIZZLE = C::TOKEN_MAJOR ? 128 : 64;
};

// stage_tile by stmatrix (stmatrix_fragments; V: the staged view; SW: as
// staged_at), token-major transposed (the staged rows are tokens): one
// instruction for four of stage_tile's 32-bit stores, or for eight of its
// token-major element stores.  (Odd NI, and two wgmma tiles a warpgroup,
// where ptxas then spilled: stage_tile.)
template <class V, class P, typename T, int NI0 = 0, int NACC = V::NI, int SW = 0>
__device__ __forceinline__ void stage_tile_x4(unsigned char *smem, float (&acc)[V::MI][NACC][4],
                                              const unsigned char *packed, int m0, int warp_m,
                                              int warp_n, int lane) {
  if constexpr (V::NI % 2 != 0 || V::MI > 1) {
    stage_tile<V, P, T, NI0, NACC, SW>(smem, acc, packed, m0, warp_m, warp_n, lane);
  } else {
    const int g = lane >> 2, mw = V::row_of(warp_m, 0);  // (MI == 1)
    const float *bias = section<float>(packed, P::BIAS_OFFSET);
    const unsigned base = sm80::smem_addr(smem);
    float bv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) bv[hh] = P::HAS_BIAS ? bias[m0 + mw + g + 8 * hh] : 0.0f;
    sm90::stmatrix_fragments<V::NI, V::TOKEN_MAJOR>(
        lane,
        [&](int j, int hh) {  // GELU: alternate pipes
          return sm80::epilogue_pair<T, P::HAS_BIAS, P::ACT>(
              acc[0][NI0 + j][2 * hh], acc[0][NI0 + j][2 * hh + 1], P::SCALE, bv[hh],
              (j & 1) != 0);
        },
        [&](int j, int hh, int i) {
          const int n8 = warp_n * V::WTN + 8 * j, m8 = mw + 8 * hh;
          const int at =
              V::TOKEN_MAJOR ? staged_at<V, SW>(n8 + i, m8) : staged_at<V, SW>(m8 + i, n8);
          return base + 2u * static_cast<unsigned>(at);
        });
  }
}

// The warpgroup's tile to Y by tensor stores, SN / 2 columns of N at a
// time (half slice H on) through the two halves of its slice buffer in
// turn: each half staged as the map's box lands, fenced to the async proxy,
// then sent by one tensor store that the warpgroup's first thread issues,
// and written again once that store has read it (two stores later, so the
// warpgroup seldom waits: at a tile's first half, for the last tile's
// second to last).
template <class C, class P, typename T, int H = 0>
__device__ __forceinline__ void store_halves(unsigned char *buf, float (&acc)[C::MW][C::WG_N / 8][4],
                                             const unsigned char *packed, int m0, int n0,
                                             int warp, int lane, int bar,
                                             const sm90::TensorMap *ymap) {
  using V = HalfView<C>;
  constexpr int HALF_BYTES = 64 * (C::SN / 2) * 2;
  unsigned char *half = buf + (H & 1) * HALF_BYTES;
  const bool first = (threadIdx.x & 127) == 0;
  if (first) sm90::wait_bulk_read<1>();  // this half's store before (two stores ago) has read it
  sm90::named_sync(bar, 128);
  stage_tile_x4<V, P, T, H * V::NI, C::WG_N / 8, V::SWIZZLE>(half, acc, packed, m0, warp & 3,
                                                              0, lane);
  sm90::fence_proxy_async();  // this thread's writes -> the tensor store's reads
  sm90::named_sync(bar, 128);
  if (first) {
    const int ns = n0 + H * (C::SN / 2);
    sm90::tma_store_2d(ymap, C::TOKEN_MAJOR ? m0 : ns, C::TOKEN_MAJOR ? ns : m0,
                       sm80::smem_addr(half));
    sm90::commit_bulk();
  }
  if constexpr ((H + 1) * (C::SN / 2) < C::WG_N)
    store_halves<C, P, T, H + 1>(buf, acc, packed, m0, n0, warp, lane, bar, ymap);
}

// This warpgroup's tile (rows m0 .. m0 + 63, columns n0 .. n0 + WG_N
// - 1) through its slice buffer at `buf`, SN columns at a time (slice S on),
// its 128 threads meeting at named barrier `bar` around each slice.  With
// `ymap` (YS, the runtime's map of Y) the tile goes to Y by tensor stores
// (store_halves); without it the warpgroup copies the slices out itself.
template <class C, class P, typename T, int S = 0>
__device__ __forceinline__ void store_sliced(unsigned char *buf, float (&acc)[C::MW][C::WG_N / 8][4],
                                             const unsigned char *packed, unsigned short *Y, int m0,
                                             int n0, int N, int warp, int lane, int bar,
                                             const sm90::TensorMap *ymap) {
  using V = SliceView<C>;
  if constexpr (C::YS)
    if (ymap) return store_halves<C, P, T>(buf, acc, packed, m0, n0, warp, lane, bar, ymap);
  sm90::named_sync(bar, 128);  // the slice before (or the last tile's) is copied out
  stage_tile_x4<V, P, T, S * V::NI, C::WG_N / 8>(buf, acc, packed, m0, warp & 3, 0, lane);
  sm90::named_sync(bar, 128);
  // (one chunk at a time: the later slices' accumulators are still live)
  copy_tile<V, P, 1>(buf, Y, m0, n0 + S * C::SN, N, threadIdx.x & 127);
  if constexpr ((S + 1) * C::SN < C::WG_N)
    store_sliced<C, P, T, S + 1>(buf, acc, packed, Y, m0, n0, N, warp, lane, bar, ymap);
}

// ---- split K: the partial tiles summed over the cluster --------------------------------------
// acc -> this CTA's fp32 partial tile in shared memory (part_at).
template <class C>
__device__ __forceinline__ void tma_store_partial(unsigned part,
                                                  const float (&acc)[C::MW][C::WG_N / 8][4],
                                                  int warp_m, int wg_n, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < C::MW; ++i)
#pragma unroll
    for (int j = 0; j < C::WG_N / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = C::row_of(warp_m, i) + g + 8 * half, c = wg_n * C::WG_N + 8 * j + 2 * t;
        if constexpr (C::TOKEN_MAJOR) {  // columns c and c + 1 are P_LD apart
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(part + C::part_at(r, c) * 4),
                       "f"(acc[i][j][2 * half])
                       : "memory");
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(part + C::part_at(r, c + 1) * 4),
                       "f"(acc[i][j][2 * half + 1])
                       : "memory");
        } else {
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(part + C::part_at(r, c) * 4),
                       "f"(acc[i][j][2 * half]), "f"(acc[i][j][2 * half + 1])
                       : "memory");
        }
      }
}

// This CTA's slice of rows (BM / KS of them): the KS partials summed in
// rank order (its own from its partial tile, the others' from its receive
// buffer, which their push_partials filled), then the epilogue, stored
// element by element (contiguous along Y's rows in either layout).
// Element i of a slice is (row i / BN, column i % BN) feature-major and
// (row i % ROWS, column i / ROWS) token-major, the way Y's rows run.
template <class C>
struct Slice {
  static constexpr int ROWS = C::BM / C::KS;
  static constexpr int COUNT = ROWS * C::BN;
  __device__ __forceinline__ static void at(int i, int &r, int &c) {
    r = C::TOKEN_MAJOR ? i % ROWS : i / C::BN;
    c = C::TOKEN_MAJOR ? i / ROWS : i % C::BN;
  }
};

// The other slices of this CTA's partial tile (part), 4 elements at a
// time (4 consecutive elements are contiguous in the tile: ROWS and BN are
// multiples of 4), into their owners' receive buffers: this CTA's slot at
// owner o is (zrank - o - 1) mod KS.
template <class C>
__device__ __forceinline__ void push_partials(unsigned part, unsigned base, int zrank, int tid) {
  using S = Slice<C>;
  static_assert(S::ROWS % 4 == 0 && C::BN % 4 == 0, "slices pushed 4 floats at a time");
  constexpr int Q = S::COUNT / 4;
#pragma unroll 1
  for (int k = 1; k < C::KS; ++k) {
    const int o = (zrank + k) % C::KS;
    const unsigned slot = static_cast<unsigned>((zrank - o - 1 + 2 * C::KS) % C::KS);
    for (int q = tid; q < Q; q += C::THREADS) {
      int r, c;
      S::at(4 * q, r, c);
      unsigned w[4];
      lds128(w, part + C::part_at(o * S::ROWS + r, c) * 4);
      const float4 v = make_float4(__uint_as_float(w[0]), __uint_as_float(w[1]),
                                   __uint_as_float(w[2]), __uint_as_float(w[3]));
      sm90::st_async_v4(base + 1024 + C::RECV_OFFSET + 16u * (slot * Q + q),
                        static_cast<unsigned>(o), v, base + C::RBAR);
    }
  }
}

template <class C, class P, typename T>
__device__ __forceinline__ void tma_reduce_store(unsigned part, const float *recv,
                                                 const unsigned char *packed,
                                                 unsigned short *Y, int m0, int n0, int N,
                                                 int zrank, int tid) {
  using S = Slice<C>;
  const float *bias = section<float>(packed, P::BIAS_OFFSET);
  const int r0 = zrank * S::ROWS;
  for (int i = tid; i < S::COUNT; i += C::THREADS) {
    int r, c;
    S::at(i, r, c);
    const int m = m0 + r0 + r, n = n0 + c;
    if (m >= P::M || n >= N) continue;
    const float own = __uint_as_float(lds32(part + C::part_at(r0 + r, c) * 4));
    float sum = 0.0f;
#pragma unroll
    for (int z = 0; z < C::KS; ++z)
      sum += z == zrank ? own : recv[((z - zrank - 1 + C::KS) % C::KS) * S::COUNT + i];
    const float bv = P::HAS_BIAS ? bias[m] : 0.0f;
    const unsigned pair = sm80::epilogue_pair<T, P::HAS_BIAS, P::ACT>(sum, 0.0f, P::SCALE, bv);
    Y[C::TOKEN_MAJOR ? (size_t)n * P::M + m : (size_t)m * N + n] =
        static_cast<unsigned short>(pair & 0xffffu);
  }
}

// ---- kernel body ------------------------------------------------------------------------
template <class C, class P, typename T>
__device__ __forceinline__ void tma_gemm(const unsigned char *__restrict__ packed,
                                         const void *__restrict__ Xv, void *__restrict__ Yv,
                                         int N, const sm90::TensorMap *map,
                                         const sm90::TensorMap *ymap_arg = nullptr) {
  static_assert(!P::HAS_RES || C::WG_N <= 64,
                "the residual's sums take WG_N / 2 registers a thread more: decode tiles only");
  static_assert(P::MP % (C::BM * C::CM) == 0 && P::KP % (C::BK * C::KS) == 0,
                "plan must pad M to the cluster's rows and K to its stages");
  const unsigned short *X = static_cast<const unsigned short *>(Xv);
  unsigned short *Y = static_cast<unsigned short *>(Yv);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char *smem = smem_raw + ((1024u - (sm80::smem_addr(smem_raw) & 1023u)) & 1023u);
  const unsigned base = sm80::smem_addr(smem);
  const unsigned full = base, empty = base + 8 * C::STAGES, stages = base + 1024;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // cluster (1, CM, KS): rank along M (the X tile's share) and along z (K's slice)
  const unsigned rank = C::CM > 1 ? blockIdx.y % C::CM : 0u;
  const int zrank = C::KS > 1 ? blockIdx.z : 0;
  // the tiles along M: MT in turn, CM * BM rows apart (the cluster's other
  // CTAs take the rows between); fewer at the end of M
  constexpr int STEP = C::CM * C::BM;
  // this cluster's column of N tiles and slot along M (RA: remapped so
  // that consecutive clusters go down M; a cluster's CTAs keep theirs)
  int col = blockIdx.x, slot = blockIdx.y / C::CM;
  if constexpr (C::RA) {
    const int slots = gridDim.y / C::CM, u = col + gridDim.x * slot;
    col = u / slots;
    slot = u % slots;
  }
  const int n0 = col * C::BN, m_first = (slot * C::MT * C::CM + rank) * C::BM;
  const int tiles = C::MT == 1 ? 1 : min(C::MT, P::MP / STEP - slot * C::MT);
  constexpr bool CLUSTER = C::CM * C::KS > 1;
  // the runtime maps X unless its rows are not 16-byte aligned (layout 1, N % 8 != 0)
  const bool use_map = C::TOKEN_MAJOR || (N & 7) == 0;
  // ... and Y likewise (YS): without it the slices are copied out by the
  // warpgroups
  const sm90::TensorMap *ymap = C::YS && use_map ? ymap_arg : nullptr;
  constexpr int KT = P::KP / C::BK / C::KS;
  constexpr int S = C::STAGES;
  // the consumers read stages after their wgmma (the residual, the steps):
  // each warp releases a stage itself (tma_release)
  constexpr bool WARP_RELEASE = C::RS || P::HAS_RES;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      sm90::mbar_init(full + 8 * s, use_map ? 1 : 33);
      sm90::mbar_init(empty + 8 * s, (C::THREADS / (WARP_RELEASE ? 32 : 128)) * C::CM);
    }
    if constexpr (C::KS > 1)  // split K: the others' partial sums of this CTA's slice
      sm90::recv_arm(base + C::RBAR, C::RECV_BYTES);
    if constexpr (C::RS)
      for (int h = 0; h < 2; ++h) {
        sm90::mbar_init(base + C::RSBAR + 8 * h, 1);                        // afull
        sm90::mbar_init(base + C::RSBAR + 16 + 8 * h, C::THREADS / 32);     // bfull
        sm90::mbar_init(base + C::RSBAR + 32 + 8 * h, C::THREADS / 128);    // rfree
      }
    sm90::fence_mbar_init();
  }
  if constexpr (CLUSTER)
    sm90::cluster_sync();  // every CTA's barriers exist before any arrive or multicast
  else
    __syncthreads();

  // the weights of the first stages (as many as the stages hold) are
  // constant: copied while the stream's previous kernel drains; nothing
  // else before it is done (SF_DECLARE_PDL)
  const int early = min(S, tiles * KT);
  // (RS) the tile's first word of step ends and its first step, loaded while the rest waits
  unsigned rs_first = 0;
  int rs_base = 0;
  if (warp == C::PRODUCER_WARP) {
    if (lane == 0)
      for (int it = 0; it < early; ++it)
        tma_produce_weights<C, P>(packed, use_map, stages, full, m_first, STEP, it, zrank * KT);
    if constexpr (C::RS) {  // (every lane: the whole warp follows the steps)
      rs_first = __ldg(rs_end_ptr<C, P>(packed, m_first));
      rs_base = __ldg(reinterpret_cast<const int *>(packed + P::RS_PTR) + m_first / C::BM);
    }
  }
  if constexpr (C::RS)  // the halves' slots no column fills must hold no NaN
    if (warp != C::PRODUCER_WARP) {
      for (int i = tid; i < 2 * C::RS_HALF / 16; i += C::THREADS)
        sts128(stages + C::RS_OFFSET + 16 * i, 0u, 0u, 0u, 0u);
      sm90::fence_proxy_async();
      sm90::named_sync(1, C::THREADS);
    }
  // (P::HAS_RES) the residual's cursors of the first tile, constant too
  ResRows<C> rs;
  if constexpr (P::HAS_RES)
    if (warp != C::PRODUCER_WARP)
      res_begin<C, P>(rs, packed, m_first, (warp >> 2) % C::WM * 4 + (warp & 3), lane, zrank);
  sm90::griddep_wait();

  if (warp == C::PRODUCER_WARP) {
    tma_produce<C, P>(packed, X, N, map, use_map, stages, full, empty, m_first, STEP, tiles, n0,
                      rank, zrank * KT, lane, early, rs_first, rs_base);
    sm90::griddep_launch_dependents();
  } else {
    const int wg = warp >> 2;
    const int wg_m = wg % C::WM, wg_n = wg / C::WM;
    float acc[C::MW][C::WG_N / 8][4];
    unsigned e0[TMA_META_REGS<C>], e1[TMA_META_REGS<C>];
    unsigned char *c_tile = smem + 1024 + C::C_OFFSET;
    int it0 = 0;  // stage counter at the tile's first K tile
    // (RS, one tile) steps copied; whether step rs_j - 1 awaits its wgmma;
    // the step whose wgmma the last committed group holds (-1: none); the
    // last step whose half this warp waited for
    int rs_j = 0, rs_prev = -1, rs_waited = 1;
    bool rs_issue = false;
    const unsigned rs_bar = base + C::RSBAR;
#pragma unroll 1
    for (int t = 0; t < tiles; ++t, it0 += KT) {
      const int m0 = m_first + t * STEP;
#pragma unroll
      for (int i = 0; i < C::MW; ++i)
#pragma unroll
        for (int j = 0; j < C::WG_N / 8; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
      if constexpr (P::HAS_RES)
        if (t > 0) res_begin<C, P>(rs, packed, m0, wg_m * 4 + (warp & 3), lane, zrank);
      auto iteration = [&](int it, unsigned(&e)[TMA_META_REGS<C>]) {
        const int s = it % S;
        sm90::mbar_wait(full + 8 * s, (it / S) & 1);
        keep(e);  // its last reader, stage it-2's wgmma, is done (the wait below, one stage ago)
        const unsigned sB = stages + s * C::STAGE_BYTES;
        const unsigned lst = sB + C::B_BYTES + C::AE_BYTES;  // (RS) the stage's list
        RsAhead ahead;
        if constexpr (C::RS) rs_read_list<C>(ahead, lst, warp);
        tma_load_meta<C>(e, sB + C::B_BYTES, wg_m, warp, lane);
        int issued = -1;
        tma_compute_stage<C, T>(acc, sB + C::B_BYTES, sB, e, wg_m, wg_n);
        if constexpr (P::HAS_RES)  // while the stage's wgmma run
          res_stage<C, P, T>(rs, packed, sB, (zrank * KT + it - it0) * C::BK, wg_n, lane);
        if constexpr (C::RS)
          if (rs_issue) {  // the last step copied: its wgmma, a group of its own after the
            rs_mma<C, T>(acc, stages, rs_bar, rs_j - 1, wg_m, warp, lane);  // stage's
            sm90::commit_group();
            issued = rs_j - 1;
            rs_issue = false;
          }
        if (issued >= 0)
          sm90::wait_group<2>();  // stage it-1's wgmma (and any step's before) are done
        else
          sm90::wait_group<1>();  // stage it-1's wgmma is done: release it
        if (it > it0) tma_release<C, WARP_RELEASE>(empty, (it - 1) % S);
        if constexpr (C::RS) {
          // the last group's step wgmma is done in this warpgroup
          if (rs_prev >= 0 && (tid & 127) == 0) sm90::mbar_arrive(rs_bar + 32 + 8 * (rs_prev & 1));
          rs_prev = issued;
          if (rs_copy<C>(stages, rs_bar, sB, lst, ahead, rs_j, rs_waited, warp, lane)) {
            rs_issue = true;
            ++rs_j;
          }
        }
      };
      int kt = 0;
      for (; kt + 1 < KT; kt += 2) {
        iteration(it0 + kt, e0);
        iteration(it0 + kt + 1, e1);
      }
      if (kt < KT) iteration(it0 + kt, e0);
      if constexpr (C::RS)
        if (rs_issue) {  // the last K tile ended a step
          rs_mma<C, T>(acc, stages, rs_bar, rs_j - 1, wg_m, warp, lane);
          sm90::commit_group();
        }
      sm90::wait_group<0>();
      keep(e0);
      keep(e1);
      tma_release<C, WARP_RELEASE>(empty, (it0 + KT - 1) % S);
      if constexpr (P::HAS_RES) res_end<C>(rs, acc);
      // the CTA's last main loop is done: the next kernel may start (its
      // weights' first stages load while this one stores)
      if (t + 1 == tiles) sm90::griddep_launch_dependents();
      if constexpr (C::SLICED) {
        // (the producer meanwhile fills the next tile's stages) each
        // warpgroup stores its rows through its own slice buffer
        store_sliced<C, P, T>(c_tile + wg * C::SLICE_BYTES, acc, packed, Y,
                              m0 + wg_m * C::MW * 64, n0 + wg_n * C::WG_N, N, warp, lane, 2 + wg,
                              ymap);
      } else {
        // every consumer is done with the stages (MT == 1: the output tile
        // reuses them) or with the last tile's output buffer (MT > 1: the
        // producer meanwhile fills the next tile's stages)
        sm90::named_sync(1, C::THREADS);
        if constexpr (C::KS > 1) {
          tma_store_partial<C>(stages, acc, wg_m * 4 + (warp & 3), wg_n, lane);
        } else {
          // (store_tile, staged by stmatrix)
          stage_tile_x4<C, P, T>(c_tile, acc, packed, m0, wg_m * 4 + (warp & 3), wg_n, lane);
          ConsumerSync<C::THREADS>::sync();
          copy_tile<C, P>(c_tile, Y, m0, n0, N, tid);
        }
      }
    }
    // (YS) the warpgroup's tensor stores are done before its CTA leaves
    if constexpr (C::YS)
      if (ymap && (tid & 127) == 0) sm90::wait_bulk<0>();
  }
  if constexpr (C::KS > 1) {
    if (warp != C::PRODUCER_WARP) {  // (one tile)
      sm90::named_sync(1, C::THREADS);  // this CTA's partial tile is written
      push_partials<C>(stages, base, zrank, tid);
      sm90::mbar_wait(base + C::RBAR, 0);  // the others' sums of this CTA's slice are here
      tma_reduce_store<C, P, T>(stages,
                                reinterpret_cast<const float *>(smem + 1024 + C::RECV_OFFSET),
                                packed, Y, m_first, n0, N, zrank, tid);
    }
  }
  // no CTA leaves while another of its cluster may still arrive on its
  // barriers or multicast into it (split K alone reads no other CTA)
  if constexpr (C::CM > 1) sm90::cluster_sync();
}

}  // namespace nm24
}  // namespace sf
