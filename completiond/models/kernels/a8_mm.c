// y [M, N] = (x [M, K] . w [N, K]^T) * scale [N] with the activations rounded to int8: per row in
// blocks of KB along K (xq = round(x / xs) in [-127, 127], xs = block max|x| / 127), u8 x s8 dot
// products exact in int32, then acc += float(block sums) * xs block by block, a fixed horizontal
// sum, the channel's scale.
//
// Why: a tree pass is bound by arithmetic, and int8 x int8 is the densest this CPU has
// (AVX512-VNNI vpdpbusd: 64 multiply-adds per instruction, 4x a float FMA's 16; the int16 kernel's
// vpdpwssd does 32). Batch-invariant like the other kernels: a row's rounding and every (row,
// channel) sum depend on that row alone.
//
// Three ways to the same int32 sums, so every path gives bit-identical outputs (one model on every
// CPU, and side-by-side runs measure time alone). Lane i of the 8-lane block sums holds the
// products of bytes 4i..4i+3 of every 32-byte piece of the block:
// - AVX2: vpmaddubsw(|xq|, sign(w, xq)) (the sign trick: |xq| is a valid u8 and no int16 pair can
//   saturate, 2 * 127 * 127 < 32767; it needs w != -128, hence weights in [-127, 127]), vpmaddwd
//   by ones to int32.
// - AVX512-VNNI: vpdpbusd(w + 128 as u8, xq) on 256-bit vectors (AVX512-VL; kind int8+avx512-vnni),
//   whose 8 lanes are already the AVX2 path's; the sums start at -128 * (each lane's sum of xq),
//   computed once per row and block when the row is rounded, so no weight-side correction is read.
//   The 512-bit form (64 bytes, 16 lanes folded to 8 at the block's end: lane i + lane i + 8) is
//   kept behind -DA8_ZMM: on AMD Zen 4 it did the same multiply-adds per cycle with two more ops per
//   (row, channel, block), and measured 1-5 % slower on whole passes.
// - AVX-VNNI: the same with 256-bit vpdpbusd.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "completiond_kernels.h"

#define NB 24  // output channels per thread work item: 8 tiles of 4 x 3 (8-row trees), 24 of 1 x 1 (one row)
// A matmul of 1-3 rows: one channel a tile, so a thread reads its channels' rows back to back (one
// stream the hardware prefetcher follows); 4 channels a tile (4 streams) was ~15% slower at one row
// and ~8% at 2-3 on Zen 4 (python -m benchmarks.experiments w4_matmul --rows 1 with int8 and w4 side by
// side). The 1-3 rows left after runs of 4 read the weights from cache: CR channels a tile.
#define KB COMPLETIOND_A8_KB  // activations per int8 block (one scale each); a multiple of 64

typedef CompletiondA8Rows A8Rows;

typedef CompletiondPrefetch A8Prefetch;
#define prefetch_step completiond_prefetch_step

// Row x [K] -> q [kp], s [nb], corr [nb, 16]. A block holding inf/nan gets scale nan (and zeros), so
// the outputs it feeds are nan, as float arithmetic would make them.
static void quantize_row(const float *x, int64_t K, int64_t kp, int8_t *q, float *s, int32_t *corr) {
    memset(q, 0, kp);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t k0 = 0, b = 0; k0 < kp; k0 += KB, b++) {
        int64_t k1 = k0 + KB < K ? k0 + KB : K;
        int finite;
        float mx = completiond_absmax(x + k0, k1 - k0, &finite);
        int32_t *cb = corr + b * 16;
        if (!finite) {
            s[b] = NAN;
            memset(cb, 0, 16 * sizeof(int32_t));
            continue;
        }
        float sc = mx > 0.0f ? mx / 127.0f : 1.0f;
        s[b] = sc;
        __m256 sv = _mm256_set1_ps(sc);
        int64_t k = k0;
        for (; k + 8 <= k1; k += 8) {  // |x / sc| <= 127: the packs never saturate
            __m256i v = completiond_round8(x + k, sv);
            __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            _mm_storel_epi64((__m128i *)(q + k), _mm_packs_epi16(h, h));
        }
        for (; k < k1; k++) q[k] = (int8_t)lrintf(x[k] / sc);
        // lane i of 16: -128 * the sum of bytes 4i..4i+3 of every 64 bytes (the block is zero past K)
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int64_t j = k0; j < k0 + KB; j += 64) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(q + j)), c = _mm256_loadu_si256((const __m256i *)(q + j + 32));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a), ones16));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, c), ones16));
        }
        const __m256i m128 = _mm256_set1_epi32(-128);
        _mm256_storeu_si256((__m256i *)cb, _mm256_mullo_epi32(lo, m128));
        _mm256_storeu_si256((__m256i *)(cb + 8), _mm256_mullo_epi32(hi, m128));
    }
}

