// Matrix products of a few rows for XLA:CPU, as XLA FFI handlers (built and registered by
// cpu_kernels/library.py with -O3 -march=native, so the vector width is the host's).
//
// The products take x float32 [M, K] and return y float32 [M, N] = x @ W, W given as
//   rwkv7_linear_f32   w float32  [N, K]               (y = x @ w.T)
//   rwkv7_linear_bf16  w bfloat16 [N, K]
//   rwkv7_linear_int8  q int8 [N, K], scale float32 [N, K / G]   (w = q * scale per group of G)
//   rwkv7_linear_int4  q uint8 [N, K / 2] (two int4 a byte, rwkv7_core.quantization's layout),
//                      scale float32 [N, K / G], G a multiple of 32
//   rwkv7_linear_fp8   q float8_e4m3fn [N, K], scale float32 [N, K / G] (one a row: G = K)
//   rwkv7_linear_kn_f32   w float32  [K, N]            (y = x @ w; rows of x that are exactly
//   rwkv7_linear_kn_bf16  w bfloat16 [K, N]             zero skip their weight row, M = 1)
//   rwkv7_linear_bf16_dot  x and w bfloat16 [N, K], K a multiple of 32 (built only with
//                          AVX512_BF16; rwkv7_capabilities() says so)
//   rwkv7_linear_kn_bf16_dot  x and w bfloat16, w [K, N], K even, N a multiple of 64 (AVX512_BF16)
//   rwkv7_linear_quantized_dot  x bfloat16, q int8 / packed int4 / float8_e4m3fn as above, scale float32
//                               [N, K / G], G a multiple of 32 (AVX512_BF16; tiles of q converted to
//                               bfloat16, the dot product)
//   rwkv7_linear_group     several [N, K] products of those kinds in one call (LinearGroup)
// K a multiple of 16 (and G a multiple of 16 dividing K). Each weight
// element is read once per pass of up to kMaxRows rows of x, widened to float32 in registers
// (no float copy of the weight), multiplied in float32 with float32 accumulation. With AVX-512, more rows against
// float32 / bfloat16 [N, K] weights go by tiles of weight rows (bfloat16 widened once into a
// float32 buffer) against 4 rows of x at a time (many_rows). Output rows (or column blocks) are
// shared out in chunks to the calling thread and XLA's intra-op thread pool: a chunk is taken
// from an atomic counter, so the caller never waits on a task that has not started (a pool
// thread busy elsewhere just finds no chunk left when it comes).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "parallel.h"
#include "vectors.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using ::widen;  // vectors.h's float32 / bfloat16 / float16 ones, beside the int8 and float8 ones below

constexpr int64_t kMaxRows = 4;  // rows of x per pass over the weight
// How far ahead of each weight row's reads to prefetch: without it the int8 [65536, 768] head
// streamed at half the memory bandwidth (docs/benchmarks.md, "Native CPU kernels").
constexpr int64_t kPrefetchBytes = 8192;
constexpr int64_t kTileBytes = 32768;  // weight rows a tile, for products of more than kMaxRows rows
constexpr int64_t kStreamMinK = 256;  // one-row products of shorter rows go 4 rows a step (rows_pass)

typedef int8_t i8x16 __attribute__((vector_size(16)));
inline f32x16 widen(const int8_t* p) {  // GCC scalarises a generic int8 -> float conversion
#if defined(__AVX512F__)
  return reinterpret_cast<f32x16>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#elif defined(__AVX2__)
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
  f32x16 v;
  std::memcpy(&v, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
  return v;
#else
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) v[i] = p[i];
  return v;
#endif
}

// float8_e4m3fn weights (one byte each). A byte's sign and 7 magnitude bits placed as a float16's
// (bits 15 and 13..7) are the same number divided by 2^8 (exponent bias 15 against 7, subnormals
// included), which the float16 convert widens: exact for every finite value (the two NaN codes
// give 480; quantized weights have none), as pallas_kernels.quantized.cpu_float32 does.
struct Fp8 {
  uint8_t bits;
};

inline f32x16 widen(const Fp8* p) {
#if defined(__AVX512F__)
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
  h = _mm256_andnot_si256(_mm256_set1_epi16(1 << 14), h);
  return reinterpret_cast<f32x16>(_mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f)));
#elif defined(__AVX2__) && defined(__F16C__)
  f32x16 v;
  for (int half = 0; half < 2; ++half) {
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half))), 7);
    h = _mm_andnot_si128(_mm_set1_epi16(1 << 14), h);
    __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    std::memcpy(reinterpret_cast<char*>(&v) + half * sizeof f, &f, sizeof f);
  }
  return v;
#else
  f32x16 v;
  for (int i = 0; i < kLanes; ++i) {  // the same number from its fields
    const uint32_t b = p[i].bits, e = (b >> 3) & 15, m = b & 7;
    float mag = static_cast<float>(m) * (1.0f / 512.0f);  // a subnormal: m / 8 * 2^-6
    if (e) {
      const uint32_t bits = ((e + 120) << 23) | (m << 20);  // (1 + m / 8) * 2^(e - 7)
      std::memcpy(&mag, &bits, sizeof mag);
    }
    v[i] = b & 0x80 ? -mag : mag;
  }
  return v;
#endif
}

// int4 weights packed two a byte (rwkv7_core.quantization's layout: in each group of G input
// channels, byte j holds channel j in its low nibble and channel j + G / 2 in its high one, each a
// 4-bit two's-complement value). widen_int4(p, lo, hi): 16 bytes -> the 16 low and the 16 high
// values as float32.
struct Int4 {
  uint8_t bits;
};

inline void widen_int4(const Int4* p, f32x16& lo, f32x16& hi) {
#if defined(__AVX512F__)
  __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = reinterpret_cast<f32x16>(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(d, 28), 28)));
  hi = reinterpret_cast<f32x16>(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(d, 24), 28)));
#elif defined(__AVX2__)
  for (int half = 0; half < 2; ++half) {
    __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half)));
    __m256 l = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(d, 28), 28));
    __m256 h = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(d, 24), 28));
    std::memcpy(reinterpret_cast<char*>(&lo) + half * sizeof l, &l, sizeof l);
    std::memcpy(reinterpret_cast<char*>(&hi) + half * sizeof h, &h, sizeof h);
  }
#else
  for (int i = 0; i < kLanes; ++i) {
    const int b = p[i].bits;
    lo[i] = static_cast<float>(((b & 15) ^ 8) - 8);
    hi[i] = static_cast<float>(((b >> 4) ^ 8) - 8);
  }
#endif
}

// Quantized weight kinds: q * scale per group of G input channels (scale [N, K / G]).
template <class W>
constexpr bool kQuantized = std::is_same_v<W, int8_t> || std::is_same_v<W, Fp8> || std::is_same_v<W, Int4>;

// Bytes of a weight row of K values.
template <class W>
constexpr int64_t row_bytes(int64_t K) {
  return std::is_same_v<W, Int4> ? K / 2 : K * int64_t{sizeof(W)};
}

// AVX-512: a 16-lane vector is one register, and there are 32 of them (AVX2 has 16 of half the
// width), so the register-blocked kernels below (up to 24 accumulators) are built only here.
#ifdef __AVX512F__
constexpr bool kWide = true;
#else
constexpr bool kWide = false;
#endif

