// One Qwen2 decoder layer for decode and verify passes (a few rows), int8 weights, float32
// activations, AVX2 + FMA: RMSNorm, q/k/v (+ bias), rotary, K/V into the cache, attention over the
// cache, o, RMSNorm, gate/up, SiLU, down, both residual adds -- in one call instead of ~40 torch ops.
//
// Like int8_mm.c, every row's arithmetic is the same whatever the other rows of the call: norms and
// dot products use one 8-lane accumulator and a fixed horizontal sum, elementwise loops run per
// row, and a query attends over its visible keys only, in slot order (softmax sum and value sum in
// that order). A tree node therefore sees exactly the keys, in the same order, that the same token
// sees in a one-token pass once its ancestors are committed, and gets bit-identical outputs.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "completiond_kernels.h"

#define hsum8 completiond_hsum8

// e^x, 8 lanes (Cephes' expf: 2^n times a degree-7 polynomial; ~1 ulp), x clamped to [-87, 88].
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

// exp of v[0, len) in place; the tail goes through the same 8-lane code (padded), so each element's
// result depends on its value only.
static void exp_inplace(float *v, int64_t len) {
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_loadu_ps(v + i)));
    if (i < len) {
        float pad[8] = {0};
        memcpy(pad, v + i, (len - i) * sizeof(float));
        _mm256_storeu_ps(pad, exp8(_mm256_loadu_ps(pad)));
        memcpy(v + i, pad, (len - i) * sizeof(float));
    }
}

// Cache rows [t0, t0 + n) of d values (bf16 or float32, rows of d from base) as float32: a float32
// cache is read in place, bf16 is widened into buf (bf16 -> float32 is exact).
static const float *cache_rows(const void *base, int bf16, int64_t t0, int64_t n, int64_t d, float *buf) {
    if (!bf16) return (const float *)base + t0 * d;
    const uint16_t *p = (const uint16_t *)base + t0 * d;
    for (int64_t i = 0; i + 8 <= n * d; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(p + i));
        _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
    return buf;
}

static inline void store_cache(void *base, int64_t at, const float *src, int64_t len, int bf16) {
    if (!bf16) {
        memcpy((float *)base + at, src, len * sizeof(float));
        return;
    }
    uint16_t *dst = (uint16_t *)base + at;
    for (int64_t i = 0; i < len; i++) {  // round to nearest even, as torch's float -> bfloat16
        uint32_t b;
        memcpy(&b, src + i, 4);
        dst[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
}

// out[r] = x[r] / rms(x[r]) * w for each of n rows of H.
static void rms_norm(const float *x, const float *w, float *out, int64_t n, int64_t H, float eps) {
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * H;
        __m256 acc = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= H; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum8(acc);
        for (; k < H; k++) ss += xr[k] * xr[k];
        float inv = 1.0f / sqrtf(ss / (float)H + eps);
        for (k = 0; k < H; k++) out[r * H + k] = (xr[k] * inv) * w[k];
    }
}

// HF's rotate-half rotary on one head vector v [d] at one position's cos/sin [d].
static inline void rotate(float *v, const float *c, const float *s, int64_t d) {
    int64_t half = d / 2;
    for (int64_t j = 0; j < half; j++) {
        float a = v[j], b = v[j + half];
        v[j] = a * c[j] - b * s[j];
        v[j + half] = b * c[j + half] + a * s[j + half];
    }
}

// hsum8 of 8 vectors at once, lane i the sum of v_i, each in hsum8's order (lo + hi halves, then
// lanes 0 + 2 and 1 + 3, then those two) so every lane has hsum8's bits: 21 shuffles and adds for 8
// sums instead of 48. A score is 8 FMAs over d = 64, so hsum8 alone had cost most of that again.
static inline __m256 hsum8x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
                             __m256 v7) {
#define HALVES(a, b) _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31))
    __m256 t01 = HALVES(v0, v1), t23 = HALVES(v2, v3), t45 = HALVES(v4, v5), t67 = HALVES(v6, v7);
#undef HALVES
    // per 128-bit lane: [x0 + x2, x1 + x3] of the two vectors it holds
    __m256 w0 = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x44), _mm256_shuffle_ps(t01, t23, 0xee));
    __m256 w1 = _mm256_add_ps(_mm256_shuffle_ps(t45, t67, 0x44), _mm256_shuffle_ps(t45, t67, 0xee));
    // lanes [v0, v2, v4, v6, v1, v3, v5, v7] -> [v0 ... v7]
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(w0, w1, 0x88), _mm256_shuffle_ps(w0, w1, 0xdd));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// s [i, t] = hsum8(acc[i][t]) x scale for a QB x KB tile of 8-lane sums (row stride lds).
static inline __attribute__((always_inline)) void store_scores(int QB, int KB, __m256 acc[2][4], float scale, float *s,
                                                                int64_t lds) {
    if (QB == 2 && KB == 4) {  // the common tile: its 8 sums at once, each with hsum8's bits
        __m256 r = _mm256_mul_ps(hsum8x8(acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1], acc[1][2],
                                         acc[1][3]), _mm256_set1_ps(scale));
        _mm_storeu_ps(s, _mm256_castps256_ps128(r));
        _mm_storeu_ps(s + lds, _mm256_extractf128_ps(r, 1));
        return;
    }
    for (int i = 0; i < QB; i++)
        for (int t = 0; t < KB; t++) s[i * lds + t] = hsum8(acc[i][t]) * scale;
}

