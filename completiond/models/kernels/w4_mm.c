// y [M, N] = x [M, K] . w [N, K]^T with int4 weights and int8 activations (kinds W4*): a decode
// pass reads every weight once, so a one-token pass of a large model is bound by its bytes; int4
// halves them against int8.
//
// Weights: q in [-8, 7] per (channel, k) with one float32 scale per block of 128 along K, stored
// as nibbles q + 8 (u8 in [0, 15]), two per byte: in each 32-byte piece, byte j holds weight
// 64 s + j (low nibble) and 64 s + 32 + j (high nibble), so a load, an AND and a shift give two
// 32-byte vectors matching the activations' bytes (quant.pack_w4 writes this; K is padded to 128
// with q = 0). Activations: a8_mm.c's int8 rows (blocks of 128, the same rounding), so the u8 x s8
// products run as in the int8 kernel: vpdpbusd where there is VNNI, vpmaddubsw + vpmaddwd on AVX2
// (15 * 127 * 2 fits in int16: no saturation). Both give, per int32 lane, the products of bytes
// 4i..4i+3 of every 32-byte piece, so every path has the same bits; the nibbles' +8 is taken off
// by starting each block's sums at -8 * the lanes' sums of xq (a8's corr / 16).
//
// Batch-invariant like every kernel here: a (row, channel) output depends on that row alone.
#include <stdlib.h>
#include <string.h>

#include "completiond_kernels.h"

#if COMPLETIOND_A8_KB != 128
#error "w4_mm.c: the weights' scale blocks are the activations' blocks of 128"
#endif
#define KB 128
#define W4_NB 24  // output channels per thread work item

typedef struct {
    const char *cur, *end;
    int per;
} W4Prefetch;

// The next channel block's lines, `per` at a time, spread over the current block's work.
static inline __attribute__((always_inline)) void w4_prefetch(W4Prefetch *pf) {
    for (int i = 0; i < pf->per && pf->cur < pf->end; i++, pf->cur += 64) COMPLETIOND_PREFETCH(pf->cur);
}

// A block's starting sums: -8 * (sum of xq over each lane's bytes) = (corr's 512-bit lanes i + i + 8) / 16.
static inline __attribute__((always_inline)) __m256i w4_corr(const int32_t *corr) {
    return _mm256_srai_epi32(_mm256_add_epi32(_mm256_loadu_si256((const __m256i *)corr),
                                              _mm256_loadu_si256((const __m256i *)(corr + 8))),
                             4);
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
#define RB 4  // 32 registers: 8 sums, 8 accumulators, 4 weight vectors, 2 activation vectors
#define CB 2
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
    if (sums == 1)
        w4_mm_vnni512(&a, w, scale, y, M, N, threads);
    else if (sums == 2)
        w4_mm_avxvnni(&a, w, scale, y, M, N, threads);
    else
        w4_mm_avx2(&a, w, scale, y, M, N, threads);
    completiond_a8_rows_free(&a);
}
