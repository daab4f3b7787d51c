#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <string.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){ size_t sz=64<<20; int fd=open("/dev/shm/perop-madv",O_RDWR|O_CREAT,0600); ftruncate(fd,sz);
 char*p=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(p,1,sz);
 for(size_t s=65536;s<=(2<<20);s*=4){ int n=2000; double t=now(); for(int i=0;i<n;i++) madvise(p+(i*s)%(sz-s),s,23); double d=now()-t; printf("%zu KiB: %.2f us per populate\n",s>>10,d/n*1e6);}
 unlink("/dev/shm/perop-madv"); return 0;}
