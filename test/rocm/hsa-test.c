// SPDX-License-Identifier: GPL-2.0-only
/*
 * hsa-test: Debian's ROCr (ROCm 5.2, /usr/include/hsa, -lhsa-runtime64) driven unchanged
 * against whatever serves /dev/kfd and the render nodes: on this project, kfd-emu
 * (`kfd-emu run --profile P -- hsa-test --cpus N --gpus M --gfx NAME ...`).
 *
 *   hsa-test --cpus N --gpus M --gfx NAME --vram BYTES [--marketing NAME] [--mib MiB]
 *
 * hsa_init; every agent and its memory pools, checked against the machine the profile
 * describes (CPU and GPU agent counts, the GPUs' ISA name, marketing name and VRAM pool
 * size); on every GPU a VRAM buffer filled from the host with hsa_amd_memory_async_copy
 * and copied back to a second host buffer; then every GPU's buffer copied to the next
 * GPU's second buffer (device to device, after hsa_amd_agents_allow_access; over XGMI
 * within a hive, over PCIe otherwise) and back to the host, where the topology links the
 * two (ROCr allows peer access only along an IO link; the other pairs are listed as
 * "note" lines for the caller to compare with the topology). Every byte is verified, every
 * completion is an hsa_signal wait with a timeout. Frees everything; hsa_shut_down.
 *
 * One line per check ("ok   ..." or "FAIL ...: reason"); exit status 1 when any check
 * failed, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_AGENTS 64
#define COPY_TIMEOUT_S 10

#include "report.h"

static const char *hsa_str(hsa_status_t s)
{
	const char *m = NULL;

	if (hsa_status_string(s, &m) != HSA_STATUS_SUCCESS || !m)
		return "(no description)";
	return m;
}

static bool hsa_ok(hsa_status_t s, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (s == HSA_STATUS_SUCCESS) {
		pass("%s", what);
		return true;
	}
	fail("%s: status %#x: %s", what, s, hsa_str(s));
	return false;
}

/* Quiet variant for per-call bookkeeping: only a failure prints. */
static bool hsa_q(hsa_status_t s, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	if (s == HSA_STATUS_SUCCESS)
		return true;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	fail("%s: status %#x: %s", what, s, hsa_str(s));
	return false;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void fill(void *buf, size_t bytes, uint32_t seed)
{
	uint64_t *p = buf;

	for (size_t i = 0; i < bytes / 8; i++)
		p[i] = mix((uint64_t)seed << 32 | i);
}

static bool verify(const char *what, const void *buf, size_t bytes, uint32_t seed)
{
	const uint64_t *p = buf;

	for (size_t i = 0; i < bytes / 8; i++)
		if (p[i] != mix((uint64_t)seed << 32 | i)) {
			fail("%s: byte %zu of %zu differs (%#" PRIx64 ", expected %#" PRIx64 ")", what,
			     i * 8, bytes, p[i], mix((uint64_t)seed << 32 | i));
			return false;
		}
	pass("%s: all %zu bytes verified", what, bytes);
	return true;
}

struct agent {
	hsa_agent_t a;
	hsa_device_type_t type;
	char name[64];
	char product[64];
	uint32_t node;
	hsa_amd_memory_pool_t pool;	/* GPU: coarse-grained VRAM; CPU: fine-grained system */
	bool has_pool;
	uint64_t pool_size;
};

static struct agent agents[MAX_AGENTS];
static unsigned nagents;

static hsa_status_t pool_cb(hsa_amd_memory_pool_t pool, void *data)
{
	struct agent *ag = data;
	hsa_amd_segment_t seg;
	uint32_t flags = 0;
	bool alloc = false;
	size_t size = 0;

	if (hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg) != HSA_STATUS_SUCCESS ||
	    seg != HSA_AMD_SEGMENT_GLOBAL)
		return HSA_STATUS_SUCCESS;
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED, &alloc);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SIZE, &size);
	printf("     agent %s (node %u): global pool, %s%s%s, %zu MiB, %s\n", ag->name, ag->node,
	       flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED ? "coarse-grained" : "",
	       flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED ? "fine-grained" : "",
	       flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT ? ", kernarg" : "", size >> 20,
	       alloc ? "allocatable" : "not allocatable");
	if (!alloc || ag->has_pool)
		return HSA_STATUS_SUCCESS;
	if ((ag->type == HSA_DEVICE_TYPE_GPU && (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED)) ||
	    (ag->type == HSA_DEVICE_TYPE_CPU && (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED))) {
		ag->pool = pool;
		ag->has_pool = true;
		ag->pool_size = size;
	}
	return HSA_STATUS_SUCCESS;
}

