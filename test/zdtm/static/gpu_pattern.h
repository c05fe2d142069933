/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The checkable pattern every criu-rocm GPU test writes: dword i of seed s
 * is gpu_pattern(s, i), a mix of both that makes a dword of another seed,
 * another offset or a zero page show as a mismatch. Only zdtm's test
 * library besides, so the tests on kfd-client, on libhsakmt and on ROCr
 * share it.
 */
#ifndef ZDTM_GPU_PATTERN_H
#define ZDTM_GPU_PATTERN_H

#include <errno.h>
#include <stdint.h>

#include "zdtmtst.h"

static inline uint32_t gpu_pattern(uint32_t seed, uint64_t index)
{
	uint64_t x = (index + 1) * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)seed << 32 | seed);

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 32;
	return (uint32_t)x;
}

/* Writes the pattern of `seed` over the bytes / 4 dwords at p. */
static inline void gpu_pattern_fill(void *p, uint64_t bytes, uint32_t seed)
{
	uint32_t *w = p;

	for (uint64_t i = 0; i < bytes / 4; i++)
		w[i] = gpu_pattern(seed, i);
}

/* The index of the first dword at p that does not hold the pattern of
 * `seed`, or bytes / 4 when all do. */
static inline uint64_t gpu_pattern_mismatch(const void *p, uint64_t bytes, uint32_t seed)
{
	const uint32_t *w = p;
	uint64_t i;

	for (i = 0; i < bytes / 4; i++)
		if (w[i] != gpu_pattern(seed, i))
			break;
	return i;
}

/*
 * 0 when the bytes / 4 dwords at p hold the pattern of `seed`; else -1,
 * after a FAIL line naming `what` and the first dword that does not.
 */
static inline int gpu_pattern_check(const void *p, uint64_t bytes, uint32_t seed, const char *what)
{
	uint64_t i = gpu_pattern_mismatch(p, bytes, seed);

	if (i == bytes / 4)
		return 0;
	errno = 0;
	fail("%s: byte %llu of %llu holds %#x, not %#x", what, (unsigned long long)(i * 4),
	     (unsigned long long)bytes, ((const uint32_t *)p)[i], gpu_pattern(seed, i));
	return -1;
}

#endif