// Scores of Q queries (rows of q, stride d) against K keys (rows of k, stride d) into s [Q, K]:
// each (query, key) is one 8-lane accumulation over d then hsum8, whatever tile computes it.
static inline __attribute__((always_inline)) void score_tile(int QB, int KB, const float *q, const float *k,
                                                              int64_t d, float scale, float *s, int64_t lds) {
    __m256 acc[2][4];
    for (int i = 0; i < QB; i++)
        for (int t = 0; t < KB; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 8) {
        __m256 kv[4];
        for (int t = 0; t < KB; t++) kv[t] = _mm256_loadu_ps(k + t * d + j);
        for (int i = 0; i < QB; i++) {
            __m256 qv = _mm256_loadu_ps(q + i * d + j);
            for (int t = 0; t < KB; t++) acc[i][t] = _mm256_fmadd_ps(qv, kv[t], acc[i][t]);
        }
    }
    store_scores(QB, KB, acc, scale, s, lds);
}

#define KEY_BLOCK 64  // keys per block: 16 KB of float32 keys (d = 64) stay in L1 for every query

// Scores s [nq, keys] of nq queries (rows of q, stride d) against cache rows [0, keys) at kc, one
// block of keys at a time (widened into kbuf [KEY_BLOCK, d] when bf16: the cache is read once and
// no float32 copy of it goes through memory).
static void scores_of(const float *q, int64_t nq, const void *kc, int bf16, int64_t keys, int64_t d,
                      float scale, float *s, float *kbuf) {
    for (int64_t t0 = 0; t0 < keys; t0 += KEY_BLOCK) {
        int64_t t1 = t0 + KEY_BLOCK < keys ? t0 + KEY_BLOCK : keys;
        const float *k = cache_rows(kc, bf16, t0, t1 - t0, d, kbuf);  // k + (t - t0) * d: key t
        int64_t i = 0;
        for (; i + 2 <= nq; i += 2) {
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) score_tile(2, 4, q + i * d, k + (t - t0) * d, d, scale, s + i * keys + t, keys);
            for (; t < t1; t++) score_tile(2, 1, q + i * d, k + (t - t0) * d, d, scale, s + i * keys + t, keys);
        }
        for (; i < nq; i++) {
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) score_tile(1, 4, q + i * d, k + (t - t0) * d, d, scale, s + i * keys + t, keys);
            for (; t < t1; t++) score_tile(1, 1, q + i * d, k + (t - t0) * d, d, scale, s + i * keys + t, keys);
        }
    }
}

// The same scores from bf16 queries and bf16 keys read in place (AVX512-BF16 CPUs, bf16 caches):
// vdpbf16ps adds two exact bf16 products a lane, so a score is d / 16 instructions into 8 lanes,
// then hsum8 as above. Any tile computes a (query, key) by the same steps (batch invariance).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
static inline __attribute__((always_inline)) void score_tile_bf16(int QB, int KB, const uint16_t *q,
                                                                   const uint16_t *k, int64_t d, float scale,
                                                                   float *s, int64_t lds) {
    __m256 acc[2][4];
    for (int i = 0; i < QB; i++)
        for (int t = 0; t < KB; t++) acc[i][t] = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 16) {
        __m256bh kv[4];
        for (int t = 0; t < KB; t++) kv[t] = (__m256bh)_mm256_loadu_si256((const __m256i *)(k + t * d + j));
        for (int i = 0; i < QB; i++) {
            __m256bh qv = (__m256bh)_mm256_loadu_si256((const __m256i *)(q + i * d + j));
            for (int t = 0; t < KB; t++) acc[i][t] = _mm256_dpbf16_ps(acc[i][t], qv, kv[t]);
        }
    }
    store_scores(QB, KB, acc, scale, s, lds);
}

static void scores_in_place_bf16(const uint16_t *q, int64_t nq, const uint16_t *kc, int64_t keys, int64_t d,
                           float scale, float *s) {
    for (int64_t t0 = 0; t0 < keys; t0 += KEY_BLOCK) {
        int64_t t1 = t0 + KEY_BLOCK < keys ? t0 + KEY_BLOCK : keys;
        int64_t i = 0;
        for (; i + 2 <= nq; i += 2) {
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) score_tile_bf16(2, 4, q + i * d, kc + t * d, d, scale, s + i * keys + t, keys);
            for (; t < t1; t++) score_tile_bf16(2, 1, q + i * d, kc + t * d, d, scale, s + i * keys + t, keys);
        }
        for (; i < nq; i++) {
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) score_tile_bf16(1, 4, q + i * d, kc + t * d, d, scale, s + i * keys + t, keys);
            for (; t < t1; t++) score_tile_bf16(1, 1, q + i * d, kc + t * d, d, scale, s + i * keys + t, keys);
        }
    }
}

// Where a head has at most completiond_score_lanes dims (64: the 0.5B's), a block of KEY_BLOCK keys
// is first laid across lanes, kt [d / 2, KEY_BLOCK] (a uint32 = one key's dims 2j, 2j + 1; keys past
// the last are zero), once for all the job's queries; then a score is one lane of one accumulator:
// d / 2 vdpbf16ps in dim order, each adding that key's two exact bf16 products, times scale. No
// horizontal sums: at 64 dims they cost about as much as the products, and the transposition, once
// per block, costs less than they do from a few queries on (at 128 dims it does not pay at one row:
// docs/kernels.md "Attention"). d is the model's, so each model computes
// a (query, key) by one of the two ways in every pass (batch invariance).

