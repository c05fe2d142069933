// SPDX-License-Identifier: GPL-2.0-only
/*
 * criu-rocm: the GPU gate of a restored task, run by CRIU's restorer (no
 * libc here) once the task's own mappings and memory are restored and
 * before it can return to its code, and the watch on criu that follows it
 * until the hand-off.  See gpu-gate.h and
 * Documentation/gpu-checkpoint-restore.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <time.h>
#include <sys/socket.h>
#include <linux/futex.h>
#include <linux/prctl.h>
#include <linux/ioctl.h>

#include "int.h"
#include "types.h"
#include "common/compiler.h"
#include <compel/plugins/std/syscall.h>
#include <compel/plugins/std/log.h>
#include "criu-log.h"
#include "common/lock.h"
#include "rst_info.h"
#include "restorer.h"
#include "gpu-gate.h"

/* struct kfd_ioctl_criu_args of the kernel's uapi linux/kfd_ioctl.h (KFD ioctl 1.8 and later). */
struct gpu_kfd_criu_args {
	u64 devices;
	u64 bos;
	u64 priv_data;
	u64 priv_data_size;
	u32 num_devices;
	u32 num_bos;
	u32 num_objects;
	u32 pid;
	u32 op;
};

_Static_assert(sizeof(struct gpu_kfd_criu_args) == 56, "kfd_ioctl_criu_args is 56 bytes");

/* AMDKFD_IOC_CRIU_OP and KFD_CRIU_OP_RESUME */
#define GPU_AMDKFD_IOC_CRIU_OP	_IOWR('K', 0x22, struct gpu_kfd_criu_args)
#define GPU_KFD_CRIU_OP_RESUME	4

int gpu_gate_pass(struct gpu_gate_args *g)
{
	struct gpu_gate_verdict v;
	struct gpu_gate_report r;
	struct gpu_kfd_criu_args a = {};
	long pid = sys_getpid();
	long ret, sent;

	if (g->chan < 0)
		return 0;

	/* The writer's end is only in the writer: end-of-file is its death, alone or with criu. */
	do
		ret = sys_recvfrom(g->chan, &v, sizeof(v), 0, NULL, NULL);
	while (ret == -EINTR);
	if (ret == 0) {
		pr_err("amdgpu: pid %ld: the GPU memory writer died (criu or the writer was killed) before it "
		       "confirmed the GPU memory of KFD image %u; the task does not run\n",
		       pid, g->image);
		goto fail;
	}
	if (ret != sizeof(v) || v.magic != GPU_GATE_MAGIC) {
		pr_err("amdgpu: pid %ld: no valid verdict on the GPU memory of KFD image %u (%ld); the task does not run\n",
		       pid, g->image, ret);
		goto fail;
	}
	if (v.status) {
		v.why[GPU_GATE_WHY_LEN - 1] = '\0';
		pr_err("amdgpu: pid %ld: the GPU memory of KFD image %u was not restored: %s; the task does not run\n",
		       pid, g->image, v.why);
		goto fail;
	}

	/* KFD lets the process resume itself while it holds CRIU's privileges (before its own creds). */
	a.op = GPU_KFD_CRIU_OP_RESUME;
	a.pid = pid;
	ret = sys_ioctl(g->kfd, GPU_AMDKFD_IOC_CRIU_OP, (unsigned long)&a);

	r.magic = GPU_GATE_MAGIC;
	r.status = ret < 0 ? -ret : 0;
	do
		sent = sys_sendto(g->chan, &r, sizeof(r), MSG_NOSIGNAL, NULL, 0);
	while (sent == -EINTR);

	if (ret < 0) {
		pr_err("amdgpu: pid %ld: RESUME (restarting the GPU queues of KFD image %u) failed with errno %ld; "
		       "the task does not run\n",
		       pid, g->image, -ret);
		goto fail;
	}
	if (sent != sizeof(r)) {
		pr_err("amdgpu: pid %ld: the GPU memory writer died (criu or the writer was killed) before it "
		       "heard that the GPU queues of KFD image %u were resumed; the task does not run\n",
		       pid, g->image);
		goto fail;
	}
	pr_info("amdgpu: pid %ld: GPU queues resumed (KFD image %u, its GPU memory confirmed)\n", pid, g->image);
	sys_close(g->chan);
	sys_close(g->kfd);
	return 0;

fail:
	sys_close(g->chan);
	sys_close(g->kfd);
	return -1;
}