// Keeps v in a register: without it GCC re-reads a vector used by several products from L1
// as a memory operand of each one (20 loads a step of 16 products instead of 8). A no-op
// where a 16-lane vector is not one register.
template <class V>
inline void in_register(V& v) {
#ifdef __AVX512F__
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// Whether the vector of weights at column k starts a cache line of its row (rows start on a
// line when K * sizeof(W) is a multiple of 64): a row's software prefetch is issued once a line,
// not once a vector (an int8 vector is a quarter of a line; in-process A/B, 30-40 interleaved
// windows: the int8 step +2.3-2.5 % at B = 1, +4.6 % at B = 4, +2.1 % at B = 32).
template <class W>
inline bool line_start(int64_t k) {
  return (k * int64_t{sizeof(W)}) % 64 == 0;
}

// The end of a group of the block kernels: acc[m][r] += part[m][r] * its scale (weight row n + r,
// group g of `groups`; 1 without scales).
template <int MR, int R>
inline void add_group(f32x16 (&acc)[MR][R], const f32x16 (&part)[MR][R], const float* scale, int64_t groups,
                      int64_t n, int64_t g) {
  for (int r = 0; r < R; ++r) {
    const f32x16 s = splat(scale ? scale[(n + r) * groups + g] : 1.f);
    for (int m = 0; m < MR; ++m) acc[m][r] += part[m][r] * s;
  }
}

// The end of a block: y[m, n + r] = the lane sum of acc[m][r] (4 rows' sums in one vector).
template <int MR, int R>
inline void store_sums(const f32x16 (&acc)[MR][R], float* y, int64_t N, int64_t n) {
  for (int m = 0; m < MR; ++m) {
    if constexpr (R == 4) {
      f32x4 sums = lane_sums4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
      std::memcpy(y + m * N + n, &sums, sizeof sums);
    } else {
      for (int r = 0; r < R; ++r) y[m * N + n + r] = lane_sum(acc[m][r]);
    }
  }
}

// y[m, n] for n in [n0, n1), m < MR: w rows [N, K] (scale [N, K / G] when int8, else null).
template <int MR, int R, class W>
void rows_block(const float* x, int64_t K, const W* w, const float* scale, int64_t G, float* y,
                int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = scale ? K / G : 1, span = scale ? G : K;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    f32x16 acc[MR][R] = {};
    for (int64_t g = 0; g < groups; ++g) {
      f32x16 part[MR][R] = {};
      for (int64_t k = g * span; k < (g + 1) * span; k += kLanes) {
        f32x16 xv[MR];
        for (int m = 0; m < MR; ++m) xv[m] = widen(x + m * K + k);
        if (line_start<W>(k))
          for (int r = 0; r < R; ++r) __builtin_prefetch(reinterpret_cast<const char*>(w + (n + r) * K + k) + kPrefetchBytes, 0, 0);
        for (int r = 0; r < R; ++r) {
          f32x16 wv = widen(w + (n + r) * K + k);
          for (int m = 0; m < MR; ++m) part[m][r] += xv[m] * wv;
        }
      }
      add_group<MR, R>(acc, part, scale, groups, n, g);
    }
    store_sums<MR, R>(acc, y, N, n);
  }
  if (n < n1) rows_block<MR, 1>(x, K, w, scale, G, y, N, n, n1);
}

// One input row: each weight row is one sequential stream, 4 accumulators over k (the float32
// [65536, 768] head: 3.9 ms against 4.6 ms in blocks of 4 rows, which interleave 4 streams).
template <class W>
void row_stream(const float* x, int64_t K, const W* w, const float* scale, int64_t G, float* y,
                int64_t n0, int64_t n1) {
  const int64_t groups = scale ? K / G : 1, span = scale ? G : K;
  for (int64_t n = n0; n < n1; ++n) {
    const W* row = w + n * K;
    f32x16 acc = {};
    for (int64_t g = 0; g < groups; ++g) {
      f32x16 p0 = {}, p1 = {}, p2 = {}, p3 = {};
      int64_t k = g * span;
      const int64_t end = (g + 1) * span;
      for (; k + 4 * kLanes <= end; k += 4 * kLanes) {
        __builtin_prefetch(reinterpret_cast<const char*>(row + k) + kPrefetchBytes, 0, 0);
        p0 += widen(x + k) * widen(row + k);
        p1 += widen(x + k + kLanes) * widen(row + k + kLanes);
        p2 += widen(x + k + 2 * kLanes) * widen(row + k + 2 * kLanes);
        p3 += widen(x + k + 3 * kLanes) * widen(row + k + 3 * kLanes);
      }
      for (; k < end; k += kLanes) p0 += widen(x + k) * widen(row + k);
      acc += ((p0 + p1) + (p2 + p3)) * splat(scale ? scale[n * groups + g] : 1.f);
    }
    y[n] = lane_sum(acc);
  }
}

// int8 / float8 weights, 2-4 rows of x (AVX-512): each weight vector dequantized in registers (times its
// group's scale) against 4 weight rows a step, MR x 4 accumulators and no per-group partial
// sums, x and w kept in registers.
template <int MR, class W>
void rows_block_q(const float* x, int64_t K, const W* w, const float* scale, int64_t G, float* y,
                  int64_t N, int64_t n0, int64_t n1) {
  constexpr int R = 4;
  const int64_t groups = K / G;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    f32x16 acc[MR][R];
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = f32x16{};
    for (int64_t g = 0; g < groups; ++g) {
      f32x16 s[R];
      for (int r = 0; r < R; ++r) s[r] = splat(scale[(n + r) * groups + g]);
      for (int64_t k = g * G; k < (g + 1) * G; k += kLanes) {
        f32x16 xv[MR];
        for (int m = 0; m < MR; ++m) {
          xv[m] = widen(x + m * K + k);
          in_register(xv[m]);
        }
        if (line_start<W>(k))
          for (int r = 0; r < R; ++r) __builtin_prefetch(reinterpret_cast<const char*>(w + (n + r) * K + k) + kPrefetchBytes, 0, 0);
        for (int r = 0; r < R; ++r) {
          f32x16 wv = widen(w + (n + r) * K + k) * s[r];
          in_register(wv);
          for (int m = 0; m < MR; ++m) acc[m][r] += xv[m] * wv;
        }
      }
    }
    store_sums<MR, R>(acc, y, N, n);
  }
  if (n < n1) rows_block<MR, 1>(x, K, w, scale, G, y, N, n, n1);
}

// int4 weights, MR rows of x against R weight rows a step: each 16 bytes of a row widen to its
// group's 16 low and 16 high channels (two runs of x), summed per group and scaled at its end.
template <int MR, int R>
void rows_block_q4(const float* x, int64_t K, const Int4* w, const float* scale, int64_t G, float* y,
                   int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / G, half = G / 2, bytes = K / 2;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    f32x16 acc[MR][R] = {};
    for (int64_t g = 0; g < groups; ++g) {
      f32x16 part[MR][R] = {};
      for (int64_t j = 0; j < half; j += kLanes) {
        const int64_t b = g * half + j;  // the byte in the row
        f32x16 xl[MR], xh[MR];
        for (int m = 0; m < MR; ++m) {
          xl[m] = widen(x + m * K + g * G + j);
          xh[m] = widen(x + m * K + g * G + half + j);
        }
        if (b % 64 == 0)
          for (int r = 0; r < R; ++r) __builtin_prefetch(reinterpret_cast<const char*>(w + (n + r) * bytes + b) + kPrefetchBytes, 0, 0);
        for (int r = 0; r < R; ++r) {
          f32x16 lo, hi;
          widen_int4(w + (n + r) * bytes + b, lo, hi);
          for (int m = 0; m < MR; ++m) part[m][r] += xl[m] * lo + xh[m] * hi;
        }
      }
      add_group<MR, R>(acc, part, scale, groups, n, g);
    }
    store_sums<MR, R>(acc, y, N, n);
  }
  if (n < n1) rows_block_q4<MR, 1>(x, K, w, scale, G, y, N, n, n1);
}

template <int MR, class W>
void rows_pass(const float* x, int64_t K, const W* w, const float* scale, int64_t G, float* y,
               int64_t N, int64_t n0, int64_t n1) {
  constexpr int R = MR <= 2 ? 4 : 2;
  // One row of x against float32 / bfloat16 weights streams one weight row at a time (measured
  // faster so), unless the rows are short: then 4 rows a step share one cross-lane sum
  // (lane_sums4), which bounds a short row's dot product (the LoRA up products, K = 32-128:
  // 34-36 us -> 23-25 us a layer's group, from cache). Quantized weights go in blocks (their
  // groups are short).
  if constexpr (std::is_same_v<W, Int4>) {
    rows_block_q4<MR, R>(x, K, w, scale, G, y, N, n0, n1);
  } else if constexpr (MR == 1 && !kQuantized<W>) {
    if (K >= kStreamMinK) row_stream(x, K, w, scale, G, y, n0, n1);
    else rows_block<MR, R>(x, K, w, scale, G, y, N, n0, n1);
  } else if constexpr (kWide && MR >= 2 && kQuantized<W>) {  // int8: measured 5-10% faster at 2
    rows_block_q<MR>(x, K, w, scale, G, y, N, n0, n1);         // rows, 15-30% at 4, 25-115% at 32
  } else {
    rows_block<MR, R>(x, K, w, scale, G, y, N, n0, n1);
  }
}

