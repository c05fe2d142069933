// A HIP process that holds state across checkpoints (test/hip-cr/run.sh).
//
//   hold [--buffers] [--host] [--streams] [--peer] [--spin] [--fork]
//
// After hipInit it sets up what its options ask for on every GPU it sees (hip_state.h:
// --buffers device memory, --host hipHostMalloc and hipHostRegister memory, --streams three
// streams with events, --peer peer access from GPU 0 with its buffer, --spin a kernel
// spinning on a host flag, in flight between rounds; nothing but HIP's own
// state without any); --fork forks before hipInit, and parent and child each do all of it.
// It writes "hold: ready: N GPU(s)" and waits for signals: SIGUSR1 runs a round (everything
// it holds still has the contents it last wrote, then new kernels on every GPU and stream,
// a new allocation, all checked on the host), writing "hold: round R: ok" (or FAIL with
// the first difference); SIGTERM runs a last round, frees everything and ends with
// "hold: PASSED" and status 0, or "hold: FAILED" and 1 (2 on a HIP error). A child writes
// "hold (child)" instead of "hold"; the parent passes SIGTERM on to it, waits for it and
// fails when it failed.
#include "../zdtm/static/hip_state.h"

#include <csignal>
#include <cstdio>
#include <sys/wait.h>
#include <unistd.h>

static bool parse(int argc, char **argv, State &st, bool &with_child)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--buffers"))
			st.buffers = true;
		else if (!strcmp(argv[i], "--host"))
			st.host = true;
		else if (!strcmp(argv[i], "--streams"))
			st.streams = true;
		else if (!strcmp(argv[i], "--spin"))
			st.spin = true;
		else if (!strcmp(argv[i], "--peer"))
			st.peer = st.buffers = true;
		else if (!strcmp(argv[i], "--fork"))
			with_child = true;
		else
			return false;
	}
	return true;
}

// Waits for SIGUSR1 (a round) or SIGTERM (the last round); returns the signal.
static int next_signal(const sigset_t &set)
{
	int sig = -1;
	while (sigwait(&set, &sig))
		;
	return sig;
}

static const char *who = "hold";

static void hip_state_fail(const char *file, int line, const char *call, hipError_t err)
{
	fprintf(stderr, "%s: %s:%d: %s: %s\n", who, file, line, call, hipGetErrorString(err));
	exit(2);
}

int main(int argc, char **argv)
{
	State st;
	bool with_child = false;
	if (!parse(argc, argv, st, with_child)) {
		fprintf(stderr, "usage: hold [--buffers] [--host] [--streams] [--peer] [--spin] [--fork]\n");
		return 2;
	}
	// Blocked before anything starts a thread: the signals wait for sigwait below.
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, nullptr);
	pid_t child = 0;
	if (with_child && (child = fork()) == 0)
		who = "hold (child)";
	if (child < 0) {
		perror("fork");
		return 2;
	}
	hs_setup(st);
	printf("%s: ready: %d GPU(s), pid %d\n", who, st.gpus, getpid());
	fflush(stdout);
	const char *why = nullptr;
	char buf[256];
	for (;;) {
		int sig = next_signal(set);
		if (sig == SIGTERM && child > 0)
			kill(child, SIGTERM); // the child ends with its parent
		const char *r = hs_round(st, buf, sizeof buf);
		printf("%s: round %d: %s%s\n", who, st.round, r ? "FAIL: " : "ok", r ? r : "");
		fflush(stdout);
		if (r && !why)
			why = strdup(r);
		if (sig == SIGTERM)
			break;
	}
	hs_teardown(st);
	if (child > 0) {
		int status = 0;
		if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
			why = why ? why : "the child failed";
	}
	printf("%s: %s\n", who, why ? "FAILED" : "PASSED");
	fflush(stdout);
	return why ? 1 : 0;
}
