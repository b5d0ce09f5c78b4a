// The 16-lane float32 vectors the native CPU kernels compute with (GCC / Clang vector
// extensions: one AVX-512 register, two AVX2 ones, plain code elsewhere), shared by linear.cc,
// wkv_step.cc and shift_mix.cc: their loads from float32, bfloat16 and float16 (widen), stores to
// them (narrow), and sums across the lanes.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

constexpr int64_t kLanes = 16;

typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));

inline f32x16 widen(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

inline f32x16 splat(float s) { return f32x16{} + s; }

inline float lane_sum(f32x16 v) {  // a tree of halves (a loop over the lanes is 16 dependent adds)
  f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// [sum a, sum b, sum c, sum d] of four 16-lane vectors (a tree of halves, 4 sums in one vector).
inline f32x4 lane_sums4(f32x16 a, f32x16 b, f32x16 c, f32x16 d) {
  auto half = [](f32x16 v) {
    return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  };
  f32x8 a8 = half(a), b8 = half(b), c8 = half(c), d8 = half(d);
  f32x8 ab = __builtin_shufflevector(a8, b8, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(a8, b8, 4, 5, 6, 7, 12, 13, 14, 15);
  f32x8 cd = __builtin_shufflevector(c8, d8, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(c8, d8, 4, 5, 6, 7, 12, 13, 14, 15);
  f32x8 u = __builtin_shufflevector(ab, cd, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(ab, cd, 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(u, u, 0, 4, 2, 6) + __builtin_shufflevector(u, u, 1, 5, 3, 7);
}

typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline f32x16 widen(const uint16_t* p) {  // bfloat16 bits -> float32: the high half of the word
#ifdef __AVX512F__
  __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  return reinterpret_cast<f32x16>(bits);
#else
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  u32x16 bits = __builtin_convertvector(h, u32x16) << 16;
  return reinterpret_cast<f32x16>(bits);
#endif
}

// float16 values (Half: bits; widen / narrow where the build has a float16 conversion:
// kHalfState). narrow rounds to nearest even, as XLA's astype does.
struct Half {
  uint16_t bits;
};
#if defined(__AVX512F__) || defined(__F16C__) || defined(__FLT16_MAX__)
#define RWKV7_HALF_STATE 1
constexpr bool kHalfState = true;
#else
constexpr bool kHalfState = false;
#endif

inline void narrow(float* p, f32x16 v) { store(p, v); }

// float32 -> bfloat16, nearest even; a NaN stays a NaN. With AVX512_BF16 one vcvtneps2bf16 (it
// flushes subnormals to zero, as XLA:CPU's float32 arithmetic, which runs with flush-to-zero,
// already does to the step's values: the reference gives the same bits).
inline void narrow(uint16_t* p, f32x16 v) {
#ifdef __AVX512BF16__
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(reinterpret_cast<__m512>(v))));
#else
  u32x16 bits = reinterpret_cast<u32x16>(v);
  u32x16 rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
  u32x16 quiet = (bits >> 16) | 0x40;
  u32x16 out = (bits & 0x7FFFFFFF) > 0x7F800000 ? quiet : rounded;
  u16x16 h = __builtin_convertvector(out, u16x16);
  std::memcpy(p, &h, sizeof h);
#endif
}

#if defined(__AVX512F__)
inline f32x16 widen(const Half* p) {
  return reinterpret_cast<f32x16>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
inline void narrow(Half* p, f32x16 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(reinterpret_cast<__m512>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(__F16C__)
inline f32x16 widen(const Half* p) {
  __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  f32x16 v;
  std::memcpy(&v, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
  return v;
}
inline void narrow(Half* p, f32x16 v) {
  __m256 lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<char*>(&v) + sizeof lo, sizeof hi);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(__FLT16_MAX__)
inline f32x16 widen(const Half* p) {
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) {
    _Float16 h;
    std::memcpy(&h, p + i, sizeof h);
    v[i] = static_cast<float>(h);
  }
  return v;
}
inline void narrow(Half* p, f32x16 v) {
  for (int i = 0; i < kLanes; ++i) {
    _Float16 h = static_cast<_Float16>(v[i]);
    std::memcpy(p + i, &h, sizeof h);
  }
}
#endif