// The 16 lane sums of a[0..15] as one vector (lane t: the sum of a[t]): four levels, each pairing
// vectors and adding the halves that two shuffles take from both (45 operations for 16 sums).
inline f32x16 lane_sums16(const f32x16 (&a)[16]) {
  f32x16 v[8], u[4], t[2];
  for (int i = 0; i < 8; ++i) {  // lanes 0-7: a[i]'s partial sums, 8-15: a[i + 8]'s
    const f32x16 p = a[i], q = a[i + 8];
    v[i] = __builtin_shufflevector(p, q, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(p, q, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int j = 0; j < 4; ++j)  // quarters: a[j], a[j + 4], a[j + 8], a[j + 12]
    u[j] = __builtin_shufflevector(v[j], v[j + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(v[j], v[j + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int k = 0; k < 2; ++k)  // pairs: a[k], a[k + 2], ..., a[k + 14]
    t[k] = __builtin_shufflevector(u[k], u[k + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(u[k], u[k + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return __builtin_shufflevector(t[0], t[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
         __builtin_shufflevector(t[0], t[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

// Narrow float32 / bfloat16 weights against float32 x (K = 16 * KS, under 128: a float32 model's
// LoRA up products): as narrow_rows_dot below, in float32 FMAs (AVX-512 builds, kWide).
template <int KS, class W>
void narrow_rows(const float* x, int64_t M, const W* w, float* y, int64_t N, int64_t n0, int64_t n1) {
  constexpr int64_t K = KS * kLanes;
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16)
    for (int64_t m = 0; m < M; ++m) {
      f32x16 xv[KS];
      for (int s = 0; s < KS; ++s) {
        xv[s] = widen(x + m * K + s * kLanes);
        in_register(xv[s]);
      }
      f32x16 acc[16];
      for (int r = 0; r < 16; ++r) {
        acc[r] = xv[0] * widen(w + (n + r) * K);
        for (int s = 1; s < KS; ++s) acc[r] += xv[s] * widen(w + (n + r) * K + s * kLanes);
      }
      store(y + m * N + n, lane_sums16(acc));
    }
  if (n < n1)
    for (int64_t m = 0; m < M; ++m)
      rows_block<1, 1>(x + m * K, K, w, static_cast<const float*>(nullptr), 0, y + m * N, N, n, n1);
}

template <class W>
void narrow_float_rows(const float* x, int64_t M, int64_t K, const W* w, float* y, int64_t N, int64_t n0,
                       int64_t n1) {
  switch (K / kLanes) {
    case 1: return narrow_rows<1>(x, M, w, y, N, n0, n1);
    case 2: return narrow_rows<2>(x, M, w, y, N, n0, n1);
    case 3: return narrow_rows<3>(x, M, w, y, N, n0, n1);
    case 4: return narrow_rows<4>(x, M, w, y, N, n0, n1);
    case 5: return narrow_rows<5>(x, M, w, y, N, n0, n1);
    case 6: return narrow_rows<6>(x, M, w, y, N, n0, n1);
    default: return narrow_rows<7>(x, M, w, y, N, n0, n1);
  }
}

// K of the narrow kernels: under 128 (NARROW_K in linear.py); they take more than 2 rows (fewer keep
// the row kernels, linear.py's MAX_ROWS_NARROW)
constexpr int64_t kNarrowK = 128, kNarrowMinRows = 3;

#ifdef __AVX512BF16__
// The end of a dot-product block: y[m, n + r] = the lane sum of acc[m][r], 4 x 4 blocks' 16 sums
// reduced together (lane_sums16), 4 weight rows' by lane_sums4 (store_sums), others one by one.
// At K = 768 a sum of its own cost about a third of a 4 x 4 block's 24 dot products an output;
// together, ~3 operations an output. bfloat16 products of 32 rows (2 threads, alternating builds):
// the head 459-498 -> 487-663 GFLOP/s, [3,072 x 768] 576-618 -> 612-649, [768 x 768] 499-533 ->
// 561-585; the 0.1b bfloat16 step at B = 32 1.02x and 1.08x, B = 8 1.05x and 1.02x (median of 6
// and 8 alternating processes).
template <int MR, int R>
inline void store_dot_sums(const __m512 (&acc)[MR][R], float* y, int64_t N, int64_t n) {
  f32x16 a[MR][R];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < R; ++r) a[m][r] = reinterpret_cast<f32x16>(acc[m][r]);
  if constexpr (MR == 4 && R == 4) {
    const f32x16 sums = lane_sums16(reinterpret_cast<const f32x16(&)[16]>(a));
    for (int m = 0; m < MR; ++m) std::memcpy(y + m * N + n, reinterpret_cast<const float*>(&sums) + m * R, R * sizeof(float));
  } else {
    store_sums<MR, R>(a, y, N, n);
  }
}

// bfloat16 x and weight: each vdpbf16ps multiplies 32 pairs exactly and adds them into 16
// float32 lanes (no widening); K a multiple of 32.
template <int MR, int R>
void rows_block_dot(const uint16_t* x, int64_t K, const uint16_t* w, float* y, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    __m512 acc[MR][R];
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 2 * kLanes) {
      for (int r = 0; r < R; ++r) __builtin_prefetch(reinterpret_cast<const char*>(w + (n + r) * K + k) + kPrefetchBytes, 0, 0);
      __m512bh xv[MR];
      for (int m = 0; m < MR; ++m) {
        xv[m] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + k));
        if constexpr (MR > 2) in_register(xv[m]);  // one or two rows: as GCC schedules them (measured)
      }
      for (int r = 0; r < R; ++r) {
        __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + (n + r) * K + k));
        if constexpr (MR > 2) in_register(wv);
        for (int m = 0; m < MR; ++m) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], wv, xv[m]);
      }
    }
    store_dot_sums<MR, R>(acc, y, N, n);
  }
  if (n < n1) rows_block_dot<MR, 1>(x, K, w, y, N, n, n1);
}

template <int MR>
void rows_pass(const uint16_t* x, int64_t K, const uint16_t* w, const float*, int64_t, float* y, int64_t N,
               int64_t n0, int64_t n1) {
  rows_block_dot<MR, 4>(x, K, w, y, N, n0, n1);  // 4 x 4 measured 20% faster than 4 x 2 at 32 rows
}

// Narrow products (K = 32 * KS, the LoRA up products): each output is only KS dot-product steps,
// so its own cross-lane sum would cost as much as its arithmetic. 16 weight rows (at most 4 KB,
// kept in L1) against every row of x in turn, their 16 sums reduced together into one vector of
// y; weight rows past the last whole 16 go by rows_block_dot.
template <int KS>
void narrow_rows_dot(const uint16_t* x, int64_t M, const uint16_t* w, float* y, int64_t N, int64_t n0,
                     int64_t n1) {
  constexpr int64_t K = KS * 2 * kLanes;
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16)
    for (int64_t m = 0; m < M; ++m) {
      __m512bh xv[KS];
      for (int s = 0; s < KS; ++s) xv[s] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + s * 2 * kLanes));
      f32x16 acc[16];
      for (int r = 0; r < 16; ++r) {
        __m512 a = _mm512_setzero_ps();
        for (int s = 0; s < KS; ++s)
          a = _mm512_dpbf16_ps(a, reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + (n + r) * K + s * 2 * kLanes)),
                               xv[s]);
        acc[r] = reinterpret_cast<f32x16>(a);
      }
      store(y + m * N + n, lane_sums16(acc));
    }
  if (n < n1)
    for (int64_t m = 0; m < M; ++m) rows_block_dot<1, 1>(x + m * K, K, w, y + m * N, N, n, n1);
}

// Whether the narrow dot-product kernel takes K (a multiple of 32 under kNarrowK).
inline bool narrow_dot(int64_t K) { return K % (2 * kLanes) == 0 && K < kNarrowK; }

void narrow_dot_rows(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* y, int64_t N, int64_t n0,
                     int64_t n1) {
  switch (K / (2 * kLanes)) {
    case 1: return narrow_rows_dot<1>(x, M, w, y, N, n0, n1);
    case 2: return narrow_rows_dot<2>(x, M, w, y, N, n0, n1);
    default: return narrow_rows_dot<3>(x, M, w, y, N, n0, n1);
  }
}

#endif

