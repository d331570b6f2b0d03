// The same libraries in cache: [M, K] x [N, K]^T with N x K bytes of weights small enough for L2, one
// thread, M = 2, 3, 4 (edit Ms for 1, 8, 16), G multiply-adds/s per variant (fastest of 15 x 100).
//   gcc -O2 -o in_cache in_cache.c -ldl && ./in_cache 256 1536 old/lib.so:4 new/lib.so:4
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
typedef int (*mmf)(int,const float*,const int8_t*,const float*,float*,int64_t,int64_t,int64_t,int);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int64_t N=atoi(argv[1]),K=atoi(argv[2]); int nv=argc-3; mmf f[8]; int kinds[8];
  for(int v=0;v<nv;v++){char path[256]; strcpy(path,argv[3+v]); char*c=strchr(path,':'); kinds[v]=atoi(c+1); *c=0; void*hd=dlopen(path,RTLD_NOW|RTLD_LOCAL); f[v]=(mmf)dlsym(hd,"completiond_mm");}
  int Ms[3]={2,3,4};
  int8_t*w=malloc(N*K); float*sc=malloc(4*N); float*x=malloc(4*16*K); float*y=malloc(4*16*N);
  for(int64_t i=0;i<N*K;i++) w[i]=(int8_t)(rand()%255-127);
  for(int64_t i=0;i<N;i++) sc[i]=1e-3f;
  for(int64_t i=0;i<16*K;i++) x[i]=((rand()%20001)-10000)*1e-3f;
  double best[8][3]; for(int v=0;v<nv;v++)for(int m=0;m<3;m++)best[v][m]=1e9;
  for(int t=0;t<15;t++) for(int mi=0;mi<3;mi++) for(int v=0;v<nv;v++){int64_t M=Ms[mi]; int reps=100;
    double t0=now(); for(int r=0;r<reps;r++) f[v](kinds[v],x,w,sc,y,M,K,N,1); t0=(now()-t0)/reps; if(t0<best[v][mi])best[v][mi]=t0;}
  for(int v=0;v<nv;v++){printf("%-16s",argv[3+v]); for(int mi=0;mi<3;mi++) printf("  M=%d %.1fus %.1fGMAC/s",Ms[mi],best[v][mi]*1e6,(double)Ms[mi]*N*K/best[v][mi]/1e9); printf("\n");}
}
