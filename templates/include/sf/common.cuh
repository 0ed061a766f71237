// common.cuh -- types, conversions and the fused epilogue shared by every
// sparseforge kernel family.  Compiles under NVRTC (no host headers).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "sf/abi.cuh"

namespace sf {

// ---- element types ------------------------------------------------------
// The generated source defines SF_DTYPE_FP32, SF_DTYPE_FP16 or
// SF_DTYPE_BF16 (through the template) and uses sf::elem_t.
template <typename T> struct elem_traits;
template <> struct elem_traits<float> {
  __device__ static float to_float(float v) { return v; }
  __device__ static float from_float(float v) { return v; }
};
template <> struct elem_traits<__half> {
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};
template <> struct elem_traits<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

template <typename T> __device__ __forceinline__ float to_float(T v) {
  return elem_traits<T>::to_float(v);
}
template <typename T> __device__ __forceinline__ T from_float(float v) {
  return elem_traits<T>::from_float(v);
}

// ---- epilogue -------------------------------------------------------------
// sf::Activation (ACT_NONE, ACT_RELU, ACT_GELU) is in sf/abi.cuh, made from
// the public header's SF_ACTIVATION_TABLE.

// tanh in one MUFU instruction (sm_75+; relative error about 2^-11): for
// results that are rounded to fp16 or bf16 anyway.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as the reference.
// APPROX: tanh.approx instead of tanhf's ~20 instructions, which made the
// epilogue a large part of short-K kernels with 16-bit outputs.
template <bool APPROX = false>
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;
  float u = k * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + (APPROX ? tanh_approx(u) : tanhf(u)));
}

// GELU of two fp16 values packed in a register, in f16x2 arithmetic (5
// half2 ops and one tanh.approx.f16x2 for the pair; the fp32 form takes
// about 7 ops and a MUFU per value).  Written as
//     h = x/2,  y = h + h * tanh(x * (k + c x^2)),
// which stays exact where x^2 overflows: tanh -> +-1 gives x or 0.
__device__ __forceinline__ unsigned gelu_f16x2(unsigned x) {
  const unsigned C = 0x28912891u;  // 0.7978845608 * 0.044715
  const unsigned K = 0x3a623a62u;  // 0.7978845608 = sqrt(2/pi)
  const unsigned HALF = 0x38003800u;
  unsigned y;
  asm("{\n .reg .b32 x2, p, u, t, h;\n"
      " mul.rn.f16x2 x2, %1, %1;\n"
      " fma.rn.f16x2 p, x2, %2, %3;\n"
      " mul.rn.f16x2 u, %1, p;\n"
      " tanh.approx.f16x2 t, u;\n"
      " mul.rn.f16x2 h, %1, %4;\n"
      " fma.rn.f16x2 %0, h, t, h;\n}"
      : "=r"(y) : "r"(x), "r"(C), "r"(K), "r"(HALF));
  return y;
}

// The same GELU of an fp16 pair on the FMA pipe, no MUFU:
//     gelu(x) = relu(x) - t q(t),  t = min(|x|, 3.75),  q(t) = (1 - tanh(s(t))) / 2,
// -q a degree-6 polynomial in u = t (2/3.75) - 1 (a Chebyshev fit, Horner in
// f16x2).  11 f16x2 instructions a pair; its error is that of gelu_f16x2
// (max 1.4e-3 against 1.3e-3, both mostly the fp16 rounding of y).  The
// constants and an exact emulation: generator/tools/gelu_poly.py.  An
// epilogue that sends some pairs here and the rest to gelu_f16x2 keeps both
// the FMA and the MUFU pipes busy.  (.NaN: a NaN input stays NaN.)
__device__ __forceinline__ unsigned gelu_poly_f16x2(unsigned x) {
  unsigned y;
  asm("{\n .reg .b32 t, u, q, r;\n"
      " abs.f16x2 t, %1;\n"
      " min.NaN.f16x2 t, t, %2;\n"
      " fma.rn.f16x2 u, t, %3, %4;\n"
      " fma.rn.f16x2 q, %5, u, %6;\n"
      " fma.rn.f16x2 q, q, u, %7;\n"
      " fma.rn.f16x2 q, q, u, %8;\n"
      " fma.rn.f16x2 q, q, u, %9;\n"
      " fma.rn.f16x2 q, q, u, %10;\n"
      " fma.rn.f16x2 q, q, u, %11;\n"
      " max.NaN.f16x2 r, %1, %12;\n"
      " fma.rn.f16x2 %0, t, q, r;\n}"
      : "=r"(y)
      : "r"(x), "r"(0x43804380u) /* T = 3.75 */, "r"(0x38443844u) /* 2/T */,
        "r"(0xbc00bc00u) /* -1 */, "r"(0x266d266du), "r"(0xabcfabcfu), "r"(0xa360a360u),
        "r"(0x31c431c4u), "r"(0xb35fb35fu), "r"(0x302f302fu), "r"(0xa7bfa7bfu), "r"(0u));
  return y;
}

// y = act(scale * acc + bias); HAS_BIAS and ACT are compile-time so the
// unused parts vanish.  APPROX: the fast GELU (16-bit outputs only).
template <bool HAS_BIAS, int ACT, bool APPROX = false>
__device__ __forceinline__ float epilogue(float acc, float scale, float bias) {
  float y = acc * scale;
  if (HAS_BIAS) y += bias;
  if (ACT == ACT_RELU) y = fmaxf(y, 0.0f);
  if (ACT == ACT_GELU) y = gelu_tanh<APPROX>(y);
  return y;
}

// Byte offset into the packed buffer, typed.
template <typename T>
__device__ __forceinline__ const T *section(const unsigned char *packed,
                                            unsigned long long offset) {
  return reinterpret_cast<const T *>(packed + offset);
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Eight 16-bit values of row r of a rows x cols row-major matrix from column
// c, zero past its edges, packed in four words: the element path of a
// 16-byte copy of X (feature-major: K x N; token-major: N x K) where a
// vector load cannot be used (the 2:4 and csr tile loaders).
__device__ __forceinline__ void load8_bounded(const unsigned short *A, int r, int c, int rows,
                                              int cols, unsigned (&w)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int x = c + 2 * j;
    const unsigned lo = (r < rows && x < cols) ? A[(size_t)r * cols + x] : 0u;
    const unsigned hi = (r < rows && x + 1 < cols) ? A[(size_t)r * cols + x + 1] : 0u;
    w[j] = lo | (hi << 16);
  }
}

}  // namespace sf
