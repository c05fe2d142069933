// SPDX-License-Identifier: GPL-2.0-only
/*
 * A process that opened /dev/kfd a second time (not a dup): both files lead
 * to its one KFD process.  After restore the second file must still reach
 * that process (an event made through the first file is set through the
 * second and waited on through the first), a dup of it must too, and the
 * process' BOs must hold their data.
 */
#include <fcntl.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "GPU process with two opens of /dev/kfd keeps one KFD process across C/R";
const char *test_author = "criu-rocm";

/* Sets `event` through `via` and waits for it through `kfd`. */
static int cross_signal(int kfd, int via, uint32_t event, const char *what)
{
	int ret = gpu_event_set(via, event);

	if (ret) {
		pr_err("%s: SET_EVENT %u: %s\n", what, event, gpu_errtext(ret));
		return 1;
	}
	do
		ret = gpu_event_wait_once(kfd, event, 5000);
	while (ret == -EINTR);
	if (ret != GPU_WAIT_COMPLETE) {
		pr_err("%s: the event set through fd %d did not fire on fd %d (%d)\n", what, via, kfd, ret);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct gpu_bo bo, staging;
	struct kfd_client_queue *q;
	struct kfd_client *c;
	uint32_t n, gpu, event;
	int kfd, again, again_dup, ret;

	test_init(argc, argv);

	gpu = gpu_open_one(&c, &n, 0);
	if (!gpu)
		return 1;
	kfd = gpu_kfd_fd();
	if (kfd < 0)
		return 1;
	again = open("/dev/kfd", O_RDWR | O_CLOEXEC);
	if (again < 0) {
		pr_perror("second open of /dev/kfd");
		return 1;
	}
	again_dup = dup(again);
	if (again_dup < 0) {
		pr_perror("dup");
		return 1;
	}
	if (gpu_bo_alloc(c, &staging, "staging", gpu, KFD_CLIENT_MEM_GTT, 1 << 20) ||
	    gpu_bo_alloc(c, &bo, "vram-1M", gpu, KFD_CLIENT_MEM_VRAM, 1 << 20))
		return 1;
	q = gpu_queue(c, gpu);
	if (!q)
		return 1;
	bo.seed = 0x4e0;
	gpu_bo_fill_cpu(&bo, 0, bo.size);
	ret = gpu_event_create(kfd, &event);
	if (ret) {
		pr_err("CREATE_EVENT: %s\n", gpu_errtext(ret));
		return 1;
	}
	/* Both files reach one KFD process, or the test itself is wrong. */
	if (cross_signal(kfd, again, event, "before the dump") || gpu_bo_check(q, &bo, &staging))
		return 1;

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested() && gpu_corrupt(q, &bo, 0x1000))
		return 1;
	if (cross_signal(kfd, again, event, "after the restore, second open") ||
	    cross_signal(kfd, again_dup, event, "after the restore, its dup") ||
	    gpu_bo_check(q, &bo, &staging) || gpu_new_work(c, gpu, 0x4e1))
		return 1;

	pass();
	return 0;
}
