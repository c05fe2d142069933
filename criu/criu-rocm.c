// SPDX-License-Identifier: GPL-2.0-only
/*
 * criu-rocm glue: version, start-up of the GPU library, the guard against a
 * second AMD GPU handler loaded as a plugin, and the GPU hooks CRIU's dump,
 * restore and restorer paths call.  The hooks only gather CRIU's state
 * (pids, fds, the image directory) and pass it to the Rust library.
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "criu-log.h"
#include "log.h"
#include "cr_options.h"
#include "files.h"
#include "image.h"
#include "pstree.h"
#include "servicefd.h"
#include "vma.h"
#include "criu-gpu.h"
#include "criu-rocm.h"

/* The name upstream's plugin records in the inventory; images stay interchangeable. */
#define AMDGPU_INVENTORY_NAME "amdgpu_plugin"

#undef LOG_PREFIX
#define LOG_PREFIX "criu-rocm: "

#ifndef CRIU_ROCM_GITREV
#define CRIU_ROCM_GITREV "unknown"
#endif

/* File names of upstream's AMD GPU plugin. */
static const char *const upstream_gpu_plugins[] = {
	"amdgpu_plugin.so",
};

int criu_rocm_init(void)
{
	int ret = criu_gpu_init(log_get_loglevel());

	if (ret)
		pr_err("GPU library failed to start: %s\n", strerror(-ret));
	return ret;
}

void criu_rocm_print_version(void)
{
	pr_msg("criu-rocm: %s\n", criu_gpu_version());
	pr_msg("criu-rocm GitID: %s\n", CRIU_ROCM_GITREV);
}

bool criu_rocm_plugin_refused(const char *dir, const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(upstream_gpu_plugins) / sizeof(upstream_gpu_plugins[0]); i++) {
		if (strcmp(name, upstream_gpu_plugins[i]))
			continue;
		pr_err("%s/%s: criu-rocm has AMD GPU checkpoint/restore built in and will not load "
		       "the upstream amdgpu plugin beside it; remove the file or point --libdir "
		       "(CRIU_LIBS_DIR) at another directory\n",
		       dir, name);
		return true;
	}
	return false;
}

static bool inventory_noted;

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

static int image_dir_fd(void)
{
	return get_service_fd(IMG_FD_OFF);
}

bool criu_rocm_is_gpu_file(const struct stat *st)
{
	return criu_gpu_device_kind(st->st_mode, st->st_dev, st->st_ino, st->st_rdev) > 0;
}

int criu_rocm_claim_vma(pid_t pid, struct vma_area *vma, const struct stat *st)
{
	if (!criu_rocm_is_gpu_file(st))
		return 0;
	pr_info("%d: %#" PRIx64 "-%#" PRIx64 " maps an AMD GPU device; its contents are saved with the GPU\n",
		pid, vma->e->start, vma->e->end);
	vma->e->status |= VMA_EXT_PLUGIN;
	if (opts.mode == CR_DUMP && note_gpu_in_inventory())
		return -1;
	return 1;
}

int criu_rocm_dump_init(void)
{
	inventory_noted = false;
	return criu_gpu_dump_init();
}

int criu_rocm_pause_devices(void)
{
	struct pstree_item *item;
	int paused = 0;

	for_each_pstree_item(item) {
		int ret;

		if (!task_alive(item))
			continue;
		ret = criu_gpu_pause_task(item->pid->real);
		if (ret < 0) {
			pr_err("Can't pause the GPU queues of %d\n", item->pid->real);
			return -1;
		}
		paused += ret;
	}
	if (paused)
		pr_info("GPU queues of %d process(es) paused before any memory is read\n", paused);
	if (paused && opts.stream) {
		/* The GPU images are files of their own, which the image streamer does not carry. */
		pr_err("--stream cannot carry the GPU state of the %d paused process(es); dump to an "
		       "image directory instead\n",
		       paused);
		return -1;
	}
	return 0;
}

int criu_rocm_dump_file(pid_t pid, int lfd, u32 id)
{
	int ret = criu_gpu_dump_file(pid, lfd, id, image_dir_fd());

	if (ret == -ENOTSUP)
		return ret;
	if (ret < 0) {
		pr_err("Can't dump the GPU file %#x of %d\n", id, pid);
		return ret;
	}
	return note_gpu_in_inventory();
}

int criu_rocm_dump_late(void)
{
	return criu_gpu_dump_late() ? -1 : 0;
}

int criu_rocm_dump_finish(bool resume)
{
	return criu_gpu_dump_finish(resume) ? -1 : 0;
}

int criu_rocm_restore_init(void)
{
	/*
	 * Claim the inventory's GPU entry the way upstream's plugin does, so
	 * that CRIU does not ask for a plugin that is built in here.
	 */
	check_and_remove_inventory_plugin(AMDGPU_INVENTORY_NAME, strlen(AMDGPU_INVENTORY_NAME));
	return criu_gpu_restore_init(image_dir_fd());
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

int criu_rocm_restore_file(u32 id)
{
	pid_t pid = vpid(current);
	int floor, fd;

	floor = find_unused_fd_pid(pid);
	if (floor < 0)
		return -1;
	fd = criu_gpu_restore_file(pid, real_pid_of_current(), id, floor, image_dir_fd());
	if (fd < 0 && fd != -ENOTSUP)
		pr_err("Can't restore the GPU file %#x of %d\n", id, pid);
	return fd;
}

int criu_rocm_update_vma(const char *path, struct vma_area *vma, u64 *new_pgoff, int *map_fd)
{
	int ret;

	ret = criu_gpu_update_vma(vpid(current), path, vma->e->start, vma->e->end - vma->e->start, vma->e->pgoff,
				  new_pgoff, map_fd);
	if (ret < 0)
		pr_err("Can't map the GPU memory at %#" PRIx64 " (%s)\n", vma->e->start, path);
	return ret;
}

int criu_rocm_restore_task_done(void)
{
	return criu_gpu_restore_task_done(vpid(current)) ? -1 : 0;
}

int criu_rocm_resume_devices(void)
{
	struct pstree_item *item;

	if (criu_gpu_restore_contents_wait()) {
		pr_err("Can't write the GPU memory of the restored tasks back\n");
		return -1;
	}
	for_each_pstree_item(item) {
		if (!task_alive(item))
			continue;
		if (criu_gpu_resume(image_dir_fd(), item->pid->real, vpid(item)) < 0) {
			pr_err("Can't resume the GPU queues of %d; the restore fails rather than leave it hung\n",
			       item->pid->real);
			return -1;
		}
	}
	return 0;
}

int criu_rocm_gpu_check(const char *dir)
{
	criu_gpu_init(LOG_WARN);
	return criu_gpu_dry_run(dir) ? 1 : 0;
}
