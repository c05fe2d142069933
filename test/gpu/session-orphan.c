/*
 * session-orphan: a process tree whose restore makes CRIU fork a helper task (test/gpu/run.sh,
 * case restore_killed_forking).
 *
 *   usage: session-orphan PROGRAM [ARG...]
 *
 * This process becomes a child subreaper. A child of it starts a session of its own
 * (setsid), forks PROGRAM in that session and exits: PROGRAM is reparented to this process,
 * while its session and process group leader is gone. CRIU's restore of the tree forks a
 * helper task in the dead leader's place (the same pid) to start the session, forks PROGRAM
 * from it and ends the helper once the tasks are restored.
 *
 * Prints "session-orphan: leader L gone, PROGRAM pid P in its session" to stderr once the
 * leader is reaped, then reaps children until it gets SIGTERM.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* In the session leader: PROGRAM forked in the new session, its pid written to fd out. */
static void lead_session(int out, char **argv)
{
	pid_t p;

	if (setsid() < 0) {
		perror("session-orphan: setsid");
		_exit(1);
	}
	p = fork();
	if (p < 0) {
		perror("session-orphan: fork");
		_exit(1);
	}
	if (p == 0) {
		close(out);
		execvp(argv[0], argv);
		perror("session-orphan: exec");
		_exit(127);
	}
	_exit(write(out, &p, sizeof(p)) == sizeof(p) ? 0 : 1);
}

int main(int argc, char **argv)
{
	int fds[2], st;
	pid_t leader, prog;

	if (argc < 2) {
		fprintf(stderr, "usage: session-orphan PROGRAM [ARG...]\n");
		return 2;
	}
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) || pipe(fds)) {
		perror("session-orphan: subreaper or pipe");
		return 1;
	}
	leader = fork();
	if (leader < 0) {
		perror("session-orphan: fork");
		return 1;
	}
	if (leader == 0) {
		close(fds[0]);
		lead_session(fds[1], argv + 1);
	}
	close(fds[1]);
	if (read(fds[0], &prog, sizeof(prog)) != sizeof(prog) || waitpid(leader, &st, 0) != leader ||
	    !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "session-orphan: the session leader %d failed\n", leader);
		return 1;
	}
	close(fds[0]);
	fprintf(stderr, "session-orphan: leader %d gone, PROGRAM pid %d in its session\n", leader, prog);
	for (;;)
		if (wait(NULL) < 0 && errno == ECHILD)
			sleep(1);
}
