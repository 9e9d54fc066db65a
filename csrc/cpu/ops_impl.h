// The CPU layer ops, written once against simd.h's 16-lane vector V and its functions: ops.cpp
// includes this file inside `namespace avx512` and again inside `namespace avx2`, each in its
// `#pragma GCC target` region, after the standard headers (this file includes none). See
// ops.cpp for what the ops do and why every row is computed on its own.

// --- RMSNorm ---------------------------------------------------------------------------------
template <typename T>
static void norm_row(const T* x, const T* w, float eps, T* out, int64_t H) {
  V ss = zero();
  for (int64_t k = 0; k < H; k += 16) {
    V v = load(x + k, H - k);
    ss = fmadd(v, v, ss);
  }
  const V r = set1(1.0f / std::sqrt(reduce_add(ss) / float(H) + eps));
  for (int64_t k = 0; k < H; k += 16) {
    V n = round_to(x, mul(load(x + k, H - k), r));
    store(out + k, mul(load(w + k, H - k), n), H - k);
  }
}

template <typename T>
static void rms_norm_k(const T* x, const T* w, float eps, T* out, int64_t M, int64_t H) {
  for (int64_t i = 0; i < M; ++i) norm_row(x + i * H, w, eps, out + i * H, H);
}

template <typename T>
static void add_rms_norm_k(T* x, const T* y, const T* w, float eps, T* out, int64_t M, int64_t H) {
  for (int64_t i = 0; i < M; ++i) {
    T* xr = x + i * H;
    const T* yr = y + i * H;
    for (int64_t k = 0; k < H; k += 16) store(xr + k, add(load(xr + k, H - k), load(yr + k, H - k)), H - k);
    norm_row(xr, w, eps, out + i * H, H);
  }
}

// --- SwiGLU ----------------------------------------------------------------------------------
template <typename T>
static void silu_mul_k(const T* gu, T* out, int64_t M, int64_t I) {
  const V one = set1(1.0f);
  for (int64_t i = 0; i < M; ++i) {
    const T* g = gu + i * 2 * I;
    for (int64_t k = 0; k < I; k += 16) {
      V gv = load(g + k, I - k);
      V s = div(gv, add(one, exp16(sub(zero(), gv))));
      store(out + i * I + k, mul(round_to(g, s), load(g + I + k, I - k)), I - k);
    }
  }
}

// --- RoPE + cache write + attention -------------------------------------------------------------
// Rotate-half RoPE of one head vector x [D] at the position whose tables are c, s [D]:
// out = x * c + rotate_half(x) * s, each product and the sum rounded to T.
template <typename T, typename Out>
SPECRT_INLINE void rope(const T* x, const T* c, const T* s, Out* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t k = 0; k < half; k += 16) {
    const int64_t n = half - k;
    V lo = load(x + k, n), hi = load(x + half + k, n);
    V a = round_to(x, mul(lo, load(c + k, n)));
    V b = round_to(x, mul(hi, load(s + k, n)));
    store(out + k, round_to(x, sub(a, b)), n);
    a = round_to(x, mul(hi, load(c + half + k, n)));
    b = round_to(x, mul(lo, load(s + half + k, n)));
    store(out + half + k, round_to(x, add(a, b)), n);
  }
}

// The softmax numerators in place: scores[j] <- exp(scores[j] - best) for j < n, summed in a
// fixed order; returns 1 / their sum.
SPECRT_INLINE float exp_scores(float* scores, int64_t n, float best) {
  V total = zero();
  const V top = set1(best);
  for (int64_t j = 0; j < n; j += 16) {
    V e = first(exp16(sub(load(scores + j, n - j), top)), n - j);
    store(scores + j, e, n - j);
    total = add(total, e);
  }
  return 1.0f / reduce_add(total);
}

// One query q [D] (fp32, already holding T's values) against keys 0..n-1 of one kv head
// (k, v [n, D]): out = softmax(q . k * scale) @ v, scores [n] as scratch.
template <typename T>
static void attend_one(const float* q, const T* k, const T* v, int64_t n, int64_t D,
                       float scale, float* scores, T* out) {
  float best = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    V acc = zero();
    for (int64_t d = 0; d < D; d += 16) acc = fmadd(load(q + d, D - d), load(k + j * D + d, D - d), acc);
    scores[j] = reduce_add(acc) * scale;
    best = std::max(best, scores[j]);
  }
  const V inv = set1(exp_scores(scores, n, best));
  for (int64_t d = 0; d < D; d += 16) {     // out[d] = sum_j p_j v_j[d], j in order
    V acc = zero();
    for (int64_t j = 0; j < n; ++j) acc = fmadd(set1(scores[j]), load(v + j * D + d, D - d), acc);
    store(out + d, mul(acc, inv), D - d);
  }
}

