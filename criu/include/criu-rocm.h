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
#include "criu-plugin.h"

/*
 * Called first thing in main(): runs a helper mode of criu-rocm when argv[1]
 * names one (the GPU memory writer of a restore, which criu main starts by
 * executing itself again) and returns its exit status; -ENOTSUP when criu
 * runs as itself.
 */
extern int criu_rocm_helper_main(int argc, char **argv);

/* Brings up the GPU library; called once CRIU's log is open. */
extern int criu_rocm_init(void);

/*
 * --gpu-knob NAME=VALUE: a GPU knob (KFD_*_CHECK, KFD_MAX_BUFFER_SIZE,
 * CRIU_ROCM_COPY_ENGINE) set from the command line or a configuration file,
 * in place of the environment variable NAME.  -1 (said why): not a knob or
 * not a value the knob takes.
 */
extern int criu_rocm_set_knob(const char *arg);

/*
 * The task (its pid in criu's namespace) and fd number of the file CRIU dumps next, for the
 * GPU plugin's DUMP_EXT_FILE (a dma-buf's record and refusals name them).
 */
extern void criu_rocm_note_file_owner(pid_t pid, int fd);

/* Prints criu-rocm's version and git revision after CRIU's own (--version). */
extern void criu_rocm_print_version(void);

/*
 * Whether the plugin at path, whose descriptor (CR_PLUGIN_DESC) is d, is
 * upstream's AMD GPU plugin, recognised by the name in its descriptor
 * whatever its file is called.  criu-rocm handles /dev/kfd and render nodes
 * itself, and two handlers for one file cannot both win: such a plugin is
 * not loaded, with one warning naming the file.
 */
extern bool criu_rocm_plugin_skipped(const char *path, const cr_plugin_desc_t *d);

/*
 * `criu check`: warns about each plugin of the plugin directory that dump
 * and restore skip (upstream's AMD GPU plugin) or cannot load.  Returns
 * how many; never fails the check.
 */
extern int criu_rocm_check_plugins(void);

/*
 * Whether a file (an fd or a mapping's file) is this host's /dev/kfd or one
 * of its render nodes: character devices by rdev, the emulator's FUSE nodes
 * by device and inode.
 */
extern bool criu_rocm_is_gpu_file(const struct stat *st);

/*
 * criu-rocm's GPU handlers as a built-in plugin, chained before any loaded
 * plugin: init/exit per stage, HANDLE_DEVICE_VMA, CHECKPOINT_DEVICES,
 * DUMP_EXT_FILE, RESTORE_EXT_FILE, UPDATE_VMA_MAP.  (RESUME_DEVICES_LATE
 * is not needed: each task resumes its own queues at its GPU gate.)
 * Each returns -ENOTSUP for what is not a GPU object.
 */
extern cr_plugin_desc_t criu_rocm_plugin;

/* --- where CRIU has no plugin hook --- */

/*
 * Restore, in a task, before CRIU opens the regular file path (relative to
 * the task's root) by its name: an fd of the file criu-rocm checked or
 * recreated under that name for the task (libhsakmt's shared memory and
 * semaphore in /dev/shm), to open it through instead, or -1.  The fd stays
 * criu-rocm's.
 */
extern int criu_rocm_held_file(const char *path);
/*
 * For tests only: with CRIU_ROCM_TEST_HELD_OPEN_DELAY_MS=N in criu's
 * environment, a task waits N ms right before it opens a file through the
 * fd criu_rocm_held_file() gave, so that the tasks of a tree open the same
 * file at the same time (test/rocm/cr.sh).  Without it nothing happens.
 */
extern void criu_rocm_test_held_open_delay(void);

/* Dump, after all CPU memory is dumped: every paused GPU process was saved. */
extern int criu_rocm_dump_late(void);
/*
 * Dump, every image written and flushed, before the post-dump scripts: the
 * image directory loses the incomplete-dump mark criu-rocm set at the start.
 */
