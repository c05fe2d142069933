// SPDX-License-Identifier: MIT
/*
 * shared-bo: one GEM BO held by two render files of one GPU (review item G3, issue 29), as a
 * process gets it when it exports a BO with PRIME and imports the dma-buf on another open of
 * the same render node: amdgpu hands back the same GEM object (not an import), so both files
 * list it, at the same mmap offset.  A checkpoint that saved each holder's copy would
 * restore two BOs, and a write through one file would no longer reach the other.
 *
 *   usage: shared-bo --hold [--kfd | --fork]
 *          shared-bo --dmabuf [--kfd | --orphan | --rdonly]
 *
 * Makes a 64 KiB VRAM BO with GEM_CREATE on a first open of /dev/dri/renderD128, exports it
 * (PRIME_HANDLE_TO_FD), imports it on a second open (PRIME_FD_TO_HANDLE), closes the
 * dma-buf fd, maps the BO through both files (GEM_MMAP) and checks that they are one BO.
 * --kfd: the BO is a KFD BO instead (ALLOC_MEMORY_OF_GPU on the first GPU, whose VM is on
 * the first open: ACQUIRE_VM), exported with AMDKFD_IOC_EXPORT_DMABUF (KFD 1.12) and
 * imported on the second open; the first holder is then /dev/kfd.
 * --fork: a child process also imports the dma-buf, on an open of its own, checks that it
 * reads the first round's bytes ("child PID ok"), then on each SIGUSR1 reads the pattern the
 * parent's last round wrote through its own mapping ("child reads round N: ok", or FAIL when
 * the bytes are not one round's or did not change since its last read: two BOs), and ends
 * on SIGTERM: one BO held by two processes.
 * Prints "ready PID", then on SIGUSR1 checks that the BO still holds the last pattern written,
 * writes a new byte pattern through the first file's mapping and reads it back through the
 * second's ("round N: ok" or "round N: FAIL ..."), and on SIGTERM does that once more and
 * prints PASS or FAIL.
 *
 * --dmabuf: exports the BO the same way and keeps the dma-buf fd (as a HIP IPC exporter or
 * a PRIME client does), moved to fd 0, below the files that hold the BO: prints "ready PID
 * dmabuf FD", then on SIGUSR1
 * writes a new byte pattern through the BO's mapping and reads it back through the dma-buf
 * ("round N: ok"), and on SIGTERM does that once more and prints PASS or FAIL.  Reading
 * through the dma-buf: the fd still reads /dmabuf:, is close-on-exec and read-write as
 * exported, and imported (PRIME_FD_TO_HANDLE) on a second open of the node, made and mapped
 * at the start (a restored process under kfd-emu cannot map files until the supervisor
 * attaches again), it is the handle that open got at the start, whose mapping reads the
 * bytes written through the first open; a GEM BO's dma-buf imported on the first open is its
 * own handle again.
 * --rdonly (with --dmabuf): the GEM BO is exported without DRM_RDWR, as a PRIME client that
 * only reads does: the dma-buf is O_RDONLY, and a shared writable mapping of it fails EACCES
 * (checked once, at the start: a restored process under kfd-emu maps a dma-buf only once the
 * supervisor attaches again); every check then wants the fd O_RDONLY instead of read-write.
 * --orphan (with --dmabuf): the GEM BO's handle is closed and its mapping unmapped once
 * exported, so that only the dma-buf holds the BO; rounds import it on a new open each (kfd-emu
 * cannot map a GEM BO whose last handle was closed, which the kernel can: not checked).
 *
 * PRIME export hands out an fd, which kfd-emu gives only under `kfd-emu supervise`.
 * Raw DRM ioctls only (the uapi headers of Debian's libdrm).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>

#include "kfd-uapi.h"

#define SZ (64u << 10)

static volatile sig_atomic_t round_req, stop_req;

static void on_signal(int sig)
{
	if (sig == SIGTERM)
		stop_req = 1;
	else
		round_req = 1;
}

/* One open of the render node holding the BO: its handle and CPU mapping. */
struct holder {
	int fd;
	uint32_t handle;
	uint64_t offset;
	volatile uint8_t *map;
};