// The same for D = 16 * ND (64 and 128: the Qwen2.5 family), with the same order of every sum,
// so the same bits: only the schedule differs. Four keys' dot products and the ND output
// vectors are independent chains, so the FMAs overlap instead of each waiting for the last
// (one chain per output vector over 2,000 keys made a long-context verify pass slower than SDPA).
template <typename T, int ND>
static void attend_fixed(const float* q, const T* k, const T* v, int64_t n, float scale,
                         float* scores, T* out) {
  constexpr int64_t D = 16 * ND;
  V qv[ND];
#pragma GCC unroll 8
  for (int c = 0; c < ND; ++c) qv[c] = load(q + 16 * c);
  float best = -INFINITY;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    V acc[4] = {zero(), zero(), zero(), zero()};
#pragma GCC unroll 8
    for (int c = 0; c < ND; ++c)
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[r] = fmadd(qv[c], load(k + (j + r) * D + 16 * c), acc[r]);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      scores[j + r] = reduce_add(acc[r]) * scale;
      best = std::max(best, scores[j + r]);
    }
  }
  for (; j < n; ++j) {
    V acc = zero();
#pragma GCC unroll 8
    for (int c = 0; c < ND; ++c) acc = fmadd(qv[c], load(k + j * D + 16 * c), acc);
    scores[j] = reduce_add(acc) * scale;
    best = std::max(best, scores[j]);
  }
  const V inv = set1(exp_scores(scores, n, best));
  V acc[ND];
#pragma GCC unroll 8
  for (int c = 0; c < ND; ++c) acc[c] = zero();
  for (int64_t i = 0; i < n; ++i) {
    const V p = set1(scores[i]);
#pragma GCC unroll 8
    for (int c = 0; c < ND; ++c) acc[c] = fmadd(p, load(v + i * D + 16 * c), acc[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < ND; ++c) store(out + 16 * c, mul(acc[c], inv));
}

template <typename T>
static void attend(const float* q, const T* k, const T* v, int64_t n, int64_t D, float scale,
                   float* scores, T* out) {
  if (D == 128) attend_fixed<T, 8>(q, k, v, n, scale, scores, out);
  else if (D == 64) attend_fixed<T, 4>(q, k, v, n, scale, scores, out);
  else attend_one(q, k, v, n, D, scale, scores, out);
}

template <typename T>
static void rope_attention_k(const T* qkv, T* k_cache, T* v_cache, const T* cos, const T* sin,
                             const int64_t* starts, const int64_t* offsets, T* out,
                             AttentionShape sh, int threads) {
  const int64_t B = sh.B, Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D, S = sh.S;
  const int64_t M = offsets[B], row = (Hq + 2 * Hkv) * D, group = Hq / Hkv;
  auto cache_at = [&](T* base, int64_t b, int64_t h, int64_t p) { return base + ((b * Hkv + h) * S + p) * D; };

  // 1. Rotate q (kept in fp32, with T's values) and write every token's k, v into the cache.
  std::vector<float> q(static_cast<size_t>(M * Hq * D));
  std::vector<T> tmp(static_cast<size_t>(D));     // one rotated head in T
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t m = offsets[b]; m < offsets[b + 1]; ++m) {
      const int64_t p = starts[b] + (m - offsets[b]);
      const int64_t pr = std::min(p, sh.S_rope - 1);
      const T* src = qkv + m * row;
      const T* c = cos + pr * D;
      const T* s = sin + pr * D;
      for (int64_t h = 0; h < Hq; ++h) {
        rope(src + h * D, c, s, tmp.data(), D);
        for (int64_t d = 0; d < D; d += 16)
          store(&q[size_t((m * Hq + h) * D + d)], load(tmp.data() + d, D - d), D - d);
      }
      for (int64_t h = 0; h < Hkv; ++h) {
        rope(src + (Hq + h) * D, c, s, cache_at(k_cache, b, h, p), D);
        std::copy(src + (Hq + Hkv + h) * D, src + (Hq + Hkv + h + 1) * D, cache_at(v_cache, b, h, p));
      }
    }
  }
  // 2. Every (row of the batch, query head) on its own: its queries against its kv head.
  #pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(static_cast<size_t>(S));
    #pragma omp for schedule(static)
    for (int64_t task = 0; task < B * Hq; ++task) {
      const int64_t b = task / Hq, h = task % Hq, kvh = h / group;
      for (int64_t m = offsets[b]; m < offsets[b + 1]; ++m) {
        const int64_t p = starts[b] + (m - offsets[b]);
        attend(&q[size_t((m * Hq + h) * D)], cache_at(k_cache, b, kvh, 0),
               cache_at(v_cache, b, kvh, 0), p + 1, D, sh.scale, scores.data(),
               out + (m * Hq + h) * D);
      }
    }
  }
}

// --- argmax ----------------------------------------------------------------------------------
// The index of the largest of x[0 .. n - 1] (n >= 1) as torch.argmax gives it: the first on
// ties, and a NaN counted above every number (the first NaN). One pass for the largest value
// (and whether there is a NaN), one for where it first appears, instead of a compare and a
// branch per element.
static int64_t argmax_row(const float* x, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  V m = set1(lowest);
  uint32_t nan = 0;
  for (int64_t k = 0; k < n; k += 16) {
    const V v = load_or(x + k, n - k, lowest);      // lanes past n hold -inf: they never win
    nan |= nan_lanes(v);
    m = max_of(v, m);
  }
  const V top = set1(reduce_max(m));
  for (int64_t k = 0; k < n; k += 16) {
    const V v = load_or(x + k, n - k, lowest);
    const uint32_t hit = nan ? nan_lanes(v) : equal_lanes(v, top);
    if (hit) return k + __builtin_ctz(hit);
  }
  return 0;    // unreachable: the largest value is somewhere
}

static void argmax_rows_k(const float* x, int64_t R, int64_t n, int64_t row_stride,
                          int64_t* out, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static) if (R > 1)
  for (int64_t r = 0; r < R; ++r) out[r] = argmax_row(x + r * row_stride, n);
}
