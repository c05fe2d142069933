/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A child process for criu-rocm's zdtm tests of process trees (gpu_fork,
 * gpu_rocr_tree): the child sets its GPU state up and says so over a pipe,
 * and the parent waits for that before it lets zdtm dump, so that the dump
 * finds both set up; end-of-file on the pipe means the child died first.
 */
#ifndef ZDTM_GPU_CHILD_H
#define ZDTM_GPU_CHILD_H

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zdtmtst.h"

struct gpu_child {
	pid_t pid;
	int ready[2];
};

/*
 * Forks: 0 in the child (c->pid == 0) and in the parent (c->pid > 0), -1
 * (logged) when it cannot.
 */
static inline int gpu_child_fork(struct gpu_child *c)
{
	if (pipe(c->ready)) {
		pr_perror("pipe");
		return -1;
	}
	c->pid = fork();
	if (c->pid < 0) {
		pr_perror("fork");
		close(c->ready[0]);
		close(c->ready[1]);
		return -1;
	}
	close(c->ready[c->pid == 0 ? 0 : 1]);
	return 0;
}

/* In the child, once its state is set up: tells the parent (exits 3 when it cannot). */
static inline void gpu_child_ready(struct gpu_child *c)
{
	char ok = 0;

	if (write(c->ready[1], &ok, 1) != 1)
		_exit(3);
	close(c->ready[1]);
}

/* In the parent: waits until the child is set up; -1 (logged) when it died first. */
static inline int gpu_child_wait_ready(struct gpu_child *c, const char *what)
{
	char ok;
	ssize_t n = read(c->ready[0], &ok, 1);

	close(c->ready[0]);
	if (n != 1) {
		pr_err("the child failed its %s setup\n", what);
		return -1;
	}
	return 0;
}

/* In the parent: tells the child to check its state and end (zdtm's SIGTERM); -1 (logged). */
static inline int gpu_child_stop(struct gpu_child *c)
{
	if (kill(c->pid, SIGTERM)) {
		pr_perror("cannot signal the child %d", c->pid);
		return -1;
	}
	return 0;
}

/* In the parent: reaps the child; -1 (with a FAIL line naming `what`) unless it exited 0. */
static inline int gpu_child_reap(struct gpu_child *c, const char *what)
{
	int status;

	if (waitpid(c->pid, &status, 0) != c->pid) {
		pr_perror("waitpid %d", c->pid);
		return -1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		errno = 0;
		fail("the child's %s failed (status %#x; its FAIL line is above)", what, status);
		return -1;
	}
	return 0;
}

/* In the parent, on a failure: kills and reaps the child. */
static inline void gpu_child_kill(struct gpu_child *c)
{
	int status;

	kill(c->pid, SIGKILL);
	waitpid(c->pid, &status, 0);
}

#endif /* ZDTM_GPU_CHILD_H */
