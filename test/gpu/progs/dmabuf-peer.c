// SPDX-License-Identifier: MIT
/*
 * dmabuf-peer: a dma-buf fd whose BO another process holds (issue 29), as a PRIME client gets
 * one from its peer: a parent makes a 64 KiB VRAM GEM BO on /dev/dri/renderD128, exports it
 * (PRIME_HANDLE_TO_FD) and forks; the child closes its copy of the render file and keeps the
 * dma-buf alone. A dump of the child alone saves no file that holds the BO, so it cannot
 * restore the dma-buf by exporting its BO again: test/gpu/run.sh's
 * gem_dmabuf_fd_peer_refused checks that the dump refuses, naming the process, fd and why,
 * and that the child runs on.
 *
 *   usage: dmabuf-peer       (under kfd-emu supervise, which hands out the dma-buf fd)
 *
 * The child prints "ready PID dmabuf FD parent PPID", one line naming both processes: the
 * suite reads the parent's pid from the line it waits for, never from a line the parent may
 * not have written yet. On SIGUSR1 the child checks that its fd still reads /dmabuf: and
 * prints "alive N" (or "FAIL ..."); both end on SIGTERM, the child printing PASS. Raw DRM
 * ioctls only (the uapi headers of Debian's libdrm).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <drm.h>
#include <amdgpu_drm.h>

static volatile sig_atomic_t round_req, stop_req;

static void on_signal(int sig)
{
	if (sig == SIGTERM)
		stop_req = 1;
	else
		round_req = 1;
}

static int fail(const char *what)
{
	printf("FAIL %s: %s\n", what, strerror(errno));
	return 1;
}

/* The child: the dma-buf fd alone; a check per SIGUSR1, PASS on SIGTERM. */
static int child(int dfd, pid_t parent, const sigset_t *wait_mask)
{
	char link[64], path[64];
	unsigned int n = 0;
	ssize_t len;

	printf("ready %d dmabuf %d parent %d\n", getpid(), dfd, parent);
	while (!stop_req) {
		sigsuspend(wait_mask);
		if (!round_req)
			continue;
		round_req = 0;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", dfd);
		len = readlink(path, link, sizeof(link) - 1);
		if (len < 0)
			return fail("readlink of the dma-buf fd");
		link[len] = 0;
		if (strcmp(link, "/dmabuf:")) {
			printf("FAIL the dma-buf fd reads %s\n", link);
			return 1;
		}
		printf("alive %u\n", ++n);
	}
	printf("PASS\n");
	return 0;
}

int main(void)
{
	union drm_amdgpu_gem_create c = { .in = { .bo_size = 64u << 10, .alignment = 4096,
						  .domains = AMDGPU_GEM_DOMAIN_VRAM } };
	struct drm_prime_handle ex = { .flags = DRM_CLOEXEC | DRM_RDWR };
	struct sigaction sa = { .sa_handler = on_signal };
	sigset_t block, wait_mask;
	pid_t pid, parent = getpid();
	int fd;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGTERM);
	/*
	 * Blocked in both processes (the child inherits the mask) but while they wait in
	 * sigsuspend: a signal sent before a process reaches its wait stays pending, where
	 * pause() would have slept through it.
	 */
	sigprocmask(SIG_BLOCK, &block, &wait_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail("/dev/dri/renderD128");
	if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &c))
		return fail("GEM_CREATE");
	ex.handle = c.out.handle;
	if (ioctl(fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &ex))
		return fail("PRIME_HANDLE_TO_FD (run under kfd-emu supervise?)");
	pid = fork();
	if (pid < 0)
		return fail("fork");
	if (pid == 0) {
		close(fd);
		return child(ex.fd, parent, &wait_mask);
	}
	close(ex.fd);
	while (!stop_req)
		sigsuspend(&wait_mask);
	return 0;
}