// 16 rows of 16 uint32 -> their transpose, in registers (4 stages of 16 shuffles).
static inline __attribute__((always_inline)) void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {  // lane L of t[i]: rows i, i + 1 at 4L, 4L + 1; of t[i + 1]: at 4L + 2, 4L + 3
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // lane L of u[i + c]: rows i .. i + 3 at 4L + c
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++) {  // column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        r[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}

// kt [d / 2, KEY_BLOCK] = keys t0 .. t0 + n (n <= KEY_BLOCK) across lanes, zero past n.
static void keys_across_lanes(const uint16_t *kc, int64_t t0, int64_t n, int64_t d, uint32_t *kt) {
    const uint32_t *k = (const uint32_t *)(kc + t0 * d);
    int64_t d2 = d / 2;
    if (d2 % 16) {
        for (int64_t l = 0; l < KEY_BLOCK; l++)
            for (int64_t j = 0; j < d2; j++) kt[j * KEY_BLOCK + l] = l < n ? k[l * d2 + j] : 0;
        return;
    }
    for (int64_t l0 = 0; l0 < KEY_BLOCK; l0 += 16)
        for (int64_t j0 = 0; j0 < d2; j0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = l0 + i < n ? _mm512_loadu_si512(k + (l0 + i) * d2 + j0) : _mm512_setzero_si512();
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(kt + (j0 + j) * KEY_BLOCK + l0, r[j]);
        }
}

// s [i, t] for QB queries (bf16 pairs q, stride d / 2) x KB groups of 16 keys (kt's lanes from k0),
// `valid` keys of the block's from k0 stored.
static inline __attribute__((always_inline)) void score_tile_lanes(int QB, int KB, const uint32_t *q, const uint32_t *kt,
                                                                    int64_t k0, int64_t d, float scale, float *s,
                                                                    int64_t lds, int64_t valid) {
    __m512 acc[4][4];
    for (int i = 0; i < QB; i++)
        for (int b = 0; b < KB; b++) acc[i][b] = _mm512_setzero_ps();
    for (int64_t j = 0; j < d / 2; j++) {
        __m512bh kv[4];
        for (int b = 0; b < KB; b++) kv[b] = (__m512bh)_mm512_loadu_si512(kt + j * KEY_BLOCK + k0 + 16 * b);
        for (int i = 0; i < QB; i++) {
            __m512bh qv = (__m512bh)_mm512_set1_epi32((int)q[i * (d / 2) + j]);
            for (int b = 0; b < KB; b++) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], qv, kv[b]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int b = 0; b < KB; b++) {
        int64_t left = valid - 16 * b;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        for (int i = 0; i < QB; i++) _mm512_mask_storeu_ps(s + i * lds + 16 * b, m, _mm512_mul_ps(acc[i][b], sc));
    }
}

#define SCORE_ROWS(QB)                                                                                         \
    for (int64_t k0 = 0; k0 < n; k0 += 64) {                                                                 \
        int64_t left = n - k0, v = left < 64 ? left : 64;                                                     \
        switch ((v + 15) / 16) {                                                                              \
            case 4: score_tile_lanes(QB, 4, q + i * d2, kt, k0, d, scale, s + i * keys + t0 + k0, keys, v); break; \
            case 3: score_tile_lanes(QB, 3, q + i * d2, kt, k0, d, scale, s + i * keys + t0 + k0, keys, v); break; \
            case 2: score_tile_lanes(QB, 2, q + i * d2, kt, k0, d, scale, s + i * keys + t0 + k0, keys, v); break; \
            default: score_tile_lanes(QB, 1, q + i * d2, kt, k0, d, scale, s + i * keys + t0 + k0, keys, v); break; \
        }                                                                                                     \
    }

// kt: KEY_BLOCK * d / 2 uint32 of scratch.
static void scores_across_lanes_bf16(const uint16_t *qh, int64_t nq, const uint16_t *kc, int64_t keys, int64_t d,
                           float scale, float *s, uint32_t *kt) {
    const uint32_t *q = (const uint32_t *)qh;
    int64_t d2 = d / 2;
    for (int64_t t0 = 0; t0 < keys; t0 += KEY_BLOCK) {
        int64_t n = t0 + KEY_BLOCK < keys ? KEY_BLOCK : keys - t0;
        keys_across_lanes(kc, t0, n, d, kt);
        int64_t i = 0;
        for (; i + 4 <= nq; i += 4) SCORE_ROWS(4)
        switch (nq - i) {
            case 3: SCORE_ROWS(3) break;
            case 2: SCORE_ROWS(2) break;
            case 1: SCORE_ROWS(1) break;
        }
    }
}
#undef SCORE_ROWS

static int score_lanes_max_d = 64;

int completiond_score_lanes(int max_d) {
    if (max_d >= 0) score_lanes_max_d = max_d;
    return score_lanes_max_d;
}

// The bf16 scores (kt: KEY_BLOCK * d / 2 uint32 of scratch, used across lanes).
static void scores_of_bf16(const uint16_t *q, int64_t nq, const uint16_t *kc, int64_t keys, int64_t d,
                           float scale, float *s, uint32_t *kt) {
    if (d <= score_lanes_max_d)
        scores_across_lanes_bf16(q, nq, kc, keys, d, scale, s, kt);
    else
        scores_in_place_bf16(q, nq, kc, keys, d, scale, s);
}
#pragma GCC pop_options

// Scores s [keys] (overwritten) -> softmax numerators e^(s - max) over the visible keys, +0.0f for the
// masked ones. The max is exact in any order (NaN scores never win, as before), so it runs 8 lanes
// wide; the sum is softmax_sums'.
static void softmax_weights(float *s, const uint8_t *vis, int64_t keys) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    const __m256 ninf = m8;
    int64_t t = 0;
    for (; t + 8 <= keys; t += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(vis + t));
        __m256 on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(b), _mm256_setzero_si256()));
        m8 = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_loadu_ps(s + t), on), m8);  // a NaN score gives m8
    }
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, m8);
    for (int i = 0; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    for (; t < keys; t++)
        if (vis[t] && s[t] > mx) mx = s[t];
    __m256 mv = _mm256_set1_ps(mx);
    for (t = 0; t + 8 <= keys; t += 8) _mm256_storeu_ps(s + t, _mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
    for (; t < keys; t++) s[t] -= mx;  // masked keys may exceed 0: clamped in exp8, then zeroed
    exp_inplace(s, keys);
    for (t = 0; t < keys; t++) s[t] = vis[t] ? s[t] : 0.0f;  // a masked key's weight adds nothing below
}

// sums[i] = the sum of query i's softmax numerators s [i * keys ...] over its visible keys (mask row
// vis(i)), each in slot order. One query's sum is a chain of dependent adds (latency bound: it cost
// more than the scores of an 8-row pass), so 8 queries' chains run interleaved, each in its own order.
// A masked key adds +0.0f, which leaves a sum (never -0.0f: it starts at +0.0f and adds e^x >= 0) as it is.
static void softmax_sums(const float *s, int64_t nq, int64_t keys, const uint8_t *mask, int64_t g, float *sums) {
    int64_t i = 0;
    for (; i + 8 <= nq; i += 8) {
        float acc[8] = {0};
        const float *si[8];
        const uint8_t *vi[8];
        for (int u = 0; u < 8; u++) si[u] = s + (i + u) * keys, vi[u] = mask + ((i + u) / g) * keys;
        for (int64_t t = 0; t < keys; t++)
            for (int u = 0; u < 8; u++) acc[u] += vi[u][t] ? si[u][t] : 0.0f;
        for (int u = 0; u < 8; u++) sums[i + u] = acc[u];
    }
    for (; i < nq; i++) {
        const float *si = s + i * keys;
        const uint8_t *vi = mask + (i / g) * keys;
        float acc = 0.0f;
        for (int64_t t = 0; t < keys; t++) acc += vi[t] ? si[t] : 0.0f;
        sums[i] = acc;
    }
}

// acc[0, 8 CB) += p[t] v[t][0, 8 CB) for the visible keys t in [t0, t1), in slot order (v rows of
// stride d). The running sums pass through memory between key blocks unchanged (float32 both ways).
static inline __attribute__((always_inline)) void value_chunk(int CB, const float *p, const uint8_t *vis,
                                                               const float *v, int64_t t0, int64_t t1,
                                                               int64_t d, float *acc_mem) {
    __m256 acc[8];
    for (int j = 0; j < CB; j++) acc[j] = _mm256_loadu_ps(acc_mem + j * 8);
    for (int64_t t = t0; t < t1; t++) {
        if (!vis[t]) continue;
        __m256 pt = _mm256_set1_ps(p[t]);
        for (int j = 0; j < CB; j++) acc[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(v + t * d + j * 8), acc[j]);
    }
    for (int j = 0; j < CB; j++) _mm256_storeu_ps(acc_mem + j * 8, acc[j]);
}

// out [d] += sum over visible t in [t0, t1) of p[t] v[t]; d: a multiple of 8.
static void add_values(const float *p, const uint8_t *vis, const float *v, int64_t t0, int64_t t1, int64_t d,
                       float *out) {
    int64_t c = 0;
    for (; c + 64 <= d; c += 64) value_chunk(8, p, vis, v + c, t0, t1, d, out + c);
    switch ((d - c) / 8) {
        case 1: value_chunk(1, p, vis, v + c, t0, t1, d, out + c); break;
        case 2: value_chunk(2, p, vis, v + c, t0, t1, d, out + c); break;
        case 3: value_chunk(3, p, vis, v + c, t0, t1, d, out + c); break;
        case 4: value_chunk(4, p, vis, v + c, t0, t1, d, out + c); break;
        case 5: value_chunk(5, p, vis, v + c, t0, t1, d, out + c); break;
        case 6: value_chunk(6, p, vis, v + c, t0, t1, d, out + c); break;
        case 7: value_chunk(7, p, vis, v + c, t0, t1, d, out + c); break;
    }
}

// add_values in 512-bit vectors (completiond_zmm_enabled(): AVX512 CPUs where they do twice the work). Each
// lane is one output element summed in slot order, as in value_chunk: the same bits.
#pragma GCC push_options
#pragma GCC target("avx512f")
static inline __attribute__((always_inline)) void value_chunk_zmm(int CB, const float *p, const uint8_t *vis,
                                                                   const float *v, int64_t t0, int64_t t1,
                                                                   int64_t d, float *acc_mem) {
    __m512 acc[8];
    for (int j = 0; j < CB; j++) acc[j] = _mm512_loadu_ps(acc_mem + j * 16);
    for (int64_t t = t0; t < t1; t++) {
        if (!vis[t]) continue;
        __m512 pt = _mm512_set1_ps(p[t]);
        for (int j = 0; j < CB; j++) acc[j] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + t * d + j * 16), acc[j]);
    }
    for (int j = 0; j < CB; j++) _mm512_storeu_ps(acc_mem + j * 16, acc[j]);
}

