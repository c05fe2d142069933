// SPDX-License-Identifier: GPL-2.0-only
/*
 * VRAM and GTT BOs of several sizes with patterns written by the CPU, by
 * SDMA copies and by an SDMA constant fill must survive checkpoint/restore
 * as both the CPU and the GPU see them; the SDMA queue made before the dump
 * must still run, a restored BO must be freeable, and new BOs and queues
 * must work.
 */
#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "GPU VRAM and GTT BOs keep their contents across C/R";
const char *test_author = "criu-rocm";

enum { B_VRAM_4K, B_VRAM_64K, B_VRAM_2M4K, B_VRAM_16M, B_VRAM_FILL, B_GTT_4K, B_GTT_1M, B_GTT_4M8K, NR_BOS };

static const struct {
	const char *name;
	uint32_t kind;
	uint64_t size;
	bool by_gpu; /* written only through SDMA */
} layout[NR_BOS] = {
	[B_VRAM_4K] = { "vram-4K", KFD_CLIENT_MEM_VRAM, 4 << 10, false },
	[B_VRAM_64K] = { "vram-64K", KFD_CLIENT_MEM_VRAM, 64 << 10, false },
	[B_VRAM_2M4K] = { "vram-2M+4K", KFD_CLIENT_MEM_VRAM, (2 << 20) + (4 << 10), true },
	[B_VRAM_16M] = { "vram-16M", KFD_CLIENT_MEM_VRAM, 16 << 20, true },
	[B_VRAM_FILL] = { "vram-fill-1M", KFD_CLIENT_MEM_VRAM, 1 << 20, true },
	[B_GTT_4K] = { "gtt-4K", KFD_CLIENT_MEM_GTT, 4 << 10, false },
	[B_GTT_1M] = { "gtt-1M", KFD_CLIENT_MEM_GTT, 1 << 20, false },
	[B_GTT_4M8K] = { "gtt-4M+8K", KFD_CLIENT_MEM_GTT, (4 << 20) + (8 << 10), true },
};

#define FILL_VALUE 0xc0ffee11U

int main(int argc, char **argv)
{
	struct gpu_bo bos[NR_BOS], staging;
	struct kfd_client_queue *q;
	struct kfd_client *c;
	uint32_t n, gpu;
	int i, ret;

	test_init(argc, argv);

	gpu = gpu_open_one(&c, &n, 0);
	if (!gpu)
		return 1;
	if (gpu_bo_alloc(c, &staging, "staging", gpu, KFD_CLIENT_MEM_GTT, 4 << 20))
		return 1;
	q = gpu_queue(c, gpu);
	if (!q)
		return 1;

	for (i = 0; i < NR_BOS; i++) {
		struct gpu_bo *b = &bos[i];

		if (gpu_bo_alloc(c, b, layout[i].name, gpu, layout[i].kind, layout[i].size))
			return 1;
		b->seed = 0x1000 + i;
		if (i == B_VRAM_FILL) {
			b->is_fill = true;
			b->fill = FILL_VALUE;
			ret = kfd_client_sdma_fill(q, b->va, FILL_VALUE, b->size);
			if (!ret)
				ret = kfd_client_sdma_wait_idle(q, 60000);
			if (ret) {
				gpu_err(ret, "GPU %#x: SDMA fill of BO %s", gpu, b->name);
				return 1;
			}
		} else if (layout[i].by_gpu) {
			if (gpu_bo_fill_sdma(q, b, &staging))
				return 1;
		} else {
			gpu_bo_fill_cpu(b, 0, b->size);
		}
	}
	/* Everything is right before the dump, or the test itself is wrong. */
	for (i = 0; i < NR_BOS; i++)
		if (gpu_bo_check(q, &bos[i], &staging))
			return 1;
	test_msg("GPU %#x: %d BOs written (CPU, SDMA copy, SDMA fill)\n", gpu, NR_BOS);

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested() && gpu_corrupt(q, &bos[B_VRAM_16M], 0x5a5a00))
		return 1;

	/* The queue made before the dump reads every BO back. */
	for (i = 0; i < NR_BOS; i++)
		if (gpu_bo_check(q, &bos[i], &staging))
			return 1;

	/* A restored BO can be freed, and the others still hold their data. */
	if (gpu_bo_free(&bos[B_VRAM_64K]))
		return 1;
	if (gpu_bo_check(q, &bos[B_VRAM_2M4K], &staging))
		return 1;

	if (gpu_new_work(c, gpu, 0x7e57))
		return 1;

	pass();
	return 0;
}
