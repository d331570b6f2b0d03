// y [M, N] = x [M, K] . w [N, K]^T with int4 weights and int8 activations (kinds W4*): a decode
// pass reads every weight once, so a one-token pass of a large model is bound by its bytes; int4
// with its scales reads 0.625 of int8's.
//
// Weights: w = q * scale + zero per group of 32 along K, q in [0, 15] (asymmetric, as torch's int4
// and llama.cpp's Q4_1), scale and zero bf16. Channels go in vectors of 8 (N padded to a multiple of
// 8 with zero weights), one channel per int32 lane, so the products of many rows run on the integer
// units and a float step comes once per 32 products of a lane, not once per 4. Vector v's nibbles
// are one stream of kp / 2 x 8 bytes (rows 8 v .. 8 v + 7 of the uint8 [N8, kp / 2] tensor): piece
// p (32 bytes) holds, in lane l's 4 bytes, channel 8 v + l's weights 8 p .. 8 p + 3 (low nibbles) and
// 8 p + 4 .. 8 p + 7 (high). Its scales and zeros are bf16 [2, G, 8] (G = kp / 32; rows 8 v .. of
// the [N8, 2, G] tensor). quant.pack_w4 writes this; K is padded to 128 with zero weights.
// Activations: a8_mm.c's int8 rows (blocks of 128, the same rounding); 4 of them are broadcast to
// every lane. u8 x s8 products: vpdpbusd where there is VNNI, vpmaddubsw + vpmaddwd on AVX2 (15 *
// 127 * 2 fits in int16: no saturation); both give each lane the same int32, so every path has the
// same bits. The zeros' part, zero x the group's sum of activations, is added after the products.
//
// Batch-invariant like every kernel here: a (row, channel) output depends on that row alone, by
// the same steps in the same order whatever the tile.
#include <stdlib.h>
#include <string.h>

#include "completiond_kernels.h"

#if COMPLETIOND_A8_KB != 128
#error "w4_mm.c: the weights' scale blocks are the activations' blocks of 128"
#endif
#define KB 128
#define W4_G 32   // weights per scale and zero along K
#define W4_NB 48  // output channels per thread work item (whole vectors of 8)

typedef CompletiondPrefetch W4Prefetch;
#define w4_prefetch completiond_prefetch_step

// 4 activation bytes as one int32 (broadcast to the lanes).
static inline __attribute__((always_inline)) int32_t w4_quad(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return v;
}

// 8 bf16 as float32.
static inline __attribute__((always_inline)) __m256 w4_bf16x8(const uint16_t *v) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)v)), 16));
}

// The first `valid` of 8 channels (all 8 when valid >= 8): the tail vector's padding is not stored.
static inline __attribute__((always_inline)) void w4_store(float *y, __m256 v, int64_t valid) {
    if (valid >= 8) {
        _mm256_storeu_ps(y, v);
    } else if (valid > 0) {
        float t[8];
        _mm256_storeu_ps(t, v);
        memcpy(y, t, sizeof(float) * valid);
    }
}

// ---- AVX2 ----
static inline __attribute__((always_inline)) __m256i dot_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define DOT dot_avx2
#define SUFFIX _avx2
#define RB 4  // 16 registers: 4 sums, 4 accumulators, 2 weight vectors, 2 activation vectors, the mask, ones
#include "w4_tiles.h"

// ---- AVX512-VNNI (256-bit vpdpbusd, AVX512-VL) ----
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define DOT _mm256_dpbusd_epi32
#define SUFFIX _vnni512
#define RB 4  // 8 rows a tile was no faster at 8-16 rows
#include "w4_tiles.h"
#pragma GCC pop_options

// ---- AVX-VNNI ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#define DOT _mm256_dpbusd_avx_epi32
#define SUFFIX _avxvnni
#define RB 4
#include "w4_tiles.h"
#pragma GCC pop_options

void completiond_mm_w4(int sums, const float *x, const uint8_t *w, const float *scale, float *y, int64_t M,
                       int64_t K, int64_t N, int threads) {
    CompletiondA8Rows a;
    completiond_a8_rows(x, M, K, threads, &a);
    int64_t G = a.kp / W4_G;
    float *xsum = malloc(sizeof(float) * M * G);  // [M, G]: block scale x the group's sum of xq
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < G; g++) {
            int32_t t = 0;
            for (int i = 0; i < W4_G; i++) t += a.q[m * a.kp + g * W4_G + i];
            xsum[m * G + g] = a.s[m * a.nb + g * W4_G / KB] * (float)t;
        }
    const uint16_t *sz = (const uint16_t *)scale;
    if (sums == 1)
        w4_mm_vnni512(&a, w, sz, xsum, y, M, N, threads);
    else if (sums == 2)
        w4_mm_avxvnni(&a, w, sz, xsum, y, M, N, threads);
    else
        w4_mm_avx2(&a, w, sz, xsum, y, M, N, threads);
    free(xsum);
    completiond_a8_rows_free(&a);
}
