// SPDX-License-Identifier: GPL-2.0-only
/*
 * Two processes of one tree, each with its own KFD context: the parent and
 * a forked child both open /dev/kfd AFTER the fork (a KFD context belongs
 * to one process and is not inherited), and each holds VRAM and GTT BOs
 * with patterns of its own and an SDMA queue. After restore each checks its
 * own data (one process seeing the other's pattern means contexts were
 * mixed up) and runs new work; the child reports through its exit status.
 */
#include <signal.h>
#include <sys/wait.h>

#include "zdtmtst.h"
#include "gpu_child.h"
#include "gpu_common.h"

const char *test_doc = "Parent and child with their own GPU contexts survive C/R";
const char *test_author = "criu-rocm";

struct side {
	const char *who;
	struct kfd_client *c;
	struct kfd_client_queue *q;
	struct gpu_bo vram, gtt, staging;
	uint32_t gpu;
};

/* Both processes use the last GPU (the same device, separate contexts). */
static int setup(struct side *s, const char *who, uint32_t seed)
{
	uint32_t n;
	int ret;

	s->who = who;
	if (gpu_open(&s->c, &n))
		return -1;
	s->gpu = gpu_id_of(s->c, n - 1);
	if (!s->gpu)
		return -1;
	if (gpu_bo_alloc(s->c, &s->staging, "staging", s->gpu, KFD_CLIENT_MEM_GTT, 1 << 20) ||
	    gpu_bo_alloc(s->c, &s->vram, who[0] == 'p' ? "parent-vram-3M" : "child-vram-3M", s->gpu,
			 KFD_CLIENT_MEM_VRAM, 3 << 20) ||
	    gpu_bo_alloc(s->c, &s->gtt, who[0] == 'p' ? "parent-gtt-512K" : "child-gtt-512K", s->gpu,
			 KFD_CLIENT_MEM_GTT, 512 << 10))
		return -1;
	s->vram.seed = seed;
	s->gtt.seed = seed + 1;
	ret = kfd_client_sdma_queue_create(s->c, s->gpu, 64 << 10, &s->q);
	if (ret) {
		gpu_err(ret, "%s: GPU %#x: cannot create an SDMA queue", who, s->gpu);
		return -1;
	}
	if (gpu_bo_fill_sdma(s->q, &s->vram, &s->staging))
		return -1;
	gpu_bo_fill_cpu(&s->gtt, 0, s->gtt.size);
	if (gpu_bo_check(s->q, &s->vram, &s->staging) || gpu_bo_check(s->q, &s->gtt, &s->staging))
		return -1;
	return 0;
}

static int verify(struct side *s, uint32_t seed)
{
	if (gpu_corrupt_requested() && gpu_corrupt(s->q, &s->vram, 0x10000))
		return 1;
	if (gpu_bo_check(s->q, &s->vram, &s->staging) || gpu_bo_check(s->q, &s->gtt, &s->staging))
		return 1;
	return gpu_new_work(s->c, s->gpu, seed);
}

int main(int argc, char **argv)
{
	struct side parent, child;
	struct gpu_child c;

	test_init(argc, argv);

	if (gpu_child_fork(&c))
		return 1;
	if (c.pid == 0) {
		if (setup(&child, "child", 0xc41d))
			_exit(2);
		gpu_child_ready(&c);
		test_waitsig();
		_exit(verify(&child, 0xc41e) ? 1 : 0);
	}

	if (setup(&parent, "parent", 0x9a7e) || gpu_child_wait_ready(&c, "GPU"))
		goto kill_child;
	test_msg("parent %d and child %d: own KFD contexts on GPU %#x\n", getpid(), c.pid, parent.gpu);

	test_daemon();
	test_waitsig();

	if (gpu_child_stop(&c))
		return 1;
	if (verify(&parent, 0x9a7f)) {
		waitpid(c.pid, NULL, 0);
		return 1;
	}
	if (gpu_child_reap(&c, "GPU check"))
		return 1;

	pass();
	return 0;

kill_child:
	gpu_child_kill(&c);
	return 1;
}
