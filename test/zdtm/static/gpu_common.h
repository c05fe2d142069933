/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Helpers shared by criu-rocm's zdtm GPU tests (gpu_*.c): BOs with
 * checkable patterns, verification through the CPU mapping and through
 * the GPU (SDMA read-back), a post-restore "new work runs" check, and the
 * few raw KFD ioctls the kfd-client C ABI does not offer (userptr, events).
 *
 * Every check reports through zdtm's fail() with the GPU, the BO and the
 * byte offset of the first mismatch.
 *
 * ZDTM_GPU_CORRUPT=1 in the environment makes a test damage one dword of
 * its GPU data (through the GPU) right before it verifies: the test must
 * then FAIL. scripts/zdtm-gpu.sh --selftest uses it to prove that every
 * test can fail.
 */
#ifndef ZDTM_GPU_COMMON_H
#define ZDTM_GPU_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "kfd_client.h"
#include "gpu_pattern.h"

/* A BO and what it must contain. */
struct gpu_bo {
	struct kfd_client_bo *bo;
	const char *name;
	uint32_t gpu_id;
	uint32_t kind; /* KFD_CLIENT_MEM_* */
	uint64_t va;   /* GPU VA == CPU address */
	uint64_t size;
	/*
	 * Content: dword i is gpu_pattern(seed, (i + rot) % (size / 4)) (the
	 * pattern rotated left by rot dwords), or `fill` for every dword.
	 */
	uint32_t seed;
	uint64_t rot;
	bool is_fill;
	uint32_t fill;
};

/*
 * The text of the last kfd-client failure on this thread; sets errno to
 * -ret so that fail()/pr_err() print the matching errno.
 */
const char *gpu_errtext(int ret);

#define gpu_fail(ret, fmt, ...)                                     \
	({                                                          \
		const char *__t = gpu_errtext(ret);                 \
		fail(fmt ": %s", ##__VA_ARGS__, __t);               \
	})

#define gpu_err(ret, fmt, ...)                                      \
	({                                                          \
		const char *__t = gpu_errtext(ret);                 \
		pr_err(fmt ": %s\n", ##__VA_ARGS__, __t);           \
	})

static inline void *gpu_ptr(uint64_t va)
{
	return (void *)(uintptr_t)va;
}

static inline const char *gpu_kind_name(uint32_t kind)
{
	return kind == KFD_CLIENT_MEM_VRAM ? "VRAM" : "GTT";
}

/* What dword `index` of `b` must hold. */
uint32_t gpu_expected(const struct gpu_bo *b, uint64_t index);

/* Opens /dev/kfd and every GPU; the GPU count goes to *ngpus. */
int gpu_open(struct kfd_client **c, uint32_t *ngpus);

/* gpu_open() for a test that handles at most `max` GPUs: more is a logged error. */
int gpu_open_at_most(struct kfd_client **c, uint32_t *ngpus, uint32_t max);

/* gpu_id of GPU `index`, or 0 (never a valid gpu_id) after a logged error. */
uint32_t gpu_id_of(struct kfd_client *c, uint32_t index);

/* gpu_open, then the gpu_id of GPU `index` (0 after pr_err). */
uint32_t gpu_open_one(struct kfd_client **c, uint32_t *ngpus, uint32_t index);

/* An SDMA queue with a 64 KiB ring on gpu_id, or NULL after pr_err. */
struct kfd_client_queue *gpu_queue(struct kfd_client *c, uint32_t gpu_id);

int gpu_bo_alloc(struct kfd_client *c, struct gpu_bo *b, const char *name, uint32_t gpu_id, uint32_t kind,
		 uint64_t size);
int gpu_bo_free(struct gpu_bo *b);

/* Writes what the BO must hold into [off, off + len) through the CPU. */
void gpu_bo_fill_cpu(struct gpu_bo *b, uint64_t off, uint64_t len);

/*
 * Writes what the BO must hold into the whole BO through the GPU only: the
 * CPU writes each chunk into `staging` (GTT, same GPU) and SDMA copies it in.
 */
int gpu_bo_fill_sdma(struct kfd_client_queue *q, struct gpu_bo *b, struct gpu_bo *staging);

/* The same for [off, off + len) of the BO only. */
int gpu_fill_sdma_range(struct kfd_client_queue *q, struct gpu_bo *b, uint64_t off, uint64_t len,
			struct gpu_bo *staging);

/*
 * Compares `len` bytes at `data` (the content of `b` at `off`, read by
 * `how`) with what the BO must hold; fail()s naming GPU/BO/offset.
 */
int gpu_check_range(const struct gpu_bo *b, const void *data, uint64_t off, uint64_t len, const char *how);

/* The whole BO through its CPU mapping. */
int gpu_bo_check_cpu(const struct gpu_bo *b);

/*
 * The whole BO as the GPU sees it: SDMA copies it chunk by chunk into
 * `staging` (GTT) on queue `q`, and each chunk is compared.
 */
int gpu_bo_check_sdma(struct kfd_client_queue *q, const struct gpu_bo *b, struct gpu_bo *staging);

/* The same for [off, off + len) of the BO only. */
int gpu_check_sdma_range(struct kfd_client_queue *q, const struct gpu_bo *b, uint64_t off, uint64_t len,
			 struct gpu_bo *staging);

/* Both of the above. */
int gpu_bo_check(struct kfd_client_queue *q, const struct gpu_bo *b, struct gpu_bo *staging);

/*
 * New work on `gpu_id` after restore: fresh VRAM and GTT BOs, a fresh SDMA
 * queue, a fill, a copy and a fence, all checked. 0 or 1 (after fail()).
 */
int gpu_new_work(struct kfd_client *c, uint32_t gpu_id, uint32_t seed);

/* True when ZDTM_GPU_CORRUPT asks this test to damage its data. */
bool gpu_corrupt_requested(void);

/*
 * Overwrites the dword at `off` of `b` through the GPU (SDMA fill) with a
 * value the BO must not hold there.
 */
int gpu_corrupt(struct kfd_client_queue *q, struct gpu_bo *b, uint64_t off);

/* Raw KFD, for what the kfd-client C ABI does not cover. */

/* The client's /dev/kfd fd (found by file identity), or -1 after pr_err. */
int gpu_kfd_fd(void);

/* A USERPTR BO over [addr, addr + size) at GPU VA addr, mapped on gpu_id. */
int gpu_userptr_register(int kfd, uint32_t gpu_id, void *addr, uint64_t size, uint64_t *handle);
int gpu_userptr_unregister(int kfd, uint32_t gpu_id, uint64_t handle);

/* Signal events: create (auto-reset), set, destroy; negative errno on failure. */
int gpu_event_create(int kfd, uint32_t *event_id);
int gpu_event_set(int kfd, uint32_t event_id);
int gpu_event_destroy(int kfd, uint32_t event_id);

enum { GPU_WAIT_COMPLETE, GPU_WAIT_TIMEOUT, GPU_WAIT_FAIL };

/*
 * One WAIT_EVENTS on `event_id` for up to `timeout_ms`: GPU_WAIT_* or a
 * negative errno (-EINTR when a signal or a checkpoint interrupted it).
 */
int gpu_event_wait_once(int kfd, uint32_t event_id, uint32_t timeout_ms);

/* Monotonic milliseconds. */
uint64_t gpu_now_ms(void);

#endif /* ZDTM_GPU_COMMON_H */
