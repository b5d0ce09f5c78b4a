// The decode step's recurrence for XLA:CPU, in place on the whole state leaf.
//
//   rwkv7_wkv_step(r, w, k, v, kk, a [B, H, N] float32, S [B, L, H, N, N]) -> y [B, H, N] float32, S'
//     attribute layer. One recurrence step of layer `layer` (contract:
//     pallas_kernels.wkv_step.wkv_step_reference).
//   rwkv7_time_mix_step(r, k, v, w_l, a_l, g [B, C] float32, vecs [7, C] float32, r_k [H, N] float32,
//                       S [B, L, H, N, N] (, v_l, v_first [B, C] float32))
//     -> out [B, C] (the model dtype: float32, bfloat16 or float16), S' (, v_first [B, C] float32)
//     attributes layer, decay_scale, kk_eps, norm_eps. The time-mix body between its products and
//     the output projection (contract: pallas_kernels.time_mix's wkv_operands_reference, one
//     recurrence step, wkv_output_reference): the products' float32 results are first rounded to
//     the model dtype (out's), as the reference's products are. The first layer passes no v_l or
//     v_first and gets its v as the v_first result. XLA:CPU runs the same as ~25 thunks a layer.
//
// S' aliases S (a donated state is never copied). S is float32, bfloat16 or float16 (where the
// build has a float16 convert: kHalfState); the step runs in float32, a 16-bit state widened as
// it is read and rounded to nearest even as it is written (y comes from the float32 S', as in the
// reference). N (the head size) is 16, 32, 64 or 128. Heads (b, h) are shared out to the caller
// and XLA's thread pool (parallel.h).
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

// x rounded to O (the model dtype) and widened back: what the reference's astype gives.
template <class O>
inline f32x16 rounded(f32x16 x) {
  if constexpr (std::is_same_v<O, float>) {
    return x;
  } else {
    O h[kLanes];
    narrow(h, x);
    return widen(h);
  }
}

// exp(x) for x in float32: 2^n e^f with n = round(x / ln 2) and |f| <= ln(2) / 2, e^f by its
// Taylor polynomial to degree 7 (relative error under 1e-8 there); x clamped to [-87, 88], where
// 2^n stays a normal float.
inline f32x16 exp16(f32x16 x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  x = x > 88.0f ? splat(88.0f) : x;
  const f32x16 shift = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const f32x16 t = x * 1.44269504f + shift;
  const f32x16 n = t - shift;
  const f32x16 f = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 in two parts
  f32x16 p = splat(1.0f / 5040) + f * (1.0f / 40320);
  p = splat(1.0f / 720) + f * p;
  p = splat(1.0f / 120) + f * p;
  p = splat(1.0f / 24) + f * p;
  p = splat(1.0f / 6) + f * p;
  p = splat(0.5f) + f * p;
  p = splat(1.0f) + f * p;
  p = splat(1.0f) + f * p;
  const u32x16 scale = (reinterpret_cast<u32x16>(t) - reinterpret_cast<u32x16>(shift) + 127) << 23;
  return p * reinterpret_cast<f32x16>(scale);
}

inline f32x16 sigmoid16(f32x16 x) { return 1.0f / (1.0f + exp16(-x)); }

// One head's step in place: Sh [N, N] of T, the head's vectors in registers (kav = kk * a), v its
// N values; y [N] = S' @ r. Rows go four at a time, so the four row sums of each pass reduce
// together (lane_sums4) instead of one dependent chain a row. The block is read twice from L1
// and written once.
template <class T, int NB>
inline void step_head(T* Sh, const f32x16 (&r)[NB], const f32x16 (&w)[NB], const f32x16 (&k)[NB],
                      const f32x16 (&kk)[NB], const f32x16 (&kav)[NB], const float* v, float* y) {
  constexpr int64_t N = NB * kLanes;
  for (int64_t i = 0; i < N; i += 4) {
    f32x16 acc[4] = {};
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < NB; ++j) acc[t] += widen(Sh + (i + t) * N + j * kLanes) * kk[j];
    const f32x4 sa = -lane_sums4(acc[0], acc[1], acc[2], acc[3]);  // S @ -kk
    f32x16 out[4] = {};
    for (int t = 0; t < 4; ++t) {
      T* row = Sh + (i + t) * N;
      const f32x16 sat = splat(sa[t]), vt = splat(v[i + t]);
      for (int j = 0; j < NB; ++j) {
        const f32x16 s = widen(row + j * kLanes) * w[j] + sat * kav[j] + vt * k[j];
        narrow(row + j * kLanes, s);
        out[t] += s * r[j];
      }
    }
    const f32x4 ys = lane_sums4(out[0], out[1], out[2], out[3]);
    std::memcpy(y + i, &ys, sizeof ys);
  }
}

