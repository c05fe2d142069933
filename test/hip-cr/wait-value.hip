// Streams held back by hipStreamWaitValue32 (test/hip-cr/run.sh).
//
//   wait-value
//
// On every GPU, stream 1 waits (hipStreamWaitValue32, >=) for a word in host memory, then
// runs a kernel that fills a host buffer, records an event and writes a second word
// (hipStreamWriteValue32); stream 2 waits for that event (hipStreamWaitEvent) and runs a
// kernel that reads the first buffer and fills another. HIP 5.2 waits for the value with a
// kernel of its own that spins on the word, so that kernel is in flight while the program
// waits. It prints "wait-value: N GPUs waiting" once both streams of every GPU are busy
// and nothing behind the waits ran; SIGUSR1 (or SIGTERM) releases them: the program checks
// once more that nothing ran, sets the words, waits for both streams and checks both
// buffers and the written word against the host. Ends with "wait-value: PASSED" (status 0)
// or "wait-value: FAILED" (1; 2 on a HIP error).
#include "../hip/check.h"

#include <csignal>
#include <unistd.h>

constexpr int N = 4096;
constexpr int MAX_GPUS = 16;
constexpr uint32_t GO = 7, DONE = 0x600d;

__global__ void fill(uint32_t *p, uint32_t seed)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	p[i] = seed ^ (i * 2654435761u);
}

__global__ void mix(const uint32_t *a, uint32_t *b)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	b[i] = a[i] * 3u + 1u;
}

struct Gpu {
	hipStream_t s1, s2;
	hipEvent_t e;
	uint32_t *a, *b; // host memory the kernels write
};

// The host's words of GPU d: [2d] the value stream 1 waits for, [2d + 1] what it writes.
static uint32_t *words;
static volatile sig_atomic_t go;

static void on_release(int) { go = 1; }

static uint32_t seed_of(int d) { return 0x9e3779b9u * (d + 1); }

static void enqueue(Gpu &g, int d)
{
	HIP_CHECK(hipSetDevice(d));
	HIP_CHECK(hipStreamCreateWithFlags(&g.s1, hipStreamNonBlocking));
	HIP_CHECK(hipStreamCreateWithFlags(&g.s2, hipStreamNonBlocking));
	HIP_CHECK(hipEventCreateWithFlags(&g.e, hipEventDisableTiming));
	HIP_CHECK(hipHostMalloc(&g.a, N * sizeof(uint32_t)));
	HIP_CHECK(hipHostMalloc(&g.b, N * sizeof(uint32_t)));
	memset(g.a, 0, N * sizeof(uint32_t));
	memset(g.b, 0, N * sizeof(uint32_t));
	HIP_CHECK(hipStreamWaitValue32(g.s1, &words[2 * d], GO, hipStreamWaitValueGte, 0xffffffffu));
	hipLaunchKernelGGL(fill, dim3(N / 256), dim3(256), 0, g.s1, g.a, seed_of(d));
	HIP_CHECK(hipGetLastError());
	HIP_CHECK(hipEventRecord(g.e, g.s1));
	HIP_CHECK(hipStreamWriteValue32(g.s1, &words[2 * d + 1], DONE, 0));
	HIP_CHECK(hipStreamWaitEvent(g.s2, g.e, 0));
	hipLaunchKernelGGL(mix, dim3(N / 256), dim3(256), 0, g.s2, g.a, g.b);
	HIP_CHECK(hipGetLastError());
}

// Nothing behind the waits ran: both streams busy, both buffers and the written word
// untouched.
static bool all_held(const Gpu *g, int gpus)
{
	for (int d = 0; d < gpus; d++) {
		if (hipStreamQuery(g[d].s1) != hipErrorNotReady || hipStreamQuery(g[d].s2) != hipErrorNotReady)
			return false;
		if (words[2 * d + 1] != 0)
			return false;
		for (int i = 0; i < N; i++)
			if (g[d].a[i] || g[d].b[i])
				return false;
	}
	return true;
}

static void check_gpu(Check &c, Gpu &g, int d)
{
	char what[96];
	HIP_CHECK(hipStreamSynchronize(g.s1));
	HIP_CHECK(hipStreamSynchronize(g.s2));
	long bad_a = 0, bad_b = 0;
	for (uint32_t i = 0; i < N; i++) {
		uint32_t want = seed_of(d) ^ (i * 2654435761u);
		bad_a += g.a[i] != want;
		bad_b += g.b[i] != want * 3u + 1u;
	}
	snprintf(what, sizeof what, "GPU %d: the kernel behind the wait", d);
	c.report(what, bad_a, N);
	snprintf(what, sizeof what, "GPU %d: the kernel behind the event", d);
	c.report(what, bad_b, N);
	snprintf(what, sizeof what, "GPU %d: the word written after the kernel", d);
	c.expect(what, words[2 * d + 1] == DONE);
	HIP_CHECK(hipStreamDestroy(g.s1));
	HIP_CHECK(hipStreamDestroy(g.s2));
	HIP_CHECK(hipEventDestroy(g.e));
	HIP_CHECK(hipHostFree(g.a));
	HIP_CHECK(hipHostFree(g.b));
}

int main()
{
	Check c("wait-value");
	int gpus = 0;
	HIP_CHECK(hipGetDeviceCount(&gpus));
	gpus = gpus > MAX_GPUS ? MAX_GPUS : gpus;
	signal(SIGUSR1, on_release);
	signal(SIGTERM, on_release);
	HIP_CHECK(hipHostMalloc(&words, 2 * gpus * sizeof(uint32_t)));
	memset(words, 0, 2 * gpus * sizeof(uint32_t));
	static Gpu g[MAX_GPUS];
	for (int d = 0; d < gpus; d++)
		enqueue(g[d], d);
	usleep(200 * 1000);
	c.expect("both streams of every GPU wait, nothing behind the waits ran", all_held(g, gpus));
	printf("wait-value: %d GPUs waiting\n", gpus);
	fflush(stdout);
	while (!go)
		usleep(10 * 1000);
	c.expect("still nothing ran when released", all_held(g, gpus));
	for (int d = 0; d < gpus; d++)
		__atomic_store_n(&words[2 * d], GO, __ATOMIC_SEQ_CST);
	for (int d = 0; d < gpus; d++)
		check_gpu(c, g[d], d);
	HIP_CHECK(hipHostFree(words));
	return c.finish();
}
