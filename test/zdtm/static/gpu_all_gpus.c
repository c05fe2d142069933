// SPDX-License-Identifier: GPL-2.0-only
/*
 * Every GPU of the machine at once (meant for the 8-GPU profiles): on each
 * GPU a VRAM BO written only by that GPU's SDMA engine, a GTT BO written by
 * the CPU, both with a pattern of their own, and an SDMA queue. After
 * restore each GPU's BOs are checked by the CPU and read back by that GPU's
 * own queue from before the dump, and each GPU takes new BOs and queues.
 * A mix-up of GPUs on restore (contents or queues landing on another GPU)
 * shows as a pattern of the wrong seed.
 */
#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "All GPUs keep their BOs and queues across C/R";
const char *test_author = "criu-rocm";

#define MAX_GPUS 64

static struct per_gpu {
	uint32_t gpu_id;
	struct gpu_bo vram, gtt, staging;
	struct kfd_client_queue *q;
	char vram_name[32], gtt_name[32];
} g[MAX_GPUS];

static int setup(struct kfd_client *c, struct per_gpu *p, uint32_t index)
{
	int ret;

	snprintf(p->vram_name, sizeof(p->vram_name), "gpu%u-vram-6M", index);
	snprintf(p->gtt_name, sizeof(p->gtt_name), "gpu%u-gtt-1M", index);
	if (gpu_bo_alloc(c, &p->staging, "staging", p->gpu_id, KFD_CLIENT_MEM_GTT, 2 << 20) ||
	    gpu_bo_alloc(c, &p->vram, p->vram_name, p->gpu_id, KFD_CLIENT_MEM_VRAM, 6 << 20) ||
	    gpu_bo_alloc(c, &p->gtt, p->gtt_name, p->gpu_id, KFD_CLIENT_MEM_GTT, 1 << 20))
		return -1;
	/* Seeds from the gpu_id and the index: nothing may move between GPUs. */
	p->vram.seed = p->gpu_id ^ (index << 24);
	p->gtt.seed = ~p->vram.seed;
	ret = kfd_client_sdma_queue_create(c, p->gpu_id, 64 << 10, &p->q);
	if (ret) {
		gpu_err(ret, "GPU %#x (index %u): cannot create an SDMA queue", p->gpu_id, index);
		return -1;
	}
	if (gpu_bo_fill_sdma(p->q, &p->vram, &p->staging))
		return -1;
	gpu_bo_fill_cpu(&p->gtt, 0, p->gtt.size);
	return 0;
}

static int check(struct per_gpu *p)
{
	return gpu_bo_check(p->q, &p->vram, &p->staging) || gpu_bo_check(p->q, &p->gtt, &p->staging);
}

int main(int argc, char **argv)
{
	struct kfd_client *c;
	uint32_t n, i;

	test_init(argc, argv);

	if (gpu_open_at_most(&c, &n, MAX_GPUS))
		return 1;
	for (i = 0; i < n; i++) {
		g[i].gpu_id = gpu_id_of(c, i);
		if (!g[i].gpu_id || setup(c, &g[i], i))
			return 1;
	}
	for (i = 0; i < n; i++)
		if (check(&g[i]))
			return 1;
	test_msg("%u GPUs, each with a VRAM and a GTT BO and an SDMA queue\n", n);

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested() && gpu_corrupt(g[n - 1].q, &g[n - 1].vram, (5 << 20) + 0x40))
		return 1;

	for (i = 0; i < n; i++)
		if (check(&g[i]))
			return 1;
	for (i = 0; i < n; i++)
		if (gpu_new_work(c, g[i].gpu_id, 0xa11 + i))
			return 1;

	pass();
	return 0;
}
