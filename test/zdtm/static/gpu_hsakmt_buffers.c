// SPDX-License-Identifier: GPL-2.0-only
/*
 * libhsakmt memory of every kind on every GPU, and an SDMA queue per GPU,
 * across checkpoint/restore. Each GPU has VRAM written by the CPU and
 * VRAM written by its SDMA engine; GTT, paged system memory (a userptr BO
 * the thunk makes) and registered malloc'd memory are mapped to all GPUs.
 * Each GPU's SDMA queue (ring and fences in GTT, completion through an
 * event's mailbox and a TRAP) runs before the dump and must run again
 * after it from where its ring was. After restore every buffer is checked
 * by the CPU, and by each GPU through its old queue; the queues copy
 * between the kinds again, a buffer is freed, new work runs, and the
 * thunk closes.
 */
#include <string.h>

#include "zdtmtst.h"
#include "gpu_round.h"
#include "hsakmt_common.h"

const char *test_doc = "libhsakmt memory and SDMA queues on every GPU survive C/R";
const char *test_author = "criu-rocm";

#define BYTES (2 << 20)
enum { SEED_GTT = 0xa0000001, SEED_PAGED = 0xa0000002, SEED_USER = 0xa0000003, SEED_VRAM = 0xa0001000,
       SEED_SDMA = 0xa0002000 };

static struct kmt k;
static struct {
	void *gtt, *paged, *user, *readback;
	uint64_t user_va;
	void *vram[KMT_MAX_GPUS]; /* written by the CPU: SEED_VRAM + i */
	void *sdma[KMT_MAX_GPUS]; /* written by SDMA: SEED_SDMA + i */
	struct kmt_sdma q[KMT_MAX_GPUS];
} s;

static int setup(void)
{
	char what[64];

	s.gtt = kmt_alloc(KMT_GTT, 0, BYTES, k.ngpus, k.gpu, "GTT");
	s.paged = kmt_alloc(KMT_PAGED, 0, BYTES, k.ngpus, k.gpu, "paged system memory");
	s.readback = kmt_alloc(KMT_GTT, 0, BYTES, k.ngpus, k.gpu, "read-back GTT");
	s.user = kmt_user(&k, BYTES, &s.user_va, "registered user memory");
	if (!s.gtt || !s.paged || !s.readback || !s.user)
		return -1;
	kmt_fill(s.gtt, BYTES, SEED_GTT);
	kmt_fill(s.paged, BYTES, SEED_PAGED);
	kmt_fill(s.user, BYTES, SEED_USER);
	for (unsigned int i = 0; i < k.ngpus; i++) {
		uint32_t g = k.gpu[i];

		snprintf(what, sizeof(what), "VRAM of node %u", g);
		s.vram[i] = kmt_alloc(KMT_VRAM, g, BYTES, 1, &g, what);
		s.sdma[i] = kmt_alloc(KMT_VRAM, g, BYTES, 1, &g, what);
		if (!s.vram[i] || !s.sdma[i] || kmt_sdma_create(&s.q[i], g))
			return -1;
		kmt_fill(s.vram[i], BYTES, SEED_VRAM + i);
		/* SDMA writes the second: its pattern staged in the read-back buffer. */
		kmt_fill(s.readback, BYTES, SEED_SDMA + i);
		snprintf(what, sizeof(what), "GTT -> VRAM of node %u by SDMA", g);
		if (kmt_sdma_copy(&s.q[i], (uintptr_t)s.sdma[i], (uintptr_t)s.readback, BYTES, what))
			return -1;
	}
	return 0;
}

/* What GPU i sees at GPU address va: SDMA copies it into the read-back buffer. */
static int gpu_check(unsigned int i, uint64_t va, uint32_t seed, const char *what)
{
	memset(s.readback, 0, BYTES);
	if (kmt_sdma_copy(&s.q[i], (uintptr_t)s.readback, va, BYTES, what))
		return -1;
	return kmt_check(s.readback, BYTES, seed, what);
}

