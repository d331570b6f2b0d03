// The matmul entry point: which kernel a kind runs, and whether this CPU runs it (checked here as
// well as in cpu_kernel.py, so a wrong kind is an error, never an illegal instruction).
#include "completiond_kernels.h"

static int zmm_on = 0;

int completiond_zmm(int on) {  // only where the 512-bit code's instructions are present
    __builtin_cpu_init();
    zmm_on = on && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    return zmm_on;
}

int completiond_zmm_enabled(void) { return zmm_on; }

int completiond_mm_supported(int kind) {
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int vnni512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    switch (kind) {
        case COMPLETIOND_MM_F32:
        case COMPLETIOND_MM_A16:
        case COMPLETIOND_MM_A8:
        case COMPLETIOND_MM_W4: return avx2;
        case COMPLETIOND_MM_A16_VNNI512:
        case COMPLETIOND_MM_A8_VNNI512:
        case COMPLETIOND_MM_W4_VNNI512: return vnni512;
        case COMPLETIOND_MM_A8_AVXVNNI:
        case COMPLETIOND_MM_W4_AVXVNNI: return avx2 && __builtin_cpu_supports("avxvnni");
        default: return 0;
    }
}

int completiond_mm(int kind, const float *x, const int8_t *w, const float *scale, float *y, int64_t M, int64_t K,
                   int64_t N, int threads) {
    if (!completiond_mm_supported(kind)) return -1;
    switch (kind) {
        case COMPLETIOND_MM_F32: completiond_mm_f32(x, w, scale, y, M, K, N, threads); return 0;
        case COMPLETIOND_MM_A16:
        case COMPLETIOND_MM_A16_VNNI512:
            completiond_mm_a16(kind == COMPLETIOND_MM_A16_VNNI512, x, w, scale, y, M, K, N, threads);
            return 0;
        case COMPLETIOND_MM_A8: completiond_mm_a8(0, x, w, scale, y, M, K, N, threads); return 0;
        case COMPLETIOND_MM_A8_VNNI512: completiond_mm_a8(1, x, w, scale, y, M, K, N, threads); return 0;
        case COMPLETIOND_MM_A8_AVXVNNI: completiond_mm_a8(2, x, w, scale, y, M, K, N, threads); return 0;
        case COMPLETIOND_MM_W4:
        case COMPLETIOND_MM_W4_VNNI512:
        case COMPLETIOND_MM_W4_AVXVNNI:  // w: packed nibbles, scale: [N, kp / 128] (completiond_kernels.h)
            completiond_mm_w4(kind - COMPLETIOND_MM_W4, x, (const uint8_t *)w, scale, y, M, K, N, threads);
            return 0;
        default: return -1;
    }
}
