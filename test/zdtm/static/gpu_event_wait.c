// SPDX-License-Identifier: GPL-2.0-only
/*
 * A thread blocked in AMDKFD_IOC_WAIT_EVENTS across checkpoint/restore.
 *
 * The waiter waits on a KFD signal event with a long timeout; the dump
 * interrupts the ioctl, so it retries on EINTR with the time left, as the
 * ROCm thunk does. After restore the event must still exist and still be
 * unsignaled (the waiter has not returned), SET_EVENT must wake the waiter
 * with a completed wait, a second event signaled before its wait must be
 * seen at once, and new BOs and queues must work.
 *
 * The kfd-client C ABI has no events, so this uses the raw KFD ioctls on
 * the client's /dev/kfd fd. The wake-up is SET_EVENT: the client's SDMA
 * queue API has no TRAP packet, which a GPU-side wake-up would need.
 *
 * Like any ROCm process the test also holds BOs and a queue (KFD cannot
 * restore a process without BOs: CRIU RESTORE refuses num_bos == 0); they
 * are checked after restore too.
 */
#include <pthread.h>
#include <signal.h>

#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "A thread waiting on a KFD event across C/R is woken afterwards";
const char *test_author = "criu-rocm";

/* Longer than any dump/restore here; a timeout means the wake-up was lost. */
#define WAIT_TOTAL_MS 300000

static int kfd;
static uint32_t event;

static struct {
	int started;
	int done;
	int result;
	unsigned int eintr;
} w;

static void *waiter(void *arg)
{
	uint64_t deadline = gpu_now_ms() + WAIT_TOTAL_MS;
	sigset_t all;
	int ret;

	/* SIGTERM is zdtm's "check now": it belongs to the main thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);

	__atomic_store_n(&w.started, 1, __ATOMIC_SEQ_CST);
	for (;;) {
		uint64_t now = gpu_now_ms();

		ret = gpu_event_wait_once(kfd, event, now < deadline ? deadline - now : 0);
		if (ret != -EINTR)
			break;
		w.eintr++;
	}
	w.result = ret;
	__atomic_store_n(&w.done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static const char *wait_text(int r)
{
	switch (r) {
	case GPU_WAIT_COMPLETE:
		return "completed";
	case GPU_WAIT_TIMEOUT:
		return "timed out";
	case GPU_WAIT_FAIL:
		return "failed";
	default:
		return strerror(-r);
	}
}

int main(int argc, char **argv)
{
	struct gpu_bo vram, staging;
	struct kfd_client_queue *q;
	struct kfd_client *c;
	uint32_t n, gpu, second;
	pthread_t th;
	int ret, i;

	test_init(argc, argv);

	gpu = gpu_open_one(&c, &n, 0);
	if (!gpu)
		return 1;
	kfd = gpu_kfd_fd();
	if (kfd < 0)
		return 1;
	if (gpu_bo_alloc(c, &vram, "vram-2M", gpu, KFD_CLIENT_MEM_VRAM, 2 << 20) ||
	    gpu_bo_alloc(c, &staging, "staging", gpu, KFD_CLIENT_MEM_GTT, 1 << 20))
		return 1;
	vram.seed = 0xe7;
	q = gpu_queue(c, gpu);
	if (!q)
		return 1;
	if (gpu_bo_fill_sdma(q, &vram, &staging))
		return 1;
	ret = gpu_event_create(kfd, &event);
	if (ret) {
		errno = -ret;
		pr_perror("cannot create a KFD signal event");
		return 1;
	}
	/* The event must not be signaled yet: a short wait times out. */
	ret = gpu_event_wait_once(kfd, event, 10);
	if (ret != GPU_WAIT_TIMEOUT) {
		pr_err("a fresh event's 10 ms wait %s, expected a time-out\n", wait_text(ret));
		return 1;
	}
	if (pthread_create(&th, NULL, waiter, NULL)) {
		pr_perror("pthread_create");
		return 1;
	}
	while (!__atomic_load_n(&w.started, __ATOMIC_SEQ_CST))
		usleep(1000);
	/* Let it enter the ioctl. */
	usleep(200000);
	test_msg("event %u: a thread waits on it for up to %d s\n", event, WAIT_TOTAL_MS / 1000);

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested()) {
		test_msg("ZDTM_GPU_CORRUPT: signaling event %u early\n", event);
		gpu_event_set(kfd, event);
		usleep(200000);
	}

	/* Nothing may have woken the waiter: C/R must not complete or fail its wait. */
	usleep(200000);
	if (__atomic_load_n(&w.done, __ATOMIC_SEQ_CST)) {
		errno = 0;
		return fail("GPU %#x: event %u: the wait returned before SET_EVENT: %s (after %u EINTR)", gpu, event,
			    wait_text(w.result), w.eintr);
	}
	ret = gpu_event_set(kfd, event);
	if (ret) {
		errno = -ret;
		return fail("GPU %#x: SET_EVENT on event %u after restore", gpu, event);
	}
	for (i = 0; i < 10000 && !__atomic_load_n(&w.done, __ATOMIC_SEQ_CST); i++)
		usleep(1000);
	if (!__atomic_load_n(&w.done, __ATOMIC_SEQ_CST)) {
		errno = 0;
		return fail("GPU %#x: event %u: SET_EVENT did not wake the waiting thread within 10 s", gpu, event);
	}
	pthread_join(th, NULL);
	if (w.result != GPU_WAIT_COMPLETE) {
		errno = 0;
		return fail("GPU %#x: event %u: the woken wait %s, expected completed", gpu, event,
			    wait_text(w.result));
	}
	test_msg("event %u: woken after %u interrupted waits\n", event, w.eintr);

	if (gpu_bo_check(q, &vram, &staging))
		return 1;

	/* Auto-reset: the completed wait consumed the signal. */
	ret = gpu_event_wait_once(kfd, event, 10);
	if (ret != GPU_WAIT_TIMEOUT) {
		errno = 0;
		return fail("GPU %#x: auto-reset event %u: a wait after the wake-up %s, expected a time-out", gpu,
			    event, wait_text(ret));
	}

	/* New events work: signaled before the wait, seen at once. */
	ret = gpu_event_create(kfd, &second);
	if (!ret)
		ret = gpu_event_set(kfd, second);
	if (ret) {
		errno = -ret;
		return fail("GPU %#x: cannot create and signal a new event after restore", gpu);
	}
	ret = gpu_event_wait_once(kfd, second, 1000);
	if (ret != GPU_WAIT_COMPLETE) {
		errno = 0;
		return fail("GPU %#x: new event %u, already signaled: wait %s", gpu, second, wait_text(ret));
	}
	if (gpu_event_destroy(kfd, second) || gpu_event_destroy(kfd, event)) {
		return fail("GPU %#x: cannot destroy events %u and %u", gpu, second, event);
	}

	if (gpu_new_work(c, gpu, 0xe7e))
		return 1;

	pass();
	return 0;
}
