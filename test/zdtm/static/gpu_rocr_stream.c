// SPDX-License-Identifier: GPL-2.0-only
/*
 * ROCr async copies streaming on every GPU at the moment of the dump. One
 * thread per GPU loops: a fresh pattern in host memory, host -> VRAM, VRAM
 * -> VRAM of the next GPU where the topology links them, back to the host,
 * every byte checked; every 16th loop it also allocates, uses and frees a
 * VRAM buffer. The dump freezes the threads with copies submitted to the
 * SDMA queues (ROCr's ring buffers) and their completion signals not yet
 * reached: after restore those copies must complete (or the waits time
 * out and the test fails), and the loops go on. SIGUSR1 rounds (and the
 * end) require every loop to have advanced since the last look and no
 * error; then new work runs and ROCr shuts down.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_round.h"
#include "rocr_common.h"

const char *test_doc = "ROCr async copies streaming on every GPU across C/R";
const char *test_author = "criu-rocm";

#define BYTES (1 << 20)
/* How long a loop may take to show progress after a round asks. */
#define PROGRESS_MS 60000

static struct rocr r;

static struct streamer {
	pthread_t thread;
	unsigned int g;
	void *src, *dst, *vram, *land; /* land: VRAM of the next GPU, when linked */
	hsa_signal_t sig;
	unsigned long loops;  /* completed, checked loops (atomic) */
	unsigned long looked; /* loops at the last round */
	int failed;	      /* atomic: the loop stopped on an error */
} st[ROCR_MAX_GPUS];

static int stop;

static int one_loop(struct streamer *w, unsigned long k)
{
	unsigned int g = w->g, next = (g + 1) % r.ngpus;
	uint32_t seed = (uint32_t)(g << 24) ^ (uint32_t)k;
	hsa_agent_t back = w->land ? r.gpu[next].agent : r.gpu[g].agent;
	char what[128];

	rocr_fill(w->src, BYTES, seed);
	memset(w->dst, 0, BYTES);
	snprintf(what, sizeof(what), "loop %lu: host -> VRAM of node %u", k, r.gpu[g].node);
	if (rocr_copy(&r, w->vram, r.gpu[g].agent, w->src, r.cpu, BYTES, w->sig, what))
		return -1;
	if (w->land) {
		snprintf(what, sizeof(what), "loop %lu: VRAM of node %u -> VRAM of node %u", k, r.gpu[g].node,
			 r.gpu[next].node);
		if (rocr_copy(&r, w->land, r.gpu[next].agent, w->vram, r.gpu[g].agent, BYTES, w->sig, what))
			return -1;
	}
	snprintf(what, sizeof(what), "loop %lu: node %u%s -> host", k, r.gpu[g].node, w->land ? " via its peer" : "");
	if (rocr_copy(&r, w->dst, r.cpu, w->land ? w->land : w->vram, back, BYTES, w->sig, what) ||
	    rocr_check(w->dst, BYTES, seed, what))
		return -1;
	if (k % 16 == 15) {
		void *extra = rocr_vram_alloc(&r, g, BYTES, "a VRAM buffer of the loop");

		snprintf(what, sizeof(what), "loop %lu: host -> new VRAM of node %u -> host", k, r.gpu[g].node);
		if (!extra || rocr_copy(&r, extra, r.gpu[g].agent, w->src, r.cpu, BYTES, w->sig, what) ||
		    rocr_check_vram(&r, g, extra, BYTES, seed, w->dst, w->sig, what) ||
		    rocr_free(extra, "a VRAM buffer of the loop"))
			return -1;
	}
	return 0;
}

