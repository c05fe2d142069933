// SPDX-License-Identifier: GPL-2.0-only
/*
 * ROCr memory of every kind on every GPU across checkpoint/restore: VRAM of
 * each GPU written by async copies from the host, VRAM written by the
 * previous GPU (peer copies, where the topology links the two), host memory
 * of the fine-grained pool written by the CPU, and locked user memory
 * (hsa_amd_memory_lock of malloc'd pages: a userptr BO) written by a GPU.
 * After restore every buffer is checked as the CPU or a GPU sees it, the
 * GPUs read the host memory again, a buffer is freed, new work runs, and
 * ROCr shuts down cleanly.
 */
#include <stdlib.h>
#include <string.h>

#include "zdtmtst.h"
#include "gpu_round.h"
#include "rocr_common.h"

const char *test_doc = "ROCr VRAM, host and locked memory on every GPU survive C/R";
const char *test_author = "criu-rocm";

#define BYTES (4 << 20)
enum { SEED_HOST = 0xb0000001, SEED_USER = 0xb0000002, SEED_VRAM = 0xb0001000 };

static struct state {
	struct rocr r;
	hsa_signal_t sig;
	void *host, *bounce, *user, *user_gpu;
	void *vram[ROCR_MAX_GPUS]; /* pattern SEED_VRAM + g */
	void *peer[ROCR_MAX_GPUS]; /* the previous GPU's pattern, where linked */
	bool has_peer[ROCR_MAX_GPUS];
} s;

static unsigned int prev(unsigned int g)
{
	return (g + s.r.ngpus - 1) % s.r.ngpus;
}

static int setup(void)
{
	struct rocr *r = &s.r;
	char what[128];
	void *tmp;

	if (rocr_signal(&s.sig))
		return -1;
	s.host = rocr_host_alloc(r, BYTES, "host memory");
	s.bounce = rocr_host_alloc(r, BYTES, "the read-back buffer");
	if (!s.host || !s.bounce)
		return -1;
	if (posix_memalign(&s.user, 4096, BYTES)) {
		pr_perror("posix_memalign");
		return -1;
	}
	memset(s.user, 0, BYTES);
	if (rocr_lock(r, s.user, BYTES, &s.user_gpu, "user memory"))
		return -1;

	for (unsigned int g = 0; g < r->ngpus; g++) {
		snprintf(what, sizeof(what), "VRAM of node %u", r->gpu[g].node);
		s.vram[g] = rocr_vram_alloc(r, g, BYTES, what);
		if (!s.vram[g])
			return -1;
		rocr_fill(s.bounce, BYTES, SEED_VRAM + g);
		snprintf(what, sizeof(what), "host -> VRAM of node %u", r->gpu[g].node);
		if (rocr_copy(r, s.vram[g], r->gpu[g].agent, s.bounce, r->cpu, BYTES, s.sig, what))
			return -1;
	}
	for (unsigned int g = 0; r->ngpus > 1 && g < r->ngpus; g++) {
		unsigned int p = prev(g);

		if (!rocr_peer(r, p, g))
			continue;
		snprintf(what, sizeof(what), "VRAM of node %u for node %u", r->gpu[g].node, r->gpu[p].node);
		s.peer[g] = rocr_vram_alloc(r, g, BYTES, what);
		if (!s.peer[g] || rocr_allow_pair(r, p, g, s.vram[p], what) ||
		    rocr_allow_pair(r, p, g, s.peer[g], what))
			return -1;
		snprintf(what, sizeof(what), "VRAM of node %u -> VRAM of node %u", r->gpu[p].node, r->gpu[g].node);
		if (rocr_copy(r, s.peer[g], r->gpu[g].agent, s.vram[p], r->gpu[p].agent, BYTES, s.sig, what))
			return -1;
		s.has_peer[g] = true;
	}
	rocr_fill(s.host, BYTES, SEED_HOST);
	/* The user memory gets its pattern from a GPU: host -> VRAM (freed again) -> user memory. */
	tmp = rocr_vram_alloc(r, 0, BYTES, "VRAM for the user memory");
	if (!tmp)
		return -1;
	rocr_fill(s.bounce, BYTES, SEED_USER);
	if (rocr_copy(r, tmp, r->gpu[0].agent, s.bounce, r->cpu, BYTES, s.sig, "host -> VRAM of the first GPU") ||
	    rocr_copy(r, s.user_gpu, r->cpu, tmp, r->gpu[0].agent, BYTES, s.sig,
		      "VRAM of the first GPU -> locked user memory"))
		return -1;
	if (rocr_free(tmp, "VRAM for the user memory"))
		return -1;
	return 0;
}