// ROWS(QB, CB) for a head of CB = d / 16 vectors (1-8: d a multiple of 16 up to 128): as many queries a
// tile as 16 accumulators hold.
#define BY_HEAD_SIZE(ROWS, d)                  \
    switch ((d) / 16) {                        \
        case 1: ROWS(4, 1) break;              \
        case 2: ROWS(4, 2) break;              \
        case 3: ROWS(4, 3) break;              \
        case 4: ROWS(4, 4) break;              \
        case 5: ROWS(2, 5) break;              \
        case 6: ROWS(2, 6) break;              \
        case 7: ROWS(2, 7) break;              \
        default: ROWS(2, 8) break;             \
    }

// out_i [d] += sum over keys t in [0, n) of p_i[t] v[t] for QB queries at once (CB vectors of 16 =
// d): each value vector is loaded once for all of them. A masked key's weight is +0.0f and
// fma(0, v, acc) is acc exactly (v finite), so summing every key in slot order gives the bits of
// value_chunk's skipping the masked ones.
static inline __attribute__((always_inline)) void value_tile_zmm(int QB, int CB, const float *const *p,
                                                                  const float *v, int64_t n, int64_t d,
                                                                  float *const *out) {
    __m512 acc[4][8], vv[8];
    for (int i = 0; i < QB; i++)
        for (int c = 0; c < CB; c++) acc[i][c] = _mm512_loadu_ps(out[i] + c * 16);
    for (int64_t t = 0; t < n; t++) {
        for (int c = 0; c < CB; c++) vv[c] = _mm512_loadu_ps(v + t * d + c * 16);
        for (int i = 0; i < QB; i++) {
            __m512 pt = _mm512_set1_ps(p[i][t]);
            for (int c = 0; c < CB; c++) acc[i][c] = _mm512_fmadd_ps(pt, vv[c], acc[i][c]);
        }
    }
    for (int i = 0; i < QB; i++)
        for (int c = 0; c < CB; c++) _mm512_storeu_ps(out[i] + c * 16, acc[i][c]);
}

