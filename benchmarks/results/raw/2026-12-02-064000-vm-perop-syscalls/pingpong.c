// Unix socket ping-pong between two processes: blocking (poll) vs spinning receiver.
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void rx(int fd,int spin){char b[64]; for(;;){ if(spin){ if(recv(fd,b,sizeof b,MSG_DONTWAIT)>0) return; continue;} struct pollfd p={fd,POLLIN,0}; poll(&p,1,-1); if(recv(fd,b,sizeof b,MSG_DONTWAIT)>0) return;}}
int main(int argc,char**argv){ int spin=argc>1?atoi(argv[1]):0; int sv[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sv); int n=20000;
 if(fork()==0){ for(int i=0;i<n;i++){ rx(sv[1],spin); send(sv[1],"y",1,0);} _exit(0);}
 double t=now(); for(int i=0;i<n;i++){ send(sv[0],"x",1,0); rx(sv[0],0);} double d=now()-t; wait(0);
 printf("round trip %.1f us (server %s)\n", d/n*1e6, spin?"spinning":"sleeping in poll"); return 0;}
