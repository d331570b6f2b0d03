// y [M, N] = (x [M, K] . w [N, K]^T) * scale [N] like int8_mm.c, with the activations rounded to
// int16 first: per row in blocks of KB = 128 along K (xq = round(x / xs), xs = max|x| / 32767 over
// the block: each within 2^-16 of its block's largest), int8 weights widened to int16, vpmaddwd
// (16 multiply-adds per instruction where a float FMA does 8; int32 sums exact: 128 * 32767 * 127
// < 2^31), then acc += float(block sums) * xs block by block, a fixed horizontal sum, the scale.
// Batch-invariant like int8_mm.c: a row's rounding and every (row, channel) sum depend on that row
// alone, so a tree node's outputs are bit-identical to the same token's in a one-token pass.
// Why: on some AVX2 CPUs the float kernel is bound by its int8 -> float widening and its 256-bit
// loads, and int16 moves half the activation bytes per multiply-add. Whether it is faster is
// measured per CPU (cpu_kernel.activations); qwen2_layer.c takes it for its matmuls then.
// On CPUs with AVX512-VNNI (kind COMPLETIOND_MM_A16_VNNI512, where cpu_kernel finds it) the
// int32 block sums come from 512-bit vpdpwssd over 32 activations at a time instead; lane i + 8 of
// those sums, added to lane i, is exactly the AVX2 loop's lane i (integer sums), and everything after
// is the same float code, so both paths give bit-identical outputs: one model on either CPU.
#include <math.h>
#include <stdlib.h>

#include "completiond_kernels.h"

#define NB 16   // output channels per thread work item
#define KB 128  // activations per int16 block (one scale each)

// Row `x` [K] -> xq [K] int16 and xs [ceil(K / KB)]. A block holding inf/nan gets scale nan (and
// zeros), so the outputs it feeds are nan, as float arithmetic would make them.
static void quantize_row(const float *x, int64_t K, int16_t *xq, float *xs) {
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += KB, b++) {
        int64_t k1 = k0 + KB < K ? k0 + KB : K;
        int finite;
        float mx = completiond_absmax(x + k0, k1 - k0, &finite);
        if (!finite) {
            xs[b] = NAN;
            for (int64_t k = k0; k < k1; k++) xq[k] = 0;
            continue;
        }
        float s = mx > 0.0f ? mx / 32767.0f : 1.0f;
        xs[b] = s;
        __m256 sv = _mm256_set1_ps(s);
        int64_t k = k0;
        for (; k + 8 <= k1; k += 8) {  // |x / s| <= 32767: the pack never saturates
            __m256i v = completiond_round8(x + k, sv);
            _mm_storeu_si128((__m128i *)(xq + k), _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
        }
        for (; k < k1; k++) xq[k] = (int16_t)lrintf(x[k] / s);
    }
}

// The end of a block from k (the 8-lane int32 sums dot [R, C] so far): 16-activation steps, then
// the rest (K not a multiple of 16), exact in int32 too, into lane 0; then acc += float(dot) * xs.
static inline __attribute__((always_inline)) void end_block(int R, int C, const int16_t *x, const float *xs,
                                                             int64_t nb, int64_t b, const int8_t *w, int64_t K,
                                                             int64_t k, int64_t k1, __m256i dot[8][4],
                                                             __m256 acc[8][4]) {
    for (; k + 16 <= k1; k += 16)
        for (int c = 0; c < C; c++) {
            __m256i wc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + c * K + k)));
            for (int r = 0; r < R; r++)
                dot[r][c] = _mm256_add_epi32(dot[r][c],
                                             _mm256_madd_epi16(wc, _mm256_loadu_si256((const __m256i *)(x + r * K + k))));
        }
    if (k < k1)
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                int32_t tail = 0;
                for (int64_t t = k; t < k1; t++) tail += (int32_t)w[c * K + t] * x[r * K + t];
                dot[r][c] = _mm256_add_epi32(dot[r][c], _mm256_setr_epi32(tail, 0, 0, 0, 0, 0, 0, 0));
            }
    for (int r = 0; r < R; r++) {
        __m256 s = _mm256_set1_ps(xs[r * nb + b]);
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][c]), s, acc[r][c]);
    }
}

