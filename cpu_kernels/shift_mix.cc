// The decode step's residual add + LayerNorm + token-shift mixes for XLA:CPU, one FFI call a
// mix (contract: pallas_kernels.shift_mix.shift_mix_reference, float32).
//
//   rwkv7_shift_mix(h [B, C], shift [B, L, C], ln_w [C], ln_b [C], mix [n, C] (, delta [B, C]))
//     -> h_out [B, C], x [B, C], mixed_0 .. mixed_{n-1} [B, C]      attributes: layer, eps
// h_out = h + delta (h without delta); x = LayerNorm(h_out) over C with float32 statistics
// (mean, then the mean of squared deviations); mixed_i = x + (shift[:, layer] - x) * mix[i].
// XLA:CPU runs the same pieces as 7-13 thunks of about a microsecond each (the add, two
// reductions, the normalisation, a copy of each mix out of the stacked [n, B, C]); the layer's
// shift rows are read from the whole leaf, so no slice of it is copied either. C a multiple of 16.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "vectors.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error ShiftMix(ffi::Buffer<ffi::F32> h, ffi::Buffer<ffi::F32> shift, ffi::Buffer<ffi::F32> ln_w,
                    ffi::Buffer<ffi::F32> ln_b, ffi::Buffer<ffi::F32> mix, ffi::RemainingArgs rest,
                    ffi::ResultBuffer<ffi::F32> h_out, ffi::ResultBuffer<ffi::F32> x_out, ffi::RemainingRets mixed,
                    int64_t layer, float eps) {
  constexpr const char* kWant =
      "rwkv7_shift_mix: want float32 h [B, C], shift [B, L, C], ln_w, ln_b [C], mix [n, C], optionally delta "
      "[B, C], and n mixed results [B, C]; C a multiple of 16, 0 <= layer < L";
  auto hd = h.dimensions(), sd = shift.dimensions(), md = mix.dimensions();
  if (hd.size() != 2 || sd.size() != 3 || md.size() != 2 || sd[0] != hd[0] || sd[2] != hd[1] || md[1] != hd[1] ||
      hd[1] % kLanes || layer < 0 || layer >= sd[1] || ln_w.element_count() != static_cast<size_t>(hd[1]) ||
      ln_b.element_count() != static_cast<size_t>(hd[1]) || static_cast<size_t>(md[0]) != mixed.size() ||
      rest.size() > 1)
    return ffi::Error::InvalidArgument(kWant);
  const int64_t B = hd[0], L = sd[1], C = hd[1], n = md[0];
  const float* delta = nullptr;
  if (rest.size() == 1) {
    auto d = rest.get<ffi::Buffer<ffi::F32>>(0);
    if (!d.has_value() || d->element_count() != static_cast<size_t>(B * C)) return ffi::Error::InvalidArgument(kWant);
    delta = d->typed_data();
  }
  float* outs[8];
  if (n > 8) return ffi::Error::InvalidArgument("rwkv7_shift_mix: at most 8 mixes");
  for (int64_t i = 0; i < n; ++i) {
    auto m = mixed.get<ffi::Buffer<ffi::F32>>(i);
    if (!m.has_value() || (*m)->element_count() != static_cast<size_t>(B * C)) return ffi::Error::InvalidArgument(kWant);
    outs[i] = (*m)->typed_data();
  }
  const float *hp = h.typed_data(), *wp = ln_w.typed_data(), *bp = ln_b.typed_data(), *mp = mix.typed_data();
  float *ho = h_out->typed_data(), *xo = x_out->typed_data();
  for (int64_t b = 0; b < B; ++b) {
    const float* hb = hp + b * C;
    const float* sb = shift.typed_data() + (b * L + layer) * C;
    float* hob = ho + b * C;
    f32x16 sum = {};
    for (int64_t c = 0; c < C; c += kLanes) {
      f32x16 v = widen(hb + c);
      if (delta) v += widen(delta + b * C + c);
      store(hob + c, v);
      sum += v;
    }
    const float mean = lane_sum(sum) / static_cast<float>(C);
    f32x16 sq = {};
    for (int64_t c = 0; c < C; c += kLanes) {
      f32x16 d = widen(hob + c) - mean;
      sq += d * d;
    }
    const float scale = 1.0f / std::sqrt(lane_sum(sq) / static_cast<float>(C) + eps);
    for (int64_t c = 0; c < C; c += kLanes) {
      f32x16 x = (widen(hob + c) - mean) * scale * widen(wp + c) + widen(bp + c);
      store(xo + b * C + c, x);
      f32x16 step = widen(sb + c) - x;
      for (int64_t i = 0; i < n; ++i) store(outs[i] + b * C + c, x + step * widen(mp + i * C + c));
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_shift_mix, ShiftMix,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .RemainingRets()
                                  .Attr<int64_t>("layer")
                                  .Attr<float>("eps"));
