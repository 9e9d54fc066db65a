// The bf16 product on AMX-BF16 tiles (TDPBF16PS), for a model whose every bf16 projection is
// packed for it: decode steps, verify passes and prompts all run here, so a verify pass gives
// the bits of the decode steps it replaces (the AVX-512 kernels of gemv.cpp sum in another
// order, which is why no pass may mix the two).
//
// Why: the AVX-512 kernels spend 16-24 dot-product instructions per 256 weight bytes on a
// 4-6-row verify pass, so on two cores such a pass is compute-bound: the 1.5B's products took
// 92 ms at 1 row, 121 at 5, 160 at 8, 274 at 16. A tile dot product multiplies a 16 x 32 block
// of x by 32 x 16 of weights in one instruction, and the same products here took 87-90 ms at
// every M from 1 to 16 (benchmarks/RESULTS.md, "AMX-BF16 for every bf16 pass").
//
// Packed layout: 16 weight rows a group, two groups a unit (one for a last odd group); a unit's
// K / 32 blocks in order, each block its groups' B tiles side by side, one tile 16 k-pairs x 16
// rows x 2 bf16 (1 KiB: tile[p][n][e] = W[n][32 b + 2 p + e]). A unit is one contiguous stream,
// the next unit follows it, and a thread's units are consecutive.
//
// Each output's sum: C[m][n] starts at 0 and takes TDPBF16PS of block 0, 1, ... K / 32 - 1 in
// order; whatever the tile's pairs do inside an instruction, they do the same for every row of
// x and every M (the rows of a tile are independent). Then + bias (as fp32), rounded to bf16
// by f32x16_to_bf16 (nearest even) or kept fp32.
#include "gemv_bf16_amx.h"

#include <immintrin.h>
#include <algorithm>
#include <cstdint>

#include "cpu_features.h"
#include "threads.h"
#include "gemv_tiled.h"

namespace specrt {

#if SPECRT_HAS_AMX
bool bf16_amx_supported() { return cpu_amx_bf16(); }

namespace {

constexpr int TILE = 16;                   // rows of x a tile, weight rows a group
constexpr int64_t TILE_BYTES = 1024;       // one block of a group
constexpr int64_t AHEAD = 2048;            // bytes prefetched ahead in a thread's stream

#define SPECRT_AMX_BF16 \
  __attribute__((target(SPECRT_AVX512_TARGET ",amx-tile,amx-bf16")))

// Tiles 0-3 the sums C (16 x 16 fp32: x tile r, group g at 2 r + g), 4-5 x's rows A (rows x 32
// bf16), 6-7 weight blocks B. `rows` rows in the x tiles and sums (the last tile of a pass may
// be short).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig(int rows0, int rows1) {
    for (int t = 0; t < 8; ++t) colsb[t] = 64;
    rows[0] = rows[1] = rows[4] = uint8_t(rows0);
    rows[2] = rows[3] = rows[5] = uint8_t(rows1 ? rows1 : rows0);
    rows[6] = rows[7] = TILE;
  }
};

// One unit (G groups) against R x tiles (rows m0.., R = 2 only with a second tile), all K.
template <int R, int G>
SPECRT_AMX_BF16 static void unit(const uint16_t* x, int64_t K, const uint8_t* w,
                                 const uint8_t* stream_end, const Vector512<Bf16Store>& store,
                                 int64_t m0, int64_t rows0, int64_t rows1, int64_t n0) {
  const int64_t blocks = K / 32, stride = K * 2;
  _tile_zero(0);
  if (G > 1) _tile_zero(1);
  if (R > 1) _tile_zero(2);
  if (R > 1 && G > 1) _tile_zero(3);
  const uint16_t* x0 = x + m0 * K;
  const uint16_t* x1 = x0 + TILE * K;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * G * TILE_BYTES;
    const uint8_t* ahead = wb + AHEAD;
#pragma GCC unroll 32
    for (int line = 0; line < G * 16; ++line)
      if (ahead + 64 * line < stream_end) __builtin_prefetch(ahead + 64 * line, 0, 2);
    _tile_loadd(4, x0 + 32 * b, stride);
    if (R > 1) _tile_loadd(5, x1 + 32 * b, stride);
    _tile_loadd(6, wb, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (R > 1) _tile_dpbf16ps(2, 5, 6);
    if (G > 1) {
      _tile_loadd(7, wb + TILE_BYTES, 64);
      _tile_dpbf16ps(1, 4, 7);
      if (R > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float c[4][TILE * TILE];
  _tile_stored(0, c[0], 64);
  if (G > 1) _tile_stored(1, c[1], 64);
  if (R > 1) _tile_stored(2, c[2], 64);
  if (R > 1 && G > 1) _tile_stored(3, c[3], 64);
  for (int g = 0; g < G; ++g) {
    const int64_t n = n0 + TILE * g;
    const __m512 bias = store.bias ? load_bf16(store.bias + n, TILE) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < (r ? rows1 : rows0); ++j)   // C's row j: x row j, 16 weight rows
        put_scaled(_mm512_load_ps(c[2 * r + g] + TILE * j), nullptr,
                   store.bias ? &bias : nullptr, TILE, store.out, store.out_f32,
                   (m0 + TILE * r + j) * store.N + n);
  }
}

}  // namespace

SPECRT_AMX_BF16 void gemv_bf16_amx(const uint16_t* x, const uint16_t* w, const uint16_t* bias,
                                   void* out, bool out_f32, int64_t M, int64_t N, int64_t K,
                                   int threads) {
  threads = threads_for(M * N * K, threads);
  const Vector512<Bf16Store> store{{bias, out, out_f32, N}};
  const int64_t groups = N / TILE, units = (groups + 1) / 2, unit_bytes = 2 * TILE * K * 2;
  const uint8_t* base = reinterpret_cast<const uint8_t*>(w);
  const uint8_t* end = base + N * K * 2;
  // Passes of up to 32 rows: each streams the weight once (a prompt runs in chunks of 32).
  for (int64_t m0 = 0; m0 < M; m0 += 2 * TILE) {
    const int64_t rows0 = std::min<int64_t>(TILE, M - m0);
    const int64_t rows1 = std::max<int64_t>(0, std::min<int64_t>(TILE, M - m0 - TILE));
    #pragma omp parallel num_threads(threads)
    {
      const TileConfig config{int(rows0), int(rows1)};
      _tile_loadconfig(&config);
      #pragma omp for schedule(static)
      for (int64_t u = 0; u < units; ++u) {
        const uint8_t* wu = base + u * unit_bytes;
        const bool two = 2 * u + 1 < groups;
        const int64_t n0 = 2 * TILE * u;
        with_tiles(rows1 > 0, two, [&](auto r, auto g) {
          unit<decltype(r)::value, decltype(g)::value>(x, K, wu, end, store, m0, rows0, rows1,
                                                        n0);
        });
      }
      _tile_release();
    }
  }
}
#else
bool bf16_amx_supported() { return false; }
// Never called: bf16_amx_supported() is false where the compiler cannot target AMX.
void gemv_bf16_amx(const uint16_t*, const uint16_t*, const uint16_t*, void*, bool, int64_t,
                   int64_t, int64_t, int) {}
#endif

}  // namespace specrt
