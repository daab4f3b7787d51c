// SPDX-License-Identifier: Apache-2.0
// Limit probe for issue 10 item 2: T threads copying a tmpfs "card" into another
// process's warm anonymous memory with process_vm_writev, against memcpy in one
// process (embedded's pass) and two memcpys (the ring's passes).
#define _GNU_SOURCE  // build: gcc -O2 -pthread -o pvmt process_vm_limit.c; run: ./pvmt OBJ_MiB PIECE_KiB THREADS TOTAL_GiB
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <fcntl.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static size_t total, obj, piece; static int T, mode; static char *src,*dst,*mid; static pid_t target;
static void* work(void*a){ long id=(long)a; size_t n=total/obj; char*ring=mid+(size_t)id*obj;
  for(size_t i=id;i<n;i+=T){ char*s=src+i*obj,*d=dst+i*obj;
    if(mode==0){ for(size_t o=0;o<obj;o+=piece){struct iovec l={s+o,piece},r={d+o,piece}; if(process_vm_writev(target,&l,1,&r,1,0)!=(ssize_t)piece){perror("w");exit(1);}}}
    else if(mode==1){ for(size_t o=0;o<obj;o+=piece){struct iovec l={s+o,piece},r={d+o,piece}; if(process_vm_readv(target,&l,1,&r,1,0)!=(ssize_t)piece){perror("r");exit(1);}}}
    else if(mode==2) memcpy(d,s,obj);
    else { memcpy(ring,s,obj); memcpy(d,ring,obj);} }
  return 0;}
static double run(int m){ mode=m; pthread_t th[64]; double t0=now(); for(long i=0;i<T;i++) pthread_create(&th[i],0,work,(void*)i); for(int i=0;i<T;i++) pthread_join(th[i],0); return total/(now()-t0)/1e9;}
int main(int argc,char**argv){ setvbuf(stdout,0,_IONBF,0);
  obj=(size_t)atol(argv[1])<<20; piece=(size_t)atol(argv[2])<<10; T=atoi(argv[3]); total=(size_t)atol(argv[4])<<30;
  dst=mmap(0,total,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  int fd=open("/dev/shm/pvmt_card",O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(fd,total);
  src=mmap(0,total,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(src,2,total);
  int p1[2],p2[2]; pipe(p1); pipe(p2); pid_t parent=getpid();
  pid_t c=fork();
  if(c==0){ target=parent; char b; read(p1[0],&b,1); /* parent has re-touched dst: no COW */
    for(int r=0;r<3;r++) printf("obj %zuMiB piece %zuKiB T=%d pvm_writev %.2f GB/s  pvm_readv %.2f GB/s\n",obj>>20,piece>>10,T,run(0),run(1));
    write(p2[1],"x",1); _exit(0);}
  memset(dst,1,total); write(p1[1],"x",1); char b; read(p2[0],&b,1); waitpid(c,0,0);
  mid=mmap(0,(size_t)T*obj,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(mid,0,(size_t)T*obj);
  for(int r=0;r<3;r++) printf("obj %zuMiB T=%d memcpy(embedded) %.2f GB/s  two-memcpy(ring) %.2f GB/s\n",obj>>20,T,run(2),run(3));
  unlink("/dev/shm/pvmt_card"); return 0;}