// ---- more than kMaxRows rows of x: float32 weight tiles against 4 rows of x at a time -----
// y[m, r] = x[m] . w[r] for m < MR, r < R: x and w rows float32 with stride K, y row stride N.
// Each step loads MR + R vectors for MR * R products (4 x 6: 10 loads, 24 FMAs, 24 accumulators).
template <int MR, int R>
inline void dot_block(const float* x, const float* w, int64_t K, float* y, int64_t N) {
  f32x16 acc[MR][R];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = f32x16{};
  for (int64_t k = 0; k < K; k += kLanes) {
    f32x16 xv[MR];
    for (int m = 0; m < MR; ++m) {
      xv[m] = widen(x + m * K + k);
      in_register(xv[m]);
    }
    for (int r = 0; r < R; ++r) {
      f32x16 wv = widen(w + r * K + k);
      in_register(wv);
      for (int m = 0; m < MR; ++m) acc[m][r] += xv[m] * wv;
    }
  }
  for (int m = 0; m < MR; ++m) {
    int r = 0;
    for (; r + 4 <= R; r += 4) {
      f32x4 s = lane_sums4(acc[m][r], acc[m][r + 1], acc[m][r + 2], acc[m][r + 3]);
      std::memcpy(y + m * N + r, &s, sizeof s);
    }
    for (; r < R; ++r) y[m * N + r] = lane_sum(acc[m][r]);
  }
}

constexpr int kBlockRows = 6;  // weight rows a dot_block of 4 x rows

template <int MR>
void dot_rows(const float* x, const float* w, int64_t K, float* y, int64_t N, int64_t rows) {
  constexpr int R = MR == 4 ? kBlockRows : 4;
  int64_t r = 0;
  for (; r + R <= rows; r += R) dot_block<MR, R>(x, w + r * K, K, y + r, N);
  for (; r < rows; ++r) dot_block<MR, 1>(x, w + r * K, K, y + r, N);
}

// Weight rows [n0, n1) as float32: w itself for float32 weights, bfloat16 ones widened into
// buf [n1 - n0, K].
template <class W>
const float* float_rows(const W* w, int64_t K, int64_t n0, int64_t n1, float* buf) {
  if constexpr (std::is_same_v<W, float>) {
    return w + n0 * K;
  } else {
    for (int64_t i = 0; i < (n1 - n0) * K; i += kLanes) {
      f32x16 v = widen(w + n0 * K + i);
      std::memcpy(buf + i, &v, sizeof v);
    }
    return buf;
  }
}

// Measured on the 0.1b products at 32 rows: float32 tiles of 48 KB (read in place), widened
// tiles of 24 KB (the copy stays in L1).
constexpr int64_t kFloatTileBytes = 49152, kWidenedTileBytes = 24576;

// Before pass p of `passes` over a tile of weight rows: the p-th share of the next tile's bytes
// [next, next + bytes) prefetched, so that they come from memory while this tile computes.
inline void prefetch_share(const void* next, int64_t bytes, int64_t p, int64_t passes) {
  const int64_t share = (bytes / passes + 63) & ~int64_t{63};
  const char* at = static_cast<const char*>(next);
  for (int64_t b = p * share; b < std::min(bytes, (p + 1) * share); b += 64) __builtin_prefetch(at + b, 0, 3);
}

// Before pass p of `passes`: the p-th share of `rows` rows of `bytes` bytes each, `stride` bytes
// apart from `next` (the next tile of a [K, N] weight's columns), prefetched.
inline void prefetch_rows_share(const char* next, int64_t rows, int64_t bytes, int64_t stride, int64_t p,
                                int64_t passes) {
  const int64_t share = (rows + passes - 1) / passes;
  for (int64_t r = p * share; r < std::min(rows, (p + 1) * share); ++r)
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(next + r * stride + b, 0, 3);
}

// y [M, N] rows n in [n0, n1) for M > kMaxRows: per tile of weight rows, every 4 rows of x.
template <class W>
void many_rows(const float* x, int64_t M, int64_t K, const W* w, float* y, int64_t N, int64_t n0, int64_t n1) {
  constexpr bool in_place = std::is_same_v<W, float>;
  const int64_t bytes = in_place ? kFloatTileBytes : kWidenedTileBytes;
  const int64_t tile = std::max<int64_t>(kBlockRows, bytes / (K * int64_t{sizeof(float)}) / kBlockRows * kBlockRows);
  thread_local std::vector<float> buf;
  if (!in_place && static_cast<int64_t>(buf.size()) < tile * K) buf.resize(tile * K);
  const int64_t passes = (M + 3) / 4;
  for (int64_t t0 = n0; t0 < n1; t0 += tile) {
    const int64_t t1 = std::min(n1, t0 + tile), rows = t1 - t0;
    const float* wt = float_rows(w, K, t0, t1, buf.data());
    const int64_t next_bytes = (std::min(n1, t1 + tile) - t1) * K * int64_t{sizeof(W)};
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) {
      prefetch_share(w + t1 * K, next_bytes, m / 4, passes);
      dot_rows<4>(x + m * K, wt, K, y + m * N + t0, N, rows);
    }
    prefetch_share(w + t1 * K, next_bytes, m / 4, passes);  // the last share, when rows are left
    switch (M - m) {
      case 1: dot_rows<1>(x + m * K, wt, K, y + m * N + t0, N, rows); break;
      case 2: dot_rows<2>(x + m * K, wt, K, y + m * N + t0, N, rows); break;
      case 3: dot_rows<3>(x + m * K, wt, K, y + m * N + t0, N, rows); break;
      default: break;
    }
  }
}

#ifdef __AVX512BF16__
// Quantized weights against bfloat16 x by the bfloat16 dot product (x of a bfloat16 model, from
// linear.py's QUANTIZED_DOT_MIN_ROWS rows): each tile of weight rows is converted once to bfloat16, exactly (int8, int4
// and float8_e4m3fn values are all bfloat16 numbers), then MR rows of x against R weight rows a
// step, each group of G inputs (a multiple of 32) summed apart and added into the accumulator times
// its scale. The pair products are exact, so the result differs from x @ (q * scale).T in float32
// only by the order of the sums. wt: the tile's converted rows from weight row t0; scale [N, K / G].
template <int MR, int R>
void rows_block_q_dot(const uint16_t* x, int64_t K, const uint16_t* wt, int64_t t0, const float* scale, int64_t G,
                      float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / G;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    __m512 acc[MR][R];
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512 part[MR][R];
      for (int m = 0; m < MR; ++m)
        for (int r = 0; r < R; ++r) part[m][r] = _mm512_setzero_ps();
      for (int64_t k = g * G; k < (g + 1) * G; k += 2 * kLanes) {
        __m512bh xv[MR];
        for (int m = 0; m < MR; ++m) {
          xv[m] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + k));
          in_register(xv[m]);
        }
        for (int r = 0; r < R; ++r) {
          __m512bh wv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wt + (n - t0 + r) * K + k));
          in_register(wv);
          for (int m = 0; m < MR; ++m) part[m][r] = _mm512_dpbf16_ps(part[m][r], wv, xv[m]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_set1_ps(scale[(n + r) * groups + g]);
        for (int m = 0; m < MR; ++m) acc[m][r] = _mm512_fmadd_ps(part[m][r], s, acc[m][r]);
      }
    }
    store_dot_sums<MR, R>(acc, y, N, n);
  }
  if constexpr (R > 1) {
    if (n < n1) rows_block_q_dot<MR, 1>(x, K, wt, t0, scale, G, y, N, n, n1);
  }
}

// Quantized weight rows [n0, n1) (groups of G) as bfloat16 into out [n1 - n0, K], channels in order.
template <class W>
void rows_to_bf16(const W* w, int64_t K, int64_t G, int64_t n0, int64_t n1, uint16_t* out) {
  for (int64_t n = n0; n < n1; ++n) {
    const W* row = reinterpret_cast<const W*>(reinterpret_cast<const char*>(w) + n * row_bytes<W>(K));
    uint16_t* o = out + (n - n0) * K;
    if constexpr (std::is_same_v<W, Int4>) {
      for (int64_t g = 0; g < K; g += G)  // byte j of a group: channel j low, channel j + G / 2 high
        for (int64_t j = 0; j < G / 2; j += kLanes) {
          f32x16 lo, hi;
          widen_int4(row + g / 2 + j, lo, hi);
          narrow(o + g + j, lo);
          narrow(o + g + G / 2 + j, hi);
        }
    } else {
      for (int64_t k = 0; k < K; k += kLanes) narrow(o + k, widen(row + k));
    }
  }
}

