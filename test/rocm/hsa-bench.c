// SPDX-License-Identifier: GPL-2.0-only
/*
 * hsa-bench: ROCr's hsa_amd_memory_async_copy throughput, host -> VRAM and VRAM -> host,
 * against a memcpy of the same size between two host buffers measured in the same run,
 * for `make bench` (run under `kfd-emu run --profile P`). Debian's ROCr 5.2 unchanged:
 * on kfd-emu the copies are SDMA packets that the emulator's engine executes.
 *
 *   hsa-bench [--mib MiB] [--reps N]      (default 64 MiB, best of 5)
 *
 * It reports; it fails (exit 1, with the reason) only when ROCr cannot do the copies or a
 * copy delivers wrong bytes, never on a slow result.
 */
#define _GNU_SOURCE
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COPY_TIMEOUT_S 60

static hsa_agent_t cpu, gpu;
static hsa_amd_memory_pool_t cpu_pool, gpu_pool;
static bool have_cpu, have_gpu;
static uint64_t ts_freq;

static int die(const char *what, hsa_status_t s)
{
	const char *m = NULL;

	hsa_status_string(s, &m);
	fprintf(stderr, "hsa-bench: %s: status %#x: %s\n", what, s, m ? m : "(no description)");
	return 1;
}

static hsa_status_t pool_cb(hsa_amd_memory_pool_t pool, void *data)
{
	hsa_device_type_t type = *(hsa_device_type_t *)data;
	hsa_amd_segment_t seg;
	uint32_t flags = 0;
	bool alloc = false;

	if (hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg) ||
	    seg != HSA_AMD_SEGMENT_GLOBAL)
		return HSA_STATUS_SUCCESS;
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED, &alloc);
	if (!alloc)
		return HSA_STATUS_SUCCESS;
	if (type == HSA_DEVICE_TYPE_CPU && !have_cpu && (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED)) {
		cpu_pool = pool;
		have_cpu = true;
	}
	if (type == HSA_DEVICE_TYPE_GPU && !have_gpu && (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED)) {
		gpu_pool = pool;
		have_gpu = true;
	}
	return HSA_STATUS_SUCCESS;
}

