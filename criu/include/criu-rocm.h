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
#include <sys/stat.h>
#include <sys/types.h>

#include "common/compiler.h"
#include "int.h"

struct vma_area;

/* Brings up the GPU library; called once CRIU's log is open. */
extern int criu_rocm_init(void);

/* Prints criu-rocm's version and git revision after CRIU's own (--version). */
extern void criu_rocm_print_version(void);

/*
 * Refuses a stray upstream AMD GPU plugin in the plugin directory: criu-rocm
 * handles those files itself and two handlers for one file cannot both win.
 */
extern bool criu_rocm_plugin_refused(const char *dir, const char *name);

/*
 * Whether a file (an fd or a mapping's file) is this host's /dev/kfd or one
 * of its render nodes: character devices by rdev, the emulator's FUSE nodes
 * by device and inode.
 */
extern bool criu_rocm_is_gpu_file(const struct stat *st);

/* --- dump (criu main) --- */

/*
 * A mapping of a GPU device file: marks it VMA_EXT_PLUGIN (metadata only,
 * contents saved with the GPU).  1 claimed, 0 not a GPU file, -1 error.
 */
extern int criu_rocm_claim_vma(pid_t pid, struct vma_area *vma, const struct stat *st);
/* Reads the GPU environment knobs at the start of a dump. */
extern int criu_rocm_dump_init(void);
/* Right after the tree is frozen, before any memory is read: pause every KFD process. */
extern int criu_rocm_pause_devices(void);
/* DUMP_EXT_FILE: a GPU device fd of task pid; -ENOTSUP when it is not one. */
extern int criu_rocm_dump_file(pid_t pid, int lfd, u32 id);
/* After all CPU memory is dumped: every paused GPU process was saved. */
extern int criu_rocm_dump_late(void);
/* End of the dump: unpause the GPUs when the tree will run again. */
extern int criu_rocm_dump_finish(bool resume);

/* --- restore --- */

/* criu main, before any task is created. */
extern int criu_rocm_restore_init(void);
/* In the restored task: the fd of GPU file id, or -ENOTSUP. */
extern int criu_rocm_restore_file(u32 id);
/* In the restored task: new offset and fd of a GPU mapping; 1 GPU, 0 not ours, <0 error. */
extern int criu_rocm_update_vma(const char *path, struct vma_area *vma, u64 *new_pgoff, int *map_fd);
/* In the restored task, after all its mappings are opened: drop the fds kept for the hooks. */
extern int criu_rocm_restore_task_done(void);
/* criu main, once every task sits at its final sigreturn: restart the GPU queues. */
extern int criu_rocm_resume_devices(void);

/* `criu-rocm gpu-check -D DIR`: can these images be restored here, and how. */
extern int criu_rocm_gpu_check(const char *dir);

#endif /* __CR_CRIU_ROCM_H__ */
