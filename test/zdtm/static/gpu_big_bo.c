// SPDX-License-Identifier: GPL-2.0-only
/*
 * One VRAM BO larger than 1 GiB (and not a multiple of 2 MiB, the upstream
 * plugin's SDMA chunk), written sparsely: whole regions at the start, at
 * the end, across the 512 MiB mark and (by the GPU) at 768 MiB, plus a
 * 64-byte stamp in every 1 MiB block; the rest is never written and must
 * read back as zeroes. Written bytes hold the pattern of their absolute
 * dword index, so data restored at the wrong offset shows.
 *
 * The emulator's VRAM is a sparse memfd, so the untouched gigabyte costs no
 * memory until something writes it; the profiles have 32 GiB or more of
 * VRAM per GPU. After restore a second BO of the same size must fit.
 */
#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "A GPU BO of more than 1 GiB survives C/R";
const char *test_author = "criu-rocm";

#define MIB	(1ULL << 20)
#define BIG	((1ULL << 30) + 2 * MIB + (68 << 10))
#define NBLOCKS ((BIG + MIB - 1) / MIB)
#define STAMP	64
#define HOLE	256 /* zero bytes checked at the end of each block */

static const struct {
	uint64_t off, len;
	bool by_gpu;
} regions[] = {
	{ 0, 4 * MIB, false },
	{ 511 * MIB + 4096, 2 * MIB, false },
	{ 768 * MIB, 8 * MIB, true },
	{ BIG - 3 * MIB - (68 << 10), 3 * MIB + (68 << 10), false },
};

static struct gpu_bo big, zero, staging;

static uint64_t block_len(uint64_t block)
{
	return BIG - block * MIB < MIB ? BIG - block * MIB : MIB;
}

/* A different page of each block (the last one is short). */
static uint64_t stamp_at(uint64_t block)
{
	return block * MIB + block * 7 % (block_len(block) / 4096 - 1) * 4096 + 1024;
}

static uint64_t hole_at(uint64_t block)
{
	return block * MIB + block_len(block) - 512;
}

static bool in_region(uint64_t off, uint64_t len)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(regions); i++)
		if (off < regions[i].off + regions[i].len && regions[i].off < off + len)
			return true;
	return false;
}

/* Stamps and holes of every block as the GPU sees them: one copy each into `staging`. */
static int check_blocks_sdma(struct kfd_client_queue *q)
{
	uint64_t b;
	int ret;

	memset(gpu_ptr(staging.va), 0xee, NBLOCKS * 512);
	for (b = 0; b < NBLOCKS; b++) {
		ret = kfd_client_sdma_copy(q, big.va + stamp_at(b), staging.va + b * 512, STAMP);
		if (!ret && !in_region(hole_at(b), HOLE))
			ret = kfd_client_sdma_copy(q, big.va + hole_at(b), staging.va + b * 512 + 256, HOLE);
		if (ret)
			return gpu_fail(ret, "GPU %#x: SDMA read-back of block %llu of BO %s", big.gpu_id,
					(unsigned long long)b, big.name);
	}
	ret = kfd_client_sdma_wait_idle(q, 120000);
	if (ret)
		return gpu_fail(ret, "GPU %#x: SDMA read-back of BO %s's blocks", big.gpu_id, big.name);
	for (b = 0; b < NBLOCKS; b++) {
		if (gpu_check_range(&big, gpu_ptr(staging.va + b * 512), stamp_at(b), STAMP, "by SDMA"))
			return 1;
		if (!in_region(hole_at(b), HOLE) &&
		    gpu_check_range(&zero, gpu_ptr(staging.va + b * 512 + 256), hole_at(b), HOLE, "by SDMA"))
			return 1;
	}
	return 0;
}

static int check(struct kfd_client_queue *q)
{
	unsigned int i;
	uint64_t b;

	for (i = 0; i < ARRAY_SIZE(regions); i++) {
		if (gpu_check_range(&big, gpu_ptr(big.va + regions[i].off), regions[i].off, regions[i].len,
				    "by the CPU"))
			return 1;
		if (gpu_check_sdma_range(q, &big, regions[i].off, regions[i].len, &staging))
			return 1;
	}
	for (b = 0; b < NBLOCKS; b++) {
		if (gpu_check_range(&big, gpu_ptr(big.va + stamp_at(b)), stamp_at(b), STAMP, "by the CPU"))
			return 1;
		if (!in_region(hole_at(b), HOLE) &&
		    gpu_check_range(&zero, gpu_ptr(big.va + hole_at(b)), hole_at(b), HOLE, "by the CPU"))
			return 1;
	}
	return check_blocks_sdma(q);
}

int main(int argc, char **argv)
{
	struct kfd_client_queue *q;
	struct gpu_bo again;
	struct kfd_client *c;
	uint32_t n, gpu;
	unsigned int i;
	uint64_t b;
	int ret;

	test_init(argc, argv);

	gpu = gpu_open_one(&c, &n, 0);
	if (!gpu)
		return 1;
	if (gpu_bo_alloc(c, &big, "big-1G", gpu, KFD_CLIENT_MEM_VRAM, BIG) ||
	    gpu_bo_alloc(c, &staging, "staging", gpu, KFD_CLIENT_MEM_GTT, 4 * MIB))
		return 1;
	big.seed = 0xb16;
	zero = big;
	zero.is_fill = true;
	zero.fill = 0;
	ret = kfd_client_sdma_queue_create(c, gpu, 256 << 10, &q);
	if (ret) {
		gpu_err(ret, "GPU %#x: cannot create an SDMA queue", gpu);
		return 1;
	}
	for (i = 0; i < ARRAY_SIZE(regions); i++) {
		if (!regions[i].by_gpu)
			gpu_bo_fill_cpu(&big, regions[i].off, regions[i].len);
		else if (gpu_fill_sdma_range(q, &big, regions[i].off, regions[i].len, &staging))
			return 1;
	}
	for (b = 0; b < NBLOCKS; b++)
		gpu_bo_fill_cpu(&big, stamp_at(b), STAMP);
	if (check(q))
		return 1;
	test_msg("GPU %#x: %#llx-byte VRAM BO at %#llx, %llu blocks stamped\n", gpu, BIG, (unsigned long long)big.va,
		 (unsigned long long)NBLOCKS);

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested() && gpu_corrupt(q, &zero, hole_at(700) + 16))
		return 1;

	if (check(q))
		return 1;

	/* The same size again next to it: VRAM accounting after restore. */
	if (gpu_bo_alloc(c, &again, "big-1G-new", gpu, KFD_CLIENT_MEM_VRAM, BIG))
		return fail("GPU %#x: no second %#llx-byte BO after restore", gpu, BIG);
	again.seed = 0xb17;
	gpu_bo_fill_cpu(&again, 0, 4096);
	gpu_bo_fill_cpu(&again, BIG - 4096, 4096);
	if (gpu_check_sdma_range(q, &again, 0, 4096, &staging) ||
	    gpu_check_sdma_range(q, &again, BIG - 4096, 4096, &staging) || gpu_bo_free(&again))
		return 1;

	if (gpu_new_work(c, gpu, 0xb18))
		return 1;

	pass();
	return 0;
}
