// HIP 6.4 IPC: one process exports a device buffer (hipIpcGetMemHandle), another opens it
// (hipIpcOpenMemHandle) and reads it; for test/rocm64/run.sh's IPC cases (built there by the
// chroot's hipcc beside test/hip's check.h):
//   ipc-mem export FILE [--expect S]   allocates a buffer on device 0, fills it by a kernel
//                         (seed 1), writes its IPC handle to FILE, prints "ipc-mem: exported"
//                         and waits for SIGUSR1; then checks the buffer against seed S
//                         (default 1: as it wrote it; an importer may have written it), fills
//                         it again with seed 2 (which an importer started after that reads),
//                         checks it, prints "ipc-mem: refilled" and ends at the next SIGUSR1
//   ipc-mem import FILE [--seed S] [--hold] [--write W]   opens the handle of FILE, checks
//                         the buffer against seed S (default 1); with --hold prints "ipc-mem:
//                         imported" and waits for SIGUSR1, then checks it again and, with
//                         --write, fills it by a kernel of its own with seed W and checks that
//                         (the kernel run once on a buffer of its own before the wait)
// Prints one line per check; exits 0 when everything matched, 1 on a mismatch, 2 on a HIP
// error.
#include "check.h"
#include <csignal>
#include <unistd.h>

constexpr size_t N = 1 << 18; // 1 MiB of words

__host__ __device__ unsigned word(size_t i, unsigned seed)
{
	return unsigned(i) * 2654435761u ^ seed;
}

__global__ void fill(unsigned *p, unsigned seed)
{
	size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
	if (i < N)
		p[i] = word(i, seed);
}

static volatile sig_atomic_t go;
static void on_usr1(int)
{
	go = 1;
}

// The mask main waits in: SIGUSR1 is blocked in every thread from the start (ROCr's threads
// inherit main's mask), so only main's sigsuspend takes it. Blocked only around the wait, a
// SIGUSR1 that came while main was not in sigsuspend went to a ROCr thread: main then slept
// on. So it did when one came right after a restored main was let go (SIGCONT), before it
// had entered its sigsuspend again, restarted with SIGUSR1 blocked.
static sigset_t waiting;

static void block_usr1()
{
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, &waiting);
	sigdelset(&waiting, SIGUSR1);
}

static void wait_usr1()
{
	while (!go)
		sigsuspend(&waiting);
}

static long mismatches(const unsigned *dev, unsigned seed)
{
	static unsigned host[N];
	HIP_CHECK(hipMemcpy(host, dev, sizeof(host), hipMemcpyDeviceToHost));
	long bad = 0;
	for (size_t i = 0; i < N; i++)
		bad += host[i] != word(i, seed);
	return bad;
}

static void fill_and_check(Check &c, unsigned *dev, unsigned seed, const char *what)
{
	fill<<<N / 256, 256>>>(dev, seed);
	HIP_CHECK(hipGetLastError());
	HIP_CHECK(hipDeviceSynchronize());
	c.report(what, mismatches(dev, seed), N);
}

static int exporter(const char *file, unsigned expect)
{
	Check c("ipc-mem");
	unsigned *dev;
	hipIpcMemHandle_t h;
	HIP_CHECK(hipMalloc(&dev, N * sizeof(unsigned)));
	fill_and_check(c, dev, 1, "exporter fills the buffer (seed 1)");
	HIP_CHECK(hipIpcGetMemHandle(&h, dev));
	FILE *f = fopen(file, "wb");
	if (!f || fwrite(&h, sizeof(h), 1, f) != 1 || fclose(f)) {
		perror(file);
		return 2;
	}
	printf("ipc-mem: exported\n");
	fflush(stdout);
	wait_usr1();
	c.report("exporter's buffer after the wait (as the last writer left it)", mismatches(dev, expect), N);
	go = 0;
	fill_and_check(c, dev, 2, "exporter fills the buffer again (seed 2)");
	printf("ipc-mem: refilled\n");
	fflush(stdout);
	wait_usr1();
	HIP_CHECK(hipFree(dev));
	return c.finish();
}

static int importer(const char *file, unsigned seed, bool hold, unsigned write)
{
	Check c("ipc-mem");
	hipIpcMemHandle_t h;
	void *dev;
	FILE *f = fopen(file, "rb");
	if (!f || fread(&h, sizeof(h), 1, f) != 1) {
		perror(file);
		return 2;
	}
	fclose(f);
	HIP_CHECK(hipIpcOpenMemHandle(&dev, h, hipIpcMemLazyEnablePeerAccess));
	if (write) {
		// The kernel loaded now, on a buffer of its own: the write after the wait
		// only launches it.
		unsigned *own;
		HIP_CHECK(hipMalloc(&own, N * sizeof(unsigned)));
		fill_and_check(c, own, write, "importer's kernel on a buffer of its own");
		HIP_CHECK(hipFree(own));
	}
	c.report("importer reads the exporter's buffer", mismatches((unsigned *)dev, seed), N);
	if (hold) {
		printf("ipc-mem: imported\n");
		fflush(stdout);
		wait_usr1();
		c.report("importer's view after the wait", mismatches((unsigned *)dev, seed), N);
		if (write)
			fill_and_check(c, (unsigned *)dev, write, "importer writes the exporter's buffer");
	}
	HIP_CHECK(hipIpcCloseMemHandle(dev));
	return c.finish();
}

int main(int argc, char **argv)
{
	setvbuf(stdout, nullptr, _IOLBF, 0);
	signal(SIGUSR1, on_usr1);
	block_usr1();
	unsigned seed = 1, write = 0;
	bool hold = false;
	for (int i = 3; i < argc; i++) {
		if (!strcmp(argv[i], "--hold"))
			hold = true;
		else if ((!strcmp(argv[i], "--seed") || !strcmp(argv[i], "--expect")) && i + 1 < argc)
			seed = strtoul(argv[++i], nullptr, 0);
		else if (!strcmp(argv[i], "--write") && i + 1 < argc)
			write = strtoul(argv[++i], nullptr, 0);
	}
	if (argc >= 3 && !strcmp(argv[1], "export"))
		return exporter(argv[2], seed);
	if (argc >= 3 && !strcmp(argv[1], "import"))
		return importer(argv[2], seed, hold, write);
	fprintf(stderr, "usage: ipc-mem export FILE [--expect S] | import FILE [--seed S] [--hold] [--write W]\n");
	return 2;
}
