/*
 * lateness.c: how late a C process wakes from 96 000 absolute sleeps 83 us apart
 * (8 s at the slot spacing of 12 000 req/s, timer slack 1 ns): the schedule lag
 * that any open loop sleeping until its slots would see on this machine, with
 * nothing of pinned's in it. It prints p50, p99, p99.9 and the maximum.
 *
 *   gcc -O2 -o /tmp/lateness profiles/lateness.c && /tmp/lateness
 *   chrt -f 10 /tmp/lateness                       # the same at real-time priority
 *   taskset -c 0 sh -c 'while :; do :; done' &     # a busy CPU 0 beside it ...
 *   taskset -c 1 /tmp/lateness                     # ... and the sleeper on CPU 1
 *   /tmp/lateness 100000                           # with a 100 us EEVDF slice
 *
 * An argument sets the sleeper's scheduling slice in ns (sched_setattr,
 * SCHED_OTHER with sched_runtime; no privilege needed on kernels 6.12+).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>
struct sched_attr { uint32_t size, sched_policy; uint64_t sched_flags; int32_t sched_nice; uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period; uint32_t util_min, util_max; };
static int cmp(const void*a,const void*b){long x=*(long*)a,y=*(long*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  long slice=argc>1?atol(argv[1]):0;
  if(slice>0){struct sched_attr a={0}; a.size=sizeof a; a.sched_runtime=slice;
    if(syscall(SYS_sched_setattr,0,&a,0)!=0){perror("sched_setattr");return 1;}}
  int n=96000; long ns=83333; long *late=malloc(n*sizeof(long));
  prctl(PR_SET_TIMERSLACK,1,0,0,0);
  struct timespec d,t; clock_gettime(CLOCK_MONOTONIC,&d);
  for(int i=0;i<n;i++){d.tv_nsec+=ns; if(d.tv_nsec>=1000000000){d.tv_nsec-=1000000000;d.tv_sec++;}
    clock_nanosleep(CLOCK_MONOTONIC,TIMER_ABSTIME,&d,NULL); clock_gettime(CLOCK_MONOTONIC,&t);
    late[i]=(t.tv_sec-d.tv_sec)*1000000000L+(t.tv_nsec-d.tv_nsec);}
  qsort(late,n,sizeof(long),cmp);
  printf("C sleep lateness over %d wakes: p50 %ld us, p99 %ld us, p99.9 %ld us, max %ld us\n",n,late[n/2]/1000,late[n*99/100]/1000,late[n*999/1000]/1000,late[n-1]/1000);
  return 0;}
