// bench-hip: the HIP process of scripts/bench-hip.sh (Debian's HIP 5.2, unchanged, on kfd-emu).
// It holds N MiB of device memory (hipMalloc: VRAM), filled with a pattern that depends on the
// offset (no zero pages, nothing two pages share), and, unless --idle, one kernel in flight:
// BLOCKS workgroups of BLOCK work-items computing (registers, LDS, barriers) until the host's
// stop word is set, so that a dump finds live waves to save.
//
//   usage: bench-hip MIB [--idle]     (MIB may be 0: no device memory beyond HIP's own)
//
// Prints {"ready":true,"pid":P,"mib":N} once the memory is filled and every wave of the kernel
// has started. SIGUSR1 stops the kernel, waits for its end, checks that each wave started and
// ended exactly once (a kernel started over after a restore would count again) and every byte
// of the device memory, prints {"ok":true|false,"pid":P,"bytes":B} and waits to be killed.
// The host memory the fill and the check need is a staging buffer freed after each, so the
// dump holds no copy of the device memory. Run it with setsid, stdin from /dev/null and stdout
// to a file.
#include "../test/hip/check.h"

#include <csignal>
#include <unistd.h>

constexpr int BLOCK = 256;
constexpr int BLOCKS = 2;
constexpr uint32_t WAVES = BLOCKS * BLOCK / 64;
constexpr size_t CHUNK = 8u << 20;

// The host's words: stop set by SIGUSR1; waves counted in and out.
struct Words {
	uint32_t stop, started, ended;
};

__global__ void spin(volatile Words *w, uint32_t *out)
{
	__shared__ uint32_t lds[BLOCK];
	__shared__ uint32_t stop;
	uint32_t t = threadIdx.x, x = blockIdx.x * BLOCK + t + 1;
	if (t % 64 == 0)
		atomicAdd_system((uint32_t *)&w->started, 1u);
	for (;;) {
		if (t == 0)
			stop = w->stop;
		__syncthreads();
		if (stop)
			break;
		for (int i = 0; i < 16; i++)
			x = x * 1664525u + 1013904223u;
		lds[t] = x;
		__syncthreads();
		x ^= lds[(t + 1) % BLOCK] >> 7;
	}
	out[blockIdx.x * BLOCK + t] = x;
	if (t % 64 == 0)
		atomicAdd_system((uint32_t *)&w->ended, 1u);
}

static uint64_t pattern(uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL;
	return x ^ (x >> 31);
}

// Fills (check false) or checks the device memory through a staging buffer; returns the
// bytes that are intact from the start (all of them when nothing differs).
static size_t fill_or_check(uint64_t *dev, size_t bytes, bool check)
{
	uint64_t *h = (uint64_t *)malloc(CHUNK);
	if (!h) {
		fprintf(stderr, "bench-hip: out of host memory\n");
		exit(2);
	}
	size_t done = 0;
	while (done < bytes) {
		size_t n = bytes - done < CHUNK ? bytes - done : CHUNK, w0 = done / 8;
		if (check) {
			HIP_CHECK(hipMemcpy(h, dev + w0, n, hipMemcpyDeviceToHost));
			for (size_t i = 0; i < n / 8; i++)
				if (h[i] != pattern(w0 + i)) {
					free(h);
					return (w0 + i) * 8;
				}
		} else {
			for (size_t i = 0; i < n / 8; i++)
				h[i] = pattern(w0 + i);
			HIP_CHECK(hipMemcpy(dev + w0, h, n, hipMemcpyHostToDevice));
		}
		done += n;
	}
	free(h);
	return bytes;
}

static volatile sig_atomic_t go;
static void on_usr1(int) { go = 1; }

// Waits (at most a minute) until every wave counted itself in.
static bool all_started(const Words *w)
{
	for (int t = 0; t < 6000; t++, usleep(10 * 1000))
		if (__atomic_load_n(&w->started, __ATOMIC_SEQ_CST) == WAVES)
			return true;
	return false;
}

int main(int argc, char **argv)
{
	char *end = nullptr;
	long mib = argc > 1 ? strtol(argv[1], &end, 10) : -1;
	bool idle = argc > 2 && !strcmp(argv[2], "--idle");
	if (argc < 2 || argc > 3 || *end || mib < 0 || (argc == 3 && !idle)) {
		fprintf(stderr, "usage: bench-hip MIB [--idle]\n");
		return 2;
	}
	size_t bytes = (size_t)mib << 20;
	signal(SIGUSR1, on_usr1);
	uint64_t *dev = nullptr;
	if (bytes) {
		HIP_CHECK(hipMalloc(&dev, bytes));
		fill_or_check(dev, bytes, false);
	}
	Words *w = nullptr;
	uint32_t *out = nullptr;
	hipStream_t s = nullptr;
	if (!idle) {
		HIP_CHECK(hipHostMalloc(&w, sizeof(Words), hipHostMallocPortable));
		memset(w, 0, sizeof(Words));
		HIP_CHECK(hipMalloc(&out, BLOCKS * BLOCK * sizeof(uint32_t)));
		HIP_CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
		hipLaunchKernelGGL(spin, dim3(BLOCKS), dim3(BLOCK), 0, s, w, out);
		HIP_CHECK(hipGetLastError());
		if (!all_started(w)) {
			fprintf(stderr, "bench-hip: the kernel's waves did not all start within a minute\n");
			return 1;
		}
	}
	printf("{\"ready\":true,\"pid\":%d,\"mib\":%ld}\n", (int)getpid(), mib);
	fflush(stdout);
	while (!go)
		usleep(10 * 1000);
	bool ok = true;
	if (!idle) {
		ok = hipStreamQuery(s) == hipErrorNotReady; // still running when told to stop
		__atomic_store_n(&w->stop, 1u, __ATOMIC_SEQ_CST);
		HIP_CHECK(hipStreamSynchronize(s));
		ok = ok && w->started == WAVES && w->ended == WAVES;
	}
	size_t intact = bytes ? fill_or_check(dev, bytes, true) : 0;
	ok = ok && intact == bytes;
	printf("{\"ok\":%s,\"pid\":%d,\"bytes\":%zu}\n", ok ? "true" : "false", (int)getpid(), intact);
	fflush(stdout);
	for (;;)
		pause(); // killed by the bench
}
