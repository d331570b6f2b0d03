// y [M, N] = x [M, K] . w [N, K]^T with int4 weights and int8 activations (kinds W4*): a decode
// pass reads every weight once, so a one-token pass of a large model is bound by its bytes; int4
// with its scales reads 0.5625 of int8's.
//
// Weights: w = q * scale + zero per group of 64 along K, q in [0, 15] (asymmetric min / max; groups
// of 32 before, docs/decisions.md), scale and zero bf16. Channels go in vectors of 8 (N padded to a multiple of
// 8 with zero weights), one channel per int32 lane, so the products of many rows run on the integer
// units and a float step comes once per 64 products of a lane, not once per 4. Vector v's piece p
// (32 bytes) holds, in lane l's 4 bytes, channel 8 v + l's weights 8 p .. 8 p + 3 (low nibbles) and
// 8 p + 4 .. 8 p + 7 (high); a group's 8 scales and 8 zeros are bf16. Vectors go in pairs, 2 u and
// 2 u + 1 one stream (rows 16 u .. 16 u + 15 of the uint8 [N8, kp / 2] tensor): piece p of the first,
// piece p of the second, piece p + 1 ...; its scales [2, G, 2 x 8] (G = kp / 64; rows 16 u .. of the
// bf16 [N8, 2, G] tensor): group g's 8 of the first vector, then the second's, then the zeros alike.
// So a 512-bit tile reads a pair as one stream of aligned 64-byte loads (docs/kernels.md "int4 weights").
// A last odd vector is a stream of its own (32-byte pieces, [2, G, 8]). quant.pack_w4 writes this;
// K is padded to 128 with zero weights.
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
#define W4_G 64   // weights per scale and zero along K (quant.W4_GROUP)
#define W4_ZRB 8   // rows a 512-bit tile
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

// Lines of the next work item to fetch per tile step, where `tiles` 256-bit tiles run over an item
// (a 512-bit tile counts as two).
static inline int w4_prefetch_per(const CompletiondA8Rows *a, int64_t tiles) {
    int64_t lines = W4_NB * (a->kp / 2) / 64, steps = tiles * a->nb;
    return (int)((lines + steps - 1) / (steps ? steps : 1));
}

// Work item b: its channels [*n0, *n1), and the prefetch of the next item's streams (whole vectors of 8).
static inline W4Prefetch w4_item(const uint8_t *w, int64_t half, int64_t b, int64_t N, int per, int64_t *n0,
                                 int64_t *n1) {
    *n0 = b * W4_NB;
    *n1 = *n0 + W4_NB < N ? *n0 + W4_NB : N;
    int64_t n2 = *n1 + W4_NB < N ? *n1 + W4_NB : N;
    return (W4Prefetch){(const char *)(w + *n1 * half), (const char *)(w + (n2 + 7) / 8 * 8 * half), per};
}

// acc + u x (4 activation bytes at p, broadcast to every lane). The AVX512 forms take the broadcast
// from memory within vpdpbusd ({1toN}, written out: GCC 12 loads each quad into a register of its
// own and, in the 512-bit tile, copies the sums between registers, ~3 instructions a vpdpbusd at 8
// rows; the products and sums are the same). Matmuls of 2 rows 0.88x the time, 5 rows 0.93x, 8-16
// rows 0.96-0.98x on Zen 4 (docs/kernels.md "int4 weights").
typedef struct {
    int8_t b[4];
} W4Quad;  // the asm's memory operand: 4 int8 (a char type may alias the activations)
#define W4_DOTQ_SET1(dot, acc, u, p) dot(acc, u, _mm256_set1_epi32(w4_quad(p)))
static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512vnni"))) __m256i
w4_dot_ymm_bcst(__m256i acc, __m256i u, const int8_t *p) {
    __asm__("vpdpbusd %1%{1to8%}, %2, %0" : "+v"(acc) : "m"(*(const W4Quad *)p), "v"(u));
    return acc;
}
static inline __attribute__((always_inline, target("avx512f,avx512vnni"))) __m512i
w4_dot_zmm_bcst(__m512i acc, __m512i u, const int8_t *p) {
    __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*(const W4Quad *)p), "v"(u));
    return acc;
}

// ---- AVX2 ----
static inline __attribute__((always_inline)) __m256i dot_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define DOTQ(acc, u, p) W4_DOTQ_SET1(dot_avx2, acc, u, p)
#define SUFFIX _avx2
// 16 registers: a pair of vectors' 8 sums and 8 accumulators spill (2-16 rows run up to 20 % slower
// than with vectors one after the other, one row 8-10 % faster: docs/kernels.md "int4 weights")
#define RB 4
#include "w4_tiles.h"

// ---- AVX512-VNNI (256-bit vpdpbusd, AVX512-VL) ----
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#define DOTQ w4_dot_ymm_bcst
#define SUFFIX _vnni512
#define RB 4  // 8 rows a tile was no faster at 8-16 rows
#include "w4_tiles.h"
#pragma GCC pop_options

// ---- AVX512-VNNI, 512 bits: two vectors of 8 channels a zmm, for matmuls of w4_zmm_rows+ rows ----
// Where a 512-bit vpdpbusd does twice a 256-bit one's products in the same time (Zen 5), a tile
// runs vectors v and v + 1 side by side (lanes 0-7 and 8-15 of a zmm): each lane gets the int32
// sums and float steps, in the same order, as the 256-bit tile's lane (integer sums are exact), so a
// (row, channel) has the same bits whichever tile computed it. The two vectors are two streams;
// smaller matmuls keep the one-stream 256-bit tiles (a one-row matmul is bound by its bytes).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
static inline __attribute__((always_inline)) __m512 w4_bf16x16(const uint16_t *v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)v)), 16));
}

