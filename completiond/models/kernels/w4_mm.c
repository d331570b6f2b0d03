// y [M, N] = x [M, K] . w [N, K]^T with int4 weights and int8 activations (kinds W4*): a decode
// pass reads every weight once, so a one-token pass of a large model is bound by its bytes; int4
// with its scales reads 0.625 of int8's.
//
// Weights: w = q * scale + zero per group of 32 along K, q in [0, 15] (asymmetric, as torch's int4
// and llama.cpp's Q4_1), scale and zero bf16 ([N, 2, G]: G scales then G zeros per channel). q is
// stored as nibbles, two per byte: in each 32-byte piece, byte j holds weight 64 s + j (low nibble,
// group 2 s) and 64 s + 32 + j (high, group 2 s + 1), so a load, an AND (and a shift) give a 32-byte
// group matching the activations' bytes (quant.pack_w4 writes this; K is padded to 128 with zero
// weights). Activations: a8_mm.c's int8 rows (blocks of 128, the same rounding), so the u8 x s8
// products run as in the int8 kernel: vpdpbusd where there is VNNI, vpmaddubsw + vpmaddwd on AVX2
// (15 * 127 * 2 fits in int16: no saturation). Both give, per int32 lane, the products of bytes
// 4i..4i+3 of the group, so every path has the same bits. The zeros' part, zero x the group's sum of
// activations, is a short dot product per (row, channel) over the groups (w4_zero_term).
//
// Batch-invariant like every kernel here: a (row, channel) output depends on that row alone.
#include <stdlib.h>
#include <string.h>

#include "completiond_kernels.h"

#if COMPLETIOND_A8_KB != 128
#error "w4_mm.c: the weights' scale blocks are the activations' blocks of 128"
#endif
#define KB 128
#define W4_G 32   // weights per scale and zero along K
#define W4_NB 24  // output channels per thread work item

typedef CompletiondPrefetch W4Prefetch;
#define w4_prefetch completiond_prefetch_step

static inline __attribute__((always_inline)) float w4_bf16(uint16_t v) {
    union {
        uint32_t u;
        float f;
    } b = {(uint32_t)v << 16};
    return b.f;
}

// sum over the G groups of zero[g] * xsum[g] (xsum: the row's block scale x the group's sum of xq):
// 8 lanes, then a fixed horizontal sum and the tail in order.
static inline __attribute__((always_inline)) float w4_zero_term(const uint16_t *zero, const float *xsum, int64_t G) {
    __m256 acc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) {
        __m256i z = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(zero + g))), 16);
        acc = _mm256_fmadd_ps(_mm256_castsi256_ps(z), _mm256_loadu_ps(xsum + g), acc);
    }
    float t = completiond_hsum8(acc);
    for (; g < G; g++) t += w4_bf16(zero[g]) * xsum[g];
    return t;
}

// ---- AVX2 ----
static inline __attribute__((always_inline)) __m256i dot_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define DOT dot_avx2
#define SUFFIX _avx2
#define RB 2  // 16 registers: 4 sums, 4 accumulators, 4 weight vectors, 2 activation vectors
#define CB 2
#define C3 1
#define C2 2
#define C1 3
#include "w4_tiles.h"

// ---- AVX512-VNNI (256-bit vpdpbusd, AVX512-VL) ----
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define DOT _mm256_dpbusd_epi32
#define SUFFIX _vnni512
#define RB 4  // 32 registers: 12 sums, 12 accumulators, 3 weight vectors, an activation vector, the mask
#define CB 3
#define C3 2
#define C2 3
#define C1 4
#include "w4_tiles.h"
#pragma GCC pop_options

// ---- AVX-VNNI ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#define DOT _mm256_dpbusd_avx_epi32
#define SUFFIX _avxvnni
#define RB 2
#define CB 2
#define C3 1
#define C2 2
#define C1 3
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
