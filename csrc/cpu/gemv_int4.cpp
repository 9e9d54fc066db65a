// Skinny matrix products with int4 weights for a draft model on the CPU:
//   y[m, n] = sum_b s_w[n, b] * s_x[m, b] * sum_{k in block b} qx[m, k] * qw[n, k]  (+ bias[n])
// qw: the weight quantized per output row and per group of 64 values (symmetric, values -8..7,
// scale s_w[n, b] chosen at quantization), stored + 8 as nibbles: in each chunk of 128 values
// of a row, byte t holds value t in its low nibble and value 64 + t in its high nibble, so one
// 64-byte load, a mask and a shift give the two 64-value groups as unsigned bytes. qx: x
// quantized per block of 64 as for int8 (gemv_quant.h), with lane corrections for the +8. The
// block dots are exact integers (vpdpbusd); each output element sums its blocks in the same
// order whatever M is, so every row's bits are independent of the rows beside it.
//
// Half the bytes of int8 for a few more instructions per byte: the draft's step is memory-bound
// either way on this machine (benchmarks/RESULTS.md). Only a draft model runs this: its outputs
// decide which tokens are proposed, never which are emitted. The spec is
// specrt.kernels.cpu.gemv_int4.reference_linear.
#include "gemv_int4.h"

#include <immintrin.h>
#include <cstdint>

#include "cpu_features.h"
#include "threads.h"
#include "gemv_quant.h"
#include "gemv_tiled.h"

namespace specrt {

namespace {

constexpr int CHUNK = 2 * QBLOCK;    // values of k per k-step: 64 bytes of a weight row
// 8 weight rows x 2 rows of x: 16 accumulators + per x row two blocks' bytes and corrections
// (8) + the weight's two halves, a mask and a product: the 32 vector registers, nearly.
constexpr int NB_I4 = 8, MB_I4 = 2;

// The rows of x the block functions see, and where the weight's group scales are: a block gets
// its tile's first weight row as a pointer, and finds the tile's scales by its offset from the
// weight's first byte.
struct QRows4 {
  QRows x;
  const uint8_t* w_base;
  const float* w_scale;             // [N, K / 64]
  QRows4 rows(int64_t m) const { return {x.rows(m), w_base, w_scale}; }
};

template <int NB, int MB>
SPECRT_AVX512_VNNI SPECRT_INLINE void step_i4(const QRows& x, const uint8_t* w, const float* ws,
                                              int64_t K, int64_t k, __m512 (&acc)[NB * MB]) {
  const int64_t b = k / QBLOCK, nb = K / QBLOCK;
  __m512i xv[2][MB], cv[2][MB];
  __m512 sx[2][MB];
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j)
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      xv[h][j] = _mm512_loadu_si512(x.q + j * K + k + h * QBLOCK);
      cv[h][j] = _mm512_loadu_si512(x.corr + j * (K / 4) + (k + h * QBLOCK) / 4);
      sx[h][j] = _mm512_set1_ps(x.scale[j * nb + b + h]);
    }
  const __m512i low = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 8
  for (int i = 0; i < NB; ++i) {
    const __m512i packed = _mm512_loadu_si512(w + i * (K / 2) + k / 2);
    const __m512i half[2] = {_mm512_and_si512(packed, low),
                             _mm512_and_si512(_mm512_srli_epi16(packed, 4), low)};
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512 s = _mm512_set1_ps(ws[i * nb + b + h]);      // a broadcast load
#pragma GCC unroll 8
      for (int j = 0; j < MB; ++j) {
        __m512i d = _mm512_dpbusd_epi32(cv[h][j], half[h], xv[h][j]);   // correction + dot
        acc[i * MB + j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s, sx[h][j]),
                                          acc[i * MB + j]);
      }
    }
  }
}

template <int NB, int MB>
SPECRT_AVX512_VNNI static void block_i4(QRows4 x, const uint8_t* w, int64_t K, int64_t k0,
                                        int64_t k1, float* state, Prefetch pf) {
  const float* ws = x.w_scale + (w - x.w_base) / (K / 2) * (K / QBLOCK);   // this tile's scales
  __m512 acc[NB * MB];
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) acc[a] = _mm512_loadu_ps(state + 16 * a);
  for (int64_t k = k0; k < k1; k += CHUNK) { pf.step(); step_i4<NB, MB>(x.x, w, ws, K, k, acc); }
#pragma GCC unroll 32
  for (int a = 0; a < NB * MB; ++a) _mm512_storeu_ps(state + 16 * a, acc[a]);
}

#define SPECRT_I4_ROW(NB) block_i4<NB, 1>, block_i4<NB, 2>
Block<QRows4, uint8_t> block_i4_table[NB_I4][MB_I4] = {
    {SPECRT_I4_ROW(1)}, {SPECRT_I4_ROW(2)}, {SPECRT_I4_ROW(3)}, {SPECRT_I4_ROW(4)},
    {SPECRT_I4_ROW(5)}, {SPECRT_I4_ROW(6)}, {SPECRT_I4_ROW(7)}, {SPECRT_I4_ROW(8)}};

}  // namespace

void gemv_int4(const void* x, bool x_f32, const uint8_t* w, const float* w_scale,
               const void* bias, void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
               int threads) {
  threads = threads_for(M * N * K, threads);
  const QuantizedX qx(x, x_f32, M, K, 8);
  const Vector512<QuantStore> store{{nullptr, bias, x_f32, out, out_f32, N}};  // scales: in the blocks
  // Blocks of 2048 values: 1 KiB of each weight row, as int8's 1024.
  gemv_tiled<NB_I4, MB_I4, 2048, 2>(QRows4{qx.view, w, w_scale}, w, M, N, K, threads,
                                    block_i4_table, store);
}

}  // namespace specrt
