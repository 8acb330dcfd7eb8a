/* Single-copy reads between two processes (CMA, process_vm_readv) as an allreduce would use them: a probe
 * that measures what a design reading its peer's buffer directly would cost, on this machine.
 *
 *   cc -O3 -mavx2 benchmarks/cma_probe.c -o /tmp/cma_probe && /tmp/cma_probe BYTES [BLOCK_BYTES] [ITERATIONS]
 *
 * Two processes (a fork), float32 sum, in place: each reads its peer's half of the buffer in blocks into a
 * scratch block and adds it into its own half (reduce-scatter), then, after a barrier, reads the peer's
 * reduced half straight into its own buffer (allgather), and meets the peer again. Barriers spin on shared
 * flags (no sleeping), which favours the probe. Prints the best of 5 runs' time per allreduce. Needs
 * ptrace permission between the two processes (Yama's ptrace_scope 0, or no Yama). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  _Atomic long step[2];
  long address[2];
  int pid[2];
} Shared;

static Shared* shared;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void meet(int me, long step) {
  atomic_store(&shared->step[me], step);
  while (atomic_load(&shared->step[1 - me]) < step) sched_yield();
}

static void read_peer(int pid, void* to, long from, size_t n) {
  while (n > 0) {
    struct iovec local = {to, n}, remote = {(void*)from, n};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      perror("process_vm_readv (is ptrace between the two processes allowed?)");
      exit(1);
    }
    to = (char*)to + got;
    from += got;
    n -= (size_t)got;
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s BYTES [BLOCK_BYTES] [ITERATIONS]\n", argv[0]);
    return 2;
  }
  const size_t bytes = strtoul(argv[1], NULL, 10) / 8 * 8;
  const size_t block = argc > 2 ? strtoul(argv[2], NULL, 10) : 262144;
  const int iterations = argc > 3 ? atoi(argv[3]) : 100;
  shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  const int me = fork() == 0 ? 1 : 0;
  float* buf = aligned_alloc(4096, bytes);
  float* scratch = aligned_alloc(4096, block);
  const size_t n = bytes / 4, half = n / 2;
  for (size_t i = 0; i < n; ++i) buf[i] = 0.0f;
  shared->address[me] = (long)buf;
  shared->pid[me] = getpid();
  meet(me, 1);
  const int peer = shared->pid[1 - me];
  const long peer_buf = shared->address[1 - me];
  const size_t mine = me ? half : 0, theirs = me ? 0 : half;
  long step = 1;
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    meet(me, ++step);
    const double start = now();
    for (int it = 0; it < iterations; ++it) {
      for (size_t at = 0; at < half; at += block / 4) {
        const size_t m = half - at < block / 4 ? half - at : block / 4;
        read_peer(peer, scratch, peer_buf + (long)((mine + at) * 4), m * 4);
        float* d = buf + mine + at;
        for (size_t i = 0; i < m; ++i) d[i] += scratch[i];
      }
      meet(me, ++step);
      read_peer(peer, buf + theirs, peer_buf + (long)(theirs * 4), half * 4);
      meet(me, ++step);
    }
    const double t = (now() - start) / iterations;
    if (t < best) best = t;
  }
  if (me == 1) return 0;
  wait(NULL);
  printf("%zu bytes, blocks of %zu: %.1f us per allreduce (best of 5 runs of %d)\n", bytes, block, best * 1e6,
         iterations);
  return 0;
}
