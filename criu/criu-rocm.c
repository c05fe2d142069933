// SPDX-License-Identifier: GPL-2.0-only
/*
 * criu-rocm glue: version, start-up of the GPU library, the GPU knob option,
 * upstream's AMD GPU plugin (skipped), and the GPU hooks CRIU's dump,
 * restore and restorer paths call.  The hooks only gather CRIU's state
 * (pids, fds, the image directory) and pass it to the Rust library.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdint.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <compel/ptrace.h>

#include "criu-log.h"
#include "log.h"
#include "cr_options.h"
#include "files.h"
#include "image.h"
#include "img-streamer.h"
#include "pstree.h"
#include "servicefd.h"
#include "vma.h"
#include "rst_info.h"
#include "plugin.h"
#include "xmalloc.h"
#include "gpu-gate.h"
#include "criu-gpu.h"
#include "criu-rocm.h"

/* The name upstream's plugin records in the inventory; images stay interchangeable. */
#define AMDGPU_INVENTORY_NAME "amdgpu_plugin"

#undef LOG_PREFIX
#define LOG_PREFIX "criu-rocm: "

#ifndef CRIU_ROCM_GITREV
#define CRIU_ROCM_GITREV "unknown"
#endif

int criu_rocm_helper_main(int argc, char **argv)
{
	return criu_gpu_helper_main(argc, (const char *const *)argv);
}

int criu_rocm_init(void)
{
	int ret = criu_gpu_init(log_get_loglevel());

	if (ret)
		pr_err("GPU library failed to start: %s\n", strerror(-ret));
	return ret;
}

int criu_rocm_set_knob(const char *arg)
{
	char why[512];

	if (criu_gpu_set_knob(arg, why, sizeof(why))) {
		pr_err("--gpu-knob %s: %s\n", arg, why);
		return -1;
	}
	return 0;
}

void criu_rocm_print_version(void)
{
	pr_msg("criu-rocm: %s\n", criu_gpu_version());
	pr_msg("criu-rocm GitID: %s\n", CRIU_ROCM_GITREV);
}

bool criu_rocm_plugin_skipped(const char *path, const cr_plugin_desc_t *d)
{
	if (!d->name || strcmp(d->name, AMDGPU_INVENTORY_NAME))
		return false;
	pr_warn("%s: skipped: it is upstream's AMD GPU plugin (\"%s\"), and criu-rocm has AMD GPU "
		"checkpoint/restore built in\n",
		path, d->name);
	return true;
}

int criu_rocm_check_plugins(void)
{
	const char *dir = opts.libdir;
	char path[PATH_MAX];
	struct dirent *de;
	int found = 0;
	DIR *d;

	/* The directory cr_plugin_init() would scan. */
	if (!dir)
		dir = getenv("CRIU_LIBS_DIR");
	if (!dir)
		dir = CR_PLUGIN_DEFAULT;
	d = opendir(dir);
	if (!d) {
		if (errno != ENOENT)
			pr_pwarn("Can't read the plugin directory %s", dir);
		return 0;
	}
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		cr_plugin_desc_t *desc;
		void *h;

		if (len < 3 || strcmp(de->d_name + len - 3, ".so"))
			continue;
		if (snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= sizeof(path))
			continue;
		h = dlopen(path, RTLD_LAZY);
		if (!h) {
			pr_warn("%s: can't be loaded (%s): dump and restore fail while it is in the plugin "
				"directory\n",
				path, dlerror());
			found++;
			continue;
		}
		desc = dlsym(h, "CR_PLUGIN_DESC");
		if (desc && criu_rocm_plugin_skipped(path, desc))
			found++;
		dlclose(h);
	}
	closedir(d);
	return found;
}

static bool inventory_noted;
/* The images being restored hold GPU state (criu main; copied into every task). */
static bool gpu_restore;
/* criu main's pid, in its own namespace: the parent of the root task. */
static pid_t criu_pid;
/* In a restored task: what its restorer needs at its GPU gate. */
static struct gpu_gate_args task_gate = { .chan = -1, .kfd = -1, .criu = -1, .tie = -1 };