extern int criu_rocm_dump_complete(void);
/* End of the dump: unpause the GPUs when the tree will run again; -1 if that failed. */
extern int criu_rocm_dump_finish(bool resume);
/*
 * Pre-dump, every task frozen and seized: each GPU process is paused only to
 * take its buffer list and kernel state, then unpaused at once.
 */
extern int criu_rocm_pre_dump_pause(void);
/* Pre-dump, the tree running again: save the GPU memory, read while it runs. */
extern int criu_rocm_pre_dump_memory(void);
/*
 * End of a pre-dump (ret: its result so far): on success the GPU images get
 * their digests and lose the incomplete mark; nothing stays paused.  Returns
 * the pre-dump's result.
 */
extern int criu_rocm_pre_dump_finish(int ret);
/* Restore, first thing: refuse an image directory left by a dump that did not complete. */
extern int criu_rocm_restore_check(void);
/* In the restored task, after all its mappings are opened: drop the fds kept for the hooks. */
extern int criu_rocm_restore_task_done(void);

/* --- the GPU gate (criu/include/gpu-gate.h) --- */

struct gpu_gate_args;

/*
 * In a task just forked for a restore with GPU state: it dies with its
 * parent (root task: with criu; the root task of --restore-sibling through
 * the tie of criu_rocm_root_tie_open) until its restorer watches criu or
 * sets its own parent-death signal, so that no half-restored task outlives
 * criu.
 */
extern int criu_rocm_task_start(void);
/*
 * criu main, around the fork of the root task: with --restore-sibling in a
 * restore with GPU state, a pipe whose read end only the root task keeps and
 * whose write end only criu does; its close, when criu exits, kills the root
 * task until its restorer watches criu (criu_rocm_task_start arms it).
 */
extern int criu_rocm_root_tie_open(void);
extern void criu_rocm_root_tie_forked(void);
/*
 * In the restored task, before it jumps to the restorer: its GPU gate's fds
 * and the pidfd of criu it watches until the hand-off (-1: none).
 */
extern void criu_rocm_restorer_gate(struct gpu_gate_args *gate);
/*
 * criu main, as it seizes thread pid for the end of a restore with GPU
 * state (has_seccomp: its seccomp is suspended): PTRACE_O_EXITKILL, so that
 * a criu that dies before it lets the tasks go takes every one with it.
 */
extern void criu_rocm_restore_seized(int pid, bool has_seccomp);
/*
 * criu main, once every task finished CR_STATE_RESTORE (each passed its
 * GPU gate) and before any may run: every KFD image was restored exactly
 * once, in the task of its pid, its memory confirmed and its queues
 * resumed; the GPU memory writer is stopped.  -1: the restore must fail.
 */
extern int criu_rocm_restore_settle(void);

/* `criu-rocm gpu-check -D DIR`: can these images be restored here, and how. */
extern int criu_rocm_gpu_check(const char *dir);

/*
 * Render nodes at their own paths (render-mounts.c, patch 0050).  While the
 * image's mounts are read (get_mp_root): an external mount keyed by a render
 * node path (/dev/dri/renderD<N>) whose key ext the restore maps is noted;
 * one it does not map is taken (1) to be placed later.  0: not a render
 * node, or noted; -1: no memory.
 */
struct mount_info;
extern int criu_rocm_collect_render_mount(struct mount_info *mi, const char *key, const char *ext);

/*
 * Once every mount is read: the render-node mounts without a source take the
 * render nodes the restore names and no image mount holds, one for one in
 * minor order, at their own paths.  -1 (said why) when the counts differ.
 */
extern int criu_rocm_place_render_mounts(void);

/*
 * After CRIU restored the content of mount parent (a tmpfs) at root: the
 * mount points of the placed mounts below it, renamed from the old node's
 * file or made; and its render device nodes (mknod'ed by runc) that the
 * restore does not name, replaced by the ones it names and the tmpfs lacks.
 * -1 (said why) when that cannot be done or the counts differ.
 */
extern int criu_rocm_render_mountpoints(struct mount_info *parent, const char *root);

#endif /* __CR_CRIU_ROCM_H__ */
