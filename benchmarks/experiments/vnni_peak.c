// The bare vpdpbusd rate of this CPU at 256 and 512 bits, on 1 and 2 threads: 12 independent chains
// a thread, nothing else in the loop (docs/kernels.md "512-bit tiles": on Zen 5 both widths run 8.2 G
// instructions/s a thread, so 512 bits do twice the multiply-adds).
//
//     gcc -O2 -fopenmp -o /tmp/vnni_peak benchmarks/vnni_peak.c && /tmp/vnni_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <omp.h>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
static double run(long n, int zmm) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (zmm) {
        __m512i d0=_mm512_set1_epi32(1),d1=d0,d2=d0,d3=d0,d4=d0,d5=d0,d6=d0,d7=d0,d8=d0,d9=d0,d10=d0,d11=d0;
        __m512i x=_mm512_set1_epi32(3), y=_mm512_set1_epi32(5);
        for (long i = 0; i < n; i++) {
            __asm__ volatile("" : "+v"(x), "+v"(y), "+v"(d0), "+v"(d1), "+v"(d2), "+v"(d3), "+v"(d4), "+v"(d5), "+v"(d6), "+v"(d7), "+v"(d8), "+v"(d9), "+v"(d10), "+v"(d11));
            d0=_mm512_dpbusd_epi32(d0,x,y); d1=_mm512_dpbusd_epi32(d1,x,y); d2=_mm512_dpbusd_epi32(d2,x,y); d3=_mm512_dpbusd_epi32(d3,x,y);
            d4=_mm512_dpbusd_epi32(d4,x,y); d5=_mm512_dpbusd_epi32(d5,x,y); d6=_mm512_dpbusd_epi32(d6,x,y); d7=_mm512_dpbusd_epi32(d7,x,y);
            d8=_mm512_dpbusd_epi32(d8,x,y); d9=_mm512_dpbusd_epi32(d9,x,y); d10=_mm512_dpbusd_epi32(d10,x,y); d11=_mm512_dpbusd_epi32(d11,x,y);
        }
        __m512i s=_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(d0,d1),_mm512_add_epi32(d2,d3)),_mm512_add_epi32(_mm512_add_epi32(d4,d5),_mm512_add_epi32(d6,d7)));
        s=_mm512_add_epi32(s,_mm512_add_epi32(_mm512_add_epi32(d8,d9),_mm512_add_epi32(d10,d11)));
        volatile int sink=_mm512_reduce_add_epi32(s); (void)sink;
    } else {
        __m256i d0=_mm256_set1_epi32(1),d1=d0,d2=d0,d3=d0,d4=d0,d5=d0,d6=d0,d7=d0,d8=d0,d9=d0,d10=d0,d11=d0;
        __m256i x=_mm256_set1_epi32(3), y=_mm256_set1_epi32(5);
        for (long i = 0; i < n; i++) {
            __asm__ volatile("" : "+v"(x), "+v"(y), "+v"(d0), "+v"(d1), "+v"(d2), "+v"(d3), "+v"(d4), "+v"(d5), "+v"(d6), "+v"(d7), "+v"(d8), "+v"(d9), "+v"(d10), "+v"(d11));
            d0=_mm256_dpbusd_epi32(d0,x,y); d1=_mm256_dpbusd_epi32(d1,x,y); d2=_mm256_dpbusd_epi32(d2,x,y); d3=_mm256_dpbusd_epi32(d3,x,y);
            d4=_mm256_dpbusd_epi32(d4,x,y); d5=_mm256_dpbusd_epi32(d5,x,y); d6=_mm256_dpbusd_epi32(d6,x,y); d7=_mm256_dpbusd_epi32(d7,x,y);
            d8=_mm256_dpbusd_epi32(d8,x,y); d9=_mm256_dpbusd_epi32(d9,x,y); d10=_mm256_dpbusd_epi32(d10,x,y); d11=_mm256_dpbusd_epi32(d11,x,y);
        }
        __m256i s=_mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(d0,d1),_mm256_add_epi32(d2,d3)),_mm256_add_epi32(_mm256_add_epi32(d4,d5),_mm256_add_epi32(d6,d7)));
        s=_mm256_add_epi32(s,_mm256_add_epi32(_mm256_add_epi32(d8,d9),_mm256_add_epi32(d10,d11)));
        volatile int sink=_mm256_extract_epi32(s,0); (void)sink;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}
int main(void) {
    long n = 200000000;
    for (int zmm = 0; zmm < 2; zmm++) for (int th = 1; th <= 2; th++) {
        double best = 1e9;
        for (int r = 0; r < 3; r++) {
            double t;
            #pragma omp parallel num_threads(th)
            { double tt = run(n, zmm); 
              #pragma omp critical
              { t = tt; } }
            if (t < best) best = t;
        }
        double macs = (double)n * 12 * (zmm ? 64 : 32) * th;
        printf("%s, %d thread(s): %.1f G vpdpbusd/s per thread, %.0f G MAC/s in all\n", zmm ? "zmm" : "ymm", th, n * 12 / best / 1e9, macs / best / 1e9);
    }
}