constexpr int64_t kDotTileBytes = 32768;  // converted bfloat16 weight rows a tile (measured at 32 rows: 8-128 KB level)
constexpr int64_t kDotRowBlockBytes = 262144;  // bfloat16 rows of x a block

// y [M, N] rows n in [n0, n1) of bfloat16 x [M, K] @ (q * scale).T: per tile of converted weight
// rows, 2 rows of x against 4 weight rows a step (2 x 4 measured fastest of 1-8 x 1-8 at 32 rows:
// 8 accumulators and 8 group sums; wider blocks ran out of registers), the next tile's bytes
// prefetched a share a pass (+30-100 % at 32 rows: the conversion otherwise waits on memory).
template <class W>
void many_rows_q_dot(const uint16_t* x, int64_t M, int64_t K, const W* q, const float* scale, int64_t G, float* y,
                     int64_t N, int64_t n0, int64_t n1) {
  const int64_t tile = std::max<int64_t>(4, kDotTileBytes / (K * int64_t{sizeof(uint16_t)}) & ~int64_t{3});
  thread_local std::vector<uint16_t> buf;
  if (static_cast<int64_t>(buf.size()) < tile * K) buf.resize(tile * K);
  // rows of x a block (its bytes kept in L2 while every tile passes; each block converts the
  // weight again, a small cost against its rows' arithmetic)
  const int64_t block = std::max<int64_t>(2, kDotRowBlockBytes / (K * int64_t{sizeof(uint16_t)}) & ~int64_t{1});
  for (int64_t m0 = 0; m0 < M; m0 += block) {
    const int64_t m1 = std::min(M, m0 + block), passes = (m1 - m0 + 1) / 2;
    for (int64_t t0 = n0; t0 < n1; t0 += tile) {
      const int64_t t1 = std::min(n1, t0 + tile);
      rows_to_bf16(q, K, G, t0, t1, buf.data());
      const char* next = reinterpret_cast<const char*>(q) + t1 * row_bytes<W>(K);
      const int64_t next_bytes = (std::min(n1, t1 + tile) - t1) * row_bytes<W>(K);
      for (int64_t m = m0; m < m1; m += 2) {
        prefetch_share(next, next_bytes, (m - m0) / 2, passes);
        if (m + 2 <= m1)
          rows_block_q_dot<2, 4>(x + m * K, K, buf.data(), t0, scale, G, y + m * N, N, t0, t1);
        else
          rows_block_q_dot<1, 4>(x + m * K, K, buf.data(), t0, scale, G, y + m * N, N, t0, t1);
      }
    }
  }
}
#endif

// One product's work: chunks of output rows, each computed by chunk(c).
struct Product {
  std::function<void(int64_t)> chunk;
  int64_t chunks = 0, bytes = 0;
};

// Runs the chunks of every product in `products` on the caller and the pool (parallel_for over
// their union): a group of short products shares one hand-out, so the pool's thread wakes once
// for all of them and each thread streams a longer stretch of weights.
void run(ffi::ThreadPool& pool, const Product* products, int64_t count) {
  if (count == 1) return parallel_for(pool, products[0].chunks, products[0].bytes, products[0].chunk);
  std::vector<int64_t> first(count + 1, 0);  // first[i]: the union's index of product i's chunk 0
  int64_t bytes = 0;
  for (int64_t i = 0; i < count; ++i) {
    first[i + 1] = first[i] + products[i].chunks;
    bytes += products[i].bytes;
  }
  parallel_for(pool, first[count], bytes, [&](int64_t c) {
    int64_t i = 0;
    while (c >= first[i + 1]) ++i;
    products[i].chunk(c - first[i]);
  });
}

// x [M, K] @ w.T for w [N, K] (scale [N, K / G] when int8) into y [M, N], as chunks of rows.
template <class X, class W>
Product plan_nk(const ffi::ThreadPool& pool, const X* x, int64_t M, int64_t K, const W* w,
                const float* scale, int64_t G, float* y, int64_t N) {
  // A few long runs of rows a thread (not many short ones): each thread then streams one
  // contiguous stretch of the weight, which the hardware prefetchers follow across pages.
  const int64_t per_thread = 4, threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t rows_per_chunk =
      std::max<int64_t>(16, (N + threads * per_thread - 1) / (threads * per_thread) + 15 & ~int64_t{15});
  const int64_t chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  // With more than kMaxRows rows of x, each tile of weight rows (~kTileBytes) takes every pass
  // while it is in L1 / L2, so the weight streams from memory once.
  const int64_t tile = M <= kMaxRows ? rows_per_chunk : std::max<int64_t>(4, kTileBytes / row_bytes<W>(K) & ~int64_t{3});
  // Not for quantized weights: the 0.1b int8 decode step at B = 32 ran 12% slower with its tiles
  // dequantized once than with the weight widened in registers on every pass.
  constexpr bool has_many = kWide && std::is_same_v<X, float> && !kQuantized<W>;
  // bfloat16 x with quantized weights: always the converted tiles and the dot product (linear.py
  // picks it from QUANTIZED_DOT_MIN_ROWS rows)
  constexpr bool q_dot = std::is_same_v<X, uint16_t> && kQuantized<W>;
  // bfloat16 x and weights: narrow products of kNarrowMinRows rows or more by narrow_dot_rows
  constexpr bool bf16_dot = std::is_same_v<X, uint16_t> && std::is_same_v<W, uint16_t>;
#ifdef __AVX512BF16__
  const bool narrow = bf16_dot && M >= kNarrowMinRows && narrow_dot(K);
#endif
  // float32 x against float32 / bfloat16 weights: narrow products of kNarrowMinRows rows or more by
  // narrow_float_rows
  const bool narrow_float = has_many && M >= kNarrowMinRows && K < kNarrowK;
  const bool many = has_many && M > kMaxRows;
  auto chunk = [=](int64_t c) {
    const int64_t n0 = c * rows_per_chunk, n1 = std::min(N, n0 + rows_per_chunk);
    if constexpr (q_dot) {
#ifdef __AVX512BF16__
      many_rows_q_dot(x, M, K, w, scale, G, y, N, n0, n1);
#endif
    } else {
#ifdef __AVX512BF16__
      if constexpr (bf16_dot) {
        if (narrow) return narrow_dot_rows(x, M, K, w, y, N, n0, n1);
      }
#endif
      if constexpr (has_many) {
        if (narrow_float) return narrow_float_rows(x, M, K, w, y, N, n0, n1);
        if (many) return many_rows(x, M, K, w, y, N, n0, n1);
      }
      for (int64_t t0 = n0; t0 < n1; t0 += tile) {
        const int64_t t1 = std::min(n1, t0 + tile);
        const int64_t next_bytes = M > kMaxRows ? (std::min(n1, t1 + tile) - t1) * row_bytes<W>(K) : 0;
        for (int64_t m = 0; m < M; m += kMaxRows) {
          const X* xm = x + m * K;
          float* ym = y + m * N;
          prefetch_share(reinterpret_cast<const char*>(w) + t1 * row_bytes<W>(K), next_bytes, m / kMaxRows,
                         (M + kMaxRows - 1) / kMaxRows);
          switch (std::min(kMaxRows, M - m)) {
            case 1: rows_pass<1>(xm, K, w, scale, G, ym, N, t0, t1); break;
            case 2: rows_pass<2>(xm, K, w, scale, G, ym, N, t0, t1); break;
            case 3: rows_pass<3>(xm, K, w, scale, G, ym, N, t0, t1); break;
            default: rows_pass<4>(xm, K, w, scale, G, ym, N, t0, t1); break;
          }
        }
      }
    }
  };
  return Product{chunk, chunks, N * row_bytes<W>(K)};
}

template <class X, class W>
void linear_nk(ffi::ThreadPool& pool, const X* x, int64_t M, int64_t K, const W* w,
               const float* scale, int64_t G, float* y, int64_t N) {
  Product p = plan_nk(pool, x, M, K, w, scale, G, y, N);
  run(pool, &p, 1);
}

