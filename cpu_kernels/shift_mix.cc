// The decode step's residual add + LayerNorm + token-shift mixes for XLA:CPU, one FFI call a
// mix (contract: pallas_kernels.shift_mix.shift_mix_reference, float32 or bfloat16 rows).
//
//   rwkv7_shift_mix(h [B, C], shift [B, L, C], ln_w [C], ln_b [C], mix [n, C] (, delta [B, C]))
//     -> h_out [B, C], x [B, C], mixed_0 .. mixed_{n-1} [B, C]      attributes: layer, eps
// h_out = h + delta (h without delta); x = LayerNorm(h_out) over C with float32 statistics
// (mean, then the mean of squared deviations); mixed_i = x + (shift[:, layer] - x) * mix[i].
// XLA:CPU runs the same pieces as 7-13 thunks of about a microsecond each (the add, two
// reductions, the normalisation, a copy of each mix out of the stacked [n, B, C]); the layer's
// shift rows are read from the whole leaf, so no slice of it is copied either. C a multiple of 16.
// bfloat16 rows are rounded where the reference rounds them: h_out, x, and each mix (the
// statistics and the mixes computed in float32 from the rounded h_out and x).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "parallel.h"
#include "vectors.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Rows b0 .. b1 of the batch.
template <class T>
void shift_mix_rows(const T* hp, const T* delta, const T* shift, const float* wp, const float* bp, const float* mp,
                    T* ho, T* xo, T* const* outs, int64_t L, int64_t C, int64_t n, int64_t layer, float eps, int64_t b0,
                    int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const T* hb = hp + b * C;
    const T* sb = shift + (b * L + layer) * C;
    T* hob = ho + b * C;
    T* xob = xo + b * C;
    f32x16 sum = {};
    for (int64_t c = 0; c < C; c += kLanes) {
      f32x16 v = widen(hb + c);
      if (delta) v += widen(delta + b * C + c);
      narrow(hob + c, v);
      sum += widen(hob + c);
    }
    const float mean = lane_sum(sum) / static_cast<float>(C);
    f32x16 sq = {};
    for (int64_t c = 0; c < C; c += kLanes) {
      f32x16 d = widen(hob + c) - mean;
      sq += d * d;
    }
    const float scale = 1.0f / std::sqrt(lane_sum(sq) / static_cast<float>(C) + eps);
    for (int64_t c = 0; c < C; c += kLanes) {
      narrow(xob + c, (widen(hob + c) - mean) * scale * widen(wp + c) + widen(bp + c));
      const f32x16 x = widen(xob + c), step = widen(sb + c) - x;
      for (int64_t i = 0; i < n; ++i) narrow(outs[i] + b * C + c, x + step * widen(mp + i * C + c));
    }
  }
}

template <class T>
T* data(ffi::AnyBuffer b) { return static_cast<T*>(b.untyped_data()); }

ffi::Error ShiftMix(ffi::ThreadPool pool, ffi::AnyBuffer h, ffi::AnyBuffer shift, ffi::Buffer<ffi::F32> ln_w,
                    ffi::Buffer<ffi::F32> ln_b, ffi::Buffer<ffi::F32> mix, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> h_out,
                    ffi::Result<ffi::AnyBuffer> x_out, ffi::RemainingRets mixed, int64_t layer, float eps) {
  constexpr const char* kWant =
      "rwkv7_shift_mix: want h [B, C], shift [B, L, C], optionally delta [B, C] and the results h_out, x and n "
      "mixed [B, C] all float32 or all bfloat16, ln_w, ln_b [C] and mix [n, C] float32; C a multiple of 16, "
      "at most 8 mixes, 0 <= layer < L";
  auto hd = h.dimensions(), sd = shift.dimensions(), md = mix.dimensions();
  const auto type = h.element_type();
  if (hd.size() != 2 || sd.size() != 3 || md.size() != 2 || sd[0] != hd[0] || sd[2] != hd[1] || md[1] != hd[1] ||
      hd[1] % kLanes || layer < 0 || layer >= sd[1] || ln_w.element_count() != static_cast<size_t>(hd[1]) ||
      ln_b.element_count() != static_cast<size_t>(hd[1]) || static_cast<size_t>(md[0]) != mixed.size() ||
      rest.size() > 1 || md[0] > 8 || (type != ffi::F32 && type != ffi::BF16) || shift.element_type() != type ||
      h_out->element_type() != type || x_out->element_type() != type)
    return ffi::Error::InvalidArgument(kWant);
  const int64_t B = hd[0], L = sd[1], C = hd[1], n = md[0];
  const size_t rows = static_cast<size_t>(B * C);
  void* delta = nullptr;
  if (rest.size() == 1) {
    auto d = rest.get<ffi::AnyBuffer>(0);
    if (!d.has_value() || d->element_type() != type || d->element_count() != rows) return ffi::Error::InvalidArgument(kWant);
    delta = d->untyped_data();
  }
  void* outs[8];
  for (int64_t i = 0; i < n; ++i) {
    auto m = mixed.get<ffi::AnyBuffer>(i);
    if (!m.has_value() || (*m)->element_type() != type || (*m)->element_count() != rows)
      return ffi::Error::InvalidArgument(kWant);
    outs[i] = (*m)->untyped_data();
  }
  auto run = [&](auto* typed) {  // rows in chunks on the caller and the pool (parallel.h)
    using T = std::remove_pointer_t<decltype(typed)>;
    const T *hp = data<T>(h), *dp = static_cast<const T*>(delta), *sp = data<T>(shift);
    T *ho = static_cast<T*>(h_out->untyped_data()), *xo = static_cast<T*>(x_out->untyped_data());
    T* mo[8];
    for (int64_t i = 0; i < n; ++i) mo[i] = static_cast<T*>(outs[i]);
    const float *wp = ln_w.typed_data(), *bp = ln_b.typed_data(), *mp = mix.typed_data();
    const int64_t per_chunk = std::max<int64_t>(1, B / (4 * std::max<int64_t>(1, pool.num_threads())));
    parallel_for(pool, (B + per_chunk - 1) / per_chunk, B * C * (n + 3) * int64_t{sizeof(T)}, [&](int64_t c) {
      shift_mix_rows<T>(hp, dp, sp, wp, bp, mp, ho, xo, mo, L, C, n, layer, eps, c * per_chunk,
                        std::min(B, (c + 1) * per_chunk));
    });
  };
  if (type == ffi::F32) {
    run(static_cast<float*>(nullptr));
  } else {
    run(static_cast<uint16_t*>(nullptr));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_shift_mix, ShiftMix,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets()
                                  .Attr<int64_t>("layer")
                                  .Attr<float>("eps"));
