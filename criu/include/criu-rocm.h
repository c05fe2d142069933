/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * criu-rocm: the C side of CRIU's built-in AMD GPU support.
 *
 * These calls sit between CRIU and the Rust static library (criu-gpu.h);
 * they are the only criu-rocm symbols CRIU's own files refer to.
 */
#ifndef __CR_CRIU_ROCM_H__
#define __CR_CRIU_ROCM_H__

#include <stdbool.h>

/* Brings up the GPU library; called once CRIU's log is open. */
extern int criu_rocm_init(void);

/* Prints criu-rocm's version and git revision after CRIU's own (--version). */
extern void criu_rocm_print_version(void);

/*
 * Refuses a stray upstream AMD GPU plugin in the plugin directory: criu-rocm
 * handles those files itself and two handlers for one file cannot both win.
 */
extern bool criu_rocm_plugin_refused(const char *dir, const char *name);

#endif /* __CR_CRIU_ROCM_H__ */