static int fail(const char *what)
{
	printf("FAIL %s: %s\n", what, strerror(errno));
	return -1;
}

static int map_bo(struct holder *h)
{
	union drm_amdgpu_gem_mmap m = { .in.handle = h->handle };

	if (ioctl(h->fd, DRM_IOCTL_AMDGPU_GEM_MMAP, &m))
		return fail("GEM_MMAP");
	h->offset = m.out.addr_ptr;
	void *p = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, (off_t)h->offset);

	if (p == MAP_FAILED)
		return fail("mmap of the BO");
	h->map = p;
	return 0;
}

/* A GEM BO on a, exported with PRIME: the dma-buf fd. */
/* --rdonly: the dma-buf is exported read-only. */
static bool rdonly;

static int gem_export(struct holder *a)
{
	union drm_amdgpu_gem_create c = { .in = { .bo_size = SZ, .alignment = 4096,
						  .domains = AMDGPU_GEM_DOMAIN_VRAM } };
	struct drm_prime_handle ex = { .flags = DRM_CLOEXEC | (rdonly ? 0 : DRM_RDWR) };

	if (ioctl(a->fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &c))
		return fail("GEM_CREATE");
	a->handle = c.out.handle;
	ex.handle = a->handle;
	if (ioctl(a->fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &ex))
		return fail("PRIME_HANDLE_TO_FD (run under kfd-emu supervise?)");
	return map_bo(a) ? -1 : ex.fd;
}

/* A KFD BO of the first GPU, its VM on a (the BO is mapped by the CPU through a, at its
 * mmap offset, at its GPU VA), exported with EXPORT_DMABUF: the dma-buf fd. */
static int kfd_export(struct holder *a)
{
	struct kfd_apertures ap[8];
	struct kfd_apertures_args pa = { .ptr = (uintptr_t)ap, .num_of_nodes = 8 };
	int kfd = open("/dev/kfd", O_RDWR | O_CLOEXEC);

	if (kfd < 0)
		return fail("/dev/kfd");
	if (ioctl(kfd, KFD_GET_PROCESS_APERTURES_NEW, &pa) || !pa.num_of_nodes)
		return fail("GET_PROCESS_APERTURES_NEW");
	struct kfd_acquire_vm_args vm = { .drm_fd = (uint32_t)a->fd, .gpu_id = ap[0].gpu_id };

	if (ioctl(kfd, KFD_ACQUIRE_VM, &vm))
		return fail("ACQUIRE_VM");
	struct kfd_alloc_args al = {
		.va_addr = ap[0].gpuvm_base + (1ull << 30), .size = SZ, .gpu_id = ap[0].gpu_id,
		.flags = KFD_ALLOC_VRAM | KFD_ALLOC_WRITABLE | KFD_ALLOC_PUBLIC };

	if (ioctl(kfd, KFD_ALLOC_MEMORY_OF_GPU, &al))
		return fail("ALLOC_MEMORY_OF_GPU (VRAM)");
	/* At its GPU VA, as libhsakmt maps a KFD BO for the CPU. */
	void *p = mmap((void *)(uintptr_t)al.va_addr, SZ, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_FIXED_NOREPLACE, a->fd, (off_t)al.mmap_offset);

	if (p != (void *)(uintptr_t)al.va_addr)
		return fail("mmap of the KFD BO at its GPU VA");
	a->map = p;
	a->offset = al.mmap_offset;
	struct export_dmabuf_args ex = { .handle = al.handle, .flags = O_CLOEXEC | O_RDWR };

	if (ioctl(kfd, KFD_EXPORT_DMABUF, &ex))
		return fail("AMDKFD_IOC_EXPORT_DMABUF (run under kfd-emu supervise?)");
	return (int)ex.dmabuf_fd;
}

