// SPDX-License-Identifier: MIT
/*
 * dmabuf-map: a CPU mapping of a dma-buf is the BO's own memory (issue 29), as amdgpu maps
 * one: a KFD VRAM BO of the first GPU (its VM on an open of /dev/dri/renderD128, mapped by
 * the CPU through that open at its GPU VA, as libhsakmt maps it), exported with
 * AMDKFD_IOC_EXPORT_DMABUF and the dma-buf fd kept.
 *
 *   usage: dmabuf-map [--hold]
 *
 * Each round maps the dma-buf (64 KiB at offset 0, and its second page alone), writes a
 * pattern through the BO's mapping and reads it through the dma-buf's, writes another through
 * the dma-buf's and reads it through the BO's, checks that the BO still held the last round's
 * bytes, and unmaps the dma-buf: "round N: ok" or "round N: FAIL ...".  Round 0 runs at the
 * start, then "ready PID"; a round on each SIGUSR1; on SIGTERM one more and PASS or FAIL.
 * --hold: the first mapping of the dma-buf is kept (from round 0 on): a process holding it.
 *
 * EXPORT_DMABUF hands out an fd, which kfd-emu gives only under `kfd-emu supervise`.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kfd-uapi.h"

#define SZ (64u << 10)
#define PAGE 4096u

static volatile sig_atomic_t round_req, stop_req;

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		round_req = 1;
	else
		stop_req = 1;
}

static int fail(const char *what)
{
	printf("FAIL %s: %m\n", what);
	return -1;
}

/* The BO, mapped at its GPU VA through an open of the render node; returns the dma-buf fd. */
static int export_bo(volatile uint8_t **bo)
{
	struct kfd_apertures ap[8];
	struct kfd_apertures_args pa = { .ptr = (uintptr_t)ap, .num_of_nodes = 8 };
	int kfd = open("/dev/kfd", O_RDWR | O_CLOEXEC);
	int r = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);

	if (kfd < 0 || r < 0)
		return fail("open /dev/kfd and /dev/dri/renderD128");
	if (ioctl(kfd, KFD_GET_PROCESS_APERTURES_NEW, &pa) || !pa.num_of_nodes)
		return fail("GET_PROCESS_APERTURES_NEW");
	struct kfd_acquire_vm_args vm = { .drm_fd = (uint32_t)r, .gpu_id = ap[0].gpu_id };

	if (ioctl(kfd, KFD_ACQUIRE_VM, &vm))
		return fail("ACQUIRE_VM");
	struct kfd_alloc_args al = {
		.va_addr = ap[0].gpuvm_base + (1ull << 30), .size = SZ, .gpu_id = ap[0].gpu_id,
		.flags = KFD_ALLOC_VRAM | KFD_ALLOC_WRITABLE | KFD_ALLOC_PUBLIC };

	if (ioctl(kfd, KFD_ALLOC_MEMORY_OF_GPU, &al))
		return fail("ALLOC_MEMORY_OF_GPU (VRAM)");
	void *p = mmap((void *)(uintptr_t)al.va_addr, SZ, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_FIXED_NOREPLACE, r, (off_t)al.mmap_offset);

	if (p != (void *)(uintptr_t)al.va_addr)
		return fail("mmap of the BO at its GPU VA");
	*bo = p;
	struct export_dmabuf_args ex = { .handle = al.handle, .flags = O_CLOEXEC | O_RDWR };

	if (ioctl(kfd, KFD_EXPORT_DMABUF, &ex))
		return fail("AMDKFD_IOC_EXPORT_DMABUF (run under kfd-emu supervise?)");
	return (int)ex.dmabuf_fd;
}

/* Whether `len` bytes at p all hold v. */
static bool all(volatile const uint8_t *p, size_t len, uint8_t v)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != v)
			return false;
	return true;
}

/* Round n (see the usage); with hold, *kept is the mapping kept (made at round 0). */
static int round_n(volatile uint8_t *bo, int fd, unsigned n, bool hold, volatile uint8_t **kept)
{
	uint8_t to_db = (uint8_t)(0x10 + 2 * n), to_bo = (uint8_t)(0x11 + 2 * n);
	volatile uint8_t *db = *kept, *second;

	if (n && !all(bo, SZ, (uint8_t)(0x11 + 2 * (n - 1))))
		return printf("round %u: FAIL the BO lost round %u's bytes\n", n, n - 1), -1;
	if (!db) {
		void *p = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		if (p == MAP_FAILED)
			return printf("round %u: FAIL mmap of the dma-buf: %m\n", n), -1;
		db = p;
	}
	void *q = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, PAGE);

	if (q == MAP_FAILED)
		return printf("round %u: FAIL mmap of the dma-buf's second page: %m\n", n), -1;
	second = q;
	memset((void *)bo, to_db, SZ);
	int rc = 0;

	if (!all(db, SZ, to_db) || !all(second, PAGE, to_db)) {
		printf("round %u: FAIL a write through the BO is not seen through the dma-buf\n", n);
		rc = -1;
	}
	memset((void *)db, to_bo, SZ);
	if (!rc && !all(bo, SZ, to_bo)) {
		printf("round %u: FAIL a write through the dma-buf is not seen through the BO\n", n);
		rc = -1;
	}
	munmap(q, PAGE);
	if (hold)
		*kept = db;
	else
		munmap((void *)db, SZ);
	return rc;
}

int main(int argc, char **argv)
{
	bool hold = argc == 2 && !strcmp(argv[1], "--hold");
	volatile uint8_t *bo = NULL, *kept = NULL;
	unsigned n = 0;
	int bad = 0;
	sigset_t block, wait_mask;

	if (argc > 2 || (argc == 2 && !hold)) {
		fprintf(stderr, "usage: dmabuf-map [--hold]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGTERM);
	/* Blocked but while waiting in sigsuspend: no request is lost between two checks. */
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	signal(SIGUSR1, on_signal);
	signal(SIGTERM, on_signal);
	int fd = export_bo(&bo);

	if (fd < 0 || round_n(bo, fd, 0, hold, &kept))
		return 1;
	printf("round 0: ok\nready %d\n", (int)getpid());
	while (!stop_req) {
		sigsuspend(&wait_mask);
		if (round_req) {
			round_req = 0;
			n++;
			if (round_n(bo, fd, n, hold, &kept))
				bad = 1;
			else
				printf("round %u: ok\n", n);
		}
	}
	bad |= round_n(bo, fd, n + 1, hold, &kept) != 0;
	printf("%s\n", bad ? "FAIL" : "PASS");
	return bad;
}