static hsa_status_t agent_cb(hsa_agent_t a, void *data)
{
	struct agent *ag;

	(void)data;
	if (nagents == MAX_AGENTS)
		return HSA_STATUS_ERROR;
	ag = &agents[nagents++];
	ag->a = a;
	hsa_agent_get_info(a, HSA_AGENT_INFO_DEVICE, &ag->type);
	hsa_agent_get_info(a, HSA_AGENT_INFO_NAME, ag->name);
	hsa_agent_get_info(a, (hsa_agent_info_t)HSA_AMD_AGENT_INFO_PRODUCT_NAME, ag->product);
	hsa_agent_get_info(a, (hsa_agent_info_t)HSA_AMD_AGENT_INFO_DRIVER_NODE_ID, &ag->node);
	return hsa_amd_agent_iterate_memory_pools(a, pool_cb, ag);
}

static uint64_t ts_freq;

/* Waits for an async copy's completion signal to reach 0. */
static bool wait_done(hsa_signal_t s, const char *what)
{
	uint64_t t0 = now_ns();
	hsa_signal_value_t v;

	v = hsa_signal_wait_scacquire(s, HSA_SIGNAL_CONDITION_LT, 1, ts_freq * COPY_TIMEOUT_S,
				      HSA_WAIT_STATE_BLOCKED);
	if (v != 0) {
		fail("%s: completion signal still %" PRId64 " after %" PRIu64 " ms", what, (int64_t)v,
		     (now_ns() - t0) / 1000000);
		return false;
	}
	return true;
}

static bool copy(void *dst, hsa_agent_t dst_agent, const void *src, hsa_agent_t src_agent,
		 size_t bytes, hsa_signal_t sig, const char *what)
{
	uint64_t t0 = now_ns(), dt;

	hsa_signal_store_screlease(sig, 1);
	if (!hsa_q(hsa_amd_memory_async_copy(dst, dst_agent, src, src_agent, bytes, 0, NULL, sig),
		   "hsa_amd_memory_async_copy(%s)", what))
		return false;
	if (!wait_done(sig, what))
		return false;
	dt = now_ns() - t0;
	pass("%s: %zu MiB copied in %" PRIu64 " ms", what, bytes >> 20, dt / 1000000);
	return true;
}

