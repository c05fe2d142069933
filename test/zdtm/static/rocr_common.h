/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Helpers of criu-rocm's zdtm tests on ROCr (gpu_rocr_*.c): Debian's ROCm 5.2
 * runtime (libhsa-runtime64), unchanged, as ROCm programs use it. Agents
 * and pools, buffers of the host pool, of every GPU's VRAM pool and locked
 * (registered) user memory, hsa_amd_memory_async_copy with completion
 * signals waited on with a deadline, patterns checked to the byte, and
 * "new work" after a restore.
 *
 * The tests also answer SIGUSR1 with a round of checks (gpu_round.h).
 *
 * ZDTM_GPU_CORRUPT=1 makes a test damage one dword of its GPU data (an
 * async copy over VRAM) right before the final check: it must then FAIL
 * (scripts/zdtm-gpu.sh --selftest).
 */
#ifndef ZDTM_ROCR_COMMON_H
#define ZDTM_ROCR_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#define ROCR_MAX_GPUS 16
/* Longer than any dump and restore here: a copy not done by then is lost. */
#define ROCR_WAIT_MS 120000

struct rocr_gpu {
	hsa_agent_t agent;
	hsa_amd_memory_pool_t vram; /* the coarse-grained global (VRAM) pool */
	uint32_t node;		    /* KFD topology node */
	char name[64];		    /* ISA name, e.g. gfx90a */
};

struct rocr {
	hsa_agent_t cpu;
	hsa_amd_memory_pool_t host; /* the first CPU agent's fine-grained global pool */
	unsigned int ngpus;
	struct rocr_gpu gpu[ROCR_MAX_GPUS];
	hsa_agent_t all[ROCR_MAX_GPUS + 1]; /* the CPU agent, then every GPU agent */
	uint64_t ts_freq;		    /* signal wait timeouts are in these ticks */
};

/* hsa_init and the agents; 0, or -1 after pr_err (also when ROCr shows no GPU). */
int rocr_init(struct rocr *r);
int rocr_shut_down(void);

/* Host memory of the fine-grained pool, accessible to the CPU and every GPU. */
void *rocr_host_alloc(struct rocr *r, size_t bytes, const char *what);
/* VRAM of GPU g, accessible to that GPU (and to its peers after rocr_allow). */
void *rocr_vram_alloc(struct rocr *r, unsigned int g, size_t bytes, const char *what);
int rocr_free(void *p, const char *what);
/* Lets GPUs a and b both reach `p` (VRAM of one of them); false without a link. */
bool rocr_peer(struct rocr *r, unsigned int a, unsigned int b);
int rocr_allow_pair(struct rocr *r, unsigned int a, unsigned int b, void *p, const char *what);

/*
 * Registers `bytes` of ordinary user memory at `p` with every GPU
 * (hsa_amd_memory_lock: a userptr BO); *agent_ptr is where GPUs reach it.
 */
int rocr_lock(struct rocr *r, void *p, size_t bytes, void **agent_ptr, const char *what);
int rocr_unlock(void *p, const char *what);

/*
 * One hsa_amd_memory_async_copy, waited for up to ROCR_WAIT_MS on `sig`
 * (a signal of the caller's thread). 0, or -1 after fail() naming `what`.
 */
int rocr_copy(struct rocr *r, void *dst, hsa_agent_t dst_agent, const void *src, hsa_agent_t src_agent,
	      size_t bytes, hsa_signal_t sig, const char *what);
int rocr_signal(hsa_signal_t *sig);

/* Dword patterns: word i of pattern `seed` is a hash of both. */
void rocr_fill(void *p, size_t bytes, uint32_t seed);
/* 0, or -1 after fail() with `what` and the offset of the first bad word. */
int rocr_check(const void *p, size_t bytes, uint32_t seed, const char *what);

/*
 * VRAM `dev` of GPU g as the GPU sees it: copied into the host buffer
 * `bounce` (at least `bytes`) and checked against pattern `seed`.
 */
int rocr_check_vram(struct rocr *r, unsigned int g, const void *dev, size_t bytes, uint32_t seed, void *bounce,
		    hsa_signal_t sig, const char *what);

/*
 * New work on every GPU: fresh host memory, VRAM and locked user memory,
 * host -> VRAM -> VRAM (same GPU) -> locked memory, and VRAM -> VRAM to
 * the next GPU where a link allows it, every byte checked, everything
 * freed. With ZDTM_GPU_CORRUPT it damages its own VRAM on the way, so it
 * must fail. 0, or -1 after fail().
 */
int rocr_new_work(struct rocr *r, uint32_t seed);

/* Whether ZDTM_GPU_CORRUPT asks for damage. */
bool rocr_corrupt_requested(void);
/* Overwrites the dword at `off` of VRAM `dev` of GPU g with a value no pattern has there. */
int rocr_corrupt(struct rocr *r, unsigned int g, void *dev, size_t off, hsa_signal_t sig);

uint64_t rocr_now_ms(void);

#endif /* ZDTM_ROCR_COMMON_H */
