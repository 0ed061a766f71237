// mma_sm80.cuh -- the sm_80 tensor-core building blocks (also valid on
// sm_90a): cp.async copies into shared memory, ldmatrix fragment loads and
// mma.sync m16n8k16 with fp32 accumulation, for fp16 and bf16 operands.
// Each wrapper is one PTX instruction; fragment layouts are the PTX ISA's
// (section "Matrix fragments for mma.m16n8k16").
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "sf/common.cuh"

namespace sf {
namespace sm80 {

// Shared-memory address (32-bit, .shared window) of a generic pointer.
__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- cp.async ---------------------------------------------------------------

// 16 bytes global -> shared, bypassing L1.  When `valid` is false nothing is
// read and the 16 shared bytes are zero-filled (the src-size form).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void *src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most PENDING committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// 16 bytes (four 32-bit words) into shared memory.
__device__ __forceinline__ void st_shared_16(unsigned dst, const unsigned (&w)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}

// One 32-bit word into shared memory.
__device__ __forceinline__ void st_shared_u32(unsigned dst, unsigned w) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(w) : "memory");
}

// One 16-bit value into shared memory.
__device__ __forceinline__ void st_shared_u16(unsigned dst, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(v) : "memory");
}

// One byte of shared memory (zero-extended).
__device__ __forceinline__ unsigned ld_shared_u8(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// ---- ldmatrix -----------------------------------------------------------------

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, each matrix transposed on the way (row-major K x N tiles become
// the column-major B operand of mma.row.col).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- mma.sync m16n8k16, fp32 accumulate -----------------------------------------

template <typename T> struct Mma16816;

template <> struct Mma16816<__half> {
  __device__ static __forceinline__ void run(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <> struct Mma16816<__nv_bfloat16> {
  __device__ static __forceinline__ void run(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                          const unsigned (&b)[2]) {
  Mma16816<T>::run(d, a, b);
}

// ---- packing two floats into one 32-bit pair of T ---------------------------------

template <typename T> struct is_half { static constexpr bool value = false; };
template <> struct is_half<__half> { static constexpr bool value = true; };

template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);

template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned *>(&h);
}

template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned *>(&h);
}

// Two accumulators through the epilogue, packed as two T.  fp16 with GELU
// runs the activation in f16x2 (the values are rounded to fp16 anyway;
// a pair costs about half the fp32 instructions), on the MUFU pipe or,
// `fma_pipe`, on the FMA pipe (a caller alternates them over its pairs); the
// rest in fp32.
template <typename T, bool HAS_BIAS, int ACT>
__device__ __forceinline__ unsigned epilogue_pair(float a0, float a1, float scale, float bias,
                                                  bool fma_pipe = false) {
  if constexpr (ACT == ACT_GELU && is_half<T>::value) {
    const unsigned x = pack2<T>(epilogue<HAS_BIAS, ACT_NONE>(a0, scale, bias),
                                epilogue<HAS_BIAS, ACT_NONE>(a1, scale, bias));
    return fma_pipe ? gelu_poly_f16x2(x) : gelu_f16x2(x);
  } else {
    return pack2<T>(epilogue<HAS_BIAS, ACT, true>(a0, scale, bias),
                    epilogue<HAS_BIAS, ACT, true>(a1, scale, bias));
  }
}

}  // namespace sm80
}  // namespace sf
