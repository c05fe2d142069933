/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * criu-rocm: the GPU gate a restored task passes in CRIU's restorer, after
 * its own memory is in place and before it can return to its code.
 *
 * The task waits on its end of a SOCK_SEQPACKET channel for the GPU memory
 * writer's verdict on its GPU memory; on "written and verified" it resumes
 * its own GPU queues (KFD CRIU_OP RESUME on its own /dev/kfd) and reports
 * back; on anything else, or end-of-file (the writer died, alone or with
 * criu), it exits and never runs its own code.  The layouts below are also
 * the Rust writer's (rust/amdgpu-cr/src/session/writer.rs, mod gate).
 *
 * After the gate the task only waits for criu's last stages; it watches a
 * pidfd of criu meanwhile and exits should criu die before the hand-off
 * (CR_STATE_COMPLETE), so that no task waits for a stage that cannot come.
 * Where that watch begins, the task drops the ties to criu it had from its
 * fork and could not keep longer (GPU_GATE_UNTIE_*).
 */
#ifndef __CR_GPU_GATE_H__
#define __CR_GPU_GATE_H__

#include "int.h"

/* What criu-rocm.c hands the restorer in struct task_restore_args. */
struct gpu_gate_args {
	int chan;  /* the task's end of its channel to the writer; -1: no GPU state */
	int kfd;   /* the task's /dev/kfd, for its own RESUME */
	u32 image; /* the KFD image, for messages */
	int criu;  /* a pidfd of criu main, watched until the hand-off; -1: not a GPU restore */
	int tie;   /* --restore-sibling: the read end of the pipe that ties the root task to criu; -1: none */
	u32 untie; /* GPU_GATE_UNTIE_*: what the task undoes where its watch on criu begins */
};

/*
 * The task's parent-death signal ties it to a helper task, which exits once
 * every task ended CR_STATE_RESTORE: the task drops it before it ends that
 * stage, and its watch on criu takes over.
 */
#define GPU_GATE_UNTIE_PDEATHSIG 1u
/* The task is the root of --restore-sibling: it disarms the tie (O_ASYNC off) before it closes it. */
#define GPU_GATE_UNTIE_ROOT_TIE 2u

#define GPU_GATE_MAGIC	 0x41544747
#define GPU_GATE_WHY_LEN 240

/* writer -> task: status 0, the memory is written and its hashes check; else an errno and why. */
struct gpu_gate_verdict {
	u32 magic;
	u32 status;
	char why[GPU_GATE_WHY_LEN];
};

/* task -> writer: status 0, its queues are resumed; else RESUME's errno. */
struct gpu_gate_report {
	u32 magic;
	u32 status;
};

_Static_assert(sizeof(struct gpu_gate_verdict) == 248, "the writer's verdict is 248 bytes");
_Static_assert(sizeof(struct gpu_gate_report) == 8, "the task's report is 8 bytes");

/* In the restorer: 0 when the task may go on (no GPU state, or memory confirmed and queues resumed). */
extern int gpu_gate_pass(struct gpu_gate_args *g);

struct task_entries;

/*
 * restore_finish_stage() for the task's leader after its gate: in a GPU
 * restore it also watches criu while it waits for the next stage, and
 * returns -1 (logged) once criu has died: the task must exit then, for
 * the stage will never come.  Without a pidfd of criu, upstream's wait.
 */
extern int gpu_gate_finish_stage(struct gpu_gate_args *g, struct task_entries *te, int stage);

/* After CR_STATE_COMPLETE: criu armed the final stop, the task stops watching it. */
extern void gpu_gate_handed_over(struct gpu_gate_args *g);

#endif /* __CR_GPU_GATE_H__ */