static void usage(void)
{
	fprintf(stderr, "usage: hsa-test --cpus N --gpus M --gfx NAME --vram BYTES [--marketing NAME] [--mib MiB]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int want_cpus = -1, want_gpus = -1;
	const char *want_gfx = NULL, *want_mkt = NULL;
	unsigned long long want_vram = 0;
	size_t bytes = 16 << 20;
	struct agent *cpu = NULL, *gpu[MAX_AGENTS];
	unsigned ngpu = 0, ncpu = 0;
	void *host_src = NULL, *host_dst = NULL, *dev[MAX_AGENTS] = { 0 }, *dev2[MAX_AGENTS] = { 0 };
	hsa_signal_t sig = { 0 };
	bool have_sig = false, pools_missing = false;
	char what[192];

	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--cpus"))
			want_cpus = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--gpus"))
			want_gpus = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--gfx"))
			want_gfx = argv[++i];
		else if (!strcmp(argv[i], "--marketing"))
			want_mkt = argv[++i];
		else if (!strcmp(argv[i], "--vram"))
			want_vram = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--mib"))
			bytes = strtoull(argv[++i], NULL, 0) << 20;
		else
			usage();
	}
	if (want_cpus < 1 || want_gpus < 1 || !want_gfx || !want_vram || !bytes)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (!hsa_ok(hsa_init(), "hsa_init"))
		goto done;
	if (!hsa_ok(hsa_system_get_info(HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY, &ts_freq),
		    "hsa_system_get_info(TIMESTAMP_FREQUENCY)") || !ts_freq) {
		fail("no timestamp frequency");
		goto shut;
	}
	if (!hsa_ok(hsa_iterate_agents(agent_cb, NULL), "hsa_iterate_agents"))
		goto shut;

	for (unsigned i = 0; i < nagents; i++) {
		struct agent *ag = &agents[i];

		if (ag->type == HSA_DEVICE_TYPE_CPU) {
			ncpu++;
			if (!ag->has_pool) {
				fail("CPU agent %u (node %u) has no allocatable fine-grained global pool", i, ag->node);
				pools_missing = true;
			} else if (!cpu)
				cpu = ag;
			continue;
		}
		if (ag->type != HSA_DEVICE_TYPE_GPU)
			continue;
		gpu[ngpu++] = ag;
		if (strcmp(ag->name, want_gfx))
			fail("GPU agent node %u: name \"%s\", expected \"%s\"", ag->node, ag->name, want_gfx);
		else
			pass("GPU agent node %u: name %s", ag->node, ag->name);
		if (want_mkt && strcmp(ag->product, want_mkt))
			fail("GPU agent node %u: product name \"%s\", expected \"%s\"", ag->node,
			     ag->product, want_mkt);
		else
			pass("GPU agent node %u: product name \"%s\"", ag->node, ag->product);
		if (!ag->has_pool) {
			fail("GPU agent node %u: no allocatable coarse-grained global (VRAM) pool", ag->node);
			pools_missing = true;
		} else if (ag->pool_size != want_vram) {
			fail("GPU agent node %u: VRAM pool of %" PRIu64 " bytes, the profile has %llu",
			     ag->node, ag->pool_size, want_vram);
		} else {
			pass("GPU agent node %u: %" PRIu64 " MiB VRAM pool", ag->node, ag->pool_size >> 20);
		}
	}
	if (ncpu != (unsigned)want_cpus || ngpu != (unsigned)want_gpus) {
		fail("ROCr lists %u CPU and %u GPU agents, the profile has %d and %d", ncpu, ngpu,
		     want_cpus, want_gpus);
		goto shut;
	}
	pass("%u CPU and %u GPU agents, as the profile says", ncpu, ngpu);
	if (!cpu || pools_missing)
		goto shut;

	if (!hsa_ok(hsa_amd_memory_pool_allocate(cpu->pool, bytes, 0, &host_src), "allocate %zu MiB of host memory", bytes >> 20) ||
	    !hsa_ok(hsa_amd_memory_pool_allocate(cpu->pool, bytes, 0, &host_dst), "allocate %zu MiB of host memory", bytes >> 20))
		goto free;
	if (!hsa_ok(hsa_signal_create(1, 0, NULL, &sig), "hsa_signal_create"))
		goto free;
	have_sig = true;

	/* Host -> device -> host on every GPU. */
	for (unsigned i = 0; i < ngpu; i++) {
		struct agent *g = gpu[i];
		hsa_agent_t both[2] = { g->a, cpu->a };

		if (!hsa_ok(hsa_amd_memory_pool_allocate(g->pool, bytes, 0, &dev[i]), "allocate %zu MiB of VRAM on node %u",
			    bytes >> 20, g->node) ||
		    !hsa_ok(hsa_amd_memory_pool_allocate(g->pool, bytes, 0, &dev2[i]), "allocate a second %zu MiB on node %u",
			    bytes >> 20, g->node))
			goto free;
		if (!hsa_q(hsa_amd_agents_allow_access(2, both, NULL, host_src), "allow node %u to host memory", g->node) ||
		    !hsa_q(hsa_amd_agents_allow_access(2, both, NULL, host_dst), "allow node %u to host memory", g->node))
			goto free;
		fill(host_src, bytes, 0x100 + i);
		memset(host_dst, 0, bytes);
		snprintf(what, sizeof(what), "host -> VRAM of node %u", g->node);
		if (!copy(dev[i], g->a, host_src, cpu->a, bytes, sig, what))
			continue;
		snprintf(what, sizeof(what), "VRAM of node %u -> host", g->node);
		if (!copy(host_dst, cpu->a, dev[i], g->a, bytes, sig, what))
			continue;
		snprintf(what, sizeof(what), "host -> node %u -> host", g->node);
		verify(what, host_dst, bytes, 0x100 + i);
	}

	/* Device -> device: every GPU's buffer to the next GPU, then back to the host. */
	for (unsigned i = 0; ngpu > 1 && i < ngpu; i++) {
		unsigned j = (i + 1) % ngpu;
		struct agent *a = gpu[i], *b = gpu[j];
		hsa_amd_memory_pool_access_t acc_ab = HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED,
					     acc_ba = HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED;
		hsa_agent_t pair[2] = { a->a, b->a };

		hsa_amd_agent_memory_pool_get_info(b->a, a->pool, HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS, &acc_ab);
		hsa_amd_agent_memory_pool_get_info(a->a, b->pool, HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS, &acc_ba);
		if (acc_ab == HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED ||
		    acc_ba == HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED) {
			/* ROCr allows peer access only along an IO link of the topology; the
			 * caller compares the pairs copied with the pairs the topology links. */
			printf("note no peer access between nodes %u and %u (access %d/%d): no IO link"
			       " between them\n", a->node, b->node, acc_ab, acc_ba);
			continue;
		}
		if (!hsa_q(hsa_amd_agents_allow_access(2, pair, NULL, dev[i]), "allow nodes %u,%u to VRAM of %u",
			   a->node, b->node, a->node) ||
		    !hsa_q(hsa_amd_agents_allow_access(2, pair, NULL, dev2[j]), "allow nodes %u,%u to VRAM of %u",
			   a->node, b->node, b->node))
			continue;
		snprintf(what, sizeof(what), "VRAM of node %u -> VRAM of node %u", a->node, b->node);
		if (!copy(dev2[j], b->a, dev[i], a->a, bytes, sig, what))
			continue;
		/* allow_access sets the GPUs a buffer is mapped on (the thunk unmaps the others):
		 * the host buffer is still mapped only on the last GPU of the loop above, and
		 * node b's SDMA engine writes it. */
		if (!hsa_q(hsa_amd_agents_allow_access(2, (hsa_agent_t[]){ b->a, cpu->a }, NULL, host_dst),
			   "allow node %u to host memory", b->node))
			continue;
		memset(host_dst, 0, bytes);
		snprintf(what, sizeof(what), "VRAM of node %u (from node %u) -> host", b->node, a->node);
		if (!copy(host_dst, cpu->a, dev2[j], b->a, bytes, sig, what))
			continue;
		snprintf(what, sizeof(what), "host -> node %u -> node %u -> host", a->node, b->node);
		verify(what, host_dst, bytes, 0x100 + i);
	}

free:
	for (unsigned i = 0; i < ngpu; i++) {
		if (dev[i])
			hsa_q(hsa_amd_memory_pool_free(dev[i]), "free VRAM of node %u", gpu[i]->node);
		if (dev2[i])
			hsa_q(hsa_amd_memory_pool_free(dev2[i]), "free VRAM of node %u", gpu[i]->node);
	}
	if (host_src)
		hsa_q(hsa_amd_memory_pool_free(host_src), "free host memory");
	if (host_dst)
		hsa_q(hsa_amd_memory_pool_free(host_dst), "free host memory");
	if (have_sig)
		hsa_q(hsa_signal_destroy(sig), "hsa_signal_destroy");
shut:
	hsa_ok(hsa_shut_down(), "hsa_shut_down");
done:
	printf("hsa-test: %d checks passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
