// SPDX-License-Identifier: GPL-2.0-only
/*
 * SIGUSR1 rounds of criu-rocm's zdtm tests on ROCm; see gpu_round.h.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_round.h"

static volatile sig_atomic_t rounds_asked;
static const char *round_who;

static void ask_round(int sig)
{
	(void)sig;
	rounds_asked++;
}

int gpu_rounds_init(const char *who)
{
	struct sigaction sa;

	round_who = who;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = ask_round;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL)) {
		pr_perror("cannot handle SIGUSR1");
		return -1;
	}
	return 0;
}

int gpu_wait_rounds(int (*round)(void *arg, unsigned int n), void *arg)
{
	unsigned int done = 0;
	int ret = 0, bad;

	while (test_go()) {
		if (done == (unsigned int)rounds_asked) {
			usleep(20000);
			continue;
		}
		done++;
		bad = round(arg, done);
		if (bad)
			ret = -1;
		test_msg("round %u%s%s%s: %s\n", done, round_who ? " (" : "", round_who ?: "", round_who ? ")" : "",
			 bad ? "FAIL" : "ok");
	}
	return ret;
}