// A tail piece of n < `width` weight bytes (the end of K), zero-padded: the activations there are
// zero, so the padding adds nothing; a copy, since reading past the last row could fault.
static inline void tail_copy(int8_t *dst, const int8_t *src, int64_t n, int width) {
    memset(dst, 0, width);
    memcpy(dst, src, n);
}

// ---- AVX2: vpmaddubsw with the sign trick ----

// Block b (len activations from k0) for R rows x C channels -> dot [R, C] (8 int32 lanes).
static inline __attribute__((always_inline)) void block_avx2(int R, int C, const int8_t *q, int64_t kp,
                                                              const int32_t *corr, int64_t nb, int64_t b,
                                                              const int8_t *w, int64_t K, int64_t k0, int64_t len,
                                                              A8Prefetch *pf, __m256i dot[8][4]) {
    (void)corr, (void)nb, (void)b;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) dot[r][c] = _mm256_setzero_si256();
    int64_t j = 0;
    int8_t tail[4][32];
    for (; j < len; j += 32) {
        int64_t k = k0 + j;
        __m256i wv[4];
        if (j + 32 <= len) {
            if ((j & 63) == 0) prefetch_step(pf);  // rows of under 1 KB are too short for the hardware prefetcher
            for (int c = 0; c < C; c++) wv[c] = _mm256_loadu_si256((const __m256i *)(w + c * K + k));
        } else {
            for (int c = 0; c < C; c++) {
                tail_copy(tail[c], w + c * K + k, len - j, 32);
                wv[c] = _mm256_loadu_si256((const __m256i *)tail[c]);
            }
        }
        for (int r = 0; r < R; r++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(q + r * kp + k));
            __m256i ax = _mm256_abs_epi8(xv);
            for (int c = 0; c < C; c++) {
                __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[c], xv));
                dot[r][c] = _mm256_add_epi32(dot[r][c], _mm256_madd_epi16(p, ones));
            }
        }
    }
}

#define BLOCK block_avx2
#define SUFFIX _avx2
#define RB 4
#define CB 1
#define C3 1
#define C2 1
#define C1 1
#define CR 1  // 16 registers: the rest stays one channel a tile
#include "a8_tiles.h"  // tile_avx2, rows_avx2, mm_avx2

// ---- AVX512-VNNI: 512-bit vpdpbusd ----
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
static inline __attribute__((always_inline)) void block_vnni512(int R, int C, const int8_t *q, int64_t kp,
                                                                 const int32_t *corr, int64_t nb, int64_t b,
                                                                 const int8_t *w, int64_t K, int64_t k0,
                                                                 int64_t len, A8Prefetch *pf, __m256i dot[8][4]) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i wide[8][4];
    for (int r = 0; r < R; r++) {
        __m512i c0 = _mm512_loadu_si512((const void *)(corr + (r * nb + b) * 16));
        for (int c = 0; c < C; c++) wide[r][c] = c0;
    }
    for (int64_t j = 0; j < len; j += 64) {
        int64_t k = k0 + j;
        __m512i wv[4];
        if (j + 64 <= len) {
            prefetch_step(pf);
            for (int c = 0; c < C; c++)
                wv[c] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + c * K + k)), bias);
        } else {  // masked-off bytes are not read (no fault past the last row)
            __mmask64 m = _cvtu64_mask64((1ULL << (len - j)) - 1);
            for (int c = 0; c < C; c++) wv[c] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w + c * K + k), bias);
        }
        for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_loadu_si512((const void *)(q + r * kp + k));
            for (int c = 0; c < C; c++) wide[r][c] = _mm512_dpbusd_epi32(wide[r][c], wv[c], xv);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            dot[r][c] = _mm256_add_epi32(_mm512_castsi512_si256(wide[r][c]), _mm512_extracti64x4_epi64(wide[r][c], 1));
}

