// SPDX-License-Identifier: GPL-2.0-only
/*
 * A CRIU plugin that is not a GPU plugin, for test/rpc/run.sh: it records each init(stage)
 * and exit(stage, ret) CRIU calls in the file $CRIU_TEST_PLUGIN_LOG, proving that plugins
 * other than upstream's amdgpu plugin still load and run beside criu-rocm.
 */
#include <stdio.h>
#include <stdlib.h>

#include "criu-plugin.h"

static void record(const char *fmt, int a, int b)
{
	const char *path = getenv("CRIU_TEST_PLUGIN_LOG");
	FILE *f;

	if (!path)
		return;
	f = fopen(path, "a");
	if (!f)
		return;
	fprintf(f, fmt, a, b);
	fclose(f);
}

static int probe_init(int stage)
{
	record("init %d\n", stage, 0);
	return 0;
}

static void probe_exit(int stage, int ret)
{
	record("exit %d %d\n", stage, ret);
}

CR_PLUGIN_REGISTER("probe", probe_init, probe_exit)
