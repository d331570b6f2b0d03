// Times completiond's int8 kernel (float activations), the q5_mm.c probe (5-bit weights) and the
// int16-activation kernel (models/kernels/a16_mm.c, once a probe here) on 12 [4864, 896] matrices (a decode pass's MLP shape, read
// from memory in turn) at 1/2/4/8/16 rows, 2 threads; prints JSON lines. Run through
// benchmarks/kernel_probe.py.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
void q5_mm(const float *x, const uint8_t *w, float *y, int64_t M, int64_t K, int64_t N, int threads);
#include "completiond_kernels.h"  // completiond_mm and its kinds
#define completiond_int8_mm(...) completiond_mm(COMPLETIOND_MM_F32, __VA_ARGS__)
#define completiond_int8_mm_a16(...) completiond_mm(COMPLETIOND_MM_A16, __VA_ARGS__)
#define MATS 12

// One core's ceilings, to say what bounds a tree pass: 12 independent ymm FMA chains with every
// operand in registers; the same with one operand loaded (ymm, then xmm: a CPU whose load path is
// 128 bits wide halves the first); and the int8 kernel itself on 6 rows with its weights in cache.
#define FMA12(E) E(0) E(1) E(2) E(3) E(4) E(5) E(6) E(7) E(8) E(9) E(10) E(11)
#define REG(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define MEM(i) a##i = _mm256_fmadd_ps(_mm256_load_ps(p + 8 * (i)), m, a##i);
#define MEM4(i) a##i = _mm_fmadd_ps(_mm_load_ps(p + 4 * (i)), m, a##i);
#define DECL(i) a##i = one,
#define SUM(i) + a##i
// 12 independent chains (more than FMA latency x ports), each a separate variable so that all stay
// in registers; returns FMA instructions per second.
#define FMA_RATE(NAME, V, SET1, ADD, BODY)                                                          \
    static double NAME(void) {                                                                 \
        static float buf[96] __attribute__((aligned(64)));                                     \
        for (int i = 0; i < 96; i++) buf[i] = 0.5f;                                            \
        const float *p = buf;                                                                  \
        V one = SET1(1e-3f), m = SET1(0.9999f), c = SET1(1e-4f);                              \
        V FMA12(DECL) last = one;                                                              \
        long n = 50000000;                                                                     \
        double t = omp_get_wtime();                                                            \
        for (long k = 0; k < n; k++) {                                                         \
            FMA12(BODY)                                                                        \
            __asm__ volatile("" : "+r"(p));                                                    \
        }                                                                                      \
        t = omp_get_wtime() - t;                                                               \
        V s = last FMA12(SUM);                                                                 \
        float o[8];                                                                            \
        memcpy(o, &s, sizeof(V));                                                              \
        if (o[0] == 12345.0f) printf("#"); /* keeps the chains live */                         \
        (void)c;                                                                               \
        return n * 12 / t / 1e9;                                                               \
    }
FMA_RATE(fma_reg, __m256, _mm256_set1_ps, _mm256_add_ps, REG)
FMA_RATE(fma_load, __m256, _mm256_set1_ps, _mm256_add_ps, MEM)
FMA_RATE(fma_load4, __m128, _mm_set1_ps, _mm_add_ps, MEM4)

static void ceilings(void) {
    int64_t N = 512, K = 256, M = 6;  // 128 KB of weights: in cache after the first call
    int8_t *w = malloc(N * K); float *s = malloc(4 * N), *x = malloc(4 * M * K), *y = malloc(4 * M * N);
    for (int64_t i = 0; i < N * K; i++) w[i] = (int8_t)(rand() % 255 - 127);
    for (int64_t i = 0; i < N; i++) s[i] = 0.01f;
    for (int64_t i = 0; i < M * K; i++) x[i] = (rand() % 1000) / 500.0f - 1;
    double best = 1e9;
    for (int rep = 0; rep < 20; rep++) {
        double t = omp_get_wtime();
        for (int i = 0; i < 200; i++) completiond_int8_mm(x, w, s, y, M, K, N, 1);
        t = omp_get_wtime() - t; if (t < best) best = t;
    }
    printf("{\"fma_reg_ymm_g_per_s\": %.2f, \"fma_load_ymm_g_per_s\": %.2f, \"fma_load_xmm_g_per_s\": %.2f, "
           "\"int8_kernel_6_rows_in_cache_g_ymm_fma_per_s\": %.2f}\n", fma_reg(), fma_load(), fma_load4(),
           200.0 * M * N * K / 8 / best / 1e9);
    free(w); free(s); free(x); free(y);
}