// rwkv7_wkv_step's heads u0 .. u1 (u = b * H + h) of layer `layer`: per head, in float32,
// sa = S @ -kk, S' = S * w + sa (kk * a)^T + v k^T, y = S' @ r.
template <class T, int NB>
void wkv_heads(const float* const* ops, T* S, float* y, int64_t L, int64_t H, int64_t layer, int64_t u0, int64_t u1) {
  constexpr int64_t N = NB * kLanes;
  const float *r = ops[0], *w = ops[1], *k = ops[2], *v = ops[3], *kk = ops[4], *a = ops[5];
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t b = u / H, h = u % H, vec = u * N;
    f32x16 rv[NB], wv[NB], kv[NB], kkv[NB], kav[NB];
    for (int j = 0; j < NB; ++j) {
      const int64_t at = vec + j * kLanes;
      rv[j] = widen(r + at), wv[j] = widen(w + at), kv[j] = widen(k + at), kkv[j] = widen(kk + at);
      kav[j] = kkv[j] * widen(a + at);
    }
    step_head<T, NB>(S + ((b * L + layer) * H + h) * N * N, rv, wv, kv, kkv, kav, v + vec, y + vec);
  }
}

struct TimeMixArgs {
  const float *r, *k, *v, *w_l, *a_l, *g, *v_l, *v_first, *vecs, *r_k;
  float* v_first_out;  // the first layer's (v_l and v_first are null there)
  int64_t C, H, L, layer;
  float decay_scale, kk_eps, norm_eps;
};

// rwkv7_time_mix_step's heads u0 .. u1 (u = b * H + h), out of O.
template <class T, class O, int NB>
void time_mix_heads(const TimeMixArgs& p, T* S, O* out, int64_t u0, int64_t u1) {
  constexpr int64_t N = NB * kLanes;
  const int64_t C = p.C;
  const float *w0 = p.vecs, *a0 = w0 + C, *v0 = a0 + C, *k_k = v0 + C, *k_a = k_k + C, *ln_w = k_a + C, *ln_b = ln_w + C;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t b = u / p.H, h = u % p.H, row = b * C + h * N, col = h * N;
    auto product = [&](const float* x, int j) { return rounded<O>(widen(x + row + j * kLanes)); };
    f32x16 r[NB], w[NB], k[NB], kk[NB], kav[NB], v[NB], sq = {};
    for (int j = 0; j < NB; ++j) {  // wkv_operands_reference
      const int64_t c = col + j * kLanes;
      const f32x16 kj = product(p.k, j), a = sigmoid16(widen(a0 + c) + product(p.a_l, j));
      r[j] = product(p.r, j);
      w[j] = exp16(-p.decay_scale * sigmoid16(widen(w0 + c) + product(p.w_l, j)));
      kk[j] = kj * widen(k_k + c);
      sq += kk[j] * kk[j];
      k[j] = kj * (1.0f + (a - 1.0f) * widen(k_a + c));
      kav[j] = a;  // times the normalised kk below
      v[j] = product(p.v, j);
      if (p.v_first_out) {
        store(p.v_first_out + row + j * kLanes, v[j]);
      } else {
        const f32x16 first = widen(p.v_first + row + j * kLanes);
        v[j] = v[j] + (first - v[j]) * sigmoid16(widen(v0 + c) + product(p.v_l, j));
      }
    }
    const float norm = std::max(std::sqrt(lane_sum(sq)), p.kk_eps);
    float vs[N], y[N];
    for (int j = 0; j < NB; ++j) {
      kk[j] = kk[j] / norm;
      kav[j] = kk[j] * kav[j];
      store(vs + j * kLanes, v[j]);
    }
    step_head<T, NB>(S + ((b * p.L + p.layer) * p.H + h) * N * N, r, w, k, kk, kav, vs, y);
    f32x16 sum = {}, bonus = {};  // wkv_output_reference
    for (int j = 0; j < NB; ++j) {
      sum += widen(y + j * kLanes);
      bonus += r[j] * k[j] * widen(p.r_k + col + j * kLanes);
    }
    const float mean = lane_sum(sum) / N, direct = lane_sum(bonus);
    f32x16 dev = {};
    for (int j = 0; j < NB; ++j) {
      const f32x16 d = widen(y + j * kLanes) - mean;
      dev += d * d;
    }
    const float scale = 1.0f / std::sqrt(lane_sum(dev) / N + p.norm_eps);
    for (int j = 0; j < NB; ++j) {
      const int64_t c = col + j * kLanes;
      const f32x16 o = (widen(y + j * kLanes) - mean) * scale * widen(ln_w + c) + widen(ln_b + c) + direct * v[j];
      narrow(out + row + j * kLanes, o * product(p.g, j));
    }
  }
}