// One block of `len` activations from k0 (len = KB, a constant, for all but a last short block:
// a constant trip count lets the compiler keep the R x C int32 sums in registers), for R rows x C
// channels, added to acc as float(block sums) * xs.
static inline __attribute__((always_inline)) void block(int R, int C, const int16_t *x, const float *xs,
                                                         int64_t nb, int64_t b, const int8_t *w, int64_t K,
                                                         int64_t k0, int64_t len, __m256 acc[8][4]) {
    __m256i dot[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) dot[r][c] = _mm256_setzero_si256();
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
        int64_t k = k0 + j;
        __m256i wv[4];
        // the tile's C rows are contiguous (C x K bytes): fetch the tile after next at the same
        // pace, since rows of under 1 KB are too short for the hardware prefetcher to start
        if ((k & 63) == 0)
            for (int c = 0; c < C; c++) COMPLETIOND_PREFETCH(w + 2 * C * K + k * C + c * 64);
        for (int c = 0; c < C; c++) wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + c * K + k)));
        for (int r = 0; r < R; r++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x + r * K + k));
            for (int c = 0; c < C; c++) dot[r][c] = _mm256_add_epi32(dot[r][c], _mm256_madd_epi16(wv[c], xv));
        }
    }
    end_block(R, C, x, xs, nb, b, w, K, k0 + j, k0 + len, dot, acc);
}

#define BLOCK block
#define SUFFIX 256
#include "a16_tiles.h"  // tile256, rows256, mm256
#undef BLOCK
#undef SUFFIX

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
// block() with 512-bit sums: [R, C] of 16 int32 lanes over 32 activations per step, folded to the
// AVX2 loop's 8 lanes (lane i + lane i + 8) for the block's end (the AVX2 code, inlined here).
static inline __attribute__((always_inline)) void block512(int R, int C, const int16_t *x, const float *xs,
                                                            int64_t nb, int64_t b, const int8_t *w, int64_t K,
                                                            int64_t k0, int64_t len, __m256 acc[8][4]) {
    __m512i wide[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) wide[r][c] = _mm512_setzero_si512();
    int64_t j = 0;
    for (; j + 32 <= len; j += 32) {
        int64_t k = k0 + j;
        __m512i wv[4];
        if ((k & 63) == 0)
            for (int c = 0; c < C; c++) COMPLETIOND_PREFETCH(w + 2 * C * K + k * C + c * 64);
        for (int c = 0; c < C; c++) wv[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + c * K + k)));
        for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_loadu_si512((const void *)(x + r * K + k));
            for (int c = 0; c < C; c++) wide[r][c] = _mm512_dpwssd_epi32(wide[r][c], wv[c], xv);
        }
    }
    __m256i dot[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            dot[r][c] = _mm256_add_epi32(_mm512_castsi512_si256(wide[r][c]), _mm512_extracti64x4_epi64(wide[r][c], 1));
    end_block(R, C, x, xs, nb, b, w, K, k0 + j, k0 + len, dot, acc);
}

#define BLOCK block512
#define SUFFIX 512
#include "a16_tiles.h"  // tile512, rows512, mm512
#undef BLOCK
#undef SUFFIX
#pragma GCC pop_options

// wide: the int32 sums run on AVX512-VNNI (mm512; the caller checked the CPU has it).
void completiond_mm_a16(int wide, const float *x, const int8_t *w, const float *scale, float *y, int64_t M,
                        int64_t K, int64_t N, int threads) {
    int64_t nb = (K + KB - 1) / KB;
    int16_t *xq = malloc(sizeof(int16_t) * M * K + 32);
    float *xs = malloc(sizeof(float) * M * nb);
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= 32768)
    for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, xq + m * K, xs + m * nb);
    (wide ? mm512 : mm256)(xq, xs, nb, w, scale, y, M, K, N, threads);
    free(xq);
    free(xs);
}