#define BLOCK block_vnni512
#define SUFFIX _vnni512
#define RB 4  // 12 int32 sums + 12 float accumulators + 3 weight vectors: within 32 registers
#define CB 3
#define C3 1
#define C2 1
#define C1 1
#define CR 3  // 9 sums + 9 accumulators + 3 weight vectors
#include "a8_tiles.h"  // tile_vnni512, rows_vnni512, mm_vnni512

// The same sums from 256-bit vpdpbusd (AVX512-VL): each lane already holds bytes 4i..4i+3 of every
// 32-byte piece, as the AVX2 path's, so no 16 -> 8 fold per (row, channel, block): two ops of the
// float side instead of four. On a CPU whose 512-bit ops run as two 256-bit halves (AMD Zen 4)
// that is the same multiply-adds per cycle with fewer ops beside them.
static inline __attribute__((always_inline)) void block_vnni256(int R, int C, const int8_t *q, int64_t kp,
                                                                 const int32_t *corr, int64_t nb, int64_t b,
                                                                 const int8_t *w, int64_t K, int64_t k0,
                                                                 int64_t len, A8Prefetch *pf, __m256i dot[8][4]) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < R; r++) {
        const int32_t *cr = corr + (r * nb + b) * 16;
        __m256i c0 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)cr),
                                      _mm256_loadu_si256((const __m256i *)(cr + 8)));
        for (int c = 0; c < C; c++) dot[r][c] = c0;
    }
    for (int64_t j = 0; j < len; j += 32) {
        int64_t k = k0 + j;
        __m256i wv[4];
        if (j + 32 <= len) {
            if ((j & 63) == 0) prefetch_step(pf);
            for (int c = 0; c < C; c++)
                wv[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + c * K + k)), bias);
        } else {  // masked-off bytes are not read (no fault past the last row)
            __mmask32 m = _cvtu32_mask32((1U << (len - j)) - 1);
            for (int c = 0; c < C; c++) wv[c] = _mm256_xor_si256(_mm256_maskz_loadu_epi8(m, w + c * K + k), bias);
        }
        for (int r = 0; r < R; r++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(q + r * kp + k));
            for (int c = 0; c < C; c++) dot[r][c] = _mm256_dpbusd_epi32(dot[r][c], wv[c], xv);
        }
    }
}