/* Images that hold GPU state name the upstream plugin, so that upstream CRIU restores them. */
static int note_gpu_in_inventory(void)
{
	if (inventory_noted)
		return 0;
	if (add_inventory_plugin(AMDGPU_INVENTORY_NAME))
		return -1;
	inventory_noted = true;
	return 0;
}

/*
 * The image directory the GPU library reads and writes: with --stream, the
 * staging directory of the GPU metadata files (see stream_start), else
 * CRIU's image directory.
 */
static int image_dir_fd(void)
{
	return get_service_fd(opts.stream ? CRIU_ROCM_STAGE_FD_OFF : IMG_FD_OFF);
}

/* The GPU library's way to CRIU's image streamer: one file, one pipe. */
static int stream_open(const char *name)
{
	return img_streamer_open((char *)name, opts.mode == CR_RESTORE ? O_RSTR : O_DUMP);
}

/*
 * --stream: GPU image files go through CRIU's image streamer; their
 * metadata is staged in memory, in a directory every restored task
 * inherits as a service fd (patch 0030).
 */
static int stream_start(void)
{
	int fd;

	if (get_service_fd(CRIU_ROCM_STAGE_FD_OFF) >= 0)
		return 0;
	fd = criu_gpu_stream_start(stream_open);
	if (fd < 0)
		return fd;
	return install_service_fd(CRIU_ROCM_STAGE_FD_OFF, fd) < 0 ? -1 : 0;
}

bool criu_rocm_is_gpu_file(const struct stat *st)
{
	return criu_gpu_device_kind(st->st_mode, st->st_dev, st->st_ino, st->st_rdev) > 0;
}

/* --- the built-in plugin: CRIU's hook chain calls these first --- */

/*
 * The GPU part of a dump starts: read the GPU knobs and mark the image
 * directory incomplete until criu_rocm_dump_complete() (streamed images have
 * no directory).  CRIU's log fd goes along for the GPU guardian and the
 * signal handler, which write there should criu-rocm die.
 */
static int gpu_dump_init(void)
{
	struct timeval logstart;
	int ret;

	inventory_noted = false;
	if (opts.stream && opts.img_parent) {
		/* CRIU would dump all memory again without saying so; GPU images could not name their parent. */
		pr_err("--prev-images-dir %s with --stream: the image streamer carries no parent images "
		       "(incremental dumps need an image directory)\n",
		       opts.img_parent);
		return -EINVAL;
	}
	if (opts.stream && stream_start()) {
		pr_err("--stream: the GPU part of the dump cannot use the image streamer\n");
		return -EINVAL;
	}
	log_get_logstart(&logstart);
	ret = criu_gpu_dump_init(opts.stream ? -1 : image_dir_fd(), log_get_fd(),
				 (uint64_t)logstart.tv_sec * 1000000 + logstart.tv_usec);
	if (ret)
		pr_err("Can't start the GPU part of the dump: %s\n", strerror(-ret));
	return ret;
}

/*
 * A pidfd of criu main for every task of a GPU restore, held as a service fd
 * through the fork and until its restorer: the restorer watches it while
 * it waits for criu's last stages, and exits once criu is gone (patch 0024).
 */
static int install_criu_pidfd(void)
{
	int fd;

	fd = syscall(SYS_pidfd_open, criu_pid, 0);
	if (fd < 0) {
		pr_perror("Can't open a pidfd of criu (pid %d) for the restored tasks to watch", criu_pid);
		return -1;
	}
	return install_service_fd(CRIU_PIDFD_OFF, fd) < 0 ? -1 : 0;
}