/* The BO on a (a GEM BO, or with kfd a KFD BO), exported and imported on b, mapped through
 * both. */
static int setup(const char *node, bool kfd, struct holder *a, struct holder *b)
{
	struct drm_prime_handle im = { 0 };

	a->fd = open(node, O_RDWR | O_CLOEXEC);
	b->fd = open(node, O_RDWR | O_CLOEXEC);
	if (a->fd < 0 || b->fd < 0)
		return fail(node);
	im.fd = kfd ? kfd_export(a) : gem_export(a);
	if (im.fd < 0)
		return -1;
	if (ioctl(b->fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &im))
		return fail("PRIME_FD_TO_HANDLE on the second open");
	close(im.fd);
	b->handle = im.handle;
	if (map_bo(b))
		return -1;
	if (a->offset != b->offset) {
		printf("FAIL the two opens map the BO at offsets %#llx and %#llx: not one BO\n",
		       (unsigned long long)a->offset, (unsigned long long)b->offset);
		return -1;
	}
	printf("ok one VRAM BO of %s (%s): handle %u in the second open, offset %#llx\n", node,
	       kfd ? "a KFD BO" : "a GEM BO of the first open", b->handle,
	       (unsigned long long)a->offset);
	return 0;
}

/* Writes pattern n through a's mapping, reads it through b's: whether they are one BO.  First
 * (n > 0) the BO must still hold pattern n - 1, the last one written (through a checkpoint:
 * its bytes restored as they were). */
static int check(struct holder *a, struct holder *b, unsigned n)
{
	uint8_t v = (uint8_t)(0x40 + n);
	unsigned i;

	for (i = 0; n && i < SZ; i += 512)
		if (b->map[i] != (uint8_t)((v - 1) ^ (i >> 9))) {
			printf("round %u: FAIL byte %#x reads %#x, not round %u's %#x: the BO's bytes "
			       "changed\n",
			       n, i, b->map[i], n - 1, (uint8_t)((v - 1) ^ (i >> 9)));
			return -1;
		}
	for (i = 0; i < SZ; i += 512)
		a->map[i] = (uint8_t)(v ^ (i >> 9));
	for (i = 0; i < SZ; i += 512) {
		uint8_t got = b->map[i];

		if (got != (uint8_t)(v ^ (i >> 9))) {
			printf("round %u: FAIL byte %#x written through the first open as %#x reads %#x "
			       "through the second: two BOs\n",
			       n, i, (uint8_t)(v ^ (i >> 9)), got);
			return -1;
		}
	}
	return 0;
}

/* Writes pattern n through h's mapping and reads it back. */
static int check_one(struct holder *h, unsigned n)
{
	return check(h, h, n);
}

/* The child's check: its mapping holds one round's pattern (v at byte 0, v ^ (i >> 9) at byte
 * i), a newer one than at its last read. */
static int child_reads(struct holder *c, uint8_t *last)
{
	uint8_t v = c->map[0];
	unsigned i;

	if (v == *last) {
		printf("FAIL child reads round %u's bytes again: the parent's write did not reach it\n",
		       v - 0x40u);
		return -1;
	}
	for (i = 0; i < SZ; i += 512)
		if (c->map[i] != (uint8_t)(v ^ (i >> 9))) {
			printf("FAIL child reads %#x at byte %#x, not round %u's\n", c->map[i], i, v - 0x40u);
			return -1;
		}
	*last = v;
	printf("child reads round %u: ok\n", v - 0x40u);
	return 0;
}

/* --dmabuf: dma-buf fd is still one of a's BO (see the usage); with orphan, a holds nothing
 * and the pattern is written and read through the import. */
