/*
 * bench-anon: the baseline process of scripts/bench-cr.sh. It holds N MiB of touched private
 * anonymous memory, filled with a pattern that depends on the offset (no zero pages, nothing
 * two pages share), so CRIU has exactly that many bytes of anonymous memory to dump and
 * restore.
 *
 *   usage: bench-anon MIB     (MIB may be 0: the process holds no extra memory)
 *
 * Prints {"ready":true,"pid":P,"mib":N} once the memory is filled. SIGUSR1 checks every byte
 * and prints {"ok":true|false,"pid":P,"bytes":B}; SIGTERM does the same and exits (0 when the
 * memory is intact). Run it with setsid, stdin from /dev/null and stdout to a file, so that
 * criu dumps it without --shell-job.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t verify, stop;

static void on_signal(int sig)
{
	if (sig == SIGTERM)
		stop = 1;
	else
		verify = 1;
}

static uint64_t pattern(uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL;

	return x ^ (x >> 31);
}

static int report(const uint64_t *mem, size_t words)
{
	size_t i;
	int ok = 1;

	for (i = 0; i < words; i++) {
		if (mem[i] != pattern(i)) {
			ok = 0;
			break;
		}
	}
	printf("{\"ok\":%s,\"pid\":%d,\"bytes\":%zu}\n", ok ? "true" : "false", (int)getpid(),
	       ok ? words * 8 : i * 8);
	fflush(stdout);
	return ok;
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_signal };
	uint64_t *mem = NULL;
	size_t words, i;
	char *end;
	unsigned long mib;
	sigset_t none;

	if (argc != 2 || (mib = strtoul(argv[1], &end, 10), *end != '\0' || end == argv[1])) {
		fprintf(stderr, "usage: bench-anon MIB\n");
		return 2;
	}
	words = (size_t)mib << 17; /* 1 MiB = 2^17 u64 */
	if (words) {
		mem = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (mem == MAP_FAILED) {
			perror("bench-anon: mmap");
			return 1;
		}
		for (i = 0; i < words; i++)
			mem[i] = pattern(i);
	}

	sigemptyset(&none);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	/* Block both outside sigsuspend, so that no signal slips in between a check and the wait. */
	{
		sigset_t both;

		sigemptyset(&both);
		sigaddset(&both, SIGUSR1);
		sigaddset(&both, SIGTERM);
		sigprocmask(SIG_BLOCK, &both, NULL);
	}
	printf("{\"ready\":true,\"pid\":%d,\"mib\":%lu}\n", (int)getpid(), mib);
	fflush(stdout);
	for (;;) {
		while (!verify && !stop)
			sigsuspend(&none);
		if (stop)
			return report(mem, words) ? 0 : 1;
		verify = 0;
		report(mem, words);
	}
}