static int gpu_init(int stage)
{
	struct timeval logstart;
	int ret;

	switch (stage) {
	case CR_PLUGIN_STAGE__DUMP:
	case CR_PLUGIN_STAGE__PRE_DUMP:
		return gpu_dump_init();
	case CR_PLUGIN_STAGE__RESTORE:
		/*
		 * Claim the inventory's GPU entry the way upstream's plugin does, so
		 * that CRIU does not ask for a plugin that is built in here.
		 */
		if (check_and_remove_inventory_plugin(AMDGPU_INVENTORY_NAME, strlen(AMDGPU_INVENTORY_NAME)) &&
		    opts.stream) {
			/* The GPU metadata files come first, before anything is validated or forked. */
			if (stream_start() || criu_gpu_stream_fetch()) {
				pr_err("--stream: the GPU images cannot be had from the image streamer\n");
				return -EINVAL;
			}
		}
		/* A stream without GPU state has no staging directory: nothing to restore. */
		if (opts.stream && get_service_fd(CRIU_ROCM_STAGE_FD_OFF) < 0)
			return 0;
		criu_pid = getpid();
		log_get_logstart(&logstart);
		ret = criu_gpu_restore_init(image_dir_fd(), log_get_fd(),
					    (uint64_t)logstart.tv_sec * 1000000 + logstart.tv_usec);
		if (ret < 0)
			return ret;
		gpu_restore = ret > 0;
		return gpu_restore ? install_criu_pidfd() : 0;
	}
	return 0;
}

static void gpu_exit(int stage, int ret)
{
	if (stage == CR_PLUGIN_STAGE__RESTORE)
		criu_gpu_restore_fini();
}

/* HANDLE_DEVICE_VMA (criu main): a GPU mapping is metadata only, its contents go with the GPU. */
static int gpu_handle_device_vma(int fd, const struct stat *st)
{
	if (!criu_rocm_is_gpu_file(st))
		return -ENOTSUP;
	if (opts.mode == CR_DUMP && note_gpu_in_inventory())
		return -1;
	return 0;
}

/* CHECKPOINT_DEVICES (criu main, tree frozen, before any memory is read): pause the GPU queues. */
static int gpu_checkpoint_devices(int pid)
{
	int ret = criu_gpu_pause_task(pid);

	if (ret < 0) {
		pr_err("Can't pause the GPU queues of %d\n", pid);
		return ret;
	}
	if (ret == 0)
		return -ENOTSUP;
	pr_info("GPU queues of %d paused before any memory is read\n", pid);
	return 0;
}

/* The task and fd number of the file CRIU dumps now (criu_rocm_note_file_owner). */
static struct {
	pid_t pid;
	int fd;
} dumping_file = { .pid = -1, .fd = -1 };

void criu_rocm_note_file_owner(pid_t pid, int fd)
{
	dumping_file.pid = pid;
	dumping_file.fd = fd;
}

/* DUMP_EXT_FILE (criu main): a GPU device fd or dma-buf of the tree. */
static int gpu_dump_ext_file(int fd, int id)
{
	int ret = criu_gpu_dump_file(fd, id, dumping_file.pid, dumping_file.fd, image_dir_fd());

	if (ret == -ENOTSUP)
		return ret;
	if (ret < 0) {
		pr_err("Can't dump the GPU file %#x\n", id);
		return ret;
	}
	return note_gpu_in_inventory();
}

/* The calling task's pid in criu main's pid namespace (read the way CRIU does). */
static int real_pid_of_current(void)
{
	char buf[16];
	int fd, n;

	fd = get_service_fd(CR_PROC_FD_OFF);
	if (fd < 0)
		return -1;
	n = readlinkat(fd, "self", buf, sizeof(buf) - 1);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return atoi(buf);
}

/* Whether the current task still has to restore file id (an fd it opens or receives). */
static bool task_restores_file(u32 id)
{
	struct fdinfo_list_entry *fle;

	list_for_each_entry(fle, &rsti(current)->fds, ps_list)
		if (fle->desc->id == id && fle->stage < FLE_RESTORED)
			return true;
	return false;
}

/*
 * RESTORE_EXT_FILE (the restored task): the fd of GPU file id. -EAGAIN: a dma-buf whose BO's
 * holder, a file the task restores later, is not restored yet (CRIU tries it again after the
 * task's other files, patch 0040); one whose holder the task does not restore fails.
 */
