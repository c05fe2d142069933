/* SPDX-License-Identifier: GPL-2.0-only */
/* Generated from rust/criu-gpu by its header test; do not edit by hand. */
#ifndef __CR_CRIU_GPU_H__
#define __CR_CRIU_GPU_H__

/*
 * Every entry returns 0 or a negative errno; -ENOTSUP means "not a GPU
 * object, let CRIU handle it". No entry unwinds into C.
 */

/* Returns the criu-rocm version as a NUL-terminated static string. */
const char *criu_gpu_version(void);

/* Routes the library's log records into CRIU's log at the given verbosity. */
int criu_gpu_init(int loglevel);

#endif /* __CR_CRIU_GPU_H__ */