static hsa_status_t agent_cb(hsa_agent_t a, void *data)
{
	hsa_device_type_t type;
	bool before_cpu = have_cpu, before_gpu = have_gpu;

	(void)data;
	hsa_agent_get_info(a, HSA_AGENT_INFO_DEVICE, &type);
	if ((type == HSA_DEVICE_TYPE_CPU && have_cpu) || (type == HSA_DEVICE_TYPE_GPU && have_gpu))
		return HSA_STATUS_SUCCESS;
	hsa_amd_agent_iterate_memory_pools(a, pool_cb, &type);
	if (!before_cpu && have_cpu)
		cpu = a;
	if (!before_gpu && have_gpu)
		gpu = a;
	return HSA_STATUS_SUCCESS;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One async copy, waited for; its time in seconds, or a negative value on failure. */
static double timed_copy(void *dst, hsa_agent_t da, const void *src, hsa_agent_t sa, size_t n,
			 hsa_signal_t sig, const char *what)
{
	double t0 = now_s();
	hsa_status_t s;

	hsa_signal_store_screlease(sig, 1);
	s = hsa_amd_memory_async_copy(dst, da, src, sa, n, 0, NULL, sig);
	if (s != HSA_STATUS_SUCCESS) {
		die(what, s);
		return -1;
	}
	if (hsa_signal_wait_scacquire(sig, HSA_SIGNAL_CONDITION_LT, 1, ts_freq * COPY_TIMEOUT_S,
				      HSA_WAIT_STATE_BLOCKED) != 0) {
		fprintf(stderr, "hsa-bench: %s: not complete after %d s (its SDMA queue did not run "
			"or its completion signal was never written)\n", what, COPY_TIMEOUT_S);
		return -1;
	}
	return now_s() - t0;
}

int main(int argc, char **argv)
{
	size_t mib = 64, n;
	int reps = 5, rc = 1;
	void *hs = NULL, *hd = NULL, *dv = NULL;
	hsa_signal_t sig;
	double best_memcpy = 1e9, best_h2d = 1e9, best_d2h = 1e9;
	hsa_status_t s;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: hsa-bench [--mib MiB] [--reps N]\n");
			return 2;
		}
	}
	if (!mib || reps < 1) {
		fprintf(stderr, "usage: hsa-bench [--mib MiB] [--reps N]\n");
		return 2;
	}
	n = mib << 20;

	if ((s = hsa_init()) != HSA_STATUS_SUCCESS)
		return die("hsa_init", s);
	hsa_system_get_info(HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY, &ts_freq);
	hsa_iterate_agents(agent_cb, NULL);
	if (!have_cpu || !have_gpu) {
		fprintf(stderr, "hsa-bench: ROCr found %s (it ignores GPUs whose ISA it does not know)\n",
			!have_gpu ? "no GPU agent with a VRAM pool" : "no CPU agent with a system pool");
		goto out;
	}
	if ((s = hsa_amd_memory_pool_allocate(cpu_pool, n, 0, &hs)) ||
	    (s = hsa_amd_memory_pool_allocate(cpu_pool, n, 0, &hd)) ||
	    (s = hsa_amd_memory_pool_allocate(gpu_pool, n, 0, &dv))) {
		die("allocate the buffers", s);
		goto out;
	}
	{
		hsa_agent_t both[2] = { gpu, cpu };

		if ((s = hsa_amd_agents_allow_access(2, both, NULL, hs)) ||
		    (s = hsa_amd_agents_allow_access(2, both, NULL, hd))) {
			die("hsa_amd_agents_allow_access", s);
			goto out;
		}
	}
	if ((s = hsa_signal_create(1, 0, NULL, &sig))) {
		die("hsa_signal_create", s);
		goto out;
	}
	for (size_t i = 0; i < n / 8; i++)
		((uint64_t *)hs)[i] = i * 0x9e3779b97f4a7c15ull;
	memset(hd, 0, n); /* touched: page faults are not timed */

	for (int r = 0; r < reps; r++) {
		double t0 = now_s(), t;

		memcpy(hd, hs, n);
		__asm__ __volatile__("" ::"r"(hd) : "memory");
		t = now_s() - t0;
		if (t < best_memcpy)
			best_memcpy = t;
	}
	memset(hd, 0, n);
	for (int r = 0; r < reps; r++) {
		double h2d = timed_copy(dv, gpu, hs, cpu, n, sig, "host -> VRAM");
		double d2h = h2d < 0 ? -1 : timed_copy(hd, cpu, dv, gpu, n, sig, "VRAM -> host");

		if (h2d < 0 || d2h < 0)
			goto destroy;
		if (h2d < best_h2d)
			best_h2d = h2d;
		if (d2h < best_d2h)
			best_d2h = d2h;
	}
	if (memcmp(hd, hs, n)) {
		fprintf(stderr, "hsa-bench: host -> VRAM -> host delivered different bytes\n");
		goto destroy;
	}
	printf("memcpy host->host %zu MiB: %.2f GiB/s\n", mib, n / best_memcpy / (1 << 30));
	printf("ROCr hsa_amd_memory_async_copy host->VRAM %zu MiB: %.2f GiB/s, ratio to memcpy %.2f\n",
	       mib, n / best_h2d / (1 << 30), best_memcpy / best_h2d);
	printf("ROCr hsa_amd_memory_async_copy VRAM->host %zu MiB: %.2f GiB/s, ratio to memcpy %.2f\n",
	       mib, n / best_d2h / (1 << 30), best_memcpy / best_d2h);
	rc = 0;
destroy:
	hsa_signal_destroy(sig);
out:
	if (dv)
		hsa_amd_memory_pool_free(dv);
	if (hd)
		hsa_amd_memory_pool_free(hd);
	if (hs)
		hsa_amd_memory_pool_free(hs);
	hsa_shut_down();
	return rc;
}
