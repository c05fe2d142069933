// SPDX-License-Identifier: GPL-2.0-only
/*
 * A small process tree for the smoke test: a parent and a child holding
 * anonymous memory with a pattern, a regular file at a known offset, and a
 * pipe with unread data in it. After restore, SIGTERM asks the parent to
 * check everything (and to make the child check its part); the verdict goes
 * to the result file: "PASS" or "FAIL: <what>".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MEM_SIZE (32UL << 20)
#define FILE_OFF 12345
static const char first[] = "before-dump;";
static const char second[] = "after-restore;";

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static uint64_t pattern(uint64_t seed, size_t i) { return (i * 0x9e3779b97f4a7c15ULL) ^ seed; }

static void fill(uint64_t *m, uint64_t seed)
{
	for (size_t i = 0; i < MEM_SIZE / 8; i++)
		m[i] = pattern(seed, i);
}

static int check(const uint64_t *m, uint64_t seed)
{
	for (size_t i = 0; i < MEM_SIZE / 8; i++)
		if (m[i] != pattern(seed, i))
			return -1;
	return 0;
}

/*
 * SIGTERM stays blocked outside sigsuspend(): a signal arriving between the
 * test of 'stop' and the call would otherwise be taken early and then wait
 * forever for a second one.
 */
static void wait_for_term(void)
{
	sigset_t open;

	sigemptyset(&open);
	while (!stop)
		sigsuspend(&open);
}

static int child(int rfd)
{
	uint64_t *m = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char buf[64] = {0};
	size_t want = strlen(first) + strlen(second), got = 0;

	if (m == MAP_FAILED)
		return 2;
	fill(m, 0xc0ffee);
	wait_for_term();
	if (check(m, 0xc0ffee))
		return 3;
	while (got < want) {
		ssize_t n = read(rfd, buf + got, want - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 4;
		got += n;
	}
	if (strncmp(buf, first, strlen(first)) || strcmp(buf + strlen(first), second))
		return 5;
	return 0;
}

static int verdict(const char *path, const char *fmt, ...)
{
	FILE *f = fopen(path, "w");
	va_list ap;

	if (!f)
		return 1;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
	return strncmp(fmt, "PASS", 4) != 0;
}

int main(int argc, char **argv)
{
	const char *data, *ready, *result;
	char buf[4096];
	int p[2], fd, status;
	uint64_t *m;
	sigset_t term;
	pid_t pid;

	if (argc != 4) {
		fprintf(stderr, "usage: %s DATAFILE READYFILE RESULTFILE\n", argv[0]);
		return 2;
	}
	data = argv[1];
	ready = argv[2];
	result = argv[3];
	signal(SIGTERM, on_term);
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	sigprocmask(SIG_BLOCK, &term, NULL);
	/* Whatever the caller leaked to us (fds from other mount namespaces) is not ours to dump. */
	close_range(3, ~0U, 0);
	/* A session of its own, so CRIU needs no --shell-job. */
	if (getsid(0) != getpid() && setsid() < 0)
		return verdict(result, "FAIL: setsid: %s", strerror(errno));

	if (pipe(p))
		return verdict(result, "FAIL: pipe: %s", strerror(errno));
	pid = fork();
	if (pid == 0) {
		close(p[1]);
		_exit(child(p[0]));
	}
	close(p[0]);

	m = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return verdict(result, "FAIL: mmap: %s", strerror(errno));
	fill(m, 0xfeed);
	fd = open(data, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, 2 * FILE_OFF) || pwrite(fd, "marker", 6, FILE_OFF) != 6 ||
	    lseek(fd, FILE_OFF, SEEK_SET) != FILE_OFF)
		return verdict(result, "FAIL: data file: %s", strerror(errno));
	if (write(p[1], first, strlen(first)) != (ssize_t)strlen(first))
		return verdict(result, "FAIL: pipe write");
	/* The ready file carries the root pid, written whole by a rename. */
	snprintf(buf, sizeof(buf), "%s.tmp", ready);
	{
		FILE *f = fopen(buf, "w");

		if (!f || fprintf(f, "%d\n", getpid()) < 0 || fclose(f) || rename(buf, ready))
			return verdict(result, "FAIL: ready file: %s", strerror(errno));
	}

	wait_for_term();

	if (check(m, 0xfeed))
		return verdict(result, "FAIL: parent memory pattern changed");
	if (lseek(fd, 0, SEEK_CUR) != FILE_OFF)
		return verdict(result, "FAIL: file offset is %ld, not %d", (long)lseek(fd, 0, SEEK_CUR), FILE_OFF);
	if (read(fd, buf, 6) != 6 || memcmp(buf, "marker", 6))
		return verdict(result, "FAIL: file contents at the offset changed");
	if (write(p[1], second, strlen(second)) != (ssize_t)strlen(second))
		return verdict(result, "FAIL: pipe write after restore");
	kill(pid, SIGTERM);
	if (waitpid(pid, &status, 0) != pid)
		return verdict(result, "FAIL: child %d is gone: %s", pid, strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return verdict(result, "FAIL: child check failed (status 0x%x)", status);
	return verdict(result, "PASS");
}