static int check_all(const char *when)
{
	char what[160];

	snprintf(what, sizeof(what), "%s: GTT read by the CPU", when);
	if (kmt_check(s.gtt, BYTES, SEED_GTT, what))
		return -1;
	snprintf(what, sizeof(what), "%s: paged memory read by the CPU", when);
	if (kmt_check(s.paged, BYTES, SEED_PAGED, what))
		return -1;
	snprintf(what, sizeof(what), "%s: registered memory read by the CPU", when);
	if (kmt_check(s.user, BYTES, SEED_USER, what))
		return -1;
	for (unsigned int i = 0; i < k.ngpus; i++) {
		uint32_t g = k.gpu[i];

		snprintf(what, sizeof(what), "%s: VRAM of node %u read by the CPU", when, g);
		if (kmt_check(s.vram[i], BYTES, SEED_VRAM + i, what))
			return -1;
		snprintf(what, sizeof(what), "%s: SDMA-written VRAM of node %u read by the CPU", when, g);
		if (kmt_check(s.sdma[i], BYTES, SEED_SDMA + i, what))
			return -1;
		snprintf(what, sizeof(what), "%s: VRAM of node %u read by its SDMA queue", when, g);
		if (gpu_check(i, (uintptr_t)s.vram[i], SEED_VRAM + i, what))
			return -1;
		snprintf(what, sizeof(what), "%s: SDMA-written VRAM of node %u read by its SDMA queue", when, g);
		if (gpu_check(i, (uintptr_t)s.sdma[i], SEED_SDMA + i, what))
			return -1;
		snprintf(what, sizeof(what), "%s: GTT read by node %u", when, g);
		if (gpu_check(i, (uintptr_t)s.gtt, SEED_GTT, what))
			return -1;
		snprintf(what, sizeof(what), "%s: paged memory read by node %u", when, g);
		if (gpu_check(i, (uintptr_t)s.paged, SEED_PAGED, what))
			return -1;
		snprintf(what, sizeof(what), "%s: registered memory read by node %u", when, g);
		if (gpu_check(i, s.user_va, SEED_USER, what))
			return -1;
	}
	return 0;
}

static int round_fn(void *arg, unsigned int n)
{
	char when[32];

	(void)arg;
	snprintf(when, sizeof(when), "round %u", n);
	if (check_all(when))
		return -1;
	return kmt_new_work(&k, 0xa0c00000 + (n << 8));
}

int main(int argc, char **argv)
{
	unsigned int i;
	int ret;

	test_init(argc, argv);

	if (kmt_open(&k) || setup())
		return 1;
	/* Everything is right before the dump, or the test itself is wrong. */
	if (check_all("before the dump"))
		return 1;
	test_msg("%u GPU(s): VRAM, GTT, paged and registered memory, an SDMA queue each\n", k.ngpus);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, NULL);

	i = k.ngpus - 1;
	if (kmt_corrupt_requested() && kmt_corrupt(&s.q[i], (uintptr_t)s.sdma[i] + BYTES - 4))
		return 1;
	if (check_all("at the end") || ret)
		return 1;
	/* The old queues move data between the kinds: VRAM -> registered -> paged. */
	for (i = 0; i < k.ngpus; i++) {
		if (kmt_sdma_copy(&s.q[i], s.user_va, (uintptr_t)s.vram[i], BYTES, "VRAM -> registered memory") ||
		    kmt_sdma_copy(&s.q[i], (uintptr_t)s.paged, s.user_va, BYTES, "registered -> paged memory") ||
		    kmt_check(s.paged, BYTES, SEED_VRAM + i, "VRAM -> registered -> paged memory"))
			return 1;
	}
	/* A restored buffer can be freed; the others keep their data. */
	if (kmt_free(s.vram[0], BYTES, "restored VRAM"))
		return 1;
	s.vram[0] = NULL;
	if (kmt_check(s.sdma[0], BYTES, SEED_SDMA, "SDMA-written VRAM after freeing its neighbour"))
		return 1;
	if (kmt_new_work(&k, 0xa0c0))
		return 1;
	for (i = 0; i < k.ngpus; i++)
		if (kmt_sdma_destroy(&s.q[i]) || kmt_free(s.vram[i], BYTES, "VRAM") ||
		    kmt_free(s.sdma[i], BYTES, "VRAM"))
			return 1;
	if (kmt_user_free(s.user, "registered memory") || kmt_free(s.gtt, BYTES, "GTT") ||
	    kmt_free(s.paged, BYTES, "paged memory") || kmt_free(s.readback, BYTES, "read-back GTT"))
		return 1;
	if (kmt_close())
		return 1;
	pass();
	return 0;
}
