// completiond's C kernels: the one place their exported functions are declared (cpu_kernel.py's
// ctypes signatures are checked against this file by tests/test_cpu_kernel.py), the matmul kinds,
// and the small SIMD helpers the sources share.
//
// Every kernel here is batch-invariant: a row's outputs depend on that row alone, whatever other
// rows share the call and whatever the thread count, so a tree node's logits are bit-identical to
// the same token's in a one-token pass (greedy speculation stays identical to plain decoding).
#ifndef COMPLETIOND_KERNELS_H
#define COMPLETIOND_KERNELS_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

// y [M, N] = (x [M, K] . w [N, K]^T) * scale [N]: how the activations x (float32 in memory) meet
// the int8 weights w (per-output-channel scales; in [-127, 127], as quant._int8 makes them).
enum completiond_mm_kind {
    COMPLETIOND_MM_F32 = 0,          // float32 products (int8_mm.c; AVX2 + FMA)
    COMPLETIOND_MM_A16 = 1,          // rounded to int16 per block of 128, vpmaddwd (a16_mm.c; AVX2)
    COMPLETIOND_MM_A16_VNNI512 = 2,  // the same bits as A16, int32 sums on AVX512-VNNI vpdpwssd
    COMPLETIOND_MM_A8 = 3,           // rounded to int8 per block (a8_mm.c), vpmaddubsw (AVX2)
    COMPLETIOND_MM_A8_VNNI512 = 4,   // the same bits as A8, vpdpbusd on AVX512-VNNI
    COMPLETIOND_MM_A8_AVXVNNI = 5,   // the same bits as A8, vpdpbusd on AVX-VNNI (256-bit)
    // int4 weights (w4_mm.c): w is uint8 [N8, kp / 2] of packed nibbles q in [0, 15] in vectors of 8
    // channels, `scale` bf16 [N8, 2, kp / 64]: a scale and a zero per group of 64 along K (kp: K
    // rounded up to 128, N8: N up to 8); activations as A8
    COMPLETIOND_MM_W4 = 6,           // vpmaddubsw (AVX2)
    COMPLETIOND_MM_W4_VNNI512 = 7,   // the same bits as W4, vpdpbusd on AVX512-VNNI (256-bit, AVX512-VL)
    COMPLETIOND_MM_W4_AVXVNNI = 8,   // the same bits as W4, vpdpbusd on AVX-VNNI
    COMPLETIOND_MM_KINDS = 9,
};

// ---- exported (ctypes) ----

// 1 where this CPU runs `kind` (its instructions are present), else 0.
int completiond_mm_supported(int kind);

// The matmul above; returns 0, or -1 for a kind this CPU does not run (nothing written then).
int completiond_mm(int kind, const float *x, const int8_t *w, const float *scale, float *y, int64_t M,
                   int64_t K, int64_t N, int threads);

// 1: where 512-bit vectors do twice the work of 256-bit ones (cpu_kernel.zmm() decides; only on
// AVX512-VNNI CPUs), int4-weight matmuls of completiond_w4_zmm_rows or more rows (w4_mm.c) and
// attention's value sums (qwen2_layer.c) run 512-bit code; 0 (the default, and on a CPU without
// AVX512-VNNI): 256-bit. Both give the same bits. Returns the choice now in force.
int completiond_zmm(int on);

// Where completiond_zmm is on, int4-weight matmuls of at least `rows` rows run the 512-bit tiles (fewer:
// 256-bit ones; the default 4, cpu_kernel.py times it per CPU). rows < 1 changes nothing. Returns the
// value in force. Same bits either way.
int completiond_w4_zmm_rows(int rows);

// int4 weights per scale and zero along K (quant.pack_w4 packs with cpu_kernel.W4_GROUP; the loader
// checks that the two agree).
int completiond_w4_group(void);

// With bf16 attention scores (kv_bf16 == 2), heads of at most `max_d` dims lay a block of keys across
// lanes first (no horizontal sums); larger heads read the keys in place (the default 64: the 0.5B's
// heads across lanes, the 1.5B's of 128 in place). The two give a score from the same exact
// products summed in a different order: a model runs one of them in every pass. max_d < 0 changes
// nothing. Returns the value in force.
int completiond_score_lanes(int max_d);

// 1 (the default): with bf16 attention scores (kv_bf16 == 2), a query's value sums take its visible
// keys in pairs, bf16 weights times bf16 values by vdpbf16ps (qwen2_layer.c); 0: one key at a time
// in float32. Two models: a process keeps one. on < 0 changes nothing. Returns the choice in force.
int completiond_value_pairs(int on);

// Floats of scratch completiond_qwen2_layer needs for n rows and `keys` cache slots.
int64_t completiond_qwen2_work(int64_t n, int64_t H, int64_t inter, int64_t heads, int64_t kv_heads,
                               int64_t d, int64_t keys, int threads);

