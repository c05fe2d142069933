// SPDX-License-Identifier: GPL-2.0-only
/*
 * Many small BOs (NR_BOS, VRAM and GTT, 4 to 16 KiB, spread over all GPUs),
 * each with a pattern of its own: every one must come back with its own
 * contents at its own address, as the CPU and the GPU see it. After restore
 * half of them are freed (the restored handles are valid), the other half
 * must be untouched by that, and new small BOs must work.
 */
#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "More than a thousand small GPU BOs survive C/R";
const char *test_author = "criu-rocm";

#define NR_BOS	 1200
#define NR_NEW	 200
#define MAX_GPUS 64
#define SLOT	 (16 << 10) /* the largest BO */
#define SLOTS	 64

static struct gpu_bo bos[NR_BOS];
static char names[NR_BOS][24];

static struct {
	uint32_t id;
	struct kfd_client_queue *q;
	struct gpu_bo staging;
} gpus[MAX_GPUS];

static uint64_t bo_size(int i)
{
	return (uint64_t)(i % 4 + 1) << 12;
}

static uint32_t bo_kind(int i)
{
	return i % 3 == 2 ? KFD_CLIENT_MEM_GTT : KFD_CLIENT_MEM_VRAM;
}

/* Checks the `nb` BOs read back into the slots of GPU `gi`'s staging BO. */
static int check_slots(uint32_t gi, struct gpu_bo **batch, int nb)
{
	int k, ret;

	ret = kfd_client_sdma_wait_idle(gpus[gi].q, 60000);
	if (ret)
		return gpu_fail(ret, "GPU %#x: SDMA read-back did not finish", gpus[gi].id);
	for (k = 0; k < nb; k++) {
		void *slot = gpu_ptr(gpus[gi].staging.va + (uint64_t)k * SLOT);

		if (gpu_check_range(batch[k], slot, 0, batch[k]->size, "by SDMA"))
			return 1;
	}
	return 0;
}

/*
 * Reads every live BO of `from` (an array of `nr`) back through its GPU's
 * SDMA queue, SLOTS BOs per submission, and checks each.
 */
static int check_sdma(struct gpu_bo *from, int nr, uint32_t ngpus)
{
	struct gpu_bo *batch[SLOTS];
	uint32_t gi;
	int i, nb, ret;

	for (gi = 0; gi < ngpus; gi++) {
		nb = 0;
		for (i = 0; i < nr; i++) {
			uint64_t slot = gpus[gi].staging.va + (uint64_t)nb * SLOT;

			if (!from[i].bo || from[i].gpu_id != gpus[gi].id)
				continue;
			memset(gpu_ptr(slot), 0xee, from[i].size);
			ret = kfd_client_sdma_copy(gpus[gi].q, from[i].va, slot, from[i].size);
			if (ret)
				return gpu_fail(ret, "GPU %#x: SDMA read-back of BO %s", gpus[gi].id, from[i].name);
			batch[nb++] = &from[i];
			if (nb == SLOTS) {
				if (check_slots(gi, batch, nb))
					return 1;
				nb = 0;
			}
		}
		if (nb && check_slots(gi, batch, nb))
			return 1;
	}
	return 0;
}

static int check_cpu(struct gpu_bo *from, int nr)
{
	int i;

	for (i = 0; i < nr; i++)
		if (from[i].bo && gpu_bo_check_cpu(&from[i]))
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	static struct gpu_bo fresh[NR_NEW];
	struct kfd_client *c;
	uint32_t n, gi;
	int i, ret;

	test_init(argc, argv);

	if (gpu_open_at_most(&c, &n, MAX_GPUS))
		return 1;
	for (gi = 0; gi < n; gi++) {
		gpus[gi].id = gpu_id_of(c, gi);
		if (!gpus[gi].id ||
		    gpu_bo_alloc(c, &gpus[gi].staging, "staging", gpus[gi].id, KFD_CLIENT_MEM_GTT, SLOT * SLOTS))
			return 1;
		ret = kfd_client_sdma_queue_create(c, gpus[gi].id, 64 << 10, &gpus[gi].q);
		if (ret) {
			gpu_err(ret, "GPU %#x: cannot create an SDMA queue", gpus[gi].id);
			return 1;
		}
	}
	for (i = 0; i < NR_BOS; i++) {
		snprintf(names[i], sizeof(names[i]), "small-%d", i);
		if (gpu_bo_alloc(c, &bos[i], names[i], gpus[i % n].id, bo_kind(i), bo_size(i)))
			return 1;
		bos[i].seed = 0x3000 + i;
		gpu_bo_fill_cpu(&bos[i], 0, bos[i].size);
	}
	if (check_cpu(bos, NR_BOS) || check_sdma(bos, NR_BOS, n))
		return 1;
	test_msg("%d BOs on %u GPUs\n", NR_BOS, n);

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested() && gpu_corrupt(gpus[777 % n].q, &bos[777], 0x800))
		return 1;

	if (check_cpu(bos, NR_BOS) || check_sdma(bos, NR_BOS, n))
		return 1;

	/* Free every other restored BO; the rest must not notice. */
	for (i = 0; i < NR_BOS; i += 2)
		if (gpu_bo_free(&bos[i]))
			return 1;
	if (check_cpu(bos, NR_BOS) || check_sdma(bos, NR_BOS, n))
		return 1;

	for (i = 0; i < NR_NEW; i++) {
		if (gpu_bo_alloc(c, &fresh[i], "new-small", gpus[i % n].id, bo_kind(i), bo_size(i)))
			return fail("no new small BO %d after restore", i);
		fresh[i].seed = 0x5000 + i;
		gpu_bo_fill_cpu(&fresh[i], 0, fresh[i].size);
	}
	if (check_sdma(fresh, NR_NEW, n) || check_cpu(bos, NR_BOS))
		return 1;
	for (i = 0; i < NR_NEW; i++)
		if (gpu_bo_free(&fresh[i]))
			return 1;

	for (gi = 0; gi < n; gi++)
		if (gpu_new_work(c, gpus[gi].id, 0x3ee + gi))
			return 1;

	pass();
	return 0;
}
