// The tiled driver shared by the skinny CPU matrix products (gemv.cpp: bf16/fp32 weights,
// gemv_int8_avx2.cpp / gemv_int4.cpp: quantized weights): it walks the weight once per call in
// tiles of NB weight rows and blocks of KB k-values, runs every row tile of x over each block
// while the block sits in L1, keeps partial sums in memory between blocks (so every output
// element sums k in the same order whatever M is) and prefetches the next block while the
// current one is multiplied. The per-format kernels supply the block function (one k-block of
// an NB x MB register tile) and the store (a tile's values -> output elements, store_tile).
#pragma once

#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_features.h"

namespace specrt {

// f(R, G) with R = 1 or 2 tiles of x and G = 1 or 2 groups of weight rows as
// std::integral_constant arguments: the AMX kernels' tile bodies, instantiated for each shape
// (gemv_int8_amx.cpp, gemv_bf16_amx.cpp).
template <typename F>
static inline void with_tiles(bool two_x, bool two_groups, F&& f) {
  using one = std::integral_constant<int, 1>;
  using two = std::integral_constant<int, 2>;
  if (two_x) {
    if (two_groups) f(two{}, two{});
    else f(two{}, one{});
  } else {
    if (two_groups) f(one{}, two{});
    else f(one{}, one{});
  }
}

// Scalar bf16 <-> fp32 for the stores.
static inline float bf16_to_f32(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// Rows of x as the block functions read them: row-major with K values per row.
template <typename T>
struct Rows {
  const T* p;
  int64_t K;
  Rows rows(int64_t m) const { return {p + m * K, K}; }
};

// The product goes through K in blocks: for each tile of NB_MAX weight rows and each block of
// k, every row tile of x (up to MB_MAX rows, sized by each format so its tile's accumulators fit
// the 32 vector registers) runs over the block while it sits in L1, so the weight is read
// from memory once whatever M is. Accumulators wait in memory between blocks; that leaves the
// order of every lane's sums, and so the bits, the same for every M. M is cut into near-equal
// row tiles (17 = 2 + 3 + 3 + 3 + 3 + 3) so that no tile is left with one row doing a load
// per product. Each k-step of a block function reads 64 bytes of each weight row. PACK: values
// of k per weight element (1; 2 for int4, two values a byte): a weight row is K / PACK elements.

// While a block is multiplied from L1, the next block is requested a few cache lines per k-step
// into L2 (prefetcht2), spread over all the row tiles' passes. Without it memory sat idle during
// the products and a verify pass cost about memory time + compute time. Measured on the
// development machine over the 1.5B target's weights (bf16, 2 threads), each pair A/B in one
// process: 1 row 72 ms (75 with the former whole-K decode tiles), 2 rows 73 (92), 9 rows 114
// (143), 17 rows 185 (215), with the prefetch (without).
// A burst of requests at the start of a block, or requests into L1, stalled on the miss queue
// and measured no better or worse.
//
// Where the next bytes come from (Ahead): the AVX-512 kernels request the block DISTANCE blocks
// on (the same rows' later k range, or a later tile's block: NB short runs, one per row); the AVX2
// kernels request the next tile in memory order (its rows are contiguous, so one linear run of
// NB * K bytes, shared out over this tile's passes). On the AVX2 development machine (Zen 3)
// the linear run made the tiled product 1.31x faster at 2 rows and 1.07x at 5 (benchmarks/
// kernel_ab.py over the 1.5B's matrix shapes, benchmarks/RESULTS.md); the AVX-512 kernels
// keep what was measured for them. The bf16 kernel requests the block after next (DISTANCE 2,
// gemv.cpp): one block (8 rows x 1 KiB) of lead was too short for memory to keep up while a
// 3- to 17-row pass multiplied the current block; the others keep the next block (1).
enum class Ahead { next_block, next_tile };

// A pass's share of the lines to request: `left` lines from p, per_step per k-step, in runs
// of lines_per_row lines with row_skip bytes skipped between runs.
struct Prefetch {
  const char* p = nullptr;
  int64_t left = 0, per_step = 0;
  int64_t col = 0, lines_per_row = 1, row_skip = 0;
  // lines [first, end) of runs of lines_per_row lines starting row_stride bytes apart at base
  static Prefetch share(const char* base, int64_t row_stride, int64_t lines_per_row,
                        int64_t first, int64_t end, int64_t per_step) {
    Prefetch pf;
    if (first >= end) return pf;
    pf.p = base + (first / lines_per_row) * row_stride + (first % lines_per_row) * 64;
    pf.left = end - first;
    pf.per_step = per_step;
    pf.col = first % lines_per_row;
    pf.lines_per_row = lines_per_row;
    pf.row_skip = row_stride - lines_per_row * 64;
    return pf;
  }
  inline void step() {
    for (int64_t n = std::min(per_step, left); n > 0; --n, --left) {
      __builtin_prefetch(p, 0, 1);
      p += 64;
      if (++col == lines_per_row) { col = 0; p += row_skip; }
    }
  }
};
// One k-block [k0, k1) of an NB x MB register tile: x (row view) against NB weight rows,
// accumulating into state [NB * MB][16] (loaded and stored around the block).
template <typename X, typename W>
using Block = void (*)(X x, const W* w, int64_t K, int64_t k0, int64_t k1, float* state, Prefetch pf);

// An output element's 16 lane sums -> its value, halving: s_i = v_i + v_(i+8), t_i = s_i +
// s_(i+4), u_i = t_i + t_(i+2), u_0 + u_1 (the tree of _mm512_reduce_add_ps).
SPECRT_AVX512 static inline float reduce16(const float* v) {
  return _mm512_reduce_add_ps(_mm512_loadu_ps(v));
}

// count output elements' lane sums v [count][16] -> out [count], each with reduce16's bits: 16
// at a time, the same pairs added at each level of the tree, 16 outputs a vector (8 + 4 + 2 + 1
// additions and twice as many shuffles for 16 outputs, where one at a time takes 4 additions
// and 4 extracts or shuffles each). A tile's outputs are reduced once all of K is summed;
// reduced and stored one at a time they took about a quarter of a 17-row product's time on
// L2-resident weights (RESULTS.md, "Zen 5: where a wide pass's time goes").
SPECRT_AVX512 static inline void reduce16_all(const float* v, int64_t count, float* out) {
  int64_t c = 0;
  for (; c + 16 <= count; c += 16) {
    // Slot 4g + k takes output 4k + g: the tree below leaves slot s's value in lane 4(s % 4) +
    // s / 4, so output o lands in lane o.
    __m512 r[8];
    for (int p = 0; p < 8; ++p) {                       // s_i: slots 2p | 2p + 1, 8 lanes each
      const int a = 2 * p, b = a + 1;
      const __m512 va = _mm512_loadu_ps(v + 16 * (c + 4 * (a % 4) + a / 4));
      const __m512 vb = _mm512_loadu_ps(v + 16 * (c + 4 * (b % 4) + b / 4));
      r[p] = _mm512_add_ps(_mm512_shuffle_f32x4(va, vb, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(va, vb, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    __m512 t[4];
    for (int q = 0; q < 4; ++q)                         // t_i: slots 4q + 0..3 by 128-bit chunk
      t[q] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * q], r[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(r[2 * q], r[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 u[2];
    for (int o = 0; o < 2; ++o)                         // u_i: per chunk k, slots 8o + k, 8o + 4 + k
      u[o] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * o], t[2 * o + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(t[2 * o], t[2 * o + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    _mm512_storeu_ps(out + c,                           // u_0 + u_1: chunk k, slots k, 4 + k, 8 + k, 12 + k
                     _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1))));
  }
  for (; c < count; ++c) out[c] = reduce16(v + 16 * c);
}

// The AVX2 blocks' partial sums (16 floats an output element, as two 8-lane halves) in a fixed
// pairwise order, one output at a time.
static inline void reduce16_pairwise(const float* v, int64_t count, float* out) {
  for (int64_t c = 0; c < count; ++c, v += 16) {
    float a[8];
    for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) a[i] += a[i + 4];
    out[c] = (a[0] + a[2]) + (a[1] + a[3]);
  }
}
// Lane sums [count][16] -> values [count].
using Reduce = void (*)(const float* v, int64_t count, float* out);

// The stores of the unquantized products (gemv.cpp, gemv_avx2.cpp): + bias[n] and the output
// element at out[m, n]; bf16 weights store fp32 or bf16 (rounded to nearest even).
struct Bf16Store {
  const uint16_t* bias;              // [N] or null
  void* out;                         // [M, N]
  bool out_f32;
  int64_t N;
  void operator()(int64_t m, int64_t n, float v) const {
    if (bias) v += bf16_to_f32(bias[n]);
    if (out_f32) static_cast<float*>(out)[m * N + n] = v;
    else static_cast<uint16_t*>(out)[m * N + n] = f32_to_bf16(v);
  }
};
struct F32Store {
  const float* bias;                 // [N] or null
  float* out;                        // [M, N]
  int64_t N;
  void operator()(int64_t m, int64_t n, float v) const { out[m * N + n] = bias ? v + bias[n] : v; }
};

// The drivers below hand a store a tile's values at once: vals [nb][mb] (weight row i, x row j)
// are the outputs (m0 + j, n0 + i). By default one at a time through store(m, n, v); a store
// wrapped in Vector512 (the AVX-512 kernels) writes each x row's nb outputs with one vector
// store, the same arithmetic lane by lane (Bf16Store's overload below, QuantStore's in
// gemv_quant.h). One at a time the stores took ~1/6 of a 48-row product's time.
template <typename Store>
static inline void store_tile(const Store& store, int64_t m0, int64_t mb, int64_t n0, int nb,
                              const float* vals) {
  for (int i = 0; i < nb; ++i)
    for (int64_t j = 0; j < mb; ++j) store(m0 + j, n0 + i, vals[i * mb + j]);
}
template <typename Store>
struct Vector512 : Store {};

// fp32 -> bf16, 16 lanes: f32_to_bf16's integer arithmetic (round to nearest even, NaN quieted).
SPECRT_AVX512 static inline __m256i f32x16_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), high = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                   _mm512_and_si512(high, _mm512_set1_epi32(1))));
  r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan,
                            _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
// Column j of vals [nb][mb] (nb <= 16): lane i = vals[i * mb + j], lanes past nb zero.
SPECRT_AVX512 static inline __m512 tile_column(const float* vals, int64_t mb, int64_t j, int nb) {
  if (mb == 1) return _mm512_maskz_loadu_ps(__mmask16((1u << nb) - 1), vals);   // a decode step
  const __m512i idx = _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(int(mb))), _mm512_set1_epi32(int(j)));
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), __mmask16((1u << nb) - 1), idx, vals, 4);
}
// Lanes [0, nb) of v -> out[at .. at + nb) as fp32 or bf16.
SPECRT_AVX512 static inline void put_row(__m512 v, int nb, void* out, bool out_f32, int64_t at) {
  const __mmask16 mask = __mmask16((1u << nb) - 1);
  if (out_f32) _mm512_mask_storeu_ps(static_cast<float*>(out) + at, mask, v);
  else _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + at, mask, f32x16_to_bf16(v));
}
SPECRT_AVX512 static inline __m512 load_bf16(const uint16_t* p, int nb) {
  const __m256i h = _mm256_maskz_loadu_epi16(__mmask16((1u << nb) - 1), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Lanes [0, nb) of v x scale (if given), + bias (if given) -> out[at ..] as fp32 or bf16: the
// stores' arithmetic lane by lane.
SPECRT_AVX512 static inline void put_scaled(__m512 v, const __m512* scale, const __m512* bias,
                                            int nb, void* out, bool out_f32, int64_t at) {
  if (scale) v = _mm512_mul_ps(v, *scale);
  if (bias) v = _mm512_add_ps(v, *bias);
  put_row(v, nb, out, out_f32, at);
}

// A tile's values vals [nb][mb] -> out [., N] at rows m0 .., columns n0 ..: each x row's nb
// values through put_scaled (the vector stores).
SPECRT_AVX512 static inline void put_tile(const float* vals, int64_t m0, int64_t mb, int64_t n0,
                                          int nb, const __m512* scale, const __m512* bias,
                                          void* out, bool out_f32, int64_t N) {
  for (int64_t j = 0; j < mb; ++j)
    put_scaled(tile_column(vals, mb, j, nb), scale, bias, nb, out, out_f32, (m0 + j) * N + n0);
}

SPECRT_AVX512 inline void store_tile(const Vector512<Bf16Store>& s, int64_t m0, int64_t mb,
                                     int64_t n0, int nb, const float* vals) {
  const __m512 bias = s.bias ? load_bf16(s.bias + n0, nb) : _mm512_setzero_ps();
  put_tile(vals, m0, mb, n0, nb, nullptr, s.bias ? &bias : nullptr, s.out, s.out_f32, s.N);
}

// A decode step or a pass of at most MB rows of x over whole weight rows (gemv.cpp,
// gemv_avx2.cpp): tiles of NB weight rows, in groups of 16 weight rows split
// evenly over the threads. tile(n0, sums) writes the lane sums of weight rows n0 .. n0 + NB - 1
// against the M rows of x into sums [NB][M][16], one(n, sums) those of weight row n alone (a
// partial last tile goes row by row); the template argument reduce turns a group's lane sums
// into values, which store_tile writes. A group, not a tile, is reduced and stored at once: a
// decode step's 4-row tile has 4 outputs, and reducing and storing them a tile at a time took
// ~1/9 of the int8 draft's decode step (perf; its weight rows are 896 bytes).
template <int NB, int MB, Reduce reduce, typename Tile, typename One, typename Store>
static void few_rows(int64_t M, int64_t N, int threads, Tile tile, One one, Store store) {
  constexpr int G = NB < 16 ? 16 / NB * NB : NB;               // weight rows a group
  const int64_t groups = (N + G - 1) / G;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    alignas(64) float sums[G * MB * 16], vals[G * MB];
    const int64_t n0 = g * G;
    const int nb = int(std::min<int64_t>(G, N - n0));
    for (int t = 0; t < nb; t += NB) {
      if (t + NB <= nb) tile(n0 + t, sums + 16 * M * t);
      else for (int i = t; i < nb; ++i) one(n0 + i, sums + 16 * M * i);
    }
    reduce(sums, nb * M, vals);
    store_tile(store, 0, M, n0, nb, vals);
  }
}

// M cut into near-equal parts of at most `most` as (first, count): 17 by 3 = 2 + 3 + 3 + 3 + 3
// + 3, so no part is left much smaller than the others (the row tiles of x below, and the
// chunks of M_CHUNK rows).
static inline std::vector<std::pair<int64_t, int64_t>> near_equal_parts(int64_t M, int64_t most) {
  std::vector<std::pair<int64_t, int64_t>> parts;
  for (int64_t m0 = 0, left = (M + most - 1) / most; m0 < M; --left) {
    const int64_t n = (M - m0) / left;
    parts.emplace_back(m0, n);
    m0 += n;
  }
  return parts;
}

// The most rows of x one pass of the AVX2 products serves (gemv_avx2.cpp, gemv_int8_avx2.cpp):
// a prefill's hundreds of rows run in near-equal chunks, a pass each. In one pass every weight
// tile re-reads all of x (M rows of a k-block) from L2 or beyond; 32-64 rows keep that in L2 for
// the cost of streaming the weight once more per chunk: a 252-token prompt's bf16 products (the
// 1.5B's shapes) took 41-42 ms a token in chunks of 32-64 rows, 44 in 96, 65 in one pass;
// kernel_ab: bf16 1.28x at 252 rows, 1.04x at 96, int8 1.09x at 96, 1.00x at 32 (RESULTS.md).
// Each row is computed on its own, so its bits do not depend on the chunking.
constexpr int64_t M_CHUNK = 48;

// How a product's weight tiles are shared among the threads: a share at a time to whichever
// thread is free, DYNAMIC_TILES tiles for passes of M_DYNAMIC rows or more (prompt chunks, long
// catch-ups), VERIFY_TILES for narrower multi-row passes (verify passes), an even share per
// thread for one row. On the 2-core development machine the second core's speed comes and
// goes with other tenants (kernel_ab's contention probe: a 1 MB parallel op 1.1-1.6x faster on
// 2 threads than on 1; the bf16 products at 9-48 rows 1.3x), and a pass split evenly up front
// waits for the slower core. `kernel_ab`, bf16, against the even split: 48 rows 1.17x, 1.03x,
// 1.03x, 1.06x, 1.05x in five runs, 96 rows 1.07x; int8 0.98x at 48, 1.08x at 96; with
// shares of 32 tiles: 2 rows 1.10x, 3 1.02x, 5 1.11x and 1.02x, 9 0.99x and 0.98x, 17 1.02x
// (benchmarks/RESULTS.md; the AVX-512 kernels share this driver and were not measured). One
// row keeps the even split: a decode step is memory-bound (1.00x). Each AVX2 pass prefetches
// the tile after its own in memory order, which shares keep but for a share's last tile.
constexpr int64_t M_DYNAMIC = 24, DYNAMIC_TILES = 8, VERIFY_TILES = 32;

// NB_MAX weight rows per tile, row tiles of at most MB_MAX rows of x, blocks of KB k-values.
template <int NB_MAX, int MB_MAX, int KB, int PACK = 1, Ahead AHEAD = Ahead::next_block,
          int DISTANCE = 1, typename X, typename T, typename Store>
static void gemv_tiled(X x, const T* w, int64_t M, int64_t N, int64_t K, int threads,
                       Block<X, T> (&Blocks)[NB_MAX][MB_MAX], Store store,
                       Reduce reduce = reduce16_all) {
  int64_t n_tiles = (N + NB_MAX - 1) / NB_MAX;
  const int64_t blocks = (K + KB - 1) / KB;                 // k-blocks a tile
  const int64_t row = K / PACK;                             // weight elements per row
  const std::vector<std::pair<int64_t, int64_t>> row_tiles = near_equal_parts(M, MB_MAX);
  const int64_t m_tiles = int64_t(row_tiles.size());
  // tiles a thread takes at a time (each tile is computed on its own, so which thread takes
  // it leaves the bits alone)
  const int64_t share = M >= M_DYNAMIC ? DYNAMIC_TILES : M >= 2 ? VERIFY_TILES
                                       : std::max<int64_t>(1, (n_tiles + threads - 1) / threads);
  #pragma omp parallel num_threads(threads)
  {
    std::vector<float> state(size_t(M) * NB_MAX * 16);    // [M][NB][16] partial sums
    std::vector<float> vals(size_t(M) * NB_MAX);            // [M][NB] their values
    #pragma omp for schedule(dynamic, share)
    for (int64_t t = 0; t < n_tiles; ++t) {
      int64_t n0 = t * NB_MAX;
      int nb = int(std::min<int64_t>(NB_MAX, N - n0));
      std::fill(state.begin(), state.end(), 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += KB) {
        int64_t k1 = std::min<int64_t>(K, k0 + KB);
        // This block's passes (one per row tile) share out the lines of what comes next, a
        // few per full k-step (one vector of k is 64 bytes; a block shorter than one vector
        // has no full step and counts one, which keeps the division defined). The next block:
        // the next k range of these rows, or the next tile's first. The next tile: all of it,
        // over all of this tile's passes.
        const int64_t steps = std::max<int64_t>(1, (k1 - k0) / PACK * int64_t(sizeof(T)) / 64);
        const char* base = nullptr;
        int64_t row_stride = 0, lines_per_row = 1, lines = 0, pass0 = 0, passes = m_tiles;
        if (AHEAD == Ahead::next_block) {
          const int64_t b = k0 / KB + DISTANCE;                 // the block requested
          const int64_t nn0 = n0 + b / blocks * NB_MAX, nk0 = b % blocks * KB;
          if (nn0 < N) {
            int64_t nkb = std::min<int64_t>(KB, K - nk0);
            base = reinterpret_cast<const char*>(w + nn0 * row + nk0 / PACK);
            row_stride = row * int64_t(sizeof(T));
            lines_per_row = (nkb / PACK * int64_t(sizeof(T)) + 63) / 64;
            lines = std::min<int64_t>(NB_MAX, N - nn0) * lines_per_row;
          }
        } else if (n0 + NB_MAX < N) {
          base = reinterpret_cast<const char*>(w + (n0 + NB_MAX) * row);
          lines = std::min<int64_t>(NB_MAX, N - n0 - NB_MAX) * row * int64_t(sizeof(T)) / 64;
          lines_per_row = std::max<int64_t>(1, lines);
          pass0 = k0 / KB * m_tiles;
          passes = (K + KB - 1) / KB * m_tiles;
        }
        for (int64_t mt = 0; mt < m_tiles; ++mt) {
          auto [m0, mb] = row_tiles[mt];
          const int64_t first = lines * (pass0 + mt) / passes, end = lines * (pass0 + mt + 1) / passes;
          Prefetch mine = Prefetch::share(base, row_stride, lines_per_row, first, end,
                                          (end - first + steps - 1) / steps);
          Blocks[nb - 1][mb - 1](x.rows(m0), w + n0 * row, K, k0, k1, &state[m0 * NB_MAX * 16],
                                 mine);
        }
      }
      // every row tile's outputs at once (a partial tile's unused sums are zeros)
      reduce(state.data(), M * NB_MAX, vals.data());
      for (auto [m0, mb] : row_tiles) store_tile(store, m0, mb, n0, nb, &vals[m0 * NB_MAX]);
    }
  }
}

}  // namespace specrt
