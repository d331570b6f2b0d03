// Probe: 5-bit weights in blocks of 32 (GGUF Q5_0's grid: w = d * (q - 16), q in 0..31) against
// completiond's int8 kernel, same tiles and batch-invariant arithmetic. Block: 16 bytes of nibbles
// (byte j: w[j] low, w[j+16] high), 4 bytes of fifth bits, float32 scale = 24 bytes per 32 weights.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#define NB 16
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline void decode5(const uint8_t *blk, float *out) {
    __m128i lo = _mm_loadu_si128((const __m128i *)blk);
    uint32_t hb; memcpy(&hb, blk + 16, 4);
    float sc; memcpy(&sc, blk + 20, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(lo, 4), m4), _mm_and_si128(lo, m4));
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)hb), shuf);
    bits = _mm256_cmpeq_epi8(_mm256_and_si256(bits, sel), sel);
    q = _mm256_sub_epi8(_mm256_or_si256(q, _mm256_and_si256(bits, _mm256_set1_epi8(16))), _mm256_set1_epi8(16));
    __m128i a = _mm256_castsi256_si128(q), b = _mm256_extracti128_si256(q, 1);
    __m256 s = _mm256_set1_ps(sc);
    _mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), s));
    _mm256_store_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), s));
    _mm256_store_ps(out + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s));
    _mm256_store_ps(out + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), s));
}
static inline __attribute__((always_inline)) void tile5(int R, int C, const float *x, const uint8_t *w, int64_t K,
                                                        float *y, int64_t ldy) {
    __m256 acc[6][8];
    float wb[8][32] __attribute__((aligned(32)));
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t nb = K / 32, rs = nb * 24;
    for (int64_t b = 0; b < nb; b++) {
        for (int c = 0; c < C; c++) {
            if ((b & 1) == 0) _mm_prefetch((const char *)(w + 2 * C * rs + c * rs + b * 24), _MM_HINT_T0);
            decode5(w + c * rs + b * 24, wb[c]);
        }
        for (int j = 0; j < 4; j++) {
            __m256 wv[8];
            for (int c = 0; c < C; c++) wv[c] = _mm256_load_ps(wb[c] + 8 * j);
            for (int r = 0; r < R; r++) {
                __m256 xv = _mm256_loadu_ps(x + r * K + b * 32 + 8 * j);
                for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv[c], xv, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++) for (int c = 0; c < C; c++) y[r * ldy + c] = hsum(acc[r][c]);
}
static inline __attribute__((always_inline)) void rows5(int R, int C, const float *x, const uint8_t *w, int64_t K,
                                                        int64_t N, float *y, int64_t m0, int64_t n0, int64_t n1) {
    int64_t rs = K / 32 * 24, n = n0;
    for (; n + C <= n1; n += C) tile5(R, C, x + m0 * K, w + n * rs, K, y + m0 * N + n, N);
    for (; n < n1; n++) tile5(R, 1, x + m0 * K, w + n * rs, K, y + m0 * N + n, N);
}
void q5_mm(const float *x, const uint8_t *w, float *y, int64_t M, int64_t K, int64_t N, int threads) {
    int64_t blocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N, m = 0;
        for (; m + 6 <= M; m += 6) rows5(6, 2, x, w, K, N, y, m, n0, n1);
        for (; m + 4 <= M; m += 4) rows5(4, 2, x, w, K, N, y, m, n0, n1);
        for (; m + 2 <= M; m += 2) rows5(2, 4, x, w, K, N, y, m, n0, n1);
        for (; m < M; m++) rows5(1, 8, x, w, K, N, y, m, n0, n1);
    }
}
