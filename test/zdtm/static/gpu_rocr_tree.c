// SPDX-License-Identifier: GPL-2.0-only
/*
 * A tree of two ROCr processes: a parent and its child, forked before
 * either calls hsa_init (a KFD process belongs to one process; ROCr is not
 * fork-safe), each with a runtime of its own: VRAM on every GPU with a
 * pattern of its own, and a thread streaming async copies over all GPUs
 * (host -> VRAM -> host, checked) at the moment of the dump. After restore
 * each process checks its own buffers (seeing the other's pattern means
 * the two were mixed up), that its copies went on, and runs new work; the
 * child reports through its exit status. SIGUSR1 to the process group runs
 * a round in both.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_child.h"
#include "gpu_round.h"
#include "rocr_common.h"

const char *test_doc = "Parent and child ROCr processes survive C/R";
const char *test_author = "criu-rocm";

#define BYTES (1 << 20)
#define PROGRESS_MS 60000

static struct rocr r;
static const char *who;
static uint32_t base; /* this process' seeds */
static void *vram[ROCR_MAX_GPUS], *src, *dst;
static hsa_signal_t sig;
static pthread_t thread;
static unsigned long loops, looked; /* atomic loops */
static int stop, failed;

static void *loop_fn(void *arg)
{
	hsa_signal_t s;
	char what[128];
	void *v = NULL;
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	if (rocr_signal(&s)) {
		__atomic_store_n(&failed, 1, __ATOMIC_RELEASE);
		return NULL;
	}
	for (unsigned long k = 0; !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); k++) {
		unsigned int g = k % r.ngpus;
		uint32_t seed = base ^ 0x10000 ^ (uint32_t)k;

		snprintf(what, sizeof(what), "%s loop %lu: node %u", who, k, r.gpu[g].node);
		v = rocr_vram_alloc(&r, g, BYTES, what);
		rocr_fill(src, BYTES, seed);
		if (!v || rocr_copy(&r, v, r.gpu[g].agent, src, r.cpu, BYTES, s, what) ||
		    rocr_check_vram(&r, g, v, BYTES, seed, dst, s, what) || rocr_free(v, what)) {
			__atomic_store_n(&failed, 1, __ATOMIC_RELEASE);
			break;
		}
		__atomic_store_n(&loops, k + 1, __ATOMIC_RELEASE);
	}
	hsa_signal_destroy(s);
	return NULL;
}

static int setup(const char *name, uint32_t seed)
{
	void *bounce;
	char what[128];

	who = name;
	base = seed;
	if (rocr_init(&r) || rocr_signal(&sig))
		return -1;
	src = rocr_host_alloc(&r, BYTES, "host memory");
	dst = rocr_host_alloc(&r, BYTES, "host memory");
	bounce = rocr_host_alloc(&r, BYTES, "host memory");
	if (!src || !dst || !bounce)
		return -1;
	for (unsigned int g = 0; g < r.ngpus; g++) {
		snprintf(what, sizeof(what), "%s: host -> VRAM of node %u", who, r.gpu[g].node);
		vram[g] = rocr_vram_alloc(&r, g, BYTES, what);
		rocr_fill(bounce, BYTES, base + g);
		if (!vram[g] || rocr_copy(&r, vram[g], r.gpu[g].agent, bounce, r.cpu, BYTES, sig, what))
			return -1;
	}
	if (rocr_free(bounce, "host memory"))
		return -1;
	errno = pthread_create(&thread, NULL, loop_fn, NULL);
	if (errno) {
		pr_perror("pthread_create");
		return -1;
	}
	return 0;
}

/* This process' VRAM holds its own patterns, and its copy loop advances. */
static int check(const char *when)
{
	void *bounce = rocr_host_alloc(&r, BYTES, "host memory");
	uint64_t t0 = rocr_now_ms();
	char what[160];
	unsigned long n;
	int ret = 0;

	if (!bounce)
		return -1;
	for (unsigned int g = 0; !ret && g < r.ngpus; g++) {
		snprintf(what, sizeof(what), "%s: %s's VRAM of node %u", when, who, r.gpu[g].node);
		if (rocr_check_vram(&r, g, vram[g], BYTES, base + g, bounce, sig, what))
			ret = -1;
	}
	if (rocr_free(bounce, "host memory"))
		ret = -1;
	while ((n = __atomic_load_n(&loops, __ATOMIC_ACQUIRE)) <= looked && !__atomic_load_n(&failed, __ATOMIC_ACQUIRE) &&
	       rocr_now_ms() - t0 < PROGRESS_MS)
		usleep(10000);
	if (__atomic_load_n(&failed, __ATOMIC_ACQUIRE)) {
		errno = 0;
		fail("%s: %s's copy loop stopped after %lu loops (its FAIL line is above)", when, who, n);
		return -1;
	}
	if (n <= looked) {
		errno = 0;
		fail("%s: %s's copy loop is stuck at %lu loops", when, who, n);
		return -1;
	}
	looked = n;
	return ret;
}

static int round_fn(void *arg, unsigned int n)
{
	char when[32];

	(void)arg;
	snprintf(when, sizeof(when), "round %u", n);
	if (check(when))
		return -1;
	return rocr_new_work(&r, base ^ 0x20000 ^ (n << 8));
}

/* After zdtm's SIGTERM: the last checks, new work, everything freed. */
static int finish(int rounds)
{
	int ret = rounds;

	if (rocr_corrupt_requested() && rocr_corrupt(&r, 0, vram[0], 64, sig))
		ret = -1;
	if (check("at the end"))
		ret = -1;
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(thread, NULL);
	if (ret || rocr_new_work(&r, base ^ 0x30000))
		return -1;
	for (unsigned int g = 0; g < r.ngpus; g++)
		if (rocr_free(vram[g], "VRAM"))
			return -1;
	if (rocr_free(src, "host memory") || rocr_free(dst, "host memory"))
		return -1;
	hsa_signal_destroy(sig);
	return rocr_shut_down();
}

int main(int argc, char **argv)
{
	struct gpu_child c;
	int ret;

	test_init(argc, argv);

	if (gpu_child_fork(&c))
		return 1;
	if (c.pid == 0) {
		if (setup("child", 0xc41d0000) || check("before the dump") || gpu_rounds_init("child"))
			_exit(2);
		gpu_child_ready(&c);
		ret = gpu_wait_rounds(round_fn, NULL);
		_exit(finish(ret) ? 1 : 0);
	}

	if (setup("parent", 0x9a7e0000) || check("before the dump") || gpu_rounds_init("parent") ||
	    gpu_child_wait_ready(&c, "ROCr"))
		goto kill_child;
	test_msg("parent %d and child %d: a ROCr runtime each on %u GPU(s), copies streaming\n", getpid(), c.pid,
		 r.ngpus);

	test_daemon();
	ret = gpu_wait_rounds(round_fn, NULL);

	if (gpu_child_stop(&c))
		return 1;
	ret = finish(ret);
	if (gpu_child_reap(&c, "check") || ret)
		return 1;
	pass();
	return 0;

kill_child:
	gpu_child_kill(&c);
	return 1;
}
