// a16_mm.c's tiling around one block kind, included once per kind: BLOCK (the block function, e.g.
// block) and SUFFIX (appended to the names defined here: tile, rows, mm) are defined by the includer,
// which also sets the target (AVX2 or AVX512) the code here is compiled for.
#define A16_CAT_(a, b) a##b
#define A16_CAT(a, b) A16_CAT_(a, b)
#define TILE A16_CAT(tile, SUFFIX)
#define ROWS A16_CAT(rows, SUFFIX)
#define MM A16_CAT(mm, SUFFIX)

// R rows x C channels: xq rows (stride K) with block scales xs (stride nb), weight rows at w
// (stride K), results at y (stride ldy).
static inline __attribute__((always_inline)) void TILE(int R, int C, const int16_t *x, const float *xs, int64_t nb,
                                                        const int8_t *w, const float *scale, int64_t K, float *y,
                                                        int64_t ldy) {
    __m256 acc[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t whole = K / KB;
    for (int64_t b = 0; b < whole; b++) BLOCK(R, C, x, xs, nb, b, w, K, b * KB, KB, acc);
    if (whole < nb) BLOCK(R, C, x, xs, nb, whole, w, K, whole * KB, K - whole * KB, acc);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[r * ldy + c] = completiond_hsum8(acc[r][c]) * scale[c];
}

// Channels [n0, n1) for rows [m0, m0 + R): tiles of C channels, then single channels.
static inline __attribute__((always_inline)) void ROWS(int R, int C, const int16_t *x, const float *xs, int64_t nb,
                                                        const int8_t *w, const float *scale, int64_t K, int64_t N,
                                                        float *y, int64_t m0, int64_t n0, int64_t n1) {
    int64_t n = n0;
    const int16_t *xr = x + m0 * K;
    const float *sr = xs + m0 * nb;
    for (; n + C <= n1; n += C) TILE(R, C, xr, sr, nb, w + n * K, scale + n, K, y + m0 * N + n, N);
    for (; n < n1; n++) TILE(R, 1, xr, sr, nb, w + n * K, scale + n, K, y + m0 * N + n, N);
}

// y [M, N] from the rounded rows xq [M, K] and their block scales xs [M, nb].
static void MM(const int16_t *xq, const float *xs, int64_t nb, const int8_t *w, const float *scale, float *y,
               int64_t M, int64_t K, int64_t N, int threads) {
    int64_t blocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N;
        int64_t m = 0;
        // the block's weights (NB x K bytes) stay in cache while every row block reads them
        // tiles of 8 x 1, 4 x 2, 2 x 4, 1 x 4: 8 int32 accumulators, within AVX2's 16 registers
        for (; m + 8 <= M; m += 8) ROWS(8, 1, xq, xs, nb, w, scale, K, N, y, m, n0, n1);
        for (; m + 4 <= M; m += 4) ROWS(4, 2, xq, xs, nb, w, scale, K, N, y, m, n0, n1);
        for (; m + 2 <= M; m += 2) ROWS(2, 4, xq, xs, nb, w, scale, K, N, y, m, n0, n1);
        for (; m < M; m++) ROWS(1, 4, xq, xs, nb, w, scale, K, N, y, m, n0, n1);
    }
}

#undef TILE
#undef ROWS
#undef MM
#undef A16_CAT
#undef A16_CAT_
