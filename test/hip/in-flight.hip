// A kernel in flight on every GPU: each work-item computes a value, leaves it in the LDS,
// spins until the host sets a flag, meets its workgroup at a barrier, computes on from its
// neighbour's LDS word and stores the result; the host checks every word against its own
// reference. The seed each work-item reads as it starts changes before the flag goes up, so
// a kernel started over (rather than resumed) gives other results; every wave counts itself
// in once it has its seed, and the host waits for all of them (all 128 fit the GPU at once:
// kfd-emu keeps 128 waves of a dispatch resident). For checkpoint tests: `--signal` sets the
// flags on SIGUSR1 instead of after `--hold-ms MS` (default 200), so that a dump lands while
// every kernel waits; "in-flight: N GPUs" is printed once every wave runs.
#include "check.h"
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

constexpr int BLOCK = 256;
constexpr int BLOCKS = 32;
constexpr int N = BLOCK * BLOCKS;
constexpr int ITERS = 500;

__host__ __device__ unsigned step(unsigned x, int n)
{
	for (int i = 0; i < n; i++)
		x = x * 1664525u + 1013904223u;
	return x;
}

__global__ void hold(const volatile int *flag, const volatile unsigned *seed, unsigned *started,
		     unsigned *out)
{
	__shared__ unsigned lds[BLOCK];
	unsigned id = blockIdx.x * blockDim.x + threadIdx.x;
	unsigned s = *seed;
	if (threadIdx.x % 64 == 0)
		atomicAdd_system(started, 1u);
	unsigned x = step(id * 2654435761u + s, ITERS);
	lds[threadIdx.x] = x;
	while (*flag == 0)
		__builtin_amdgcn_s_sleep(2);
	__syncthreads();
	unsigned y = step(lds[(threadIdx.x + 1) % BLOCK], ITERS);
	out[id] = x ^ y;
}

static volatile sig_atomic_t go;

static void on_usr1(int) { go = 1; }

int main(int argc, char **argv)
{
	Check c("in-flight");
	int hold_ms = 200;
	bool by_signal = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--signal"))
			by_signal = true;
		else if (!strcmp(argv[i], "--hold-ms") && i + 1 < argc)
			hold_ms = atoi(argv[++i]);
	}
	signal(SIGUSR1, on_usr1);
	int n = 0;
	HIP_CHECK(hipGetDeviceCount(&n));
	int *flags;
	HIP_CHECK(hipHostMalloc(&flags, 64 * sizeof(int), hipHostMallocPortable));
	memset(flags, 0, 64 * sizeof(int));
	// The seed of GPU d at flags[4 * d + 1].
	for (int d = 0; d < 16; d++)
		flags[4 * d + 1] = d;
	unsigned *out[16];
	hipStream_t s[16];
	n = n > 16 ? 16 : n;
	for (int d = 0; d < n; d++) {
		HIP_CHECK(hipSetDevice(d));
		HIP_CHECK(hipMalloc(&out[d], N * sizeof(unsigned)));
		HIP_CHECK(hipStreamCreateWithFlags(&s[d], hipStreamNonBlocking));
		hipLaunchKernelGGL(hold, dim3(BLOCKS), dim3(BLOCK), 0, s[d], flags + 4 * d,
				   (const unsigned *)(flags + 4 * d + 1), (unsigned *)(flags + 4 * d + 2),
				   out[d]);
		HIP_CHECK(hipGetLastError());
	}
	// Every wave of every kernel has its seed (at most a minute).
	int waves = 0;
	for (int t = 0; t < 6000; t++, usleep(10 * 1000)) {
		waves = 0;
		for (int d = 0; d < n; d++)
			waves += __atomic_load_n(&flags[4 * d + 2], __ATOMIC_SEQ_CST);
		if (waves == n * N / 64)
			break;
	}
	int running = 0;
	for (int d = 0; d < n; d++)
		running += hipStreamQuery(s[d]) == hipErrorNotReady;
	c.expect("every wave of every kernel runs", waves == n * N / 64);
	c.expect("every kernel waits for its flag", running == n);
	printf("in-flight: %d GPUs\n", n);
	fflush(stdout);
	// Polled, not pause(): SIGUSR1 is process-directed, and the thread that runs its handler
	// may be one of the runtime's (as after a restore), leaving the main thread paused.
	if (by_signal)
		while (!go)
			usleep(10 * 1000);
	else
		usleep(hold_ms * 1000);
	for (int d = 0; d < n; d++) {
		__atomic_store_n(&flags[4 * d + 1], 0x5eed, __ATOMIC_SEQ_CST);
		__atomic_store_n(&flags[4 * d], 1, __ATOMIC_SEQ_CST);
	}
	static unsigned h[N];
	for (int d = 0; d < n; d++) {
		HIP_CHECK(hipSetDevice(d));
		HIP_CHECK(hipStreamSynchronize(s[d]));
		HIP_CHECK(hipMemcpy(h, out[d], sizeof(h), hipMemcpyDeviceToHost));
		long bad = 0;
		for (unsigned id = 0; id < N; id++) {
			unsigned x = step(id * 2654435761u + d, ITERS);
			unsigned nb = id / BLOCK * BLOCK + (id % BLOCK + 1) % BLOCK;
			unsigned y = step(step(nb * 2654435761u + d, ITERS), ITERS);
			bad += h[id] != (x ^ y);
		}
		char what[64];
		snprintf(what, sizeof(what), "GPU %d's kernel against the host", d);
		c.report(what, bad, N);
		HIP_CHECK(hipStreamDestroy(s[d]));
		HIP_CHECK(hipFree(out[d]));
	}
	HIP_CHECK(hipHostFree(flags));
	return c.finish();
}