// value_tile_zmm over the queries ix [0, m) (weights s + ix * lds, sums qj + ix * d; d: a multiple of
// 16 up to 128), as many a tile as 16 accumulators hold.
static void add_values_tiled(const float *s, int64_t lds, const float *v, int64_t n, int64_t d, const int64_t *ix,
                             int64_t m, float *qj) {
#define VALUE_ROWS(QB, CB)                                                          \
    {                                                                               \
        int64_t i = 0;                                                              \
        for (; i < m; i += QB) {                                                    \
            const float *p[QB];                                                     \
            float *out[QB];                                                         \
            int q = m - i < QB ? (int)(m - i) : QB;                                 \
            for (int u = 0; u < q; u++) p[u] = s + ix[i + u] * lds, out[u] = qj + ix[i + u] * d; \
            if (q == QB)                                                            \
                value_tile_zmm(QB, CB, p, v, n, d, out);                            \
            else                                                                    \
                for (int u = 0; u < q; u++) value_tile_zmm(1, CB, p + u, v, n, d, out + u); \
        }                                                                           \
    }
    BY_HEAD_SIZE(VALUE_ROWS, d)
#undef VALUE_ROWS
}

static void add_values_zmm(const float *p, const uint8_t *vis, const float *v, int64_t t0, int64_t t1, int64_t d,
                           float *out) {
    int64_t c = 0;
    for (; c + 128 <= d; c += 128) value_chunk_zmm(8, p, vis, v + c, t0, t1, d, out + c);
    switch ((d - c) / 16) {
        case 1: value_chunk_zmm(1, p, vis, v + c, t0, t1, d, out + c); break;
        case 2: value_chunk_zmm(2, p, vis, v + c, t0, t1, d, out + c); break;
        case 3: value_chunk_zmm(3, p, vis, v + c, t0, t1, d, out + c); break;
        case 4: value_chunk_zmm(4, p, vis, v + c, t0, t1, d, out + c); break;
        case 5: value_chunk_zmm(5, p, vis, v + c, t0, t1, d, out + c); break;
        case 6: value_chunk_zmm(6, p, vis, v + c, t0, t1, d, out + c); break;
        case 7: value_chunk_zmm(7, p, vis, v + c, t0, t1, d, out + c); break;
    }
    c += (d - c) / 16 * 16;
    if (c < d) value_chunk(1, p, vis, v + c, t0, t1, d, out + c);  // 8 left (d: a multiple of 8)
}
#pragma GCC pop_options

// ---- Value sums from bf16 pairs of keys (bf16 attention: AVX512-BF16, a bf16 cache) ----
// A query's visible keys, in slot order, are summed two at a time by vdpbf16ps: their weights rounded
// to bf16 (as the cache's values already are), two exact products a lane, half the instructions of
// float32 multiply-adds; an odd last key goes with a zero weight. Pairs are made of consecutive
// *visible* keys, so a tree node, whose visible keys are those of the same token's one-token pass in
// the same order (only at other slots), sums the same pairs in the same order: the same bits, however
// deep the tree or the uncommitted nodes of appended passes. Where a query sees every key of a block
// from an even count on (the committed keys: nearly all of them), its pairs are the block's adjacent
// slots, laid out once for all its queries (value_pairs); elsewhere it makes its pairs key by key.

static int value_pairs_on = 1;

int completiond_value_pairs(int on) {
    if (on >= 0) value_pairs_on = on != 0;
    return value_pairs_on;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
// vp [(n + 1) / 2, d] uint32 from n <= KEY_BLOCK bf16 value rows v: element j of rows 2m (low half)
// and 2m + 1 (high half, zero past n) side by side.
static void value_pairs(const uint16_t *v, int64_t n, int64_t d, uint32_t *vp) {
    for (int64_t m = 0; 2 * m < n; m++)
        for (int64_t c = 0; c < d; c += 16) {
            __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + 2 * m * d + c)));
            __m512i hi = 2 * m + 1 < n ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + (2 * m + 1) * d + c)))
                                       : _mm512_setzero_si512();
            _mm512_storeu_si512(vp + m * d + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
}

