/*
 * wake.c: what one timed wake-up costs a C process on this machine, the floor
 * beneath any open-loop load generator that wakes once per request (Go's
 * figure: go test ./loadgen -run '^$' -bench TimedWake -benchtime 2000x).
 * It sleeps 5 000 times for 83 us (the slot spacing at 12 000 req/s; timer
 * slack 1 ns), 5 000 times in a 1 ms epoll_wait, and 5 000 times on a periodic
 * 83 us timerfd (armed once, so the sleeper never arms a timer itself), and
 * prints the wall time and the process's CPU time (getrusage: user + system)
 * per wake-up.
 *
 *   gcc -O2 -o /tmp/wake profiles/wake.c && /tmp/wake
 */
#include <stdio.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <stdint.h>
#include <unistd.h>
static double cpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec*1e6+r.ru_utime.tv_usec+r.ru_stime.tv_sec*1e6+r.ru_stime.tv_usec;}
int main(int argc,char**argv){
  int n=5000; long ns=83000;
  prctl(PR_SET_TIMERSLACK,1,0,0,0);
  struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
  double c0=cpu();
  for(int i=0;i<n;i++){struct timespec d={0,ns}; clock_nanosleep(CLOCK_MONOTONIC,0,&d,NULL);}
  double c1=cpu(); clock_gettime(CLOCK_MONOTONIC,&t1);
  double wall=((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/1e3/n;
  printf("clock_nanosleep 83us: wall %.1f us/wake, cpu %.2f us/wake\n",wall,(c1-c0)/n);
  int ep=epoll_create1(0); struct epoll_event ev;
  c0=cpu(); clock_gettime(CLOCK_MONOTONIC,&t0);
  for(int i=0;i<n;i++){epoll_wait(ep,&ev,1,1);}
  c1=cpu(); clock_gettime(CLOCK_MONOTONIC,&t1);
  wall=((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/1e3/n;
  printf("epoll_wait 1ms: wall %.1f us/wake, cpu %.2f us/wake\n",wall,(c1-c0)/n);
  int tf=timerfd_create(CLOCK_MONOTONIC,0); struct itimerspec its={{0,ns},{0,ns}}; uint64_t x; long got=0;
  timerfd_settime(tf,0,&its,NULL);
  c0=cpu(); clock_gettime(CLOCK_MONOTONIC,&t0);
  while(got<n){if(read(tf,&x,8)==8)got+=x;}
  c1=cpu(); clock_gettime(CLOCK_MONOTONIC,&t1);
  wall=((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/1e3/n;
  printf("periodic timerfd 83us: wall %.1f us/expiry, cpu %.2f us/expiry\n",wall,(c1-c0)/n);
  return 0;}
