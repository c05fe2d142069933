// SPDX-License-Identifier: GPL-2.0-only
/*
 * A libhsakmt process checkpointed right after hsaKmtOpenKFD and
 * hsaKmtAcquireSystemProperties, having allocated nothing itself: the
 * thunk's own state (its KFD process and the BOs it made at open, its
 * /dev/shm shared memory and freshly created semaphore, the topology it
 * read) must come back so that afterwards every GPU works: fresh VRAM,
 * GTT and paged memory, a fresh SDMA queue copying through them, events,
 * everything freed, hsaKmtCloseKFD.
 */
#include "zdtmtst.h"
#include "gpu_round.h"
#include "hsakmt_common.h"

const char *test_doc = "libhsakmt right after hsaKmtOpenKFD works after C/R";
const char *test_author = "criu-rocm";

static int round_fn(void *arg, unsigned int n)
{
	return kmt_new_work(arg, 0x1d1e0000 + (n << 8));
}

int main(int argc, char **argv)
{
	struct kmt k;
	int ret;

	test_init(argc, argv);

	if (kmt_open(&k))
		return 1;
	test_msg("libhsakmt: %u nodes, %u GPU(s); nothing allocated\n", k.sys.NumNodes, k.ngpus);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, &k);

	if (kmt_new_work(&k, 0x1d1e) || ret)
		return 1;
	if (kmt_close())
		return 1;
	pass();
	return 0;
}
