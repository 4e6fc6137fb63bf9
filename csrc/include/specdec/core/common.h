// Shared definitions for the framework-free kernels: host/device qualifiers, bit casts, dtype tags.
// Nothing here knows about torch.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

// Host code is compiled once per instruction set (csrc/cpu/row_ops.cpp); functions live in an inline
// namespace named after it so that the copies never collide at link time. Plain types stay outside.
#ifndef SPECDEC_CPU_ISA
#define SPECDEC_CPU_ISA generic
#endif
#define SPECDEC_NS_BEGIN \
  namespace specdec {    \
  inline namespace SPECDEC_CPU_ISA {
#define SPECDEC_NS_END \
  }                    \
  }

namespace specdec {

// Element types of logits / draft probabilities, as passed from the bindings.
enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

}  // namespace specdec

SPECDEC_NS_BEGIN

SPECDEC_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPECDEC_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

SPECDEC_HD uint64_t double_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPECDEC_HD double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// bfloat16 -> float32 is exact: the bf16 bits are the top half of the float32 bits.
SPECDEC_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// IEEE half -> float32, exact for every input (normals, subnormals, inf, NaN), branch-free selects.
SPECDEC_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu);
  const uint32_t exp = em >> 10;
  // Normal: rebias exponent by 112. Inf/NaN: exponent 255. Subnormal: value = em * 2^-24.
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t infnan = (em << 13) | 0x7f800000u;
  const float sub = static_cast<float>(em) * 5.9604644775390625e-08f;  // 2^-24, exact
  uint32_t bits = exp == 0x1fu ? infnan : normal;
  bits = exp == 0 ? float_bits(sub) : bits;
  return bits_float(bits | sign);
}

template <DType D>
struct Elem;
template <>
struct Elem<DType::kFloat32> {
  using type = float;
  static SPECDEC_HD float load(const float* p, int64_t i) { return p[i]; }
};
template <>
struct Elem<DType::kBFloat16> {
  using type = uint16_t;
  static SPECDEC_HD float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }
};
template <>
struct Elem<DType::kFloat16> {
  using type = uint16_t;
  static SPECDEC_HD float load(const uint16_t* p, int64_t i) { return fp16_to_float(p[i]); }
};

constexpr float kFloat32Max = 3.4028234663852886e+38f;

SPECDEC_NS_END
