// cuda_client: the smallest real MPS client, with the command line of mpswrap's simulated
// client (mps-sim-client), so the contract suite drives both the same way.
//   cuda_client [--seconds S] [--fault-after S] [--linger S] [--alloc-mib M] [--busy N]
//               [--record FILE] [--tag T]
// Works for S seconds (a tiny kernel and a sync every 10 ms); with --fault-after it makes an
// illegal memory access. With --busy N it works as a training step does instead: N x N matrix
// products (N rounded up to a multiple of 16; 8192 in the finding of 2026-11-27) back to back,
// a sync after each and no pause, so a kernel is nearly always in flight; it says "started"
// once the first product is done. Any CUDA error prints "CUDA error <code>: <text>" and exits
// 1, after --linger seconds (host work before the program notices: a client slow to go).
// --alloc-mib holds M MiB more of device memory, written once (a client of a known footprint).
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

#define TILE 16
__global__ void product(const float *a, const float *b, float *c, size_t n) {
  __shared__ float ta[TILE][TILE], tb[TILE][TILE];
  size_t row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float sum = 0.0f;
  for (size_t t = 0; t < n; t += TILE) {
    ta[threadIdx.y][threadIdx.x] = a[row * n + t + threadIdx.x];
    tb[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < TILE; ++k) sum += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  c[row * n + col] = sum;
}

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

// One N x N product of the --busy load, synced.
static void busy_step(float *m, size_t n) {
  dim3 threads(TILE, TILE), blocks((unsigned)(n / TILE), (unsigned)(n / TILE));
  product<<<blocks, threads>>>(m, m + n * n, m + 2 * n * n, n);
  check(cudaDeviceSynchronize(), "busy");
}

int main(int argc, char **argv) {
  double seconds = 2.0, fault_after = -1.0, alloc_mib = 0.0;
  size_t busy = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--fault-after")) fault_after = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--linger")) linger = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--alloc-mib")) alloc_mib = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--busy"))
      busy = (strtoul(argv[i + 1], NULL, 10) + TILE - 1) / TILE * TILE;
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
  float *m = NULL;
  if (busy > 0) {
    check(cudaMalloc(&m, 3 * busy * busy * sizeof(float)), "cudaMalloc --busy");
    check(cudaMemset(m, 0, 3 * busy * busy * sizeof(float)), "cudaMemset --busy");
    busy_step(m, busy);
  }
  printf("cuda-client %d started\n", (int)getpid());
  fflush(stdout);
  double start = now();
  while (now() - start < seconds) {
    if (busy > 0) {
      busy_step(m, busy);
    } else {
      work<<<(n + 255) / 256, 256>>>(x, n);
      check(cudaDeviceSynchronize(), "work");
    }
    if (fault_after >= 0 && now() - start >= fault_after) {
      illegal<<<1, 1>>>(x);
      check(cudaDeviceSynchronize(), "illegal");
    }
    if (busy == 0) usleep(10000);
  }
  printf("cuda-client %d done\n", (int)getpid());
  return 0;
}
