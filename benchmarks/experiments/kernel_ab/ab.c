// Libraries side by side in one process: every matmul kind named on the command line as LIB.so:KIND
// (completiond_mm_kind), the 1.5B's four layer shapes ([2048|1536|17920 x 1536], [1536 x 8960]) over
// 8 layers of distinct random weights (streamed from memory as in a pass) at 1, 4, 8, 16 rows,
// variants interleaved round by round, fastest round per cell (ms a layer); outputs of every
// variant compared bit for bit with the first (MISMATCH lines). The a8 kernel's prefetch and tile numbers
// (docs/kernels.md) came from it. Build each library as cpu_kernel.py does, from a copy of
// completiond/models/kernels with COMPLETIOND_HIDDEN emptied in completiond_kernels.h:
//   gcc -O3 -mavx2 -mfma -fopenmp -ffp-contract=off -shared -fPIC -o DIR/lib.so DIR/*.c -lm
//   gcc -O2 -o ab ab.c -ldl && ROUNDS=10 ./ab 0 THREADS old/lib.so:4 new/lib.so:4
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
typedef int (*mmf)(int,const float*,const int8_t*,const float*,float*,int64_t,int64_t,int64_t,int);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define L 8
int main(int argc,char**argv){
  int threads=atoi(argv[2]); int nv=argc-3; int kinds[8];
  mmf f[8];
  for(int v=0;v<nv;v++){char path[256]; strcpy(path,argv[3+v]); char*c=strchr(path,':'); kinds[v]=atoi(c+1); *c=0; void*hd=dlopen(path,RTLD_NOW|RTLD_LOCAL); if(!hd){printf("%s\n",dlerror());return 1;} f[v]=(mmf)dlsym(hd,"completiond_mm");}
  int64_t shapes[4][2]={{2048,1536},{1536,1536},{17920,1536},{1536,8960}};
  int Ms[4]={1,4,8,16};
  srand(1);
  int8_t*w[L][4]; float*sc[4];
  for(int s=0;s<4;s++){int64_t N=shapes[s][0],K=shapes[s][1]; sc[s]=malloc(4*N); for(int64_t i=0;i<N;i++) sc[s][i]=(rand()%1000)*1e-5f;
    for(int l=0;l<L;l++){w[l][s]=malloc(N*K); for(int64_t i=0;i<N*K;i++) w[l][s][i]=(int8_t)(rand()%255-127);}}
  float*x=malloc(4*16*8960); float*y=malloc(4*16*17920); float*y0=malloc(4*16*17920);
  for(int64_t i=0;i<16*8960;i++) x[i]=((rand()%20001)-10000)*1e-3f;
  // identity check
  for(int s=0;s<4;s++) for(int mi=0;mi<4;mi++){int64_t M=Ms[mi],N=shapes[s][0],K=shapes[s][1];
    f[0](kinds[0],x,w[0][s],sc[s],y0,M,K,N,threads);
    for(int v=1;v<nv;v++){f[v](kinds[v],x,w[0][s],sc[s],y,M,K,N,threads); if(memcmp(y,y0,4*M*N)) printf("MISMATCH v%d shape %d M=%ld\n",v,s,(long)M);}}
  double best[8][4]; for(int v=0;v<nv;v++) for(int m=0;m<4;m++) best[v][m]=1e9;
  int rounds=atoi(getenv("ROUNDS")?getenv("ROUNDS"):"12");
  for(int r=0;r<rounds;r++) for(int mi=0;mi<4;mi++) for(int v=0;v<nv;v++){int64_t M=Ms[mi];
      double t=now();
      for(int l=0;l<L;l++) for(int s=0;s<4;s++) f[v](kinds[v],x,w[l][s],sc[s],y,M,shapes[s][1],shapes[s][0],threads);
      t=now()-t; if(t<best[v][mi])best[v][mi]=t;}
  for(int v=0;v<nv;v++){printf("%-14s",argv[3+v]); for(int mi=0;mi<4;mi++) printf("  M=%d %.2fms(x%.2f)",Ms[mi],best[v][mi]/L*1e3,best[v][mi]/best[v][0]); printf("\n");}
}