static int gpu_restore_ext_file(int id)
{
	pid_t pid = vpid(current);
	u32 wait_for = 0;
	int floor, fd;

	floor = find_unused_fd_pid(pid);
	if (floor < 0)
		return -1;
	fd = criu_gpu_restore_file(pid, real_pid_of_current(), id, floor, image_dir_fd(), &wait_for);
	if (fd == -EAGAIN) {
		if (task_restores_file(wait_for))
			return fd;
		pr_err("The dma-buf file %#x of %d is of a BO of GPU file %#x, which this task does "
		       "not restore\n",
		       id, pid, wait_for);
		return -1;
	}
	if (fd < 0 && fd != -ENOTSUP)
		pr_err("Can't restore the GPU file %#x of %d\n", id, pid);
	return fd;
}

/*
 * The task's VMA at addr with offset pgoff. CRIU opens a task's mappings in the order of its
 * list, so the search starts after the VMA found last (and wraps around): one step per
 * mapping, where a scan from the start for each would be quadratic in the task's VMAs. The
 * cursor belongs to one list; a task (a process of its own after fork) starts afresh.
 */
static struct vma_area *mapped_vma(struct list_head *vmas, uint64_t addr, uint64_t pgoff)
{
	static struct list_head *cursor_list;
	static struct vma_area *cursor;
	struct vma_area *vma, *from;

	if (cursor_list != vmas || !cursor) {
		cursor_list = vmas;
		cursor = list_first_entry(vmas, struct vma_area, list);
	}
	from = cursor;
	vma = from;
	list_for_each_entry_from(vma, vmas, list)
		if (vma->e->start == addr && vma->e->pgoff == pgoff)
			return cursor = vma;
	list_for_each_entry(vma, vmas, list) {
		if (vma == from)
			break;
		if (vma->e->start == addr && vma->e->pgoff == pgoff)
			return cursor = vma;
	}
	return NULL;
}

/* UPDATE_VMA_MAP (the restored task): the new offset and fd of a GPU mapping. */
static int gpu_update_vma_map(const char *path, const uint64_t addr, const uint64_t old_pgoff, uint64_t *new_pgoff,
			      int *plugin_fd)
{
	struct vma_area *vma;
	int ret;

	/* The mapping's length comes from the task's own list: GPU mappings are matched by range. */
	vma = mapped_vma(&rsti(current)->vmas.h, addr, old_pgoff);
	if (!vma)
		return -ENOTSUP;
	ret = criu_gpu_update_vma(vpid(current), path, addr, vma->e->end - vma->e->start, old_pgoff, new_pgoff,
				  plugin_fd);
	if (ret < 0)
		pr_err("Can't map the GPU memory at %#" PRIx64 " (%s)\n", addr, path);
	return ret == 0 ? -ENOTSUP : ret;
}

cr_plugin_desc_t criu_rocm_plugin = {
	.name = "criu-rocm-amdgpu",
	.init = gpu_init,
	.exit = gpu_exit,
	.version = CRIU_PLUGIN_VERSION,
	.max_hooks = CR_PLUGIN_HOOK__MAX,
	.hooks = {
		[CR_PLUGIN_HOOK__DUMP_EXT_FILE] = (void *)gpu_dump_ext_file,
		[CR_PLUGIN_HOOK__RESTORE_EXT_FILE] = (void *)gpu_restore_ext_file,
		[CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA] = (void *)gpu_handle_device_vma,
		[CR_PLUGIN_HOOK__UPDATE_VMA_MAP] = (void *)gpu_update_vma_map,
		[CR_PLUGIN_HOOK__CHECKPOINT_DEVICES] = (void *)gpu_checkpoint_devices,
	},
};

/* --- call sites where CRIU has no plugin hook --- */

int criu_rocm_dump_late(void)
{
	return criu_gpu_dump_late() ? -1 : 0;
}