// y[m, c0 .. c0 + 16 * V) = sum_k x[m, k] w[k, c0 ..]: w [K, N]; with one row of x (MR = 1), a zero x
// skips its weight row.
template <int MR, int V, class W>
void columns_block(const float* x, int64_t K, const W* w, float* y, int64_t N, int64_t c0) {
  f32x16 acc[MR][V] = {};
  for (int64_t k = 0; k < K; ++k) {
    if (MR == 1 && x[k] == 0.f) continue;
    f32x16 xs[MR];
    for (int m = 0; m < MR; ++m) xs[m] = splat(x[m * K + k]);
    for (int v = 0; v < V; ++v) {
      f32x16 wv = widen(w + k * N + c0 + v * kLanes);
      for (int m = 0; m < MR; ++m) acc[m][v] += xs[m] * wv;
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < V; ++v) std::memcpy(y + m * N + c0 + v * kLanes, &acc[m][v], sizeof(f32x16));
}

// y[0, c0 .. c0 + 16 V) = sum over the rows k in ks of x[k] w[k, c0 ..]: w [K, N], ks the rows
// whose x is not zero, in order; the rows kRowsAhead further down the list are prefetched.
template <int V, class W>
void columns_block_listed(const float* x, const int32_t* ks, int64_t count, const W* w, float* y, int64_t N,
                          int64_t c0) {
  constexpr int64_t kRowsAhead = 32;
  f32x16 acc[V] = {};
  for (int64_t i = 0; i < count; ++i) {
    if (i + kRowsAhead < count)
      for (int64_t b = 0; b < V * kLanes * int64_t{sizeof(W)}; b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(w + ks[i + kRowsAhead] * N + c0) + b, 0, 0);
    const int64_t k = ks[i];
    const f32x16 xs = splat(x[k]);
    for (int v = 0; v < V; ++v) acc[v] += xs * widen(w + k * N + c0 + v * kLanes);
  }
  for (int v = 0; v < V; ++v) store(y + c0 + v * kLanes, acc[v]);
}

template <class W>
void linear_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* w, float* y,
               int64_t N) {
  // One input row: 512 bytes of each weight row a chunk (8 vectors of float32 columns, 16 of
  // bfloat16; measured 1.4 and 1.9 ms on the 0.1b value weights against 1.7 and 3.1 ms with 4,
  // half the rows skipped). The rows of non-zero inputs are listed first and walked with a
  // prefetch 32 rows ahead, not tested for zero one by one (in-process A/B, 24-30 interleaved
  // windows: bfloat16 B = 1 step +6-9 % at 16-128 rows ahead, float32 unchanged).
  if (M == 1) {
    constexpr int V1 = 32 / sizeof(W);
    std::vector<int32_t> ks;
    ks.reserve(K);
    for (int64_t k = 0; k < K; ++k)
      if (x[k] != 0.f) ks.push_back(static_cast<int32_t>(k));
    const int32_t* list = ks.data();
    const int64_t count = static_cast<int64_t>(ks.size()), width = V1 * kLanes;
    const int64_t blocks = N / width, tail = (N % width) / kLanes;
    parallel_for(pool, blocks + tail, count * N * int64_t{sizeof(W)}, [=](int64_t c) {
      if (c < blocks) columns_block_listed<V1>(x, list, count, w, y, N, c * width);
      else columns_block_listed<1>(x, list, count, w, y, N, blocks * width + (c - blocks) * kLanes);
    });
    return;
  }
  // More rows: 4 vectors a chunk, so the accumulators of 4 rows fit the registers.
  const int64_t width = 4 * kLanes;  // columns a chunk
  const int64_t blocks = N / width, tail = (N % width) / kLanes;
  parallel_for(pool, blocks + tail, K * N * int64_t{sizeof(W)}, [=](int64_t c) {
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const float* xm = x + m * K;
      float* ym = y + m * N;
      int64_t rows = std::min(kMaxRows, M - m);
      if (c < blocks) {
        int64_t c0 = c * width;
        switch (rows) {
          case 1: columns_block<1, 4>(xm, K, w, ym, N, c0); break;  // the last pass's one row
          case 2: columns_block<2, 4>(xm, K, w, ym, N, c0); break;
          case 3: columns_block<3, 4>(xm, K, w, ym, N, c0); break;
          default: columns_block<4, 4>(xm, K, w, ym, N, c0); break;
        }
      } else {
        int64_t c0 = blocks * width + (c - blocks) * kLanes;
        for (int64_t r = 0; r < rows; ++r) columns_block<1, 1>(xm + r * K, K, w, ym + r * N, N, c0);
      }
    }
  });
}

#ifdef __AVX512BF16__
// ---- bfloat16 x [M, K] @ bfloat16 w [K, N] (the channel-mix value's layout), 2 or more rows ----
// vdpbf16ps multiplies pairs along K, and in this layout a pair (w[k, n], w[k + 1, n]) lies in two
// rows: each tile of kKnTileRows weight rows is packed once, rows k and k + 1 interleaved word by
// word (unpacklo / unpackhi, so within each 128-bit lane the columns come 4 by 4: the results are
// put back in order once, at the end), and every pass of kKnPassRows rows of x reads it from L1
// with one broadcast of x's pair a row. A chunk is a run of column blocks; it reads its columns of
// each weight row in order (a stripe of each row at a time read 3072 strided lines per block and
// ran at ~60 % of this speed in a microbenchmark).
constexpr int64_t kKnBlockCols = 64;  // columns a block: 4 accumulators a row of x
constexpr int64_t kKnVectors = kKnBlockCols / kLanes;
constexpr int kKnPassRows = 5;        // rows of x a pass: 20 accumulators
constexpr int64_t kKnTileRows = 64;   // weight rows a packed tile
constexpr int64_t kKnChunkBlocks = 3;  // column blocks a chunk (its packed tile: 24 KB)

// acc[m][v] (m < MR) += x[m, k0 + j] w[k0 + j, block columns] over the packed tile of kn rows;
// acc is read from / written to io in the packed column order, or starts at zero when first.
template <int MR>
void kn_dot_pass(const uint16_t* x, int64_t K, int64_t k0, int64_t kn, const uint16_t* tile, float* io,
                 bool first) {
  __m512 acc[MR][kKnVectors];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kKnVectors; ++v)
      acc[m][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(io + (m * kKnVectors + v) * kLanes);
  for (int64_t p = 0; p < kn / 2; ++p) {
    __m512bh wv[kKnVectors];
    for (int v = 0; v < kKnVectors; ++v)
      wv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(tile + (p * kKnVectors + v) * 2 * kLanes));
    for (int m = 0; m < MR; ++m) {
      uint32_t pair;
      std::memcpy(&pair, x + m * K + k0 + 2 * p, sizeof pair);
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
      for (int v = 0; v < kKnVectors; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], wv[v], xv);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kKnVectors; ++v) _mm512_storeu_ps(io + (m * kKnVectors + v) * kLanes, acc[m][v]);
}

