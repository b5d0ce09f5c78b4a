// The 16-lane float32 vectors the native CPU kernels compute with (GCC / Clang vector
// extensions: one AVX-512 register, two AVX2 ones, plain code elsewhere), shared by linear.cc and
// shift_mix.cc.
#pragma once

#include <cstdint>
#include <cstring>

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