// One Qwen2 decoder layer on h [n, H] in place (qwen2_layer.c says what each argument is); its
// attention matmuls run `kind`, its MLP's `mlp_kind` (completiond_mm_kinds supported here: a W4
// kind where wgu / wd are int4, else `kind`).
void completiond_qwen2_layer(float *h, int64_t n, int64_t H, const float *in_norm, const float *post_norm,
                             float eps, const int8_t *wqkv, const float *sqkv, const float *bqkv,
                             const int8_t *wo, const float *so, const int8_t *wgu, const float *sgu,
                             int64_t inter, const int8_t *wd, const float *sd, const float *cos,
                             const float *sin, void *kc, void *vc, int kv_bf16, int64_t cap, int64_t begin,
                             int64_t keys, const uint8_t *mask, int64_t heads, int64_t kv_heads, int64_t d,
                             float scale, float *work, int kind, int mlp_kind, int threads);

// ---- internal: shared by the sources, not exported ----
#define COMPLETIOND_HIDDEN __attribute__((visibility("hidden")))

COMPLETIOND_HIDDEN int completiond_zmm_enabled(void);  // completiond_zmm's choice

COMPLETIOND_HIDDEN void completiond_mm_f32(const float *x, const int8_t *w, const float *scale, float *y,
                                           int64_t M, int64_t K, int64_t N, int threads);
COMPLETIOND_HIDDEN void completiond_mm_a16(int wide, const float *x, const int8_t *w, const float *scale,
                                           float *y, int64_t M, int64_t K, int64_t N, int threads);
// sums: 0 AVX2, 1 AVX512-VNNI, 2 AVX-VNNI
COMPLETIOND_HIDDEN void completiond_mm_a8(int sums, const float *x, const int8_t *w, const float *scale,
                                          float *y, int64_t M, int64_t K, int64_t N, int threads);

// Activation rows rounded to int8 per block of COMPLETIOND_A8_KB (a8_mm.c; w4_mm.c uses them too).
#ifndef A8_KB  // (a -D for probes; w4_mm.c needs 128)
#define A8_KB 128
#endif
#define COMPLETIOND_A8_KB A8_KB
typedef struct {
    int8_t *q;      // [M, kp] int8, zero past K
    float *s;       // [M, nb] block scales
    int32_t *corr;  // [M, nb, 16] -128 * (sum of xq over each 512-bit lane's bytes), for the u8 x s8 paths
    int64_t kp, nb;
} CompletiondA8Rows;
COMPLETIOND_HIDDEN void completiond_a8_rows(const float *x, int64_t M, int64_t K, int threads, CompletiondA8Rows *a);
COMPLETIOND_HIDDEN void completiond_a8_rows_free(CompletiondA8Rows *a);
// sums: 0 AVX2, 1 AVX512-VNNI, 2 AVX-VNNI
COMPLETIOND_HIDDEN void completiond_mm_w4(int sums, const float *x, const uint8_t *w, const float *scale, float *y,
                                          int64_t M, int64_t K, int64_t N, int threads);

// Software prefetches of weights go to L2 (_MM_HINT_T2), not L1: a block of weights fetched into L1
// evicted the lines of the block being computed (L1 holds 32 KB on most x86 CPUs), and on AMD Zen 4
// (2 threads, the 1.5B's layer shapes, interleaved A/B in one process) L2 made a one-row matmul
// 12-15 % faster on every kernel and an 8-row int8-activation one 20 % faster (docs/kernels.md).
#define COMPLETIOND_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T2)

// The weights of a thread's next block of channels (a8_mm.c, w4_mm.c), fetched while the current block computes.
// Every row block re-reads the current block from cache and issues no memory traffic of its own, so
// a prefetch only a few tiles ahead (the old way) left the memory idle during the second half of an
// 8-row pass and then stalled on the next block: the loads added to the arithmetic instead of
// overlapping it (an 8-row pass cost its 1-row pass's memory time plus its in-cache arithmetic). Here
// the next block's lines are spread over all of the current block's steps: `per` lines per 64-byte
// step, from cur up to end.
typedef struct {
    const char *cur, *end;
    int per;
} CompletiondPrefetch;

static inline __attribute__((always_inline)) void completiond_prefetch_step(CompletiondPrefetch *pf) {
    for (int i = 0; i < pf->per && pf->cur < pf->end; i++, pf->cur += 64) COMPLETIOND_PREFETCH(pf->cur);
}

// The sum of 8 float lanes in a fixed order (every kernel's final reduction: the same bits for a
// (row, channel) whichever tile computed it).
static inline float completiond_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The largest |x[k]| over [0, n) (0 for n = 0), and in *finite whether every x[k] is finite.
static inline float completiond_absmax(const float *x, int64_t n, int *finite) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 mx = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
        mx = _mm256_max_ps(mx, a);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, inf, _CMP_LT_OQ));  // false for inf and nan
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mx);
    float m = 0.0f;
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    int fin = _mm256_movemask_ps(ok) == 0xff;
    for (; k < n; k++) {
        float a = x[k] < 0 ? -x[k] : x[k];
        fin &= a < INFINITY;  // false for inf and nan
        m = a > m ? a : m;
    }
    *finite = fin;
    return m;
}

// round(x[k] / s) as int32 for 8 lanes: IEEE division and round-half-even, as lrintf(x / s) in the
// default rounding mode (so the scalar tails give the same values).
static inline __m256i completiond_round8(const float *x, __m256 s) {
    return _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x), s));
}

#endif
