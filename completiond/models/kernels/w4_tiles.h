// w4_mm.c's tiling around one way of summing, included once per way. The includer defines DOTQ
// (acc, u, p: acc + the u8 x s8 products of u's 4 bytes per int32 lane and the 4 activation bytes at
// p, the same in every lane), SUFFIX (appended to tile / rows / mm), RB (rows a tile; runs of 3, 2,
// 1 take the rest) and the target the code is compiled for.
#define W4_CAT_(a, b) a##b
#define W4_CAT(a, b) W4_CAT_(a, b)
#define TILE W4_CAT(w4_tile, SUFFIX)
#define ROWS W4_CAT(w4_rows, SUFFIX)
#define MM W4_CAT(w4_mm, SUFFIX)

// R rows from m0 x P vectors of 8 channels (lane l of vector j: channel 8 j + l): vector j's 32-byte
// pieces from w + 32 j, ws bytes apart, its group's 8 scales from sz + 8 j, ss apart, then its zeros
// likewise (a pair: ws 64, ss 16; a lone vector: 32, 8). Per group of W4_G along K and vector: int32
// lane sums of nibble x xq (W4_G / 4 DOTs, an activation quad broadcast to every lane), then acc +=
// float(sums) x (group scale x the row's block scale); after the last group the zeros' part, acc +=
// zero x xsum over the groups in order. A pair is read in one sweep, one stream. `valid`: channels
// to store from the first (the tail).
static inline __attribute__((always_inline)) void TILE(int R, int P, const CompletiondA8Rows *a, int64_t m0,
                                                        const uint8_t *w, int64_t ws, const uint16_t *sz, int64_t ss,
                                                        const float *xsum, float *y, int64_t ldy, int64_t valid,
                                                        W4Prefetch *pf) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    int64_t nb = a->nb, kp = a->kp, G = kp / W4_G;
    const int8_t *q = a->q + m0 * kp;
    const float *xs = a->s + m0 * nb;
    __m256 acc[RB][2];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < P; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int j = 0; j < P; j++) w4_prefetch(pf);  // a vector's share of the next item's lines
        for (int64_t g = b * (KB / W4_G); g < (b + 1) * (KB / W4_G); g++) {
            __m256i d[RB][2];
            for (int r = 0; r < R; r++)
                for (int j = 0; j < P; j++) d[r][j] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int64_t k = g * W4_G; k < (g + 1) * W4_G; k += 8) {  // a 32-byte piece: quads k (low), k + 4 (high)
                for (int j = 0; j < P; j++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(w + k / 8 * ws + 32 * j));
                    __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    for (int r = 0; r < R; r++)
                        d[r][j] = DOTQ(DOTQ(d[r][j], lo, q + r * kp + k), hi, q + r * kp + k + 4);
                }
            }
            for (int j = 0; j < P; j++) {
                __m256 sw = w4_bf16x8(sz + g * ss + 8 * j);
                for (int r = 0; r < R; r++) {
                    __m256 s = _mm256_mul_ps(sw, _mm256_set1_ps(xs[r * nb + b]));
                    acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r][j]), s, acc[r][j]);
                }
            }
        }
    }
    for (int64_t g = 0; g < G; g++)
        for (int j = 0; j < P; j++) {
            __m256 zero = w4_bf16x8(sz + ss * G + g * ss + 8 * j);
            for (int r = 0; r < R; r++)
                acc[r][j] = _mm256_fmadd_ps(zero, _mm256_set1_ps(xsum[(m0 + r) * G + g]), acc[r][j]);
        }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < P; j++) w4_store(y + r * ldy + 8 * j, acc[r][j], valid - 8 * j);
}

// Channels [n0, n1) (n0 a multiple of 16) for rows [m0, m0 + R), a pair of vectors at a time (a last
// odd vector alone): a thread reads its pairs back to back, one stream the hardware prefetcher follows
// (tiles of 2-3 vectors read as 2-3 streams made one-row matmuls ~25 % slower on Zen 4).
static inline __attribute__((always_inline)) void ROWS(int R, const CompletiondA8Rows *a, const uint8_t *w,
                                                        const uint16_t *sz, const float *xsum, int64_t N, float *y,
                                                        int64_t m0, int64_t n0, int64_t n1, W4Prefetch *pf) {
    int64_t G = a->kp / W4_G, paired = (N + 7) / 16 * 16;  // channels in whole pairs of vectors
    int64_t n = n0;
    for (; n < n1 && n < paired; n += 16)
        TILE(R, 2, a, m0, w + n / 2 * a->kp, 64, sz + n * 2 * G, 16, xsum, y + m0 * N + n, N, n1 - n, pf);
    if (n < n1) TILE(R, 1, a, m0, w + n / 2 * a->kp, 32, sz + n * 2 * G, 8, xsum, y + m0 * N + n, N, n1 - n, pf);
}

static void MM(const CompletiondA8Rows *a, const uint8_t *w, const uint16_t *sz, const float *xsum, float *y,
               int64_t M, int64_t N, int threads) {
    int64_t blocks = (N + W4_NB - 1) / W4_NB;
    int per = w4_prefetch_per(a, (M / RB + (M % RB) / 3 + (M % RB % 3) / 2 + M % RB % 3 % 2) * (W4_NB / 8));
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0, n1;
        W4Prefetch pf = w4_item(w, a->kp / 2, b, N, per, &n0, &n1);
        int64_t m = 0;
        for (; m + RB <= M; m += RB) ROWS(RB, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        for (; m + 3 <= M; m += 3) ROWS(3, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        for (; m + 2 <= M; m += 2) ROWS(2, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        for (; m < M; m++) ROWS(1, a, w, sz, xsum, N, y, m, n0, n1, &pf);
    }
}

#undef TILE
#undef ROWS
#undef MM
#undef W4_CAT
#undef W4_CAT_
#undef DOTQ
#undef SUFFIX
#undef RB
