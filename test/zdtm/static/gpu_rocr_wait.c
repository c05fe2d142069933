// SPDX-License-Identifier: GPL-2.0-only
/*
 * Threads blocked in hsa_signal_wait_* across checkpoint/restore, one woken
 * by the GPU and one by the CPU, with a copy held in flight on the GPU.
 *
 * On every GPU an async copy host -> VRAM is submitted behind a gate: a
 * dependency signal still at 1, which ROCr turns into POLL_REGMEM packets
 * ahead of the copy in the GPU's SDMA ring. The SDMA queue stalls on the
 * poll, so at the dump the copy sits unexecuted in the ring. One thread
 * per GPU waits (hsa_signal_wait_scacquire, no timeout, BLOCKED: in KFD's
 * WAIT_EVENTS) for that copy's completion signal; one more thread waits
 * for a plain signal to reach a value only the main thread stores.
 *
 * After restore (each SIGUSR1 round, and the end) the waiters must still be
 * blocked and the copies not done; then the main thread opens the gates
 * (the SDMA engines see the new value, copy, and signal completion through
 * the event mailbox and an interrupt) and stores the plain signal: every
 * waiter must wake with the right value, every copied byte must be right.
 * A round arms everything again for the next checkpoint.
 */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_round.h"
#include "rocr_common.h"

const char *test_doc = "Threads blocked in hsa_signal_wait across C/R are woken afterwards";
const char *test_author = "criu-rocm";

#define BYTES (2 << 20)
#define WAKE_MS 60000
#define PLAIN_VALUE 7

static struct rocr r;
static hsa_signal_t gate, plain;
static void *src[ROCR_MAX_GPUS], *vram[ROCR_MAX_GPUS], *bounce;
static uint32_t seed[ROCR_MAX_GPUS];

static struct waiter {
	pthread_t thread;
	hsa_signal_t sig;
	hsa_signal_condition_t cond;
	hsa_signal_value_t value;
	hsa_signal_value_t got; /* what the wait returned */
	int done;		/* atomic */
} copy_waiter[ROCR_MAX_GPUS], plain_waiter;

