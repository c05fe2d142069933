// A long kernel on every GPU, computing the whole time (test/hip-cr/run.sh).
//
//   busy [--min-rounds N]
//
// Each GPU runs one kernel of BLOCKS workgroups of BLOCK work-items. A work-item starts
// from a value of its own and computes rounds: ITERS steps of a linear congruential
// generator, its value into the LDS, a barrier, its neighbour's value mixed in. Before
// each round the workgroup's first work-item reads the host's stop word into the LDS; once
// it is set (SIGUSR1 or SIGTERM sets it) and the workgroup has done at least N rounds
// (default 1), the workgroup stops, its work-items store their values, and the first
// records how many rounds it did. So the waves are mid-arithmetic whenever a checkpoint
// lands, with live registers, LDS and barriers, and the kernel ends only after the signal.
// The host then checks every value against its own computation of that many rounds, and
// that every wave counted itself in exactly once (a kernel started over after a restore
// would count again, and start from round 0).
//
// Prints "busy: N GPUs running" once every wave of every kernel has started, and at the
// end one line per check and "busy: PASSED" (status 0) or "busy: FAILED" (1; 2 on a HIP
// error).
#include "../hip/check.h"

#include <csignal>
#include <unistd.h>

constexpr int BLOCK = 256;
constexpr int BLOCKS = 2;
constexpr int N = BLOCK * BLOCKS;
constexpr int WAVES = N / 64;
constexpr int ITERS = 16;
constexpr int MAX_GPUS = 16;

__host__ __device__ static uint32_t lcg(uint32_t x)
{
	for (int i = 0; i < ITERS; i++)
		x = x * 1664525u + 1013904223u;
	return x;
}

__host__ __device__ static uint32_t start_value(uint32_t gpu, uint32_t id)
{
	return (id + 1) * 2654435761u ^ (gpu + 1) * 0x9e3779b9u;
}

// The host's words of one GPU: set to stop, waves counted in; rounds of each workgroup.
struct Words {
	uint32_t stop, started, rounds[BLOCKS];
};

__global__ void busy(volatile Words *w, uint32_t gpu, uint32_t min_rounds, uint32_t *out)
{
	__shared__ uint32_t lds[BLOCK];
	__shared__ uint32_t stop;
	uint32_t t = threadIdx.x, id = blockIdx.x * BLOCK + t;
	uint32_t x = start_value(gpu, id), r = 0;
	if (t % 64 == 0)
		atomicAdd_system((uint32_t *)&w->started, 1u);
	for (;; r++) {
		if (t == 0)
			stop = w->stop && r >= min_rounds;
		__syncthreads();
		if (stop)
			break;
		x = lcg(x);
		lds[t] = x;
		__syncthreads();
		x ^= lds[(t + 1) % BLOCK] >> 7;
	}
	out[id] = x;
	if (t == 0)
		w->rounds[blockIdx.x] = r;
}

// What work-item `id` of GPU `gpu` computes in `rounds` rounds (its whole workgroup, as
// the kernel does); fills v[BLOCK] for the workgroup of `wg`.
static void reference(uint32_t gpu, int wg, uint32_t rounds, uint32_t *v)
{
	static uint32_t next[BLOCK];
	for (int t = 0; t < BLOCK; t++)
		v[t] = start_value(gpu, wg * BLOCK + t);
	for (uint32_t r = 0; r < rounds; r++) {
		for (int t = 0; t < BLOCK; t++)
			v[t] = lcg(v[t]);
		for (int t = 0; t < BLOCK; t++)
			next[t] = v[t] ^ (v[(t + 1) % BLOCK] >> 7);
		memcpy(v, next, sizeof next);
	}
}

static Words *words;
static int gpus;
static volatile sig_atomic_t go;

static void on_release(int) { go = 1; }

// Waits (at most a minute) until every wave of every kernel counted itself in.
static bool all_started()
{
	for (int t = 0; t < 6000; t++, usleep(10 * 1000)) {
		int n = 0;
		for (int d = 0; d < gpus; d++)
			n += __atomic_load_n(&words[d].started, __ATOMIC_SEQ_CST);
		if (n == gpus * WAVES)
			return true;
	}
	return false;
}

// GPU d's kernel, ended: its values against the host's, its count of waves.
static void check_gpu(Check &c, int d, const uint32_t *out, uint32_t min_rounds)
{
	static uint32_t h[N], v[BLOCK];
	char what[96];
	HIP_CHECK(hipMemcpy(h, out, sizeof h, hipMemcpyDeviceToHost));
	long bad = 0;
	for (int wg = 0; wg < BLOCKS; wg++) {
		reference(d, wg, words[d].rounds[wg], v);
		for (int t = 0; t < BLOCK; t++)
			bad += h[wg * BLOCK + t] != v[t];
	}
	snprintf(what, sizeof what, "GPU %d's kernel (%u and %u rounds) against the host", d,
		 words[d].rounds[0], words[d].rounds[BLOCKS - 1]);
	c.report(what, bad, N);
	snprintf(what, sizeof what, "GPU %d's %d waves counted in once, ran %u rounds or more", d,
		 WAVES, min_rounds);
	c.expect(what, words[d].started == WAVES && words[d].rounds[0] >= min_rounds &&
			       words[d].rounds[BLOCKS - 1] >= min_rounds);
}

int main(int argc, char **argv)
{
	uint32_t min_rounds = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--min-rounds") && i + 1 < argc) {
			min_rounds = atoi(argv[++i]);
		} else {
			fprintf(stderr, "usage: busy [--min-rounds N]\n");
			return 2;
		}
	}
	Check c("busy");
	HIP_CHECK(hipGetDeviceCount(&gpus));
	gpus = gpus > MAX_GPUS ? MAX_GPUS : gpus;
	HIP_CHECK(hipHostMalloc(&words, gpus * sizeof(Words), hipHostMallocPortable));
	memset(words, 0, gpus * sizeof(Words));
	signal(SIGUSR1, on_release);
	signal(SIGTERM, on_release);
	uint32_t *out[MAX_GPUS];
	hipStream_t s[MAX_GPUS];
	for (int d = 0; d < gpus; d++) {
		HIP_CHECK(hipSetDevice(d));
		HIP_CHECK(hipMalloc(&out[d], N * sizeof(uint32_t)));
		HIP_CHECK(hipStreamCreateWithFlags(&s[d], hipStreamNonBlocking));
		hipLaunchKernelGGL(busy, dim3(BLOCKS), dim3(BLOCK), 0, s[d], words + d, (uint32_t)d,
				   min_rounds, out[d]);
		HIP_CHECK(hipGetLastError());
	}
	c.expect("every wave of every kernel started", all_started());
	printf("busy: %d GPUs running\n", gpus);
	fflush(stdout);
	while (!go)
		usleep(10 * 1000);
	int running = 0;
	for (int d = 0; d < gpus; d++)
		running += hipStreamQuery(s[d]) == hipErrorNotReady;
	c.expect("every kernel still ran when it was told to stop", running == gpus);
	for (int d = 0; d < gpus; d++)
		__atomic_store_n(&words[d].stop, 1u, __ATOMIC_SEQ_CST);
	for (int d = 0; d < gpus; d++) {
		HIP_CHECK(hipSetDevice(d));
		HIP_CHECK(hipStreamSynchronize(s[d]));
		check_gpu(c, d, out[d], min_rounds);
		HIP_CHECK(hipStreamDestroy(s[d]));
		HIP_CHECK(hipFree(out[d]));
	}
	HIP_CHECK(hipHostFree(words));
	return c.finish();
}