static int check_dmabuf(const char *node, struct holder *a, struct holder *b, int fd, unsigned n,
			bool orphan)
{
	char path[64], link[64] = "";
	struct holder c = { .fd = orphan ? open(node, O_RDWR | O_CLOEXEC) : -1 };
	struct drm_prime_handle im = { .fd = fd };
	int rc = -1;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (readlink(path, link, sizeof(link) - 1) < 0 || strncmp(link, "/dmabuf:", 8)) {
		printf("round %u: FAIL fd %d reads %s, not /dmabuf:\n", n, fd, link);
		goto out;
	}
	if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC) ||
	    (fcntl(fd, F_GETFL) & O_ACCMODE) != (rdonly ? O_RDONLY : O_RDWR)) {
		printf("round %u: FAIL dma-buf fd %d is not close-on-exec and %s\n", n, fd,
		       rdonly ? "read-only" : "read-write");
		goto out;
	}
	if (!orphan) {
		if (ioctl(b->fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &im) || im.handle != b->handle) {
			printf("round %u: FAIL the dma-buf imported on the second open is handle %u, not "
			       "%u, the BO's there\n",
			       n, im.handle, b->handle);
			return -1;
		}
		rc = check(a, b, n);
	}
	if (orphan) {
		if (c.fd < 0 || ioctl(c.fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &im)) {
			fail("PRIME_FD_TO_HANDLE of the dma-buf on a new open");
			goto out;
		}
		rc = 0;
	}
	if (!rc && !orphan && a->handle) {
		struct drm_prime_handle again = { .fd = fd };

		if (ioctl(a->fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &again) || again.handle != a->handle) {
			printf("round %u: FAIL the dma-buf imported on the first open is handle %u, "
			       "not its BO's %u\n",
			       n, again.handle, a->handle);
			rc = -1;
		}
	}
out:
	if (c.fd >= 0)
		close(c.fd);
	return rc;
}

/* --rdonly: a shared writable mapping of the read-only dma-buf fails EACCES (do_mmap's check
 * of the file's mode), a read-only one works. */
static int check_rdonly_map(int fd)
{
	void *p = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p != MAP_FAILED || errno != EACCES) {
		printf("FAIL a writable shared mapping of the read-only dma-buf %s\n",
		       p != MAP_FAILED ? "was made" : strerror(errno));
		return -1;
	}
	p = mmap(NULL, SZ, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return fail("read-only mmap of the read-only dma-buf");
	munmap(p, SZ);
	return 0;
}

/* --orphan: a's handle closed and its mapping gone; the dma-buf alone holds the BO. */
static int orphan_bo(struct holder *a)
{
	struct drm_gem_close cl = { .handle = a->handle };

	munmap((void *)a->map, SZ);
	if (ioctl(a->fd, DRM_IOCTL_GEM_CLOSE, &cl))
		return fail("GEM_CLOSE");
	a->handle = 0;
	a->map = NULL;
	return 0;
}

/* --fork: a child holding the BO through an open of its own (a dma-buf of a's BO imported),
 * which reads round 0's bytes and waits for SIGTERM. */
static int fork_holder(const char *node, struct holder *a)
{
	struct drm_prime_handle ex = { .handle = a->handle, .flags = DRM_CLOEXEC | DRM_RDWR };

	if (ioctl(a->fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &ex))
		return fail("PRIME_HANDLE_TO_FD for the child");
	pid_t pid = fork();

	if (pid < 0)
		return fail("fork");
	if (pid > 0) {
		close(ex.fd);
		return 0;
	}
	struct holder c = { .fd = open(node, O_RDWR | O_CLOEXEC) };
	struct drm_prime_handle im = { .fd = ex.fd };
	sigset_t none;

	if (c.fd < 0 || ioctl(c.fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &im))
		_exit(fail("the child's import"));
	close(ex.fd);
	c.handle = im.handle;
	if (map_bo(&c))
		_exit(1);
	if (c.map[512] != (uint8_t)(0x40 ^ 1)) {
		printf("FAIL child %d reads %#x, not round 0's byte\n", (int)getpid(), c.map[512]);
		_exit(1);
	}
	printf("child %d ok\n", (int)getpid());
	sigemptyset(&none);
	uint8_t last = c.map[0];
	while (!stop_req) {
		sigsuspend(&none);
		if (round_req) {
			round_req = 0;
			if (child_reads(&c, &last))
				_exit(1);
		}
	}
	_exit(0);
}

