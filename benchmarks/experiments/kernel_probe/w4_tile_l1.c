// The 512-bit int4 tile (w4_mm.c's w4_tile_zmm) alone, its weights and activations in L1: one pair of
// vectors (16 channels), K = 1024, R = 1..8 rows, one thread; vpdpbusd instructions a second.
// docs/kernels.md "int4 weights": 2.6 G/s at 5-8 rows on Zen 4 (72 % of vnni_peak.c's 3.66 G/s), 3.2 G/s
// with the per-group float step replaced by an integer add (wrong sums, timing only).
//
//     gcc -O3 -mavx2 -mfma -ffp-contract=off -fopenmp -Icompletiond/models/kernels \
//         -DSRC='"w4_mm.c"' -o /tmp/w4_tile_l1 \
//         benchmarks/kernel_probe/w4_tile_l1.c completiond/models/kernels/a8_mm.c -lm && /tmp/w4_tile_l1
#include <stdio.h>
#include <time.h>
#include <stdint.h>
#include SRC
int completiond_zmm_enabled(void){return 1;}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) int main(void){
  enum {KK=1024};
  static int8_t q[8*KK]; static float s[8*(KK/128)]; static uint8_t w[16*KK/2] __attribute__((aligned(64)));
  static uint16_t sz[2*(KK/32)*16]; static float xsum[8*(KK/32)]; static float y[8*16];
  for(int i=0;i<8*KK;i++) q[i]=i*7; for(int i=0;i<16*KK/2;i++) w[i]=i*13;
  for(int i=0;i<2*(KK/32)*16;i++) sz[i]=0x3f80; for(int i=0;i<8*(KK/128);i++) s[i]=1;
  CompletiondA8Rows a={q,s,0,KK,KK/128};
  for(int R=1;R<=8;R++){ double best=1e9;
   for(int rep=0;rep<5;rep++){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
    long n=200000/R;
    for(long i=0;i<n;i++){ W4Prefetch pf={0,0,0};
      switch(R){case 1:w4_tile_zmm(1,&a,0,w,sz,xsum,y,16,16,&pf);break;case 2:w4_tile_zmm(2,&a,0,w,sz,xsum,y,16,16,&pf);break;
      case 3:w4_tile_zmm(3,&a,0,w,sz,xsum,y,16,16,&pf);break;case 4:w4_tile_zmm(4,&a,0,w,sz,xsum,y,16,16,&pf);break;
      case 5:w4_tile_zmm(5,&a,0,w,sz,xsum,y,16,16,&pf);break;case 6:w4_tile_zmm(6,&a,0,w,sz,xsum,y,16,16,&pf);break;
      case 7:w4_tile_zmm(7,&a,0,w,sz,xsum,y,16,16,&pf);break;case 8:w4_tile_zmm(8,&a,0,w,sz,xsum,y,16,16,&pf);break;}
      __asm__ volatile(""::"r"(y):"memory"); }
    clock_gettime(CLOCK_MONOTONIC,&t1); double t=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; if(t<best)best=t;}
   long n=200000/R; printf("R=%d: %.2f G dpbusd/s\n",R,(double)n*R*(KK/8)*2/best/1e9);}
}