static void *streamer_fn(void *arg)
{
	struct streamer *w = arg;
	sigset_t all;

	/* Signals (zdtm's SIGTERM, rounds' SIGUSR1) belong to the main thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (unsigned long k = 0; !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); k++) {
		if (one_loop(w, k)) {
			__atomic_store_n(&w->failed, 1, __ATOMIC_RELEASE);
			break;
		}
		__atomic_store_n(&w->loops, k + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int setup(unsigned int g)
{
	struct streamer *w = &st[g];
	unsigned int next = (g + 1) % r.ngpus;

	w->g = g;
	if (rocr_signal(&w->sig))
		return -1;
	w->src = rocr_host_alloc(&r, BYTES, "host memory of a loop");
	w->dst = rocr_host_alloc(&r, BYTES, "host memory of a loop");
	w->vram = rocr_vram_alloc(&r, g, BYTES, "VRAM of a loop");
	if (!w->src || !w->dst || !w->vram)
		return -1;
	if (next != g && rocr_peer(&r, g, next)) {
		w->land = rocr_vram_alloc(&r, next, BYTES, "peer VRAM of a loop");
		if (!w->land || rocr_allow_pair(&r, g, next, w->vram, "VRAM of a loop") ||
		    rocr_allow_pair(&r, g, next, w->land, "peer VRAM of a loop"))
			return -1;
	}
	return 0;
}

/* Every loop must advance past where it was last time, without error. */
static int progress(const char *when)
{
	uint64_t t0 = rocr_now_ms();

	for (unsigned int g = 0; g < r.ngpus; g++) {
		struct streamer *w = &st[g];
		unsigned long n;

		while ((n = __atomic_load_n(&w->loops, __ATOMIC_ACQUIRE)) <= w->looked &&
		       !__atomic_load_n(&w->failed, __ATOMIC_ACQUIRE) && rocr_now_ms() - t0 < PROGRESS_MS)
			usleep(10000);
		if (__atomic_load_n(&w->failed, __ATOMIC_ACQUIRE)) {
			errno = 0;
			fail("%s: the copy loop of node %u stopped after %lu loops (its FAIL line is above)", when,
			     r.gpu[g].node, n);
			return -1;
		}
		if (n <= w->looked) {
			errno = 0;
			fail("%s: the copy loop of node %u is stuck at %lu loops for %d s", when, r.gpu[g].node, n,
			     PROGRESS_MS / 1000);
			return -1;
		}
		w->looked = n;
	}
	return 0;
}

static void loop_counts(char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = '\0';
	for (unsigned int g = 0; g < r.ngpus && at < len; g++)
		at += snprintf(buf + at, len - at, "%s%lu", g ? " " : "", st[g].looked);
}

static int round_fn(void *arg, unsigned int n)
{
	char when[32], counts[256];

	(void)arg;
	snprintf(when, sizeof(when), "round %u", n);
	if (progress(when))
		return -1;
	loop_counts(counts, sizeof(counts));
	test_msg("round %u: copy loops at %s\n", n, counts);
	return rocr_new_work(&r, 0x57e40000 + (n << 8));
}

int main(int argc, char **argv)
{
	char counts[256];
	unsigned int g, linked = 0;
	int ret;

	test_init(argc, argv);

	if (rocr_init(&r))
		return 1;
	for (g = 0; g < r.ngpus; g++) {
		if (setup(g))
			return 1;
		linked += !!st[g].land;
	}
	for (g = 0; g < r.ngpus; g++) {
		errno = pthread_create(&st[g].thread, NULL, streamer_fn, &st[g]);
		if (errno) {
			pr_perror("pthread_create");
			return 1;
		}
	}
	/* The loops run before the dump, or the test itself is wrong. */
	if (progress("before the dump"))
		return 1;
	test_msg("%u copy loops running (%u through a peer GPU), %d KiB each\n", r.ngpus, linked, BYTES >> 10);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, NULL);

	if (progress("at the end"))
		ret = -1;
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (g = 0; g < r.ngpus; g++)
		pthread_join(st[g].thread, NULL);
	for (g = 0; g < r.ngpus; g++)
		if (__atomic_load_n(&st[g].failed, __ATOMIC_ACQUIRE)) {
			errno = 0;
			fail("the copy loop of node %u failed at the end", r.gpu[g].node);
			ret = -1;
		}
	if (ret)
		return 1;
	loop_counts(counts, sizeof(counts));
	test_msg("copy loops ended at %s\n", counts);
	if (rocr_new_work(&r, 0x57e4))
		return 1;
	for (g = 0; g < r.ngpus; g++) {
		if (rocr_free(st[g].src, "host memory") || rocr_free(st[g].dst, "host memory") ||
		    rocr_free(st[g].vram, "VRAM") || rocr_free(st[g].land, "peer VRAM"))
			return 1;
		hsa_signal_destroy(st[g].sig);
	}
	if (rocr_shut_down())
		return 1;
	pass();
	return 0;
}