int main(int argc, char **argv)
{
	struct holder a = { 0 }, b = { 0 };
	const char *node = "/dev/dri/renderD128";
	bool kfd = argc == 3 && !strcmp(argv[2], "--kfd");
	bool only = argc >= 2 && !strcmp(argv[1], "--dmabuf");
	bool forked = argc == 3 && !strcmp(argv[2], "--fork");
	bool orphan = only && argc == 3 && !strcmp(argv[2], "--orphan");

	rdonly = only && argc == 3 && !strcmp(argv[2], "--rdonly");
	unsigned n = 0;
	int bad = 0, dmabuf = -1;

	if (argc < 2 || argc > 3 || (strcmp(argv[1], "--hold") && !only) ||
	    (argc == 3 && !kfd && !orphan && !rdonly && !(forked && !only))) {
		fprintf(stderr, "usage: shared-bo --hold [--kfd | --fork] | --dmabuf [--kfd | "
				"--orphan | --rdonly]\n");
		return 2;
	}
	sigset_t block, wait_mask;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGTERM);
	/* Blocked but while waiting in sigsuspend: no request is lost between two checks. */
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	signal(SIGUSR1, on_signal);
	signal(SIGTERM, on_signal);
	if (only) {
		a.fd = open(node, O_RDWR | O_CLOEXEC);
		if (a.fd < 0) {
			fail(node);
			return 1;
		}
		dmabuf = kfd ? kfd_export(&a) : gem_export(&a);
		if (dmabuf < 0 || check_one(&a, 0) || (orphan && orphan_bo(&a)) ||
		    (rdonly && check_rdonly_map(dmabuf)))
			return 1;
		/* At fd 0 (stdin, /dev/null), before the files that hold its BO: CRIU restores
		 * a task's files in fd order, so the dma-buf must wait for its holder. */
		if (dup3(dmabuf, 0, O_CLOEXEC) < 0)
			return fail("dup3 of the dma-buf to fd 0"), 1;
		close(dmabuf);
		dmabuf = 0;
		if (!orphan) {
			struct drm_prime_handle im = { .fd = dmabuf };

			b.fd = open(node, O_RDWR | O_CLOEXEC);
			if (b.fd < 0 || ioctl(b.fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &im)) {
				fail("PRIME_FD_TO_HANDLE of the dma-buf on a second open");
				return 1;
			}
			b.handle = im.handle;
			if (map_bo(&b))
				return 1;
		}
		if (check_dmabuf(node, &a, &b, dmabuf, 0, orphan))
			return 1;
		printf("ready %d dmabuf %d\n", (int)getpid(), dmabuf);
	} else {
		if (setup(node, kfd, &a, &b) || check(&a, &b, 0) ||
		    (forked && fork_holder(node, &a)))
			return 1;
		printf("ready %d\n", (int)getpid());
	}
	while (!stop_req) {
		sigsuspend(&wait_mask);
		if (round_req) {
			round_req = 0;
			n++;
			if (only ? check_dmabuf(node, &a, &b, dmabuf, n, orphan) : check(&a, &b, n))
				bad = 1;
			else
				printf("round %u: ok\n", n);
		}
	}
	bad |= (only ? check_dmabuf(node, &a, &b, dmabuf, n + 1, orphan) : check(&a, &b, n + 1)) != 0;
	printf("%s\n", bad ? "FAIL" : "PASS");
	return bad;
}
