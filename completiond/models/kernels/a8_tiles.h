// a8_mm.c's tiling around one block kind, included once per kind. The includer defines BLOCK (the
// block function: int32 sums of one block, folded to 8 lanes), optionally TILE43 (its 4 x 3 tile
// written out), SUFFIX (appended to the names defined here: tile, rows, mm), the tile shapes (RB x
// CB for runs of RB rows; C3, C2, C1 channels for a matmul of 3, 2 or 1 rows; CR channels for the
// 1-3 rows left after runs of RB) and the target (AVX2, AVX512 or AVX-VNNI) the code here is
// compiled for.
#define A8_CAT_(a, b) a##b
#define A8_CAT(a, b) A8_CAT_(a, b)
#define TILE A8_CAT(tile, SUFFIX)
#define ROWS A8_CAT(rows, SUFFIX)
#define MM A8_CAT(mm, SUFFIX)

// R rows x C channels of the quantized rows `a` from row m0; weight rows at w (stride K), results
// at y (stride ldy). Every block: acc += float(int32 sums) * the row's block scale (8-lane FMA, the
// same code on every path), then a fixed horizontal sum and the channel's scale.
static inline __attribute__((always_inline)) void TILE(int R, int C, const A8Rows *a, int64_t m0, const int8_t *w,
                                                        const float *scale, int64_t K, float *y, int64_t ldy,
                                                        A8Prefetch *pf) {
    __m256 acc[8][4];
    __m256i dot[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    const int8_t *q = a->q + m0 * a->kp;
    const int32_t *corr = a->corr + m0 * a->nb * 16;
    const float *xs = a->s + m0 * a->nb;
    int64_t whole = K / KB, nb = a->nb, kp = a->kp;
    for (int64_t b = 0; b <= whole && b < nb; b++) {
        if (b < whole)
            BLOCK(R, C, q, kp, corr, nb, b, w, K, b * KB, KB, pf, dot);  // a constant trip count: sums in registers
        else
            BLOCK(R, C, q, kp, corr, nb, b, w, K, b * KB, K - b * KB, pf, dot);
        for (int r = 0; r < R; r++) {
            __m256 s = _mm256_set1_ps(xs[r * nb + b]);
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][c]), s, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[r * ldy + c] = completiond_hsum8(acc[r][c]) * scale[c];
}

// Channels [n0, n1) for rows [m0, m0 + R): tiles of C channels, then single channels.
static inline __attribute__((always_inline)) void ROWS(int R, int C, const A8Rows *a, const int8_t *w,
                                                        const float *scale, int64_t K, int64_t N, float *y,
                                                        int64_t m0, int64_t n0, int64_t n1, A8Prefetch *pf) {
    int64_t n = n0;
#ifdef TILE43  // the includer's hand-written 4 x 3 tile (the same sums and float steps as TILE)
    if (R == 4 && C == 3)
        for (; n + C <= n1; n += C) TILE43(a, m0, w + n * K, scale + n, K, y + m0 * N + n, N, pf);
#endif
    for (; n + C <= n1; n += C) TILE(R, C, a, m0, w + n * K, scale + n, K, y + m0 * N + n, N, pf);
    for (; n < n1; n++) TILE(R, 1, a, m0, w + n * K, scale + n, K, y + m0 * N + n, N, pf);
}

// Tiles one row block of R rows runs over NB channels with C at a time.
static inline int64_t A8_CAT(tiles, SUFFIX)(int64_t R, int64_t C) { return R ? NB / C + NB % C : 0; }

// y [M, N] from the quantized rows a. The 1-3 rows left after runs of RB read the weights from
// cache (the runs streamed them): there a tile of one channel is bound by its one chain of
// dependent vpdpbusd, not by memory, so they take CR channels a tile (R x CR chains).
static void MM(const A8Rows *a, const int8_t *w, const float *scale, float *y, int64_t M, int64_t K, int64_t N,
               int threads) {
    int64_t blocks = (N + NB - 1) / NB, rest = M % RB, runs = M / RB;
    // tiles per 64 bytes of K over a whole block -> lines of the next block to fetch per tile step
    int64_t steps = runs * A8_CAT(tiles, SUFFIX)(1, CB) + A8_CAT(tiles, SUFFIX)(rest == 3, runs ? CR : C3) +
                    A8_CAT(tiles, SUFFIX)(rest == 2, runs ? CR : C2) + A8_CAT(tiles, SUFFIX)(rest == 1, runs ? CR : C1);
    int per = (int)((NB + steps - 1) / (steps ? steps : 1));
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N, n2 = n1 + NB < N ? n1 + NB : N;
        A8Prefetch pf = {(const char *)(w + n1 * K), (const char *)(w + n2 * K), per};
        int64_t m = 0;
        // the block's weights (NB x K bytes) stay in cache while every row block reads them
        for (; m + RB <= M; m += RB) ROWS(RB, CB, a, w, scale, K, N, y, m, n0, n1, &pf);
        if (m) {  // the weights are in cache: one R x CR tile run (R = the rest, under RB rows)
            if (M - m == 3) ROWS(3, CR, a, w, scale, K, N, y, m, n0, n1, &pf);
            if (M - m == 2) ROWS(2, CR, a, w, scale, K, N, y, m, n0, n1, &pf);
            if (M - m == 1) ROWS(1, CR, a, w, scale, K, N, y, m, n0, n1, &pf);
            continue;
        }
        for (; m + 3 <= M; m += 3) ROWS(3, C3, a, w, scale, K, N, y, m, n0, n1, &pf);
        for (; m + 2 <= M; m += 2) ROWS(2, C2, a, w, scale, K, N, y, m, n0, n1, &pf);
        for (; m < M; m++) ROWS(1, C1, a, w, scale, K, N, y, m, n0, n1, &pf);
    }
}

#undef TILE
#undef ROWS
#undef MM
#undef A8_CAT
#undef A8_CAT_
// the includer's parameters end here too, so each inclusion sets them afresh
#undef BLOCK
#undef TILE43
#undef SUFFIX
#undef RB
#undef CB
#undef C3
#undef C2
#undef C1
#undef CR