bool head_size_ok(int64_t N) { return N == 16 || N == 32 || N == 64 || N == 128; }

// Runs heads(u0, u1) over the B * H heads in chunks on the caller and the pool.
template <class F>
void over_heads(ffi::ThreadPool& pool, int64_t units, int64_t state_bytes, F heads) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t per_chunk = std::max<int64_t>(1, units / (threads * 4)), chunks = (units + per_chunk - 1) / per_chunk;
  parallel_for(pool, chunks, state_bytes, [=](int64_t c) { heads(c * per_chunk, std::min(units, (c + 1) * per_chunk)); });
}

// Calls f(T*) with S_out's data as its element type (S copied in first when not aliased).
template <class F>
ffi::Error with_state(ffi::AnyBuffer S, ffi::Result<ffi::AnyBuffer>& S_out, F f) {
  if (S_out->untyped_data() != S.untyped_data()) std::memcpy(S_out->untyped_data(), S.untyped_data(), S.size_bytes());
  switch (S.element_type()) {
    case ffi::F32: return f(static_cast<float*>(S_out->untyped_data()));
    case ffi::BF16: return f(static_cast<uint16_t*>(S_out->untyped_data()));
#ifdef RWKV7_HALF_STATE
    case ffi::F16: return f(static_cast<Half*>(S_out->untyped_data()));
#endif
    default: return ffi::Error::InvalidArgument("rwkv7 wkv: the state is not float32, bfloat16 or (this build's) float16");
  }
}

bool state_type_ok(ffi::AnyBuffer S, ffi::Result<ffi::AnyBuffer>& S_out) {
  const auto type = S.element_type();
  return S_out->element_type() == type &&
         (type == ffi::F32 || type == ffi::BF16 || (type == ffi::F16 && kHalfState));
}

ffi::Error WkvStep(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> r, ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> k,
                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> kk, ffi::Buffer<ffi::F32> a, ffi::AnyBuffer S,
                   ffi::ResultBuffer<ffi::F32> y, ffi::Result<ffi::AnyBuffer> S_out, int64_t layer) {
  auto vd = r.dimensions(), sd = S.dimensions();
  if (vd.size() != 3 || sd.size() != 5 || sd[0] != vd[0] || sd[2] != vd[1] || sd[3] != vd[2] || sd[4] != vd[2] ||
      !head_size_ok(vd[2]) || layer < 0 || layer >= sd[1] || !state_type_ok(S, S_out))
    return ffi::Error::InvalidArgument(
        "rwkv7_wkv_step: want r w k v kk a [B, H, N] float32, S [B, L, H, N, N] float32 / bfloat16 / float16 (this "
        "build's), N 16, 32, 64 or 128, 0 <= layer < L");
  const float* ops[6] = {r.typed_data(), w.typed_data(), k.typed_data(), v.typed_data(), kk.typed_data(), a.typed_data()};
  const int64_t B = vd[0], H = vd[1], N = vd[2], L = sd[1];
  float* yp = y->typed_data();
  return with_state(S, S_out, [&](auto* state) {
    using T = std::remove_pointer_t<decltype(state)>;
    // The kernel is picked as a function pointer (here and in time_mix_step), not called inside
    // the pool's closure: one dispatch serving both, with the kernel inlined into the closure,
    // ran a bfloat16 state's B = 32 step at 197-258 us a layer against 125-193 (alternating builds, 7 each).
    auto heads = [&]() -> void (*)(const float* const*, T*, float*, int64_t, int64_t, int64_t, int64_t, int64_t) {
      switch (N / kLanes) {
        case 1: return wkv_heads<T, 1>;
        case 2: return wkv_heads<T, 2>;
        case 4: return wkv_heads<T, 4>;
        default: return wkv_heads<T, 8>;
      }
    }();
    over_heads(pool, B * H, B * H * N * N * int64_t{sizeof(T)},
               [=](int64_t u0, int64_t u1) { heads(ops, state, yp, L, H, layer, u0, u1); });
    return ffi::Error::Success();
  });
}

