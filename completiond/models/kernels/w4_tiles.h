// w4_mm.c's tiling around one way of summing, included once per way. The includer defines DOT
// (acc + the u8 x s8 products of 4 bytes per int32 lane), SUFFIX (appended to tile / rows / mm),
// the tile shapes (RB x CB for runs of RB rows; C3, C2, C1 channels for the 3, 2 or 1 rows left)
// and the target the code is compiled for.
#define W4_CAT_(a, b) a##b
#define W4_CAT(a, b) W4_CAT_(a, b)
#define TILE W4_CAT(w4_tile, SUFFIX)
#define ROWS W4_CAT(w4_rows, SUFFIX)
#define MM W4_CAT(w4_mm, SUFFIX)

// R rows from m0 x C channels (packed rows at w, stride kp / 2 bytes; bf16 scale and zero rows at
// sz, stride 2 G: G scales then G zeros). Per group of 32: int32 lane sums of nibble x xq, then
// acc += float(sums) x (row's block scale x group scale); at the end a fixed horizontal sum plus the
// zeros' term, sum over groups of zero x (block scale x sum of the group's xq) (w4_zero_term).
static inline __attribute__((always_inline)) void TILE(int R, int C, const CompletiondA8Rows *a, int64_t m0,
                                                        const uint8_t *w, const uint16_t *sz, const float *xsum,
                                                        float *y, int64_t ldy, W4Prefetch *pf) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    int64_t nb = a->nb, kp = a->kp, half = kp / 2, G = kp / W4_G;
    const int8_t *q = a->q + m0 * kp;
    const float *xs = a->s + m0 * nb;
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256 blk[4][4];  // this block's sum over its groups of float(sums) x group scale
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) blk[r][c] = _mm256_setzero_ps();
        w4_prefetch(pf);
#pragma GCC unroll 4
        for (int j = 0; j < KB; j += W4_G) {  // group g: low nibbles of 32-byte piece g / 2 when g is even, else high
            int64_t k = b * KB + j, g = k / W4_G;
            __m256i u[4];
            __m256 sw[4];
            for (int c = 0; c < C; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + c * half + (k & ~(int64_t)63) / 2));
                u[c] = _mm256_and_si256((g & 1) ? _mm256_srli_epi16(v, 4) : v, low);
                sw[c] = _mm256_set1_ps(w4_bf16(sz[c * 2 * G + g]));
            }
            for (int r = 0; r < R; r++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(q + r * kp + k));
                for (int c = 0; c < C; c++) {
                    __m256i d = DOT(_mm256_setzero_si256(), u[c], x);
                    blk[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sw[c], blk[r][c]);
                }
            }
        }
        for (int r = 0; r < R; r++) {
            __m256 sx = _mm256_set1_ps(xs[r * nb + b]);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(blk[r][c], sx, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[r * ldy + c] = completiond_hsum8(acc[r][c]) + w4_zero_term(sz + c * 2 * G + G, xsum + (m0 + r) * G, G);
}

// Channels [n0, n1) for rows [m0, m0 + R): tiles of C channels, then single channels.
static inline __attribute__((always_inline)) void ROWS(int R, int C, const CompletiondA8Rows *a, const uint8_t *w,
                                                        const uint16_t *sz, const float *xsum, int64_t N, float *y,
                                                        int64_t m0, int64_t n0, int64_t n1, W4Prefetch *pf) {
    int64_t n = n0, half = a->kp / 2, g2 = 2 * (a->kp / W4_G);
    for (; n + C <= n1; n += C) TILE(R, C, a, m0, w + n * half, sz + n * g2, xsum, y + m0 * N + n, N, pf);
    for (; n < n1; n++) TILE(R, 1, a, m0, w + n * half, sz + n * g2, xsum, y + m0 * N + n, N, pf);
}

static void MM(const CompletiondA8Rows *a, const uint8_t *w, const uint16_t *sz, const float *xsum, float *y,
               int64_t M, int64_t N, int threads) {
    int64_t blocks = (N + W4_NB - 1) / W4_NB, rest = M % RB, half = a->kp / 2;
    // tile blocks run over one channel block -> lines of the next block to fetch per tile block
    int64_t tiles = (M / RB) * (W4_NB / CB) + (rest == 3) * (W4_NB / C3) + (rest == 2) * (W4_NB / C2) +
                    (rest == 1) * (W4_NB / C1);
    int64_t lines = W4_NB * half / 64, steps = tiles * a->nb;
    int per = (int)((lines + steps - 1) / (steps ? steps : 1));
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * W4_NB, n1 = n0 + W4_NB < N ? n0 + W4_NB : N, n2 = n1 + W4_NB < N ? n1 + W4_NB : N;
        W4Prefetch pf = {(const char *)(w + n1 * half), (const char *)(w + n2 * half), per};
        int64_t m = 0;
        for (; m + RB <= M; m += RB) ROWS(RB, CB, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        for (; m + 3 <= M; m += 3) ROWS(3, C3, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        for (; m + 2 <= M; m += 2) ROWS(2, C2, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        for (; m < M; m++) ROWS(1, C1, a, w, sz, xsum, N, y, m, n0, n1, &pf);
    }
}

#undef TILE
#undef ROWS
#undef MM
#undef W4_CAT
#undef W4_CAT_
#undef DOT
#undef SUFFIX
#undef RB
#undef CB
#undef C3
#undef C2
#undef C1
