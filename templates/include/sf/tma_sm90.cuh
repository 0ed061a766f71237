// tma_sm90.cuh -- Hopper's asynchronous copies and barriers (sm_90): the
// tensor maps of X (and Y) a kernel receives after its four parameters
// (the runtime encodes them per launch: sf_kernel_args_set), TMA tile
// loads (optionally multicast to the CTAs of a cluster) and stores, 1-D
// bulk copies, mbarriers (local and across a cluster) and cluster
// barriers.  Thin wrappers over PTX (PTX ISA: cp.async.bulk.tensor,
// cp.async.bulk, mbarrier, mapa, barrier.cluster).
#pragma once

namespace sf {
namespace sm90 {

// A CUtensorMap by value (128 bytes, 64-byte aligned), passed as a
// __grid_constant__ kernel parameter.
struct alignas(64) TensorMap {
  unsigned long long v[16];
};

// The module declares its map of X: {layout (1: X is K x N, 2: X is N x K),
// K, box width (elements along X's contiguous dimension), box rows}.
#define SF_DECLARE_X_MAP(layout, k, box_w, box_rows) \
  extern "C" __device__ const int sf_x_map[4] = {(layout), (k), (box_w), (box_rows)}

// ... and its map of Y, for tensor stores: {layout (1: Y is M x N, 2: Y is
// N x M), M, box width, box rows}; the parameter after X's map.
#define SF_DECLARE_Y_MAP(layout, m, box_w, box_rows) \
  extern "C" __device__ const int sf_y_map[4] = {(layout), (m), (box_w), (box_rows)}

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives and waits.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The cluster's barrier in two halves, without ordering memory: after
// fence_mbar_init, an arrival that lets the cluster's CTAs (once they
// wait) use this CTA's barriers.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes barrier initializations visible to the cluster (and the async proxy).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives once and expects `bytes` more of transfers to complete on it.
__device__ __forceinline__ void mbar_arrive_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on the barrier at the same offset in CTA `cta` of the cluster,
// with the default (CTA-scope) release: what it hands over is shared memory
// the tensor cores have finished reading; it publishes no data.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// The receiving side of split K's pushed partial sums (st_async_v4): the
// barrier at `bar`, armed for `bytes` to arrive (one arrival, its own).
__device__ __forceinline__ void recv_arm(unsigned bar, unsigned bytes) {
  mbar_init(bar, 1);
  mbar_arrive_expect(bar, bytes);
}

// At a CTA's start, every thread: thread 0 arms the receive barrier (where
// `arm`: the CTAs that receive) and publishes it, and the cluster arrives
// without a fence; the CTAs that push wait for that arrival (cluster_wait)
// before their first st_async_v4, long after.
__device__ __forceinline__ void recv_init(unsigned bar, unsigned bytes, bool arm) {
  if (arm && threadIdx.x == 0) {
    recv_arm(bar, bytes);
    fence_mbar_init();
  }
  cluster_arrive_relaxed();
}

__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// A 2-D box of the map at coordinates (c0 along the contiguous dimension,
// c1) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TensorMap *map, int c0, int c1,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The same box written to the same offset of every CTA in `mask`, each
// completing on its own barrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TensorMap *map, int c0,
                                                      int c1, unsigned bar,
                                                      unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}

// A 2-D box of shared memory at `src` (laid out as the map's loads land
// it: swizzled to the box's row) to the map's coordinates (c0 along the
// contiguous dimension, c1); what lies outside the matrix is not written.
// One bulk group per commit_bulk(); the source may be written again once
// wait_bulk_read() says the group has been read.
__device__ __forceinline__ void tma_store_2d(const TensorMap *map, int c0, int c1, unsigned src) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          reinterpret_cast<unsigned long long>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}

__device__ __forceinline__ void commit_bulk() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's bulk groups have their sources still to
// read (their shared memory may then be written).
template <int N>
__device__ __forceinline__ void wait_bulk_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Until at most N of this thread's bulk groups are still to complete (their
// writes done).
template <int N>
__device__ __forceinline__ void wait_bulk() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// `bytes` (a multiple of 16) contiguous bytes of global memory into shared
// memory, completing on `bar`.
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes,
                                          unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Four floats into the shared memory of CTA `cta` of the cluster, at
// `local`'s offset (16-byte aligned), their 16 bytes counted on the barrier
// at `bar`'s offset there: the receiver's wait on that barrier sees them,
// with no fence on either side.
__device__ __forceinline__ void st_async_v4(unsigned local, unsigned cta, float4 v,
                                            unsigned bar) {
  asm volatile(
      "{\n.reg .b32 ra, rb;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mapa.shared::cluster.u32 rb, %2, %1;\n"
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [ra], {%3, %4, %5, %6}, [rb];\n}\n"
      ::"r"(local), "r"(cta), "r"(bar), "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)),
      "r"(__float_as_uint(v.z)), "r"(__float_as_uint(v.w))
      : "memory");
}

// Programmatic dependent launch.  A module that declares SF_DECLARE_PDL is
// launched (runtime/module.c) while the stream's previous work is still
// draining: its kernels call griddep_wait() before they read anything
// that work may write (X) or write anything it may read (Y); only their
// constant operands (the packed weights) may be read before it.  Once
// every CTA has called griddep_launch_dependents() (or exited), the next
// such kernel may start the same way.
#define SF_DECLARE_PDL() extern "C" __device__ const int sf_pdl = 1

__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Named barrier `id` (1..15) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sm90
}  // namespace sf
