// y [M, N] = (x [M, K] . w [N, K]^T) * scale [N], float32 activations, int8 weights (AVX2 + FMA).
//
// Batch invariance is the point: every (row, channel) dot product runs the same arithmetic
// whatever M is and whichever other rows share the call -- one 8-lane float accumulator over K in
// steps of 8, a fixed horizontal sum, a scalar tail in order, then the scale. So a tree node's
// output is bit-identical to the same token's in a one-token pass, and greedy speculation stays
// token-identical to plain decoding. The tiles (rows x channels) only change which dot products
// are computed together, so the weights converted to float are reused across the rows of a tree.
// Threads split the output channels (blocks of 16); -ffp-contract=off keeps the scalar code exact.
// Prefetches past the end of w are harmless (a prefetch never faults).
#include "completiond_kernels.h"

#define NB 16  // output channels per thread work item

static inline __m256 widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

// R rows x C channels: x rows at x (stride K), weight rows at w (stride K), results at y (stride ldy).
static inline __attribute__((always_inline)) void tile(int R, int C, const float *x, const int8_t *w,
                                                        const float *scale, int64_t K, float *y,
                                                        int64_t ldy) {
    __m256 acc[6][8];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[8];
        // the tile's C rows are contiguous (C x K bytes): fetch the tile after next at the same pace,
        // since rows of under 1 KB are too short for the hardware prefetcher to start
        if ((k & 63) == 0)
            for (int c = 0; c < C; c++) COMPLETIOND_PREFETCH(w + 2 * C * K + k * C + c * 64);
        for (int c = 0; c < C; c++) wv[c] = widen8(w + c * K + k);
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * K + k);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv[c], xv, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = completiond_hsum8(acc[r][c]);
            for (int64_t t = k; t < K; t++) s += (float)w[c * K + t] * x[r * K + t];
            y[r * ldy + c] = s * scale[c];
        }
}

// Channels [n0, n1) for rows [m0, m0 + R): tiles of C channels, then single channels.
static inline __attribute__((always_inline)) void rows(int R, int C, const float *x, const int8_t *w,
                                                        const float *scale, int64_t K, int64_t N,
                                                        float *y, int64_t m0, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + C <= n1; n += C) tile(R, C, x + m0 * K, w + n * K, scale + n, K, y + m0 * N + n, N);
    for (; n < n1; n++) tile(R, 1, x + m0 * K, w + n * K, scale + n, K, y + m0 * N + n, N);
}

void completiond_mm_f32(const float *x, const int8_t *w, const float *scale, float *y, int64_t M, int64_t K,
                        int64_t N, int threads) {
    int64_t blocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N;
        int64_t m = 0;
        // the block's weights (NB x K bytes) stay in cache while every row block reads them
        // tiles of 6 x 2, then one tile for the 1-5 rows left (5 x 2 ... 1 x 8): 6-12 accumulators,
        // within AVX2's 16 registers. One tile for the rest (not 2 x 4 + 1 x 8): 3 rows then cost
        // about what 3 rows should, not what 4 do (docs/kernels.md)
        for (; m + 6 <= M; m += 6) rows(6, 2, x, w, scale, K, N, y, m, n0, n1);
        switch (M - m) {
        case 5: rows(5, 2, x, w, scale, K, N, y, m, n0, n1); break;
        case 4: rows(4, 2, x, w, scale, K, N, y, m, n0, n1); break;
        case 3: rows(3, 2, x, w, scale, K, N, y, m, n0, n1); break;
        case 2: rows(2, 4, x, w, scale, K, N, y, m, n0, n1); break;
        case 1: rows(1, 8, x, w, scale, K, N, y, m, n0, n1); break;
        }
    }
}
