// SPDX-License-Identifier: GPL-2.0-only
/*
 * An SDMA queue with seconds of work still queued when the dump comes.
 *
 * The chain: N "half-steps", each rotating one 4 MiB VRAM BO into the other
 * by K bytes (two copies: X[K..S) -> Y[0..S-K), X[0..K) -> Y[S-K..S)), then
 * filling one dword of a log BO with the step number; every 32 steps a
 * fence writes the step count to a progress BO. Each step reads what the
 * previous one wrote, so the final contents depend on every step having
 * run exactly once and in order: after N steps X holds the first pattern
 * rotated by N*K bytes, and log slot j the last step i < N with
 * i % LOG_SLOTS == j. A lost, repeated or reordered step shows.
 *
 * N is calibrated for about CHAIN_MS of engine time, so the queue is busy
 * when CRIU freezes the process: the dump must save a queue with pending
 * packets, and after restore the engine must finish them. Then the same
 * queue and a new one must run new work.
 */
#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "SDMA work in flight during the dump completes correctly after restore";
const char *test_author = "criu-rocm";

#define S	  (4ULL << 20)
#define K	  0x1234ULL
#define LOG_SLOTS 4096
#define RING	  (8ULL << 20)
/* Ring bytes per step: two COPY_LINEAR (7 dwords each), a CONST_FILL (5), a FENCE (4) per 32. */
#define STEP_BYTES 80
#define MAX_STEPS  ((RING / STEP_BYTES) & ~1ULL)
#define WARMUP	   64 /* first touches of the BOs' pages */
#define CALIBRATE  256
#define CHAIN_MS   4000
#define WAIT_MS	   180000

static struct gpu_bo x, y, flog, prog;
static uint64_t nsteps;

static int step(struct kfd_client_queue *q, uint64_t i)
{
	const struct gpu_bo *src = i % 2 ? &y : &x, *dst = i % 2 ? &x : &y;
	int ret;

	ret = kfd_client_sdma_copy(q, src->va + K, dst->va, S - K);
	if (!ret)
		ret = kfd_client_sdma_copy(q, src->va, dst->va + S - K, K);
	if (!ret)
		ret = kfd_client_sdma_fill(q, flog.va + (i % LOG_SLOTS) * 4, (uint32_t)i, 4);
	if (!ret && ((i + 1) % 32 == 0 || i + 1 == nsteps))
		ret = kfd_client_sdma_fence(q, prog.va, (uint32_t)(i + 1));
	if (ret)
		gpu_err(ret, "GPU %#x: submitting step %llu of %llu", x.gpu_id, (unsigned long long)i,
			(unsigned long long)nsteps);
	return ret;
}

static uint32_t progress(void)
{
	return *(volatile uint32_t *)gpu_ptr(prog.va);
}

/* The log slot j after `n` steps: the last step i < n with i % LOG_SLOTS == j. */
static int check_log(uint64_t n)
{
	const uint32_t *l = gpu_ptr(flog.va);
	uint64_t j;

	for (j = 0; j < LOG_SLOTS; j++) {
		uint32_t want = j < n ? (uint32_t)(j + (n - 1 - j) / LOG_SLOTS * LOG_SLOTS) : 0xffffffffU;

		if (l[j] != want) {
			errno = 0;
			fail("GPU %#x VRAM BO %s: offset %#llx holds step %#x, expected step %#x (after %llu steps)",
			     flog.gpu_id, flog.name, (unsigned long long)j * 4, l[j], want, (unsigned long long)n);
			return 1;
		}
	}
	return 0;
}

/* X and Y after `n` (even) steps, by the CPU and by SDMA on `q`. */
static int check_xy(struct kfd_client_queue *q, struct gpu_bo *staging, uint64_t n)
{
	x.rot = n * K / 4 % (S / 4);
	y.rot = (n - 1) * K / 4 % (S / 4);
	return gpu_bo_check(q, &x, staging) || gpu_bo_check(q, &y, staging);
}