// y[:, b0 * 64 .. b1 * 64) for all M rows of x: K even, N a multiple of kKnBlockCols.
void kn_dot_blocks(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* y, int64_t N, int64_t b0,
                   int64_t b1) {
  const int64_t blocks = b1 - b0;
  // per block: the packed tile, (kKnTileRows / 2) x kKnVectors vectors of 16 pairs, and the
  // accumulators of every row of x, M x kKnVectors vectors
  constexpr int64_t kPacked = kKnTileRows / 2 * kKnVectors * 2 * kLanes;
  thread_local std::vector<uint16_t> tile;
  thread_local std::vector<float> acc;
  tile.resize(blocks * kPacked);
  acc.resize(blocks * M * kKnVectors * kLanes);
  for (int64_t k0 = 0; k0 < K; k0 += kKnTileRows) {
    const int64_t kn = std::min(kKnTileRows, K - k0);
    for (int64_t p = 0; p < kn / 2; ++p) {  // pack: row pairs in order, each pair's columns in order
      const uint16_t* row = w + (k0 + 2 * p) * N + b0 * kKnBlockCols;
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t v = 0; v < kKnVectors; v += 2) {
          const uint16_t* at = row + b * kKnBlockCols + v * kLanes;
          __m512i lo = _mm512_loadu_si512(at), hi = _mm512_loadu_si512(at + N);
          uint16_t* out = tile.data() + b * kPacked + (p * kKnVectors + v) * 2 * kLanes;
          _mm512_storeu_si512(out, _mm512_unpacklo_epi16(lo, hi));
          _mm512_storeu_si512(out + 2 * kLanes, _mm512_unpackhi_epi16(lo, hi));
        }
    }
    // the next tile's rows of these columns, a share before each pass over this one (the packing
    // otherwise waits on memory: products of 32 / 16 rows, [3,072 x 768], 352-405 -> 396-423 and
    // 219-252 -> 264-291 GFLOP/s; the 0.1b bfloat16 step's value products 4.0-7.8 -> 3.4-4.8 ms
    // at B = 32, the step 1.06x at B = 32 and 1.05x at B = 16, 6 alternating processes)
    const int64_t next_rows = std::min(kKnTileRows, K - k0 - kn), segment = blocks * kKnBlockCols * 2;
    const char* next = next_rows > 0 ? reinterpret_cast<const char*>(w + (k0 + kn) * N + b0 * kKnBlockCols) : nullptr;
    const int64_t passes = blocks * ((M + kKnPassRows - 1) / kKnPassRows);
    int64_t pass = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint16_t* packed = tile.data() + b * kPacked;
      float* io = acc.data() + b * M * kKnVectors * kLanes;
      int64_t m = 0;
      for (; m + kKnPassRows <= M; m += kKnPassRows) {
        prefetch_rows_share(next, next_rows, segment, N * 2, pass++, passes);
        kn_dot_pass<kKnPassRows>(x + m * K, K, k0, kn, packed, io + m * kKnVectors * kLanes, k0 == 0);
      }
      if (m < M) prefetch_rows_share(next, next_rows, segment, N * 2, pass++, passes);
      const uint16_t* xm = x + m * K;
      switch (M - m) {
        case 1: kn_dot_pass<1>(xm, K, k0, kn, packed, io + m * kKnVectors * kLanes, k0 == 0); break;
        case 2: kn_dot_pass<2>(xm, K, k0, kn, packed, io + m * kKnVectors * kLanes, k0 == 0); break;
        case 3: kn_dot_pass<3>(xm, K, k0, kn, packed, io + m * kKnVectors * kLanes, k0 == 0); break;
        case 4: kn_dot_pass<4>(xm, K, k0, kn, packed, io + m * kKnVectors * kLanes, k0 == 0); break;
        default: break;
      }
    }
  }
  // unpacklo / unpackhi left columns 0-3, 8-11 ... in the first of each pair of accumulators and
  // 4-7, 12-15 ... in the second (per 128-bit lane): two permutes put each 16 back in order.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t v = 0; v < kKnVectors; v += 2) {
        const float* a = acc.data() + ((b * M + m) * kKnVectors + v) * kLanes;
        const __m512 a0 = _mm512_loadu_ps(a), a1 = _mm512_loadu_ps(a + kLanes);
        float* out = y + m * N + (b0 + b) * kKnBlockCols + v * kLanes;
        _mm512_storeu_ps(out, _mm512_permutex2var_ps(a0, first, a1));
        _mm512_storeu_ps(out + kLanes, _mm512_permutex2var_ps(a0, second, a1));
      }
}

void linear_kn_dot(ffi::ThreadPool& pool, const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, float* y,
                   int64_t N) {
  const int64_t blocks = N / kKnBlockCols, chunks = (blocks + kKnChunkBlocks - 1) / kKnChunkBlocks;
  parallel_for(pool, chunks, K * N * int64_t{sizeof(uint16_t)}, [=](int64_t c) {
    kn_dot_blocks(x, M, K, w, y, N, c * kKnChunkBlocks, std::min(blocks, (c + 1) * kKnChunkBlocks));
  });
}
#endif

ffi::Error shape_error(const char* what) { return ffi::Error::InvalidArgument(what); }

// Whether scales of dimensions sd are [N, K / G] for a weight of N rows of K values, G a multiple
// of `multiple` (16; 32 for int4, whose group holds two runs of 16-byte vectors).
bool scale_fits(ffi::Span<const int64_t> sd, int64_t N, int64_t K, int64_t multiple = kLanes) {
  return sd.size() == 2 && sd[0] == N && sd[1] > 0 && K % sd[1] == 0 && (K / sd[1]) % multiple == 0;
}

template <ffi::DataType T, class W>
ffi::Error LinearNK(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || xd[1] % kLanes)
    return shape_error("rwkv7_linear: want x [M, K], w [N, K], K a multiple of 16");
  linear_nk(pool, x.typed_data(), xd[0], xd[1], reinterpret_cast<const W*>(w.untyped_data()),
            static_cast<const float*>(nullptr), 0, y->typed_data(), wd[0]);
  return ffi::Error::Success();
}

// Kinds of rwkv7_linear_group's products (its `kinds` attribute): the weight's dtype, and for
// kGroupBf16Dot (bfloat16 weights) and kGroup<Q>Dot (quantized ones) a bfloat16 x multiplied by the
// bfloat16 dot product (AVX512_BF16 builds only).
enum GroupKind : int64_t {
  kGroupF32 = 0, kGroupBf16 = 1, kGroupInt8 = 2, kGroupBf16Dot = 3, kGroupInt4 = 4, kGroupFp8 = 5,
  kGroupInt8Dot = 6, kGroupInt4Dot = 7, kGroupFp8Dot = 8
};

// A quantized product's plan: x float32, or bfloat16 for the dot product (`dot`).
template <class W>
Product plan_quantized(const ffi::ThreadPool& pool, bool dot, const void* x, int64_t M, int64_t K, const void* q,
                       const float* scale, int64_t G, float* y, int64_t N) {
  if (dot) return plan_nk(pool, static_cast<const uint16_t*>(x), M, K, static_cast<const W*>(q), scale, G, y, N);
  return plan_nk(pool, static_cast<const float*>(x), M, K, static_cast<const W*>(q), scale, G, y, N);
}

// Products x_i [M, K_i] @ w_i.T -> y_i float32 [M, N_i] (operands x_0, w_0 [, scale_0], x_1, ...:
// a scale after each int8 weight; kinds[i] the product's kind), run as one hand-out of chunks
// (`run`). Each y_i is what the product's own target (rwkv7_linear_<kind>) gives, bit for bit.
ffi::Error LinearGroup(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                       ffi::Span<const int64_t> kinds) {
  constexpr const char* kWant =
      "rwkv7_linear_group: want, per kind (0 f32, 1 bf16, 2 int8, 3 bf16 dot, 4 int4, 5 fp8, 6 int8 dot, 7 int4 dot, "
      "8 fp8 dot), x [M, K] (float32; bfloat16 for the dot kinds), w [N, K] of the kind (int4: uint8 [N, K / 2]; a "
      "float32 scale [N, K / G] after a quantized one), a float32 y [M, N], K a multiple of 16 (32 for 3) and G of "
      "16 (32 for int4 and 6-8)";
  if (static_cast<size_t>(kinds.size()) != rets.size()) return shape_error(kWant);
  std::vector<Product> products;
  products.reserve(kinds.size());
  size_t a = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const int64_t kind = kinds[i];
    const bool q_dot = kind >= kGroupInt8Dot, dot = kind == kGroupBf16Dot || q_dot,
               int8 = kind == kGroupInt8 || kind == kGroupInt8Dot, int4 = kind == kGroupInt4 || kind == kGroupInt4Dot,
               fp8 = kind == kGroupFp8 || kind == kGroupFp8Dot, quantized = int8 || int4 || fp8;
    const size_t need = quantized ? 3 : 2;
    if (kind < kGroupF32 || kind > kGroupFp8Dot || a + need > args.size()) return shape_error(kWant);
#ifndef __AVX512BF16__
    if (dot) return shape_error("rwkv7_linear_group: this build has no bfloat16 dot product");
#endif
    auto x = args.get<ffi::AnyBuffer>(a);
    auto w = args.get<ffi::AnyBuffer>(a + 1);
    auto y = rets.get<ffi::Buffer<ffi::F32>>(i);
    if (!x.has_value() || !w.has_value() || !y.has_value()) return shape_error(kWant);
    const auto w_dtype = kind == kGroupF32 ? ffi::F32 : int8 ? ffi::S8 : int4 ? ffi::U8 : fp8 ? ffi::F8E4M3FN : ffi::BF16;
    auto xd = x->dimensions(), wd = w->dimensions(), yd = (*y)->dimensions();
    if (xd.size() != 2 || wd.size() != 2 || yd.size() != 2 || xd[1] != wd[1] * (int4 ? 2 : 1) || yd[0] != xd[0] ||
        yd[1] != wd[0] || xd[1] % (dot ? 2 * kLanes : kLanes) || w->element_type() != w_dtype ||
        x->element_type() != (dot ? ffi::BF16 : ffi::F32))
      return shape_error(kWant);
    const int64_t M = xd[0], K = xd[1], N = wd[0];
    float* yp = (*y)->typed_data();
    const void *xp = x->untyped_data(), *wp = w->untyped_data();
    if (quantized) {
      auto scale = args.get<ffi::Buffer<ffi::F32>>(a + 2);
      if (!scale.has_value()) return shape_error(kWant);
      auto sd = scale->dimensions();
      if (!scale_fits(sd, N, K, int4 || q_dot ? 2 * kLanes : kLanes)) return shape_error(kWant);
      const float* sp = scale->typed_data();
      const int64_t G = K / sd[1];
      if (int8)
        products.push_back(plan_quantized<int8_t>(pool, q_dot, xp, M, K, wp, sp, G, yp, N));
      else if (int4)
        products.push_back(plan_quantized<Int4>(pool, q_dot, xp, M, K, wp, sp, G, yp, N));
      else
        products.push_back(plan_quantized<Fp8>(pool, q_dot, xp, M, K, wp, sp, G, yp, N));
#ifdef __AVX512BF16__
    } else if (dot) {
      products.push_back(plan_nk(pool, static_cast<const uint16_t*>(xp), M, K, static_cast<const uint16_t*>(wp),
                                 static_cast<const float*>(nullptr), 0, yp, N));
#endif
    } else if (kind == kGroupBf16) {
      products.push_back(plan_nk(pool, static_cast<const float*>(xp), M, K, static_cast<const uint16_t*>(wp),
                                 static_cast<const float*>(nullptr), 0, yp, N));
    } else {
      products.push_back(plan_nk(pool, static_cast<const float*>(xp), M, K, static_cast<const float*>(wp),
                                 static_cast<const float*>(nullptr), 0, yp, N));
    }
    a += need;
  }
  if (a != args.size()) return shape_error(kWant);
  run(pool, products.data(), static_cast<int64_t>(products.size()));
  return ffi::Error::Success();
}