int criu_rocm_dump_complete(void)
{
	return criu_gpu_dump_complete(image_dir_fd()) ? -1 : 0;
}

int criu_rocm_dump_finish(bool resume)
{
	return criu_gpu_dump_finish(resume) ? -1 : 0;
}

int criu_rocm_pre_dump_pause(void)
{
	struct pstree_item *item;

	for_each_pstree_item(item) {
		int ret;

		if (item->pid->state == TASK_DEAD)
			continue;
		ret = criu_gpu_pre_dump_task(item->pid->real);
		if (ret < 0) {
			pr_err("Can't take the GPU state of %d\n", item->pid->real);
			return -1;
		}
	}
	return 0;
}

int criu_rocm_pre_dump_memory(void)
{
	return criu_gpu_pre_dump_memory(image_dir_fd()) ? -1 : 0;
}

int criu_rocm_pre_dump_finish(int ret)
{
	if (!ret && criu_rocm_dump_complete())
		ret = -1;
	if (criu_gpu_dump_finish(1)) {
		pr_err("The GPU work of the pre-dumped tree could not be resumed\n");
		ret = -1;
	}
	return ret;
}

int criu_rocm_restore_check(void)
{
	/*
	 * A required signature is checked on the image directory before CRIU
	 * reads it; streamed images and lazily restored pages are read from
	 * elsewhere or after that check, so they cannot be verified.
	 */
	if ((opts.stream || opts.lazy_pages) && criu_gpu_signature_required() != 0) {
		pr_err("CRIU_ROCM_VERIFY_KEY is set: %s restores read images the signature check cannot see\n",
		       opts.stream ? "--stream" : "--lazy-pages");
		return -1;
	}
	/* A stream has no mark: its GPU images end with amdgpu-digests.img, without which it is refused. */
	if (opts.stream)
		return 0;
	return criu_gpu_restore_check(image_dir_fd()) ? -1 : 0;
}

int criu_rocm_restore_task_done(void)
{
	return criu_gpu_restore_task_done(vpid(current), get_service_fd(CR_PROC_FD_OFF), &task_gate.chan,
					  &task_gate.kfd, &task_gate.image) ?
		       -1 :
		       0;
}

int criu_rocm_held_file(const char *path)
{
	int fd;

	if (!gpu_restore)
		return -1;
	fd = criu_gpu_restore_held_file(path);
	return fd >= 0 ? fd : -1;
}

void criu_rocm_test_held_open_delay(void)
{
	static int ms = -1;
	struct timespec left;
	const char *v;

	if (ms < 0) {
		v = getenv("CRIU_ROCM_TEST_HELD_OPEN_DELAY_MS");
		ms = v ? atoi(v) : 0;
	}
	if (ms <= 0)
		return;
	/* The whole wait, whatever signal (SIGCHLD) comes meanwhile. */
	left.tv_sec = ms / 1000;
	left.tv_nsec = (ms % 1000) * 1000000L;
	while (nanosleep(&left, &left) && errno == EINTR)
		;
}

/* --restore-sibling, criu main: its write end of the pipe that ties the root task to criu. */
static int root_tie_wr = -1;

int criu_rocm_root_tie_open(void)
{
	int p[2];

	if (!gpu_restore || !opts.restore_sibling)
		return 0;
	/* Close-on-exec: no script criu runs may keep the write end, and the tie, alive. */
	if (pipe2(p, O_CLOEXEC)) {
		pr_perror("Can't make the pipe that ties the root task of --restore-sibling to criu");
		return -1;
	}
	if (install_service_fd(CRIU_ROOT_TIE_OFF, p[0]) < 0) {
		close(p[1]);
		return -1;
	}
	root_tie_wr = p[1];
	return 0;
}

void criu_rocm_root_tie_forked(void)
{
	/* The read end is the root task's alone now. */
	close_service_fd(CRIU_ROOT_TIE_OFF);
}