int main(int argc, char **argv)
{
	struct kfd_client_queue *q;
	struct gpu_bo staging;
	struct kfd_client *c;
	uint64_t i, t0 = 0, dt;
	uint32_t n, gpu, p;
	int ret;

	test_init(argc, argv);

	gpu = gpu_open_one(&c, &n, 0);
	if (!gpu)
		return 1;
	if (gpu_bo_alloc(c, &x, "rot-x", gpu, KFD_CLIENT_MEM_VRAM, S) ||
	    gpu_bo_alloc(c, &y, "rot-y", gpu, KFD_CLIENT_MEM_VRAM, S) ||
	    gpu_bo_alloc(c, &flog, "step-log", gpu, KFD_CLIENT_MEM_VRAM, LOG_SLOTS * 4) ||
	    gpu_bo_alloc(c, &prog, "progress", gpu, KFD_CLIENT_MEM_GTT, 4096) ||
	    gpu_bo_alloc(c, &staging, "staging", gpu, KFD_CLIENT_MEM_GTT, 1 << 20))
		return 1;
	x.seed = 0x1f1;
	y.seed = 0x1f1;
	gpu_bo_fill_cpu(&x, 0, S);
	memset(gpu_ptr(flog.va), 0xff, LOG_SLOTS * 4);
	ret = kfd_client_sdma_queue_create(c, gpu, RING, &q);
	if (ret) {
		gpu_err(ret, "GPU %#x: cannot create an SDMA queue with a %#llx byte ring", gpu, RING);
		return 1;
	}

	/* How fast is the engine now? The first steps of the chain tell. */
	nsteps = MAX_STEPS;
	for (i = 0; i < WARMUP + CALIBRATE; i++) {
		if (i == WARMUP) {
			ret = kfd_client_sdma_wait_idle(q, WAIT_MS);
			if (ret) {
				gpu_err(ret, "GPU %#x: the first %d steps did not finish", gpu, WARMUP);
				return 1;
			}
			t0 = gpu_now_ms();
		}
		if (step(q, i))
			return 1;
	}
	ret = kfd_client_sdma_wait_idle(q, WAIT_MS);
	if (ret) {
		gpu_err(ret, "GPU %#x: the first %d steps did not finish", gpu, WARMUP + CALIBRATE);
		return 1;
	}
	dt = gpu_now_ms() - t0 + 1;
	nsteps = WARMUP + CALIBRATE * CHAIN_MS / dt;
	if (nsteps > MAX_STEPS)
		nsteps = MAX_STEPS;
	if (nsteps < 4 * (WARMUP + CALIBRATE))
		nsteps = 4 * (WARMUP + CALIBRATE);
	nsteps &= ~1ULL;
	for (i = WARMUP + CALIBRATE; i < nsteps; i++)
		if (step(q, i))
			return 1;

	p = progress();
	test_msg("GPU %#x: %llu steps queued (%d took %llu ms), %u done when ready for the dump\n", gpu,
		 (unsigned long long)nsteps, CALIBRATE, (unsigned long long)dt, p);
	if (p >= nsteps) {
		pr_err("the chain finished before the dump: nothing would be in flight\n");
		return 1;
	}

	test_daemon();
	test_waitsig();

	p = progress();
	test_msg("on SIGTERM: %u of %llu steps done, the engine runs the rest now\n", p, (unsigned long long)nsteps);
	ret = kfd_client_sdma_wait_idle(q, WAIT_MS);
	if (ret)
		return gpu_fail(ret, "GPU %#x: the queued steps did not finish after restore (%u of %llu done)", gpu,
				progress(), (unsigned long long)nsteps);
	if (progress() != nsteps) {
		errno = 0;
		return fail("GPU %#x: queue idle but the progress fence says %u of %llu steps", gpu, progress(),
			    (unsigned long long)nsteps);
	}

	if (gpu_corrupt_requested()) {
		x.rot = nsteps * K / 4 % (S / 4);
		if (gpu_corrupt(q, &x, S - K))
			return 1;
	}

	if (check_log(nsteps) || check_xy(q, &staging, nsteps))
		return 1;

	/* The queue from before the dump takes two more steps. */
	for (i = nsteps; i < nsteps + 2; i++)
		if (step(q, i))
			return 1;
	ret = kfd_client_sdma_wait_idle(q, WAIT_MS);
	if (ret)
		return gpu_fail(ret, "GPU %#x: two new steps on the restored queue", gpu);
	if (check_log(nsteps + 2) || check_xy(q, &staging, nsteps + 2))
		return 1;

	if (gpu_new_work(c, gpu, 0x1f2))
		return 1;

	pass();
	return 0;
}