// tile_vnni256's 4 x 3 tile (the runs of 4 rows) written out: 12 int32 sums, 12 float accumulators
// and 3 weight vectors in named registers, a block's 4 steps unrolled, its prefetches issued at its
// start. From the arrays GCC emitted two register moves per vpdpbusd and a prefetch test per step:
// in cache (one thread, [8, 1536] x [256, 1536]^T) 84 -> 114 G multiply-adds/s, 93 % of this Zen 4's
// measured vpdpbusd peak. Every (row, channel) gets the same int32 sums and float steps as the
// general tile (tests/test_cpu_kernel.py compares every kind bit for bit).
static inline __attribute__((always_inline)) void tile43_vnni256(const A8Rows *a, int64_t m0, const int8_t *w,
                                                                  const float *scale, int64_t K, float *y,
                                                                  int64_t ldy, A8Prefetch *pf) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    const int8_t *q = a->q + m0 * a->kp;
    const int32_t *corr = a->corr + m0 * a->nb * 16;
    const float *xs = a->s + m0 * a->nb;
    int64_t nb = a->nb, kp = a->kp, whole = K / KB;
    const int8_t *w0 = w, *w1 = w + K, *w2 = w + 2 * K;
    __m256 f00 = _mm256_setzero_ps(), f01 = f00, f02 = f00, f10 = f00, f11 = f00, f12 = f00, f20 = f00, f21 = f00,
           f22 = f00, f30 = f00, f31 = f00, f32 = f00;
    int64_t b = 0;
    for (; b < whole; b++) {
        __m256i c0 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(corr + b * 16)),
                                      _mm256_loadu_si256((const __m256i *)(corr + b * 16 + 8)));
        __m256i c1 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(corr + (nb + b) * 16)),
                                      _mm256_loadu_si256((const __m256i *)(corr + (nb + b) * 16 + 8)));
        __m256i c2 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(corr + (2 * nb + b) * 16)),
                                      _mm256_loadu_si256((const __m256i *)(corr + (2 * nb + b) * 16 + 8)));
        __m256i c3 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(corr + (3 * nb + b) * 16)),
                                      _mm256_loadu_si256((const __m256i *)(corr + (3 * nb + b) * 16 + 8)));
        __m256i d00 = c0, d01 = c0, d02 = c0, d10 = c1, d11 = c1, d12 = c1, d20 = c2, d21 = c2, d22 = c2, d30 = c3,
                d31 = c3, d32 = c3;
        for (int i = 0; i < KB / 64; i++) prefetch_step(pf);
#pragma GCC unroll 8
        for (int64_t j = 0; j < KB; j += 32) {
            int64_t k = b * KB + j;
            __m256i v0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w0 + k)), bias);
            __m256i v1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w1 + k)), bias);
            __m256i v2 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w2 + k)), bias);
            __m256i x;
            x = _mm256_loadu_si256((const __m256i *)(q + k));
            d00 = _mm256_dpbusd_epi32(d00, v0, x); d01 = _mm256_dpbusd_epi32(d01, v1, x); d02 = _mm256_dpbusd_epi32(d02, v2, x);
            x = _mm256_loadu_si256((const __m256i *)(q + kp + k));
            d10 = _mm256_dpbusd_epi32(d10, v0, x); d11 = _mm256_dpbusd_epi32(d11, v1, x); d12 = _mm256_dpbusd_epi32(d12, v2, x);
            x = _mm256_loadu_si256((const __m256i *)(q + 2 * kp + k));
            d20 = _mm256_dpbusd_epi32(d20, v0, x); d21 = _mm256_dpbusd_epi32(d21, v1, x); d22 = _mm256_dpbusd_epi32(d22, v2, x);
            x = _mm256_loadu_si256((const __m256i *)(q + 3 * kp + k));
            d30 = _mm256_dpbusd_epi32(d30, v0, x); d31 = _mm256_dpbusd_epi32(d31, v1, x); d32 = _mm256_dpbusd_epi32(d32, v2, x);
        }
        __m256 s;
        s = _mm256_set1_ps(xs[b]);
        f00 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d00), s, f00); f01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d01), s, f01); f02 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d02), s, f02);
        s = _mm256_set1_ps(xs[nb + b]);
        f10 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d10), s, f10); f11 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d11), s, f11); f12 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d12), s, f12);
        s = _mm256_set1_ps(xs[2 * nb + b]);
        f20 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d20), s, f20); f21 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d21), s, f21); f22 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d22), s, f22);
        s = _mm256_set1_ps(xs[3 * nb + b]);
        f30 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d30), s, f30); f31 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d31), s, f31); f32 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d32), s, f32);
    }
    __m256 acc[8][4] = {{f00, f01, f02}, {f10, f11, f12}, {f20, f21, f22}, {f30, f31, f32}};
    if (b < nb) {  // the short last block: the general code
        __m256i dot[8][4];
        block_vnni256(4, 3, q, kp, corr, nb, b, w, K, b * KB, K - b * KB, pf, dot);
        for (int r = 0; r < 4; r++) {
            __m256 s = _mm256_set1_ps(xs[r * nb + b]);
            for (int c = 0; c < 3; c++) acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][c]), s, acc[r][c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) y[r * ldy + c] = completiond_hsum8(acc[r][c]) * scale[c];
}
#define TILE43 tile43_vnni256
#define BLOCK block_vnni256
#define SUFFIX _vnni256
#define RB 4  // 12 int32 sums + 12 float accumulators + 3 weight vectors: within 32 registers
#define CB 3
#define C3 1
#define C2 1
#define C1 1
#define CR 3  // 9 sums + 9 accumulators + 3 weight vectors
#include "a8_tiles.h"  // tile_vnni256, rows_vnni256, mm_vnni256
#pragma GCC pop_options