static void *wait_fn(void *arg)
{
	struct waiter *w = arg;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	/* No timeout: only the GPU or the main thread can end this wait. */
	w->got = hsa_signal_wait_scacquire(w->sig, w->cond, w->value, UINT64_MAX, HSA_WAIT_STATE_BLOCKED);
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static int start_waiter(struct waiter *w, hsa_signal_t sig, hsa_signal_condition_t cond, hsa_signal_value_t value)
{
	w->sig = sig;
	w->cond = cond;
	w->value = value;
	w->done = 0;
	errno = pthread_create(&w->thread, NULL, wait_fn, w);
	if (errno) {
		pr_perror("pthread_create");
		return -1;
	}
	return 0;
}

/* Gate closed, one gated copy per GPU, a waiter on each and one on the plain signal. */
static int arm(unsigned int n)
{
	hsa_status_t s;

	hsa_signal_store_screlease(gate, 1);
	hsa_signal_store_screlease(plain, 0);
	for (unsigned int g = 0; g < r.ngpus; g++) {
		seed[g] = 0x3a170000 + (n << 8) + g;
		rocr_fill(src[g], BYTES, seed[g]);
		if (rocr_signal(&copy_waiter[g].sig))
			return -1;
		s = hsa_amd_memory_async_copy(vram[g], r.gpu[g].agent, src[g], r.cpu, BYTES, 1, &gate,
					      copy_waiter[g].sig);
		if (s != HSA_STATUS_SUCCESS) {
			errno = 0;
			fail("gated async copy to node %u: HSA status %#x", r.gpu[g].node, s);
			return -1;
		}
		if (start_waiter(&copy_waiter[g], copy_waiter[g].sig, HSA_SIGNAL_CONDITION_LT, 1))
			return -1;
	}
	return start_waiter(&plain_waiter, plain, HSA_SIGNAL_CONDITION_EQ, PLAIN_VALUE);
}

/* The waiters are still blocked and the gated copies have not run. */
static int still_blocked(const char *when)
{
	usleep(200000);
	for (unsigned int g = 0; g < r.ngpus; g++) {
		if (__atomic_load_n(&copy_waiter[g].done, __ATOMIC_ACQUIRE) ||
		    hsa_signal_load_scacquire(copy_waiter[g].sig) != 1) {
			errno = 0;
			fail("%s: the copy to node %u completed behind a closed gate (signal %ld)", when,
			     r.gpu[g].node, (long)hsa_signal_load_scacquire(copy_waiter[g].sig));
			return -1;
		}
	}
	if (__atomic_load_n(&plain_waiter.done, __ATOMIC_ACQUIRE)) {
		errno = 0;
		fail("%s: the wait for value %d returned %ld before anyone stored it", when, PLAIN_VALUE,
		     (long)plain_waiter.got);
		return -1;
	}
	return 0;
}

static int woken(struct waiter *w, hsa_signal_value_t want, const char *what)
{
	uint64_t t0 = rocr_now_ms();

	while (!__atomic_load_n(&w->done, __ATOMIC_ACQUIRE) && rocr_now_ms() - t0 < WAKE_MS)
		usleep(2000);
	if (!__atomic_load_n(&w->done, __ATOMIC_ACQUIRE)) {
		errno = 0;
		fail("%s: the waiting thread was not woken within %d s (signal %ld)", what, WAKE_MS / 1000,
		     (long)hsa_signal_load_scacquire(w->sig));
		return -1;
	}
	pthread_join(w->thread, NULL);
	if (w->got != want) {
		errno = 0;
		fail("%s: the wait returned %ld, not %ld", what, (long)w->got, (long)want);
		return -1;
	}
	return 0;
}

/* Opens the gate and stores the plain value: everyone wakes, every copy is right. */
static int release(const char *when)
{
	char what[128];
	hsa_signal_t sig;
	int ret = 0;

	if (still_blocked(when))
		return -1;
	hsa_signal_store_screlease(gate, 0);
	for (unsigned int g = 0; g < r.ngpus; g++) {
		snprintf(what, sizeof(what), "%s: the gated copy to node %u", when, r.gpu[g].node);
		if (woken(&copy_waiter[g], 0, what))
			return -1;
		hsa_signal_destroy(copy_waiter[g].sig);
	}
	hsa_signal_store_screlease(plain, PLAIN_VALUE);
	snprintf(what, sizeof(what), "%s: the wait for value %d", when, PLAIN_VALUE);
	if (woken(&plain_waiter, PLAIN_VALUE, what))
		return -1;
	if (rocr_signal(&sig))
		return -1;
	for (unsigned int g = 0; !ret && g < r.ngpus; g++) {
		if (rocr_corrupt_requested() && !strcmp(when, "at the end") && rocr_corrupt(&r, g, vram[g], 4096, sig))
			ret = -1;
		snprintf(what, sizeof(what), "%s: VRAM of node %u after the gated copy", when, r.gpu[g].node);
		if (!ret && rocr_check_vram(&r, g, vram[g], BYTES, seed[g], bounce, sig, what))
			ret = -1;
	}
	hsa_signal_destroy(sig);
	return ret;
}

static int round_fn(void *arg, unsigned int n)
{
	char when[32];
	int ret;

	(void)arg;
	snprintf(when, sizeof(when), "round %u", n);
	if (release(when))
		return -1;
	ret = rocr_new_work(&r, 0x3a1f0000 + (n << 8));
	/* Armed again for the next checkpoint. */
	return arm(n) ? -1 : ret;
}

int main(int argc, char **argv)
{
	int ret;

	test_init(argc, argv);

	if (rocr_init(&r) || rocr_signal(&gate) || rocr_signal(&plain))
		return 1;
	bounce = rocr_host_alloc(&r, BYTES, "the read-back buffer");
	if (!bounce)
		return 1;
	for (unsigned int g = 0; g < r.ngpus; g++) {
		src[g] = rocr_host_alloc(&r, BYTES, "host memory");
		vram[g] = rocr_vram_alloc(&r, g, BYTES, "VRAM");
		if (!src[g] || !vram[g])
			return 1;
	}
	if (arm(0) || still_blocked("before the dump"))
		return 1;
	test_msg("%u gated copies and %u+1 blocked waiters\n", r.ngpus, r.ngpus);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, NULL);

	if (release("at the end") || ret)
		return 1;
	if (rocr_new_work(&r, 0x3a1f))
		return 1;
	for (unsigned int g = 0; g < r.ngpus; g++)
		if (rocr_free(src[g], "host memory") || rocr_free(vram[g], "VRAM"))
			return 1;
	if (rocr_free(bounce, "read-back buffer"))
		return 1;
	hsa_signal_destroy(gate);
	hsa_signal_destroy(plain);
	if (rocr_shut_down())
		return 1;
	pass();
	return 0;
}
