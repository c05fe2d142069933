/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Helpers of criu-rocm's zdtm tests on libhsakmt (gpu_hsakmt_*.c): Debian's
 * ROCm 5.2 thunk (libhsakmt, the library ROCr is built on), unchanged. The
 * topology's GPU nodes; memory of every kind the thunk hands out (VRAM,
 * GTT, paged system memory, registered user memory) mapped to GPUs; SDMA
 * queues fed with the packets ROCr's BlitSdma writes (COPY_LINEAR, FENCE,
 * TRAP), completion seen through the read pointer, a fence word and an
 * event; dword patterns checked to the byte; new work after a restore.
 *
 * ZDTM_GPU_CORRUPT=1 makes a test damage one dword of its VRAM through
 * SDMA right before it checks: it must then FAIL.
 */
#ifndef ZDTM_HSAKMT_COMMON_H
#define ZDTM_HSAKMT_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include <hsakmt.h>

#define KMT_MAX_GPUS 16
/* Longer than any dump and restore here: SDMA work not done by then is lost. */
#define KMT_WAIT_MS 120000

struct kmt {
	HsaSystemProperties sys;
	unsigned int ngpus;
	uint32_t gpu[KMT_MAX_GPUS]; /* node ids of the GPUs, in node order */
};

/* hsaKmtOpenKFD and the topology; 0, or -1 after pr_err (also with no GPU). */
int kmt_open(struct kmt *k);
int kmt_close(void);

/*
 * Memory from hsaKmtAllocMemory, mapped to the nodes given: VRAM of node
 * `node`, or system memory (node 0): GTT (NonPaged) or paged.
 */
enum kmt_mem { KMT_VRAM, KMT_GTT, KMT_PAGED };
void *kmt_alloc(enum kmt_mem kind, uint32_t node, uint64_t bytes, unsigned int nnodes, uint32_t *nodes,
		const char *what);
int kmt_free(void *p, uint64_t bytes, const char *what);

/* posix_memalign'd memory registered and mapped to all GPUs; *gpu_va is its GPU address. */
void *kmt_user(struct kmt *k, uint64_t bytes, uint64_t *gpu_va, const char *what);
int kmt_user_free(void *p, const char *what);

/* An SDMA queue of one GPU, its ring and fence words in GTT. */
struct kmt_sdma {
	uint32_t node;
	uint32_t *ring;
	uint64_t wptr; /* bytes, monotonic (64-bit doorbell and pointers on GFX9+) */
	HsaQueueResource qr;
	volatile uint32_t *fence; /* a GTT word SDMA's FENCE writes */
	uint32_t fence_value;
	HsaEvent *event; /* signalled by FENCE to its mailbox + TRAP */
};

int kmt_sdma_create(struct kmt_sdma *q, uint32_t node);
int kmt_sdma_destroy(struct kmt_sdma *q);

/*
 * SDMA copies of `bytes` from GPU address src to dst, then a FENCE, a
 * mailbox FENCE and a TRAP; waits for the event, the read pointer and the
 * fence word (each up to KMT_WAIT_MS). 0, or -1 after fail() with `what`.
 */
int kmt_sdma_copy(struct kmt_sdma *q, uint64_t dst, uint64_t src, uint64_t bytes, const char *what);

void kmt_fill(void *p, uint64_t bytes, uint32_t seed);
int kmt_check(const void *p, uint64_t bytes, uint32_t seed, const char *what);

/*
 * New work on every GPU: fresh VRAM and GTT, a fresh SDMA queue and event,
 * GTT -> VRAM -> GTT copied and checked, events set and waited for,
 * everything freed. 0, or -1 after fail().
 */
int kmt_new_work(struct kmt *k, uint32_t seed);

bool kmt_corrupt_requested(void);
/* Overwrites the dword at GPU address `va` through SDMA queue q. */
int kmt_corrupt(struct kmt_sdma *q, uint64_t va);

uint64_t kmt_now_ms(void);

#endif /* ZDTM_HSAKMT_COMMON_H */
