// SPDX-License-Identifier: GPL-2.0-only
/*
 * criu-rocm glue: version, start-up of the GPU library, and the guard
 * against a second AMD GPU handler loaded as a plugin.
 */
#include <string.h>

#include "criu-log.h"
#include "log.h"
#include "criu-gpu.h"
#include "criu-rocm.h"

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