ffi::Error LinearInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q,
                      ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), qd = q.dimensions(), sd = scale.dimensions();
  if (xd.size() != 2 || qd.size() != 2 || xd[1] != qd[1] || !scale_fits(sd, qd[0], qd[1]))
    return shape_error("rwkv7_linear_int8: want x [M, K], q [N, K], scale [N, K / G], G a multiple of 16");
  linear_nk(pool, x.typed_data(), xd[0], xd[1], q.typed_data(), scale.typed_data(), qd[1] / sd[1],
            y->typed_data(), qd[0]);
  return ffi::Error::Success();
}

// Packed int4 (q uint8 [N, K / 2]) and float8_e4m3fn (q [N, K]) weights with float32 scales
// [N, K / G]: x [M, K] @ (q * scale).T.
ffi::Error LinearInt4(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> q,
                      ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), qd = q.dimensions(), sd = scale.dimensions();
  if (xd.size() != 2 || qd.size() != 2 || xd[1] != 2 * qd[1] || !scale_fits(sd, qd[0], xd[1], 2 * kLanes))
    return shape_error("rwkv7_linear_int4: want x [M, K], q uint8 [N, K / 2], scale [N, K / G], G a multiple of 32");
  linear_nk(pool, x.typed_data(), xd[0], xd[1], reinterpret_cast<const Int4*>(q.typed_data()), scale.typed_data(),
            xd[1] / sd[1], y->typed_data(), qd[0]);
  return ffi::Error::Success();
}

ffi::Error LinearFp8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer q, ffi::Buffer<ffi::F32> scale,
                     ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), qd = q.dimensions(), sd = scale.dimensions();
  if (xd.size() != 2 || qd.size() != 2 || xd[1] != qd[1] || q.element_type() != ffi::F8E4M3FN ||
      !scale_fits(sd, qd[0], qd[1]))
    return shape_error("rwkv7_linear_fp8: want x [M, K], q float8_e4m3fn [N, K], scale [N, K / G], G a multiple of 16");
  linear_nk(pool, x.typed_data(), xd[0], xd[1], reinterpret_cast<const Fp8*>(q.untyped_data()), scale.typed_data(),
            qd[1] / sd[1], y->typed_data(), qd[0]);
  return ffi::Error::Success();
}

template <ffi::DataType T, class W>
ffi::Error LinearKN(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0] || wd[1] % kLanes)
    return shape_error("rwkv7_linear_kn: want x [M, K], w [K, N], N a multiple of 16");
  linear_kn(pool, x.typed_data(), xd[0], xd[1], reinterpret_cast<const W*>(w.untyped_data()),
            y->typed_data(), wd[1]);
  return ffi::Error::Success();
}


#ifdef __AVX512BF16__
ffi::Error LinearBf16Dot(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                         ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || xd[1] % (2 * kLanes))
    return shape_error("rwkv7_linear_bf16_dot: want x [M, K], w [N, K] bfloat16, K a multiple of 32");
  linear_nk(pool, reinterpret_cast<const uint16_t*>(x.untyped_data()), xd[0], xd[1],
            reinterpret_cast<const uint16_t*>(w.untyped_data()), static_cast<const float*>(nullptr), 0,
            y->typed_data(), wd[0]);
  return ffi::Error::Success();
}

// Quantized weights (int8 [N, K], packed int4 uint8 [N, K / 2] or float8_e4m3fn [N, K], by q's dtype)
// against a bfloat16 x by the dot product.
ffi::Error LinearQuantizedDot(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::AnyBuffer q,
                              ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), qd = q.dimensions(), sd = scale.dimensions();
  const auto type = q.element_type();
  const bool int4 = type == ffi::U8;
  if (xd.size() != 2 || qd.size() != 2 || (type != ffi::S8 && !int4 && type != ffi::F8E4M3FN) ||
      xd[1] != qd[1] * (int4 ? 2 : 1) || !scale_fits(sd, qd[0], xd[1], 2 * kLanes))
    return shape_error("rwkv7_linear_quantized_dot: want x bfloat16 [M, K], q int8 [N, K], packed int4 uint8 "
                       "[N, K / 2] or float8_e4m3fn [N, K], scale [N, K / G], G a multiple of 32");
  const int64_t M = xd[0], K = xd[1], N = qd[0], G = K / sd[1];
  const void *xp = x.untyped_data(), *qp = q.untyped_data();
  const float* sp = scale.typed_data();
  float* yp = y->typed_data();
  Product p = type == ffi::S8 ? plan_quantized<int8_t>(pool, true, xp, M, K, qp, sp, G, yp, N)
              : int4          ? plan_quantized<Int4>(pool, true, xp, M, K, qp, sp, G, yp, N)
                              : plan_quantized<Fp8>(pool, true, xp, M, K, qp, sp, G, yp, N);
  run(pool, &p, 1);
  return ffi::Error::Success();
}

ffi::Error LinearKnBf16Dot(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                           ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0] || xd[1] % 2 || wd[1] % kKnBlockCols)
    return shape_error("rwkv7_linear_kn_bf16_dot: want x [M, K], w [K, N] bfloat16, K even, N a multiple of 64");
  linear_kn_dot(pool, reinterpret_cast<const uint16_t*>(x.untyped_data()), xd[0], xd[1],
                reinterpret_cast<const uint16_t*>(w.untyped_data()), y->typed_data(), wd[1]);
  return ffi::Error::Success();
}
#endif

}  // namespace

// What this build of the library can do beyond what every build does (read by library.py).
extern "C" int rwkv7_capabilities() {
  int bits = 0;
#ifdef __AVX512BF16__
  bits |= 1;  // rwkv7_linear_bf16_dot
#endif
  if (kWide) bits |= 2;  // the many-row [N, K] products of float32 / bfloat16 weights
  if (kHalfState) bits |= 4;  // wkv_step.cc's targets on a float16 state (vectors.h)
  return bits;
}

#define RWKV7_BIND_2(T)                                                              \
  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<T>>() \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_f32, (LinearNK<ffi::F32, float>), RWKV7_BIND_2(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_bf16, (LinearNK<ffi::BF16, uint16_t>), RWKV7_BIND_2(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_kn_f32, (LinearKN<ffi::F32, float>), RWKV7_BIND_2(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_kn_bf16, (LinearKN<ffi::BF16, uint16_t>), RWKV7_BIND_2(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_int8, LinearInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_int4, LinearInt4,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_fp8, LinearFp8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_group, LinearGroup,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<ffi::Span<const int64_t>>("kinds"));

#ifdef __AVX512BF16__
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_bf16_dot, LinearBf16Dot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_quantized_dot, LinearQuantizedDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_linear_kn_bf16_dot, LinearKnBf16Dot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
#endif
