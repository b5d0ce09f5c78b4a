// The host's arithmetic peak with every operand in registers (the ceiling the many-row CPU
// products are measured against, benchmarks/cpu_many_rows.py --peak): 12 independent
// accumulators of 512-bit float32 FMAs, and of bfloat16 dot products (vdpbf16ps, 32 products
// an instruction) where the compiler targets AVX512_BF16, on 1 and 2 threads.
// Build and run: g++ -O2 -march=native -pthread benchmarks/cpu_peak_flops.cc -o peak && ./peak
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr long kSteps = 100000000;
float sink[2];

#define REPEAT12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#ifdef __AVX512F__
// kSteps x 12 independent chains a = step(a), the chains summed into sink[id].
template <class Step>
void chains(int id, Step step) {
#define START(i) __m512 a##i = _mm512_set1_ps(i * 1e-3f);  // distinct, so no two chains fold into one
  REPEAT12(START)
  for (long n = 0; n < kSteps; ++n) {
#define STEP(i) a##i = step(a##i);
    REPEAT12(STEP)
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, a##i);
  REPEAT12(SUM)
  sink[id] = _mm512_reduce_add_ps(s);
}

void fma_f32(int id) {
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-7f);
  chains(id, [=](__m512 a) { return _mm512_fmadd_ps(a, b, c); });
}
#endif

#ifdef __AVX512BF16__
void dot_bf16(int id) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
  chains(id, [=](__m512 a) { return _mm512_dpbf16_ps(a, x, y); });
}
#endif

template <class F>
void report(const char* what, F body, double flops_per_step) {
  for (int threads : {1, 2}) {
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) pool.emplace_back(body, i);
    for (auto& t : pool) t.join();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s, %d threads: %.0f GFLOP/s\n", what, threads, threads * kSteps * flops_per_step / seconds / 1e9);
  }
}

}  // namespace

int main() {
#ifdef __AVX512F__
  report("float32 FMA 512-bit", fma_f32, 12 * 16 * 2);
#else
  std::printf("float32 FMA 512-bit: not built (no AVX-512)\n");
#endif
#ifdef __AVX512BF16__
  report("bfloat16 dot 512-bit", dot_bf16, 12 * 32 * 2);
#endif
  std::printf("(checksum %g)\n", static_cast<double>(sink[0] + sink[1]));  // keeps the loops
  return 0;
}
