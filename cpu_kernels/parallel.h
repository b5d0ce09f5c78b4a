// parallel_for: how the native CPU kernels share their work out to the calling thread and XLA's
// intra-op thread pool (shared by linear.cc and wkv_step.cc).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

// Work reading fewer bytes runs on the calling thread alone: a chain of one-row [64, 768] float32
// products took 9.1 us a product split over two threads, 3.5 us on one (XLA's: 3.5 us).
constexpr int64_t kSerialBytes = 262144;

// Runs body(chunk) for chunk in [0, chunks) on the caller and up to (pool threads - 1) helpers;
// on the caller alone when the work reads fewer than kSerialBytes (handing chunks to a pool
// thread costs a few microseconds, more than a small product takes).
inline void parallel_for(xla::ffi::ThreadPool& pool, int64_t chunks, int64_t bytes,
                         const std::function<void(int64_t)>& body) {
  struct Job {
    std::atomic<int64_t> next{0}, done{0};
    int64_t chunks = 0;
    std::function<void(int64_t)> body;
    void work() {
      for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
        body(c);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, chunks - 1);  // the caller is one worker
  if (helpers <= 0 || bytes < kSerialBytes) {
    for (int64_t c = 0; c < chunks; ++c) body(c);
    return;
  }
  auto job = std::make_shared<Job>();
  job->chunks = chunks;
  job->body = body;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->work(); });
  job->work();
  while (job->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
}
