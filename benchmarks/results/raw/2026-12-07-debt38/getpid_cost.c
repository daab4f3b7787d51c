// SPDX-License-Identifier: Apache-2.0
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(void){struct timespec a,b;long n=2000000;volatile int x=0;clock_gettime(CLOCK_MONOTONIC,&a);for(long i=0;i<n;i++)x+=getpid();clock_gettime(CLOCK_MONOTONIC,&b);printf("getpid: %.1f ns a call (%ld calls)\n",((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/n,n);return 0;}