// Weights p [0, n) -> bf16 in place (round to nearest even): uint16 t of p is then weight t.
static void weights_to_bf16(float *p, int64_t n) {
    for (int64_t t = 0; t < n; t += 32) {
        int64_t left = n - t;
        __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
        __m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, p + t + 16), _mm512_maskz_loadu_ps(m0, p + t));
        _mm512_mask_storeu_epi16((uint16_t *)p + t, ((__mmask32)m1 << 16) | m0, (__m512i)b);
    }
}

// out_i [d] += the pairs of a block that QB queries see whole (pw_i: their bf16 weights from the
// block's first key; np pairs, the last one's second weight zero where the block has an odd count).
static inline __attribute__((always_inline)) void pair_tile(int QB, int CB, const uint16_t *const *pw,
                                                             const uint32_t *vp, int64_t n, int64_t d,
                                                             float *const *out) {
    __m512 acc[4][8];
    __m512bh vv[8];
    for (int i = 0; i < QB; i++)
        for (int c = 0; c < CB; c++) acc[i][c] = _mm512_loadu_ps(out[i] + c * 16);
    for (int64_t m = 0; 2 * m < n; m++) {
        for (int c = 0; c < CB; c++) vv[c] = (__m512bh)_mm512_loadu_si512(vp + m * d + c * 16);
        for (int i = 0; i < QB; i++) {
            uint32_t w2 = pw[i][2 * m] | (2 * m + 1 < n ? (uint32_t)pw[i][2 * m + 1] << 16 : 0);
            __m512bh w = (__m512bh)_mm512_set1_epi32((int)w2);
            for (int c = 0; c < CB; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], w, vv[c]);
        }
    }
    for (int i = 0; i < QB; i++)
        for (int c = 0; c < CB; c++) _mm512_storeu_ps(out[i] + c * 16, acc[i][c]);
}

// pair_tile over the queries ix [0, m) (bf16 weights s + ix * lds from key t0, sums qj + ix * d; d: a
// multiple of 16 up to 128), tiled as BY_HEAD_SIZE says.
static void add_block_pairs(const float *s, int64_t lds, int64_t t0, const uint32_t *vp, int64_t n, int64_t d,
                            const int64_t *ix, int64_t m, float *qj) {
#define PAIR_ROWS(QB, CB)                                                                        \
    for (int64_t i = 0; i < m; i += QB) {                                                        \
        const uint16_t *pw[QB];                                                                  \
        float *out[QB];                                                                          \
        int q = m - i < QB ? (int)(m - i) : QB;                                                  \
        for (int u = 0; u < q; u++) pw[u] = (const uint16_t *)(s + ix[i + u] * lds) + t0, out[u] = qj + ix[i + u] * d; \
        if (q == QB)                                                                             \
            pair_tile(QB, CB, pw, vp, n, d, out);                                                \
        else                                                                                     \
            for (int u = 0; u < q; u++) pair_tile(1, CB, pw + u, vp, n, d, out + u);             \
    }
    BY_HEAD_SIZE(PAIR_ROWS, d)
#undef PAIR_ROWS
}

// out [d] += weight pw[a] times value row a of the cache v (bf16): a query's odd last key, paired
// with a zero weight and a zero row.
static void add_last_key(const uint16_t *pw, const uint16_t *v, int64_t a, int64_t d, float *out) {
    __m512bh w = (__m512bh)_mm512_set1_epi32((int)pw[a]);
    for (int64_t c = 0; c < d; c += 16) {
        __m512bh vv = (__m512bh)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + a * d + c)));
        _mm512_storeu_ps(out + c, _mm512_dpbf16_ps(_mm512_loadu_ps(out + c), w, vv));
    }
}

// One query's pairs among the visible keys (vis) of the block [t0, t1), key by key: *held is a
// visible key still waiting for its partner (-1: none), from this block or an earlier one. Two
// visible neighbours at an even offset in the block are a pair of vp (value_pairs of the block): the
// same operands as when built here, loaded instead.
static void add_pairs_by_key(const uint16_t *pw, const uint8_t *vis, const uint16_t *v, const uint32_t *vp,
                             int64_t t0, int64_t t1, int64_t d, int64_t *held, float *out) {
    __m512 acc[8];
    int64_t cb = d / 16;
    for (int64_t c = 0; c < cb; c++) acc[c] = _mm512_loadu_ps(out + c * 16);
    for (int64_t t = t0; t < t1; t++) {
        if (!vis[t]) continue;
        int64_t a = *held, b = t;
        if (a < 0 && (t - t0) % 2 == 0 && t + 1 < t1 && vis[t + 1]) {  // an adjacent pair: vp's
            __m512bh w = (__m512bh)_mm512_set1_epi32((int)(pw[t] | (uint32_t)pw[t + 1] << 16));
            for (int64_t c = 0; c < cb; c++)
                acc[c] = _mm512_dpbf16_ps(acc[c], w, (__m512bh)_mm512_loadu_si512(vp + (t - t0) / 2 * d + c * 16));
            t++;
            continue;
        }
        if (a < 0) {
            *held = t;
            continue;
        }
        __m512bh w = (__m512bh)_mm512_set1_epi32((int)(pw[a] | (uint32_t)pw[b] << 16));
        for (int64_t c = 0; c < cb; c++) {
            __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + a * d + c * 16)));
            __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + b * d + c * 16)));
            acc[c] = _mm512_dpbf16_ps(acc[c], w, (__m512bh)_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        *held = -1;
    }
    for (int64_t c = 0; c < cb; c++) _mm512_storeu_ps(out + c * 16, acc[c]);
}
#pragma GCC pop_options