/*
 * The root task of --restore-sibling, whose parent is criu's caller: the
 * kernel sends SIGKILL to it (F_SETSIG) once the pipe's last write end, criu
 * main's, closes, as criu exits however it dies.  Its restorer disarms the
 * tie where its watch on criu begins.
 */
static int tie_root_to_criu(void)
{
	int rd = get_service_fd(CRIU_ROOT_TIE_OFF);

	if (rd < 0 || fcntl(rd, F_SETOWN, getpid()) || fcntl(rd, F_SETSIG, SIGKILL) || fcntl(rd, F_SETFL, O_ASYNC)) {
		pr_perror("Can't tie the root task %d to criu (fd %d)", vpid(current), rd);
		return -1;
	}
	/* A criu dead by now makes this the last write end: the task is killed here. */
	close(root_tie_wr);
	root_tie_wr = -1;
	return 0;
}

int criu_rocm_task_start(void)
{
	struct pstree_item *parent = current->parent;
	pid_t ppid;

	if (!gpu_restore)
		return 0;
	if (!parent && opts.restore_sibling)
		return tie_root_to_criu();
	/*
	 * A helper's child is tied to the helper, which ties it to criu while
	 * it lives; the helper exits once every task ended CR_STATE_RESTORE, and
	 * the child's restorer drops the tie before it ends that stage.
	 */
	task_gate.untie = parent && parent->pid->state == TASK_HELPER ? GPU_GATE_UNTIE_PDEATHSIG : 0;
	if (prctl(PR_SET_PDEATHSIG, SIGKILL)) {
		pr_perror("Can't tie task %d to its parent", vpid(current));
		return -1;
	}
	/* A parent that died before the line above told nobody (0: the parent is in another pid namespace). */
	ppid = getppid();
	if (ppid != 0 && ppid != (parent ? vpid(parent) : criu_pid)) {
		pr_err("The parent of task %d is gone; the restore is over\n", vpid(current));
		return -1;
	}
	return 0;
}

void criu_rocm_restorer_gate(struct gpu_gate_args *gate)
{
	*gate = task_gate;
	gate->criu = get_service_fd(CRIU_PIDFD_OFF);
	/* Every task of a --restore-sibling tree inherited the root task's tie: each closes its copy. */
	gate->tie = get_service_fd(CRIU_ROOT_TIE_OFF);
	if (gate->tie >= 0 && !current->parent)
		gate->untie |= GPU_GATE_UNTIE_ROOT_TIE;
	task_gate.chan = task_gate.kfd = -1;
}

void criu_rocm_restore_seized(int pid, bool has_seccomp)
{
	long opts = PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL;

	if (!gpu_restore)
		return;
	/* The options replace those CRIU set: keep its own. */
	if (has_seccomp)
		opts |= PTRACE_O_SUSPEND_SECCOMP;
	if (ptrace(PTRACE_SETOPTIONS, pid, NULL, opts))
		pr_perror("Can't tie task %d to criu with PTRACE_O_EXITKILL; its restorer still watches criu", pid);
}

int criu_rocm_restore_settle(void)
{
	struct pstree_item *item;
	int *vpids, n = 0, ret;

	if (!gpu_restore)
		return 0;
	for_each_pstree_item(item)
		n++;
	vpids = xmalloc(sizeof(*vpids) * (n ? n : 1));
	if (!vpids)
		return -1;
	n = 0;
	for_each_pstree_item(item)
		if (task_alive(item))
			vpids[n++] = vpid(item);
	ret = criu_gpu_restore_settle(image_dir_fd(), vpids, n);
	xfree(vpids);
	if (ret < 0) {
		pr_err("The GPU state of the restored tree is not whole; no task runs\n");
		return -1;
	}
	/* 0: the images hold render files only, whose GEM objects each task restored itself. */
	if (ret > 0)
		pr_info("GPU memory confirmed and GPU queues resumed in %d process(es)\n", ret);
	return 0;
}

int criu_rocm_gpu_check(const char *dir)
{
	criu_gpu_init(LOG_WARN);
	return criu_gpu_dry_run(dir) ? 1 : 0;
}