static inline __attribute__((always_inline)) void w4_tile_zmm(int R, const CompletiondA8Rows *a, int64_t m0,
                                                           const uint8_t *w, const uint16_t *sz, const float *xsum,
                                                           float *y, int64_t ldy, int64_t valid, W4Prefetch *pf) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    int64_t nb = a->nb, kp = a->kp, G = kp / W4_G;
    const int8_t *q = a->q + m0 * kp;
    const float *xs = a->s + m0 * nb;
    __m512 acc[W4_ZRB];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        w4_prefetch(pf);
        w4_prefetch(pf);  // two vectors: the steps of two 256-bit tiles
        for (int64_t g = b * (KB / W4_G); g < (b + 1) * (KB / W4_G); g++) {
            __m512i d[W4_ZRB];
            for (int r = 0; r < R; r++) d[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int64_t k = g * W4_G; k < (g + 1) * W4_G; k += 8) {
                __m512i v = _mm512_loadu_si512((const void *)(w + 8 * k));  // piece k / 8 of both vectors
                __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                for (int r = 0; r < R; r++)
                    d[r] = w4_dot_zmm_bcst(w4_dot_zmm_bcst(d[r], lo, q + r * kp + k), hi, q + r * kp + k + 4);
            }
            __m512 sw = w4_bf16x16(sz + g * 16);
            for (int r = 0; r < R; r++) {
                __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(xs[r * nb + b]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r]), s, acc[r]);
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        __m512 zero = w4_bf16x16(sz + 16 * G + g * 16);
        for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(zero, _mm512_set1_ps(xsum[(m0 + r) * G + g]), acc[r]);
    }
    for (int r = 0; r < R; r++) {
        w4_store(y + r * ldy, _mm512_castps512_ps256(acc[r]), valid);
        w4_store(y + r * ldy + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1)), valid - 8);
    }
}

// Rows from which a matmul runs the 512-bit tiles (completiond_w4_zmm_rows): fewer rows are bound by
// the weights' bytes, which either tile reads at the same speed. Timed per CPU (cpu_kernel.py); on the
// Zen 5 of docs/kernels.md "512-bit tiles" from 3 rows (before pairs of vectors were interleaved, when a
// 512-bit tile read two streams, from 5). The rest of a larger matmul (12 rows: 8 + 4) stays in
// 512-bit tiles: it reads the weights from cache, where the arithmetic bounds it.
static int w4_zmm_rows = 4;

int completiond_w4_group(void) { return W4_G; }

int completiond_w4_zmm_rows(int rows) {
    if (rows >= 1) w4_zmm_rows = rows;
    return w4_zmm_rows;
}

static inline __attribute__((always_inline)) void w4_rows_zmm(int R, const CompletiondA8Rows *a, const uint8_t *w,
                                                           const uint16_t *sz, const float *xsum, int64_t N, float *y,
                                                           int64_t m0, int64_t n0, int64_t n1, W4Prefetch *pf) {
    int64_t G = a->kp / W4_G, n = n0;
    for (; n + 8 < n1; n += 16)  // a pair of vectors
        w4_tile_zmm(R, a, m0, w + n / 2 * a->kp, sz + n * 2 * G, xsum, y + m0 * N + n, N, n1 - n, pf);
    for (int r = 0; n < n1 && r < R; r += 4)  // a last lone vector: 256-bit tiles of at most 4 rows
        w4_tile_vnni512(R - r < 4 ? R - r : 4, 1, a, m0 + r, w + n / 2 * a->kp, 32, sz + n * 2 * G, 8, xsum,
                        y + (m0 + r) * N + n, N, n1 - n, pf);
}

static void w4_mm_zmm(const CompletiondA8Rows *a, const uint8_t *w, const uint16_t *sz, const float *xsum, float *y,
                      int64_t M, int64_t N, int threads) {
    int64_t blocks = (N + W4_NB - 1) / W4_NB;
    int per = w4_prefetch_per(a, (M / W4_ZRB + (M % W4_ZRB > 0)) * (W4_NB / 8));
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0, n1;
        W4Prefetch pf = w4_item(w, a->kp / 2, b, N, per, &n0, &n1);
        int64_t m = 0;
        for (; m + W4_ZRB <= M; m += W4_ZRB) w4_rows_zmm(W4_ZRB, a, w, sz, xsum, N, y, m, n0, n1, &pf);
        switch (M - m) {  // the rest, as one tile
            case 7: w4_rows_zmm(7, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
            case 6: w4_rows_zmm(6, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
            case 5: w4_rows_zmm(5, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
            case 4: w4_rows_zmm(4, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
            case 3: w4_rows_zmm(3, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
            case 2: w4_rows_zmm(2, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
            case 1: w4_rows_zmm(1, a, w, sz, xsum, N, y, m, n0, n1, &pf); break;
        }
    }
}
#pragma GCC pop_options

// ---- AVX-VNNI ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
#define DOTQ(acc, u, p) W4_DOTQ_SET1(_mm256_dpbusd_avx_epi32, acc, u, p)
#define SUFFIX _avxvnni
#define RB 4  // as AVX2's: 16 registers
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
    if (sums == 1 && M >= w4_zmm_rows && completiond_zmm_enabled())
        w4_mm_zmm(&a, w, sz, xsum, y, M, N, threads);
    else if (sums == 1)
        w4_mm_vnni512(&a, w, sz, xsum, y, M, N, threads);
    else if (sums == 2)
        w4_mm_avxvnni(&a, w, sz, xsum, y, M, N, threads);
    else
        w4_mm_avx2(&a, w, sz, xsum, y, M, N, threads);
    free(xsum);
    completiond_a8_rows_free(&a);
}