int main() {
    int64_t N = 4864, K = 896, nb = K / 32;
    srand(1);
    int8_t *w8[MATS]; float *s8[MATS]; uint8_t *w5[MATS];
    float *ref = malloc(sizeof(float) * N * K);
    for (int m = 0; m < MATS; m++) {
        w8[m] = malloc(N * K); s8[m] = malloc(4 * N); w5[m] = malloc(N * nb * 24);
        for (int64_t n = 0; n < N; n++) {
            s8[m][n] = 0.01f;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *blk = w5[m] + (n * nb + b) * 24; uint32_t hb = 0; float d = 0.003f;
                memset(blk, 0, 16);
                for (int j = 0; j < 32; j++) {
                    int q = rand() % 32; float v = d * (q - 16);
                    ref[n * K + b * 32 + j] = v; w8[m][n * K + b * 32 + j] = (int8_t)(q - 16);
                    if (j < 16) blk[j] |= q & 15; else blk[j - 16] |= (q & 15) << 4;
                    if (q & 16) hb |= 1u << j;
                }
                memcpy(blk + 16, &hb, 4); memcpy(blk + 20, &d, 4);
            }
        }
    }
    float *x = malloc(sizeof(float) * 16 * K), *y = malloc(sizeof(float) * 16 * N), *y2 = malloc(sizeof(float) * 16 * N);
    // every 97th activation 50x the others: the outlier channels real hidden states have
    for (int i = 0; i < 16 * K; i++) x[i] = ((rand() % 1000) / 500.0f - 1) * (i % 97 ? 1.0f : 50.0f);
    // correctness of the last matrix against the float reference
    q5_mm(x, w5[MATS - 1], y, 3, K, N, 2);
    double err = 0;
    for (int r = 0; r < 3; r++) for (int64_t n = 0; n < N; n++) {
        double s = 0; for (int64_t k = 0; k < K; k++) s += (double)ref[n * K + k] * x[r * K + k];
        err = fmax(err, fabs(s - y[r * N + n]));
    }
    q5_mm(x, w5[MATS - 1], y2, 1, K, N, 2);
    printf("{\"q5_max_abs_err\": %.3e, \"q5_batch_invariant\": %d}\n", err, memcmp(y, y2, 4 * N) == 0);
    // int16 activations against float ones on the same int8 weights
    completiond_int8_mm(x, w8[MATS - 1], s8[MATS - 1], y, 5, K, N, 2);
    completiond_int8_mm_a16(x, w8[MATS - 1], s8[MATS - 1], y2, 5, K, N, 2);
    double d16 = 0, mag = 0;
    for (int64_t i = 0; i < 5 * N; i++) { d16 = fmax(d16, fabs(y[i] - y2[i])); mag = fmax(mag, fabs(y[i])); }
    completiond_int8_mm_a16(x + 3 * K, w8[MATS - 1], s8[MATS - 1], y, 1, K, N, 2);
    printf("{\"int16_act_max_rel_diff\": %.3e, \"int16_act_batch_invariant\": %d}\n", d16 / mag,
           memcmp(y, y2 + 3 * N, 4 * N) == 0);
    {  // what 2 threads can stream here: the floor of a memory-bound pass (sum 512 MB of bytes)
        size_t n = (size_t)512 << 20;
        uint8_t *a = malloc(n);
        memset(a, 1, n);
        double best = 1e9;
        long total = 0;
        for (int rep = 0; rep < 5; rep++) {
            double t = omp_get_wtime();
            long sum = 0;
#pragma omp parallel for reduction(+ : sum) num_threads(2)
            for (size_t i = 0; i < n; i += 64) {
                __m256i v = _mm256_add_epi8(_mm256_loadu_si256((const __m256i *)(a + i)),
                                            _mm256_loadu_si256((const __m256i *)(a + i + 32)));
                sum += _mm256_extract_epi8(v, 0);
            }
            t = omp_get_wtime() - t;
            total += sum;
            if (t < best) best = t;
        }
        free(a);
        printf("{\"read_gb_per_s\": %.2f, \"checksum\": %ld}\n", n / best / 1e9, total);
    }
    ceilings();
    int rows[] = {1, 2, 4, 8, 16};
    for (int ri = 0; ri < 5; ri++) {
        double best8 = 1e9, best5 = 1e9, best16 = 1e9;
        for (int rep = 0; rep < 15; rep++) {
            double t = omp_get_wtime();
            for (int m = 0; m < MATS; m++) completiond_int8_mm(x, w8[m], s8[m], y, rows[ri], K, N, 2);
            t = omp_get_wtime() - t; if (t < best8) best8 = t;
            t = omp_get_wtime();
            for (int m = 0; m < MATS; m++) q5_mm(x, w5[m], y, rows[ri], K, N, 2);
            t = omp_get_wtime() - t; if (t < best5) best5 = t;
            t = omp_get_wtime();
            for (int m = 0; m < MATS; m++) completiond_int8_mm_a16(x, w8[m], s8[m], y, rows[ri], K, N, 2);
            t = omp_get_wtime() - t; if (t < best16) best16 = t;
        }
        printf("{\"rows\": %d, \"int8_ms\": %.3f, \"q5_ms\": %.3f, \"a16_ms\": %.3f}\n", rows[ri], best8 * 1e3,
               best5 * 1e3, best16 * 1e3);
    }
}
