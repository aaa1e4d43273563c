// cuda_client: the smallest real MPS client, with the command line of mpswrap's simulated
// client (mps-sim-client), so the contract suite drives both the same way.
//   cuda_client [--seconds S] [--fault-after S] [--linger S] [--alloc-mib M] [--record FILE]
//               [--tag T]
// Works for S seconds (a tiny kernel and a sync every 10 ms); with --fault-after it makes an
// illegal memory access. Any CUDA error prints "CUDA error <code>: <text>" and exits 1, after
// --linger seconds (host work before the program notices: a client slow to go). --alloc-mib
// holds M MiB more of device memory, written once (a client of a known footprint).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__global__ void work(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}

__global__ void illegal(float *x) { x[(size_t)1 << 40] = 1.0f; }

static double linger = 0.0;

static void check(cudaError_t err, const char *what) {
  if (err != cudaSuccess) {
    printf("CUDA error %d: %s (%s)\n", (int)err, cudaGetErrorString(err), what);
    fflush(stdout);
    if (linger > 0) {
      struct timespec ts = {(time_t)linger, (long)((linger - (time_t)linger) * 1e9)};
      nanosleep(&ts, NULL);
    }
    exit(1);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double seconds = 2.0, fault_after = -1.0, alloc_mib = 0.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--fault-after")) fault_after = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--linger")) linger = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--alloc-mib")) alloc_mib = atof(argv[i + 1]);
  }
  const int n = 1 << 16;
  float *x;
  check(cudaMalloc(&x, n * sizeof(float)), "cudaMalloc");
  if (alloc_mib > 0) {
    void *held;
    size_t bytes = (size_t)(alloc_mib * 1024 * 1024);
    check(cudaMalloc(&held, bytes), "cudaMalloc --alloc-mib");
    check(cudaMemset(held, 1, bytes), "cudaMemset --alloc-mib");
  }
  printf("cuda-client %d started\n", (int)getpid());
  fflush(stdout);
  double start = now();
  while (now() - start < seconds) {
    work<<<(n + 255) / 256, 256>>>(x, n);
    check(cudaDeviceSynchronize(), "work");
    if (fault_after >= 0 && now() - start >= fault_after) {
      illegal<<<1, 1>>>(x);
      check(cudaDeviceSynchronize(), "illegal");
    }
    usleep(10000);
  }
  printf("cuda-client %d done\n", (int)getpid());
  return 0;
}