// ---- AVX-VNNI: 256-bit vpdpbusd ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
static inline __attribute__((always_inline)) void block_avxvnni(int R, int C, const int8_t *q, int64_t kp,
                                                                 const int32_t *corr, int64_t nb, int64_t b,
                                                                 const int8_t *w, int64_t K, int64_t k0,
                                                                 int64_t len, A8Prefetch *pf, __m256i dot[8][4]) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < R; r++) {
        const int32_t *cr = corr + (r * nb + b) * 16;
        __m256i c0 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)cr),
                                      _mm256_loadu_si256((const __m256i *)(cr + 8)));
        for (int c = 0; c < C; c++) dot[r][c] = c0;
    }
    int8_t tail[4][32];
    for (int64_t j = 0; j < len; j += 32) {
        int64_t k = k0 + j;
        __m256i wv[4];
        if (j + 32 <= len) {
            if ((j & 63) == 0) prefetch_step(pf);
            for (int c = 0; c < C; c++)
                wv[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + c * K + k)), bias);
        } else {
            for (int c = 0; c < C; c++) {
                tail_copy(tail[c], w + c * K + k, len - j, 32);
                wv[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)tail[c]), bias);
            }
        }
        for (int r = 0; r < R; r++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(q + r * kp + k));
            for (int c = 0; c < C; c++) dot[r][c] = _mm256_dpbusd_avx_epi32(dot[r][c], wv[c], xv);
        }
    }
}

#define BLOCK block_avxvnni
#define SUFFIX _avxvnni
#define RB 4
#define CB 2
#define C3 1
#define C2 1
#define C1 1
#define CR 2  // 16 registers: 6 sums + 6 accumulators + 2 weight vectors
#include "a8_tiles.h"  // tile_avxvnni, rows_avxvnni, mm_avxvnni
#pragma GCC pop_options

void completiond_a8_rows(const float *x, int64_t M, int64_t K, int threads, A8Rows *a) {
    a->nb = (K + KB - 1) / KB;
    a->kp = a->nb * KB;
    a->q = malloc(M * a->kp + 64);
    a->s = malloc(sizeof(float) * M * a->nb);
    a->corr = malloc(sizeof(int32_t) * M * a->nb * 16);
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= 32768)
    for (int64_t m = 0; m < M; m++)
        quantize_row(x + m * K, K, a->kp, a->q + m * a->kp, a->s + m * a->nb, a->corr + m * a->nb * 16);
}

void completiond_a8_rows_free(A8Rows *a) {
    free(a->q);
    free(a->s);
    free(a->corr);
}

void completiond_mm_a8(int sums, const float *x, const int8_t *w, const float *scale, float *y, int64_t M,
                       int64_t K, int64_t N, int threads) {
    A8Rows a;
    completiond_a8_rows(x, M, K, threads, &a);
    if (sums == 1)
#ifdef A8_ZMM
        mm_vnni512(&a, w, scale, y, M, K, N, threads);
#else
        mm_vnni256(&a, w, scale, y, M, K, N, threads);
#endif
    else if (sums == 2)
        mm_avxvnni(&a, w, scale, y, M, K, N, threads);
    else
        mm_avx2(&a, w, scale, y, M, K, N, threads);
    completiond_a8_rows_free(&a);
}