/* How long a task waiting for the next stage sleeps before it looks at criu again. */
#define GPU_GATE_WATCH_NS (10 * 1000 * 1000)

/* The stages a task waits out after its gate, for messages. */
static const char *stage_name(int stage)
{
	switch (stage) {
	case CR_STATE_RESTORE:
		return "CR_STATE_RESTORE";
	case CR_STATE_RESTORE_SIGCHLD:
		return "CR_STATE_RESTORE_SIGCHLD";
	case CR_STATE_RESTORE_CREDS:
		return "CR_STATE_RESTORE_CREDS";
	}
	return "a restore stage";
}

/* 0 while criu main runs; else logged: criu exited, or its pidfd cannot tell. */
static int criu_gone(int pidfd, int stage)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };
	struct timespec now = {};
	long pid = sys_getpid();
	long ret;

	do
		ret = sys_ppoll(&p, 1, &now, NULL, 0);
	while (ret == -EINTR);
	if (ret == 0)
		return 0;
	if (ret > 0 && (p.revents & (POLLIN | POLLHUP)))
		pr_err("pid %ld: criu died before it handed the restored tree over (the task was at the end of %s); "
		       "the task exits and never runs\n",
		       pid, stage_name(stage));
	else
		pr_err("pid %ld: can't watch criu (ppoll on its pidfd: %ld, revents %#x) at the end of %s; "
		       "the task exits and never runs\n",
		       pid, ret, ret > 0 ? p.revents : 0, stage_name(stage));
	return -1;
}

/*
 * Where the watch on criu begins (the end of CR_STATE_RESTORE): the ties from
 * the task's fork that cannot last end here.  A helper's child drops the
 * parent-death signal that ties it to the helper, before the helper can exit;
 * every task of a --restore-sibling tree closes its copy of the root task's
 * tie, the root task disarms it first (the file is shared by every copy).
 */
static int gpu_gate_untie(struct gpu_gate_args *g)
{
	long pid = sys_getpid();
	long ret;

	if (g->untie & GPU_GATE_UNTIE_PDEATHSIG) {
		ret = sys_prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
		if (ret) {
			pr_err("pid %ld: can't drop the parent-death signal that ties the task to its helper parent "
			       "(%ld); the task exits and never runs\n",
			       pid, ret);
			return -1;
		}
	}
	if (g->tie < 0)
		return 0;
	if (g->untie & GPU_GATE_UNTIE_ROOT_TIE) {
		ret = sys_fcntl(g->tie, F_SETFL, 0);
		if (ret) {
			pr_err("pid %ld: can't disarm the pipe that ties the root task to criu (fd %d: %ld); "
			       "the task exits and never runs\n",
			       pid, g->tie, ret);
			return -1;
		}
	}
	sys_close(g->tie);
	g->tie = -1;
	return 0;
}

int gpu_gate_finish_stage(struct gpu_gate_args *g, struct task_entries *te, int stage)
{
	struct timespec tick = { .tv_nsec = GPU_GATE_WATCH_NS };
	long ret;

	/* Before the stage ends for this task: the helper waits for its end to exit. */
	if (stage == CR_STATE_RESTORE && gpu_gate_untie(g))
		return -1;
	futex_dec_and_wake(&te->nr_in_progress);
	if (g->criu < 0) {
		futex_wait_while(&te->start, stage);
		return 0;
	}
	/* A futex word has no way to say that the one who would change it died: look every tick. */
	while (futex_get(&te->start) == (u32)stage) {
		if (criu_gone(g->criu, stage))
			return -1;
		ret = sys_futex((u32 *)&te->start.raw.counter, FUTEX_WAIT, stage, &tick, NULL, 0);
		if (ret < 0 && ret != -EAGAIN && ret != -ETIMEDOUT && ret != -EINTR) {
			pr_err("pid %ld: waiting at the end of %s failed with errno %ld; the task exits and never runs\n",
			       sys_getpid(), stage_name(stage), -ret);
			return -1;
		}
	}
	return 0;
}

void gpu_gate_handed_over(struct gpu_gate_args *g)
{
	if (g->criu < 0)
		return;
	sys_close(g->criu);
	g->criu = -1;
}