static int64_t attention_blocks(int64_t n, int64_t kv_heads, int threads) {
    int64_t blocks = threads > kv_heads ? (threads + kv_heads - 1) / kv_heads : 1;
    return blocks > n ? (n > 0 ? n : 1) : blocks;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// floats one attention job uses: one block of its kv head's keys or values widened (and in pairs),
// its queries (later their value sums), their scores and softmax sums, the lists of its queries that
// see a block whole or not and their held keys (rows: the most rows a job takes, g: queries per kv head)
static int64_t job_floats(int64_t keys, int64_t d, int64_t rows, int64_t g) {
    int64_t floats = KEY_BLOCK * d + rows * g * (d + keys + 1) + (rows * g * d + 1) / 2;  // + the queries in bf16
    floats += KEY_BLOCK * d / 2 + 2 * 3 * rows * g + 2;  // + value pairs, two int64 query lists, held keys
    return (floats + 15) / 16 * 16;
}

// floats of scratch completiond_qwen2_layer needs (the caller keeps one buffer: fresh large
// allocations per layer would fault their pages in on every call).
int64_t completiond_qwen2_work(int64_t n, int64_t H, int64_t inter, int64_t heads, int64_t kv_heads,
                               int64_t d, int64_t keys, int threads) {
    int64_t nq = heads * d, nqkv = nq + 2 * kv_heads * d, blocks = attention_blocks(n, kv_heads, threads);
    int64_t job = job_floats(keys, d, (n + blocks - 1) / blocks, heads / kv_heads);
    return n * max64(H, inter) + n * max64(nqkv, 2 * inter) + n * nq + n * H + kv_heads * blocks * job;
}

// h [n, H] (the residual stream, float32) goes through one layer in place.
// Weights: int8 [N, K] row-major with float32 scales [N]; wqkv's rows are q (heads d), k, v
// (kv_heads d each), bqkv their biases; wgu's rows are gate (inter) then up (inter).
// Cache: kc / vc [kv_heads, cap, d] (bf16 when kv_bf16, else float32; kv_bf16 == 2: the scores are
// bf16 dot products, scores_of_bf16: AVX512-BF16 only, d a multiple of 16); this pass's rows go to slots
// [begin, begin + n) and row r attends to slots t < keys where mask[r * keys + t].
// cos / sin: [n, d] at the rows' positions. kind: the matmuls' completiond_mm_kind, the one cpu_kernel
// chose for this process (one choice for every pass, so trees and single tokens agree); mlp_kind:
// the gate / up / down matmuls' (a W4 kind where wgu / wd are int4 packed as w4_mm.c reads them,
// with their block scales in sgu / sd; else kind).
void completiond_qwen2_layer(float *h, int64_t n, int64_t H, const float *in_norm,
                             const float *post_norm, float eps, const int8_t *wqkv,
                             const float *sqkv, const float *bqkv, const int8_t *wo,
                             const float *so, const int8_t *wgu, const float *sgu, int64_t inter,
                             const int8_t *wd, const float *sd, const float *cos,
                             const float *sin, void *kc, void *vc, int kv_bf16, int64_t cap,
                             int64_t begin, int64_t keys, const uint8_t *mask, int64_t heads,
                             int64_t kv_heads, int64_t d, float scale, float *work, int kind, int mlp_kind,
                             int threads) {
    int64_t nq = heads * d, nkv = kv_heads * d, nqkv = nq + 2 * nkv, g = heads / kv_heads;
    float *x = work, *y = x + n * max64(H, inter), *a = y + n * max64(nqkv, 2 * inter), *y2 = a + n * nq;
    float *jobs = y2 + n * H;

    rms_norm(h, in_norm, x, n, H, eps);
    completiond_mm(kind, x, wqkv, sqkv, y, n, H, nqkv, threads);
    for (int64_t r = 0; r < n; r++) {
        float *row = y + r * nqkv;
        for (int64_t i = 0; i < nqkv; i++) row[i] += bqkv[i];
        for (int64_t hd = 0; hd < heads + kv_heads; hd++) rotate(row + hd * d, cos + r * d, sin + r * d, d);
        for (int64_t kv = 0; kv < kv_heads; kv++) {
            store_cache(kc, (kv * cap + begin + r) * d, row + nq + kv * d, d, kv_bf16);
            store_cache(vc, (kv * cap + begin + r) * d, row + nq + nkv + kv * d, d, kv_bf16);
        }
    }
    // Attention: a job is one kv head and a block of rows (its g query heads each); it scores its
    // queries against the head's keys, then sums values, a block of keys at a time.
    int elem = kv_bf16 ? 2 : 4, zmm = completiond_zmm_enabled();
    int64_t blocks = attention_blocks(n, kv_heads, threads);
    int64_t job_size = job_floats(keys, d, (n + blocks - 1) / blocks, g);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t job = 0; job < kv_heads * blocks; job++) {
        int64_t kv = job / blocks, r0 = n * (job % blocks) / blocks, r1 = n * (job % blocks + 1) / blocks;
        int64_t nqj = (r1 - r0) * g;
        // tiny softmax weights times values would be subnormal, which x86 multiplies slowly: flush
        // them to zero in this thread for the job (deterministic: same inputs, same bits)
        unsigned int csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);  // FTZ | DAZ
        float *buf = jobs + job * job_size;
        float *qj = buf + KEY_BLOCK * d, *s = qj + nqj * d, *sums = s + nqj * keys;
        const char *kh = (const char *)kc + kv * cap * d * elem, *vh = (const char *)vc + kv * cap * d * elem;
        for (int64_t r = r0; r < r1; r++)  // query heads kv * g ... of each row, gathered
            memcpy(qj + (r - r0) * g * d, y + r * nqkv + kv * g * d, sizeof(float) * g * d);
        if (kv_bf16 == 2) {  // bf16 dot products: the queries rounded to bf16 as the cache's keys are
            uint16_t *qb = (uint16_t *)(sums + nqj);
            store_cache(qb, 0, qj, nqj * d, 1);
            scores_of_bf16(qb, nqj, (const uint16_t *)kh, keys, d, scale, s, (uint32_t *)buf);
        } else {
            scores_of(qj, nqj, kh, kv_bf16, keys, d, scale, s, buf);
        }
        for (int64_t i = 0; i < nqj; i++) {  // qj becomes the running value sums
            softmax_weights(s + i * keys, mask + (r0 + i / g) * keys, keys);
            memset(qj + i * d, 0, sizeof(float) * d);
        }
        softmax_sums(s, nqj, keys, mask + r0 * keys, g, sums);
        uint32_t *vp = (uint32_t *)(sums + nqj + (nqj * d + 1) / 2);  // after the bf16 queries
        int64_t *whole = (int64_t *)(((uintptr_t)(vp + KEY_BLOCK * d / 2) + 7) & ~(uintptr_t)7);
        int64_t *other = whole + nqj, *held = other + nqj;
        int tiles = d % 16 == 0 && d <= 128;  // the head fits 8 vectors of 16 (BY_HEAD_SIZE)
        int pairs = value_pairs_on && kv_bf16 == 2 && tiles;
        for (int64_t i = 0; i < nqj; i++) whole[i] = i;
        if (pairs)  // (after their float32 sums)
            for (int64_t i = 0; i < nqj; i++) weights_to_bf16(s + i * keys, keys), held[i] = -1;
        for (int64_t t0 = 0; t0 < keys; t0 += KEY_BLOCK) {  // a block of values stays in L1 for all queries
            int64_t t1 = t0 + KEY_BLOCK < keys ? t0 + KEY_BLOCK : keys, nw = 0, no = 0;
            if (pairs) {
                for (int64_t r = r0; r < r1; r++) {  // a row's queries see the block whole, or not
                    const uint8_t *vis = mask + r * keys;
                    int64_t t = t0;
                    while (t < t1 && vis[t]) t++;
                    for (int64_t i = (r - r0) * g; i < (r - r0 + 1) * g; i++) {
                        if (t == t1 && held[i] < 0)
                            whole[nw++] = i;
                        else
                            other[no++] = i;
                    }
                }
                value_pairs((const uint16_t *)vh + t0 * d, t1 - t0, d, vp);
                if (nw) add_block_pairs(s, keys, t0, vp, t1 - t0, d, whole, nw, qj);
                for (int64_t u = 0; u < no; u++) {
                    int64_t i = other[u];
                    add_pairs_by_key((const uint16_t *)(s + i * keys), mask + (r0 + i / g) * keys, (const uint16_t *)vh,
                                     vp, t0, t1, d, held + i, qj + i * d);
                }
                continue;
            }
            const float *v = cache_rows(vh, kv_bf16, t0, t1 - t0, d, buf);  // v + (t - t0) * d: value t
            if (zmm && tiles) {
                add_values_tiled(s + t0, keys, v, t1 - t0, d, whole, nqj, qj);  // whole: every query
            } else {
                for (int64_t i = 0; i < nqj; i++)
                    (zmm ? add_values_zmm : add_values)(s + i * keys + t0, mask + (r0 + i / g) * keys + t0,
                                                                       v, 0, t1 - t0, d, qj + i * d);
            }
        }
        if (pairs)  // an odd last key, with a zero weight
            for (int64_t i = 0; i < nqj; i++)
                if (held[i] >= 0)
                    add_last_key((const uint16_t *)(s + i * keys), (const uint16_t *)vh, held[i], d, qj + i * d);
        for (int64_t i = 0; i < nqj; i++) {
            float *out = a + (r0 + i / g) * nq + (kv * g + i % g) * d;
            for (int64_t j = 0; j < d; j++) out[j] = qj[i * d + j] / sums[i];
        }
        _mm_setcsr(csr);
    }
    completiond_mm(kind, a, wo, so, y2, n, nq, H, threads);
    for (int64_t i = 0; i < n * H; i++) h[i] += y2[i];

    rms_norm(h, post_norm, x, n, H, eps);
    completiond_mm(mlp_kind, x, wgu, sgu, y, n, H, 2 * inter, threads);
    for (int64_t r = 0; r < n; r++) {  // silu(gate) * up = gate * up / (1 + e^-gate)
        float *gate = y + r * 2 * inter, *up = gate + inter, *m = x + r * inter;
        for (int64_t i = 0; i < inter; i++) m[i] = -gate[i];
        exp_inplace(m, inter);
        for (int64_t i = 0; i < inter; i++) m[i] = gate[i] / (1.0f + m[i]) * up[i];
    }
    completiond_mm(mlp_kind, x, wd, sd, y2, n, inter, H, threads);
    for (int64_t i = 0; i < n * H; i++) h[i] += y2[i];
}