static int check_all(const char *when)
{
	struct rocr *r = &s.r;
	char what[160];

	snprintf(what, sizeof(what), "%s: host memory, read by the CPU", when);
	if (rocr_check(s.host, BYTES, SEED_HOST, what))
		return -1;
	snprintf(what, sizeof(what), "%s: locked user memory, read by the CPU", when);
	if (rocr_check(s.user, BYTES, SEED_USER, what))
		return -1;
	for (unsigned int g = 0; g < r->ngpus; g++) {
		snprintf(what, sizeof(what), "%s: VRAM of node %u", when, r->gpu[g].node);
		if (rocr_check_vram(r, g, s.vram[g], BYTES, SEED_VRAM + g, s.bounce, s.sig, what))
			return -1;
		if (!s.has_peer[g])
			continue;
		snprintf(what, sizeof(what), "%s: VRAM of node %u written by node %u", when, r->gpu[g].node,
			 r->gpu[prev(g)].node);
		if (rocr_check_vram(r, g, s.peer[g], BYTES, SEED_VRAM + prev(g), s.bounce, s.sig, what))
			return -1;
	}
	/* Every GPU reads the host and the locked user memory. */
	for (unsigned int g = 0; g < r->ngpus; g++) {
		void *dst = s.has_peer[g] ? s.peer[g] : s.vram[g];
		uint32_t seed = s.has_peer[g] ? SEED_VRAM + prev(g) : SEED_VRAM + g;

		snprintf(what, sizeof(what), "%s: host memory read by node %u", when, r->gpu[g].node);
		if (rocr_copy(r, dst, r->gpu[g].agent, s.host, r->cpu, BYTES, s.sig, what) ||
		    rocr_check_vram(r, g, dst, BYTES, SEED_HOST, s.bounce, s.sig, what))
			return -1;
		snprintf(what, sizeof(what), "%s: locked user memory read by node %u", when, r->gpu[g].node);
		if (rocr_copy(r, dst, r->gpu[g].agent, s.user_gpu, r->cpu, BYTES, s.sig, what) ||
		    rocr_check_vram(r, g, dst, BYTES, SEED_USER, s.bounce, s.sig, what))
			return -1;
		/* Back to what it held. */
		rocr_fill(s.bounce, BYTES, seed);
		snprintf(what, sizeof(what), "%s: VRAM of node %u rewritten", when, r->gpu[g].node);
		if (rocr_copy(r, dst, r->gpu[g].agent, s.bounce, r->cpu, BYTES, s.sig, what))
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
	return rocr_new_work(&s.r, 0xb0c00000 + (n << 8));
}

int main(int argc, char **argv)
{
	struct rocr *r = &s.r;
	unsigned int g, peers = 0;
	int ret;

	test_init(argc, argv);

	if (rocr_init(r) || setup())
		return 1;
	/* Everything is right before the dump, or the test itself is wrong. */
	if (check_all("before the dump"))
		return 1;
	for (g = 0; g < r->ngpus; g++)
		peers += s.has_peer[g];
	test_msg("%u GPU(s): %d MiB of VRAM each, %u peer copies, host and locked user memory\n", r->ngpus,
		 BYTES >> 20, peers);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, NULL);

	if (rocr_corrupt_requested() && rocr_corrupt(r, r->ngpus - 1, s.vram[r->ngpus - 1], BYTES - 8, s.sig))
		return 1;
	if (check_all("at the end") || ret)
		return 1;
	/* A restored buffer can be freed; the others keep their data. */
	if (rocr_free(s.vram[0], "restored VRAM"))
		return 1;
	s.vram[0] = NULL;
	if (r->ngpus > 1 && rocr_check_vram(r, 1, s.vram[1], BYTES, SEED_VRAM + 1, s.bounce, s.sig,
					    "VRAM of the second GPU after freeing the first's"))
		return 1;
	if (rocr_new_work(r, 0xb0c0))
		return 1;
	if (rocr_unlock(s.user, "user memory"))
		return 1;
	for (g = 0; g < r->ngpus; g++)
		if (rocr_free(s.vram[g], "VRAM") || rocr_free(s.peer[g], "peer VRAM"))
			return 1;
	if (rocr_free(s.host, "host memory") || rocr_free(s.bounce, "read-back buffer"))
		return 1;
	hsa_signal_destroy(s.sig);
	if (rocr_shut_down())
		return 1;
	pass();
	return 0;
}
