// SPDX-License-Identifier: GPL-2.0-only
/*
 * A ROCr process checkpointed right after hsa_init, having allocated
 * nothing itself: ROCr's own state (its KFD process, events and signal
 * pages, scratch and trap handler memory, libhsakmt's shared memory and
 * semaphore) must come back so that afterwards the runtime works as if
 * nothing had happened: new host memory, VRAM and locked user memory on
 * every GPU, async copies (SDMA queues created only now) within a GPU,
 * between GPUs where linked and to the host, every byte checked, all freed,
 * hsa_shut_down.
 */
#include "zdtmtst.h"
#include "gpu_round.h"
#include "rocr_common.h"

const char *test_doc = "ROCr right after hsa_init works after C/R";
const char *test_author = "criu-rocm";

static int round_fn(void *arg, unsigned int n)
{
	return rocr_new_work(arg, 0x1d1e0000 + (n << 8));
}

int main(int argc, char **argv)
{
	struct rocr r;
	int ret;

	test_init(argc, argv);

	if (rocr_init(&r))
		return 1;
	test_msg("ROCr: %u GPU agent(s), first %s (node %u); nothing allocated\n", r.ngpus, r.gpu[0].name,
		 r.gpu[0].node);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, &r);

	if (rocr_new_work(&r, 0x1d1e) || ret)
		return 1;
	if (rocr_shut_down())
		return 1;
	pass();
	return 0;
}