template <class T, class O>
void time_mix_step(ffi::ThreadPool& pool, const TimeMixArgs& p, T* S, O* out, int64_t B, int64_t N) {
  auto heads = [N]() -> void (*)(const TimeMixArgs&, T*, O*, int64_t, int64_t) {
    switch (N / kLanes) {
      case 1: return time_mix_heads<T, O, 1>;
      case 2: return time_mix_heads<T, O, 2>;
      case 4: return time_mix_heads<T, O, 4>;
      default: return time_mix_heads<T, O, 8>;
    }
  }();
  over_heads(pool, B * p.H, B * p.H * N * N * int64_t{sizeof(T)},
             [=, &p](int64_t u0, int64_t u1) { heads(p, S, out, u0, u1); });
}

ffi::Error TimeMixStep(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> r, ffi::Buffer<ffi::F32> k,
                       ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> w_l, ffi::Buffer<ffi::F32> a_l,
                       ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> vecs, ffi::Buffer<ffi::F32> r_k, ffi::AnyBuffer S,
                       ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> S_out,
                       ffi::RemainingRets first_out, int64_t layer, float decay_scale, float kk_eps, float norm_eps) {
  constexpr const char* kWant =
      "rwkv7_time_mix_step: want r k v w_l a_l g [B, C] float32, vecs [7, C], r_k [H, N] float32 (C = H * N, N 16, "
      "32, 64 or 128), S [B, L, H, N, N] float32 / bfloat16 / float16 (this build's), then v_l and v_first [B, C] "
      "float32 (or, on the first layer, a v_first result [B, C] float32); out [B, C] float32 / bfloat16 / float16 "
      "(this build's); 0 <= layer < L";
  auto rd = r.dimensions(), hd = r_k.dimensions(), sd = S.dimensions();
  if (rd.size() != 2 || hd.size() != 2 || sd.size() != 5) return ffi::Error::InvalidArgument(kWant);
  const int64_t B = rd[0], C = rd[1], H = hd[0], N = hd[1];
  const size_t rows = static_cast<size_t>(B * C);
  bool ok = C == H * N && head_size_ok(N) && sd[0] == B && sd[2] == H && sd[3] == N && sd[4] == N && layer >= 0 &&
            layer < sd[1] && vecs.element_count() == static_cast<size_t>(7 * C) && state_type_ok(S, S_out) &&
            out->element_count() == rows;
  for (auto* x : {&k, &v, &w_l, &a_l, &g}) ok = ok && x->element_count() == rows;
  const bool first = rest.size() == 0;
  ok = ok && (first ? first_out.size() == 1 : rest.size() == 2 && first_out.size() == 0);
  TimeMixArgs p{r.typed_data(), k.typed_data(), v.typed_data(), w_l.typed_data(), a_l.typed_data(), g.typed_data(),
                nullptr, nullptr, vecs.typed_data(), r_k.typed_data(), nullptr, C, H, sd[1], layer,
                decay_scale, kk_eps, norm_eps};
  if (ok && first) {
    auto f = first_out.get<ffi::Buffer<ffi::F32>>(0);
    ok = f.has_value() && (*f)->element_count() == rows;
    if (ok) p.v_first_out = (*f)->typed_data();
  } else if (ok) {
    auto vl = rest.get<ffi::Buffer<ffi::F32>>(0), vf = rest.get<ffi::Buffer<ffi::F32>>(1);
    ok = vl.has_value() && vf.has_value() && vl->element_count() == rows && vf->element_count() == rows;
    if (ok) p.v_l = vl->typed_data(), p.v_first = vf->typed_data();
  }
  if (!ok) return ffi::Error::InvalidArgument(kWant);
  void* o = out->untyped_data();
  return with_state(S, S_out, [&](auto* state) {
    switch (out->element_type()) {
      case ffi::F32: time_mix_step(pool, p, state, static_cast<float*>(o), B, N); break;
      case ffi::BF16: time_mix_step(pool, p, state, static_cast<uint16_t*>(o), B, N); break;
#ifdef RWKV7_HALF_STATE
      case ffi::F16: time_mix_step(pool, p, state, static_cast<Half*>(o), B, N); break;
#endif
      default: return ffi::Error::InvalidArgument(kWant);
    }
    return ffi::Error::Success();
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_wkv_step, WkvStep,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("layer"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(rwkv7_time_mix_step, TimeMixStep,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets()
                                  .Attr<int64_t>("layer")
                                  .Attr<float>("decay_scale")
                                  .Attr<float>("kk_eps")
                                  .Attr<float>("norm_eps"));
