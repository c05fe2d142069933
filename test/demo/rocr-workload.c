// SPDX-License-Identifier: GPL-2.0-only
/*
 * rocr-workload: the ROCr program `make demo` checkpoints mid-copy. Debian's
 * ROCm 5.2 runtime (libhsa-runtime64), unchanged, as applications use it.
 *
 *   rocr-workload [--mib N]
 *
 * On every GPU it keeps N MiB of VRAM with a pattern of its own (written by
 * async copies from the host), and a thread per GPU streams async copies
 * of that VRAM back to the host, checking every byte, in a loop. Besides,
 * an upload of 4 MiB per GPU (host -> VRAM) is submitted behind a gate, a
 * dependency signal still at 1: ROCr puts POLL_REGMEM packets ahead of the
 * copy into the GPU's SDMA ring, so the copy stays there, submitted and not
 * executed, until the gate opens. A checkpoint therefore always finds one
 * copy per GPU in flight, besides the streaming ones.
 *
 * One JSON line per event on stdout:
 *   {"ready":true,"pid":P,"gpus":G,"nodes":[...],"mib":N}
 *   SIGUSR1: checks the VRAM and the loops, answers
 *            {"ok":B,"pid":P,"loops":[...],"bytes":V,"in_flight":K,"errors":[...]}
 *            (loops: copy loops per GPU so far; bytes: bytes of VRAM checked by this
 *            check; in_flight: gated copies still waiting)
 *   SIGUSR2: opens the gate, waits for the gated copies, checks what they wrote:
 *            {"ok":B,"pid":P,"released":K,"bytes":V,"errors":[...]}
 *   SIGTERM: stops the loops, checks everything once more, frees it all, shuts
 *            ROCr down: {"ok":B,"pid":P,"loops":[...],"bytes":V,"errors":[...]};
 *            exit status 0 when every check passed.
 */
#define _GNU_SOURCE
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 16
#define CHUNK (4u << 20)
#define GATED (4u << 20)
#define WAIT_S 120

struct gpu {
	hsa_agent_t agent;
	hsa_amd_memory_pool_t vram_pool;
	uint32_t node;
	void *keep;		/* mib MiB, pattern 0x100 + index */
	void *gated_dst;	/* GATED bytes, written by the gated copy */
	void *gated_src;	/* host, pattern 0x200 + index */
	hsa_signal_t gated_done;
	bool gated_pending;
	void *bounce;		/* host, for the loop */
	pthread_t thread;
	unsigned long loops;	/* atomic */
	int failed;		/* atomic */
	char why[256];
};

static hsa_agent_t cpu;
static hsa_amd_memory_pool_t host_pool;
static struct gpu gpus[MAX_GPUS];
static unsigned int ngpus;
static size_t keep_bytes = 16u << 20;
static hsa_signal_t gate;
static uint64_t ts_freq;
static int stop;
static volatile sig_atomic_t usr1, usr2, term;

/* Errors of the current check, as a JSON array body. */
static char errors[4096];
static size_t nerr;

static void error(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	size_t at = strlen(errors);

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (char *c = msg; *c; c++)
		if (*c == '"' || *c == '\\')
			*c = '\'';
	snprintf(errors + at, sizeof(errors) - at, "%s\"%s\"", nerr ? "," : "", msg);
	nerr++;
}

static uint32_t word(uint32_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)seed << 32 | seed);

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 32;
	return (uint32_t)x;
}

static void fill(void *p, size_t bytes, uint32_t seed, uint64_t first)
{
	uint32_t *w = p;

	for (size_t i = 0; i < bytes / 4; i++)
		w[i] = word(seed, first + i);
}

/* The offset of the first wrong byte, or -1. */
static long long mismatch(const void *p, size_t bytes, uint32_t seed, uint64_t first)
{
	const uint32_t *w = p;

	for (size_t i = 0; i < bytes / 4; i++)
		if (w[i] != word(seed, first + i))
			return (long long)i * 4;
	return -1;
}

static hsa_status_t pool_cb(hsa_amd_memory_pool_t pool, void *data)
{
	hsa_amd_memory_pool_t *want = data;
	hsa_amd_segment_t seg;
	uint32_t flags = 0;
	bool alloc = false;
	bool gpu = want != &host_pool;

	if (hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg) != HSA_STATUS_SUCCESS ||
	    seg != HSA_AMD_SEGMENT_GLOBAL)
		return HSA_STATUS_SUCCESS;
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED, &alloc);
	if (alloc && !want->handle &&
	    (flags & (gpu ? HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED : HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED)))
		*want = pool;
	return HSA_STATUS_SUCCESS;
}

static hsa_status_t agent_cb(hsa_agent_t a, void *data)
{
	hsa_device_type_t type;

	(void)data;
	hsa_agent_get_info(a, HSA_AGENT_INFO_DEVICE, &type);
	if (type == HSA_DEVICE_TYPE_CPU && !cpu.handle) {
		cpu = a;
		return hsa_amd_agent_iterate_memory_pools(a, pool_cb, &host_pool);
	}
	if (type != HSA_DEVICE_TYPE_GPU || ngpus == MAX_GPUS)
		return HSA_STATUS_SUCCESS;
	gpus[ngpus].agent = a;
	hsa_agent_get_info(a, (hsa_agent_info_t)HSA_AMD_AGENT_INFO_DRIVER_NODE_ID, &gpus[ngpus].node);
	return hsa_amd_agent_iterate_memory_pools(a, pool_cb, &gpus[ngpus++].vram_pool);
}

static void *host_alloc(size_t bytes)
{
	hsa_agent_t all[MAX_GPUS + 1] = { cpu };
	void *p = NULL;

	for (unsigned int i = 0; i < ngpus; i++)
		all[i + 1] = gpus[i].agent;
	if (hsa_amd_memory_pool_allocate(host_pool, bytes, 0, &p) != HSA_STATUS_SUCCESS)
		return NULL;
	if (hsa_amd_agents_allow_access(ngpus + 1, all, NULL, p) != HSA_STATUS_SUCCESS) {
		hsa_amd_memory_pool_free(p);
		return NULL;
	}
	return p;
}

/* One async copy and its wait (up to WAIT_S; the wait may span a checkpoint). */
static bool copy(void *dst, hsa_agent_t da, const void *src, hsa_agent_t sa, size_t bytes, hsa_signal_t sig)
{
	time_t t0 = time(NULL);
	hsa_signal_value_t v;

	hsa_signal_store_screlease(sig, 1);
	if (hsa_amd_memory_async_copy(dst, da, src, sa, bytes, 0, NULL, sig) != HSA_STATUS_SUCCESS)
		return false;
	do
		v = hsa_signal_wait_scacquire(sig, HSA_SIGNAL_CONDITION_LT, 1, ts_freq, HSA_WAIT_STATE_BLOCKED);
	while (v != 0 && time(NULL) - t0 < WAIT_S);
	return v == 0;
}

/* The streaming loop of one GPU: its VRAM back to the host, chunk by chunk, checked. */
static void *loop(void *arg)
{
	struct gpu *g = arg;
	unsigned int idx = (unsigned int)(g - gpus);
	hsa_signal_t sig;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	if (hsa_signal_create(1, 0, NULL, &sig) != HSA_STATUS_SUCCESS) {
		snprintf(g->why, sizeof(g->why), "node %u: hsa_signal_create failed", g->node);
		__atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
		return NULL;
	}
	for (unsigned long k = 0; !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); k++) {
		size_t off = (k * CHUNK) % keep_bytes, n = keep_bytes - off < CHUNK ? keep_bytes - off : CHUNK;
		long long bad;

		memset(g->bounce, 0, n);
		if (!copy(g->bounce, cpu, (char *)g->keep + off, g->agent, n, sig)) {
			snprintf(g->why, sizeof(g->why), "node %u: loop %lu: the copy VRAM -> host did not complete",
				 g->node, k);
			__atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
			break;
		}
		bad = mismatch(g->bounce, n, 0x100 + idx, off / 4);
		if (bad >= 0) {
			snprintf(g->why, sizeof(g->why), "node %u: loop %lu: VRAM byte %zu is wrong", g->node, k,
				 off + (size_t)bad);
			__atomic_store_n(&g->failed, 1, __ATOMIC_RELEASE);
			break;
		}
		__atomic_store_n(&g->loops, k + 1, __ATOMIC_RELEASE);
	}
	hsa_signal_destroy(sig);
	return NULL;
}

/* Every GPU's VRAM through a copy to the host; returns the bytes checked. */
static uint64_t check_keep(hsa_signal_t sig, void *buf)
{
	uint64_t bytes = 0;

	for (unsigned int i = 0; i < ngpus; i++)
		for (size_t off = 0; off < keep_bytes; off += CHUNK) {
			size_t n = keep_bytes - off < CHUNK ? keep_bytes - off : CHUNK;
			long long bad;

			if (!copy(buf, cpu, (char *)gpus[i].keep + off, gpus[i].agent, n, sig)) {
				error("node %u: the check's copy did not complete", gpus[i].node);
				return bytes;
			}
			bad = mismatch(buf, n, 0x100 + i, off / 4);
			if (bad >= 0) {
				error("node %u: VRAM byte %zu is wrong", gpus[i].node, off + (size_t)bad);
				return bytes;
			}
			bytes += n;
		}
	return bytes;
}

static void loops_json(char *out, size_t len)
{
	size_t at = 0;

	for (unsigned int i = 0; i < ngpus; i++) {
		at += snprintf(out + at, len - at, "%s%lu", i ? "," : "", __atomic_load_n(&gpus[i].loops, __ATOMIC_ACQUIRE));
		if (__atomic_load_n(&gpus[i].failed, __ATOMIC_ACQUIRE))
			error("%s", gpus[i].why);
	}
}

static void report(const char *fields)
{
	printf("{\"ok\":%s,\"pid\":%d,%s,\"errors\":[%s]}\n", nerr ? "false" : "true", getpid(), fields, errors);
	fflush(stdout);
	errors[0] = '\0';
	nerr = 0;
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		usr1 = 1;
	else if (sig == SIGUSR2)
		usr2 = 1;
	else
		term = 1;
}

static unsigned int in_flight(void)
{
	unsigned int n = 0;

	for (unsigned int i = 0; i < ngpus; i++)
		n += gpus[i].gated_pending && hsa_signal_load_scacquire(gpus[i].gated_done) == 1;
	return n;
}

/* Opens the gate; every gated copy must complete and have written its pattern. */
static uint64_t release(hsa_signal_t sig, void *buf, unsigned int *released)
{
	uint64_t bytes = 0;

	*released = 0;
	hsa_signal_store_screlease(gate, 0);
	for (unsigned int i = 0; i < ngpus; i++) {
		struct gpu *g = &gpus[i];
		hsa_signal_value_t v;
		time_t t0 = time(NULL);
		long long bad;

		if (!g->gated_pending)
			continue;
		do
			v = hsa_signal_wait_scacquire(g->gated_done, HSA_SIGNAL_CONDITION_LT, 1, ts_freq,
						      HSA_WAIT_STATE_BLOCKED);
		while (v != 0 && time(NULL) - t0 < WAIT_S);
		if (v != 0) {
			error("node %u: the gated copy did not complete after the gate opened", g->node);
			continue;
		}
		g->gated_pending = false;
		(*released)++;
		if (!copy(buf, cpu, g->gated_dst, g->agent, GATED, sig)) {
			error("node %u: reading back the gated copy failed", g->node);
			continue;
		}
		bad = mismatch(buf, GATED, 0x200 + i, 0);
		if (bad >= 0)
			error("node %u: byte %lld of the gated copy is wrong", g->node, bad);
		else
			bytes += GATED;
	}
	return bytes;
}

static int setup(void)
{
	hsa_signal_t sig;

	if (hsa_signal_create(1, 0, NULL, &gate) != HSA_STATUS_SUCCESS ||
	    hsa_signal_create(1, 0, NULL, &sig) != HSA_STATUS_SUCCESS)
		return -1;
	for (unsigned int i = 0; i < ngpus; i++) {
		struct gpu *g = &gpus[i];
		void *src = host_alloc(CHUNK);

		g->bounce = host_alloc(CHUNK);
		g->gated_src = host_alloc(GATED);
		if (!src || !g->bounce || !g->gated_src || !g->vram_pool.handle ||
		    hsa_amd_memory_pool_allocate(g->vram_pool, keep_bytes, 0, &g->keep) != HSA_STATUS_SUCCESS ||
		    hsa_amd_memory_pool_allocate(g->vram_pool, GATED, 0, &g->gated_dst) != HSA_STATUS_SUCCESS ||
		    hsa_signal_create(1, 0, NULL, &g->gated_done) != HSA_STATUS_SUCCESS) {
			fprintf(stderr, "rocr-workload: allocating on node %u failed\n", g->node);
			return -1;
		}
		for (size_t off = 0; off < keep_bytes; off += CHUNK) {
			size_t n = keep_bytes - off < CHUNK ? keep_bytes - off : CHUNK;

			fill(src, n, 0x100 + i, off / 4);
			if (!copy((char *)g->keep + off, g->agent, src, cpu, n, sig)) {
				fprintf(stderr, "rocr-workload: writing the VRAM of node %u failed\n", g->node);
				return -1;
			}
		}
		hsa_amd_memory_pool_free(src);
		fill(g->gated_src, GATED, 0x200 + i, 0);
		if (hsa_amd_memory_async_copy(g->gated_dst, g->agent, g->gated_src, cpu, GATED, 1, &gate,
					      g->gated_done) != HSA_STATUS_SUCCESS) {
			fprintf(stderr, "rocr-workload: the gated copy to node %u was refused\n", g->node);
			return -1;
		}
		g->gated_pending = true;
	}
	hsa_signal_destroy(sig);
	for (unsigned int i = 0; i < ngpus; i++)
		if (pthread_create(&gpus[i].thread, NULL, loop, &gpus[i])) {
			fprintf(stderr, "rocr-workload: pthread_create failed\n");
			return -1;
		}
	return 0;
}

int main(int argc, char **argv)
{
	char f[4096], loops[1024], nodes[256];
	struct sigaction sa;
	hsa_signal_t sig;
	void *buf;
	size_t at = 0;
	int failed = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
			keep_bytes = (size_t)atoi(argv[++i]) << 20;
		} else {
			fprintf(stderr, "usage: rocr-workload [--mib N]\n");
			return 2;
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	if (hsa_init() != HSA_STATUS_SUCCESS ||
	    hsa_system_get_info(HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY, &ts_freq) != HSA_STATUS_SUCCESS ||
	    hsa_iterate_agents(agent_cb, NULL) != HSA_STATUS_SUCCESS || !cpu.handle || !host_pool.handle || !ngpus) {
		fprintf(stderr, "rocr-workload: ROCr shows no usable CPU and GPU agents (is this on kfd-emu?)\n");
		return 1;
	}
	if (setup())
		return 1;
	buf = host_alloc(CHUNK);
	if (!buf || hsa_signal_create(1, 0, NULL, &sig) != HSA_STATUS_SUCCESS)
		return 1;
	for (unsigned int i = 0; i < ngpus; i++)
		at += snprintf(nodes + at, sizeof(nodes) - at, "%s%u", i ? "," : "", gpus[i].node);
	printf("{\"ready\":true,\"pid\":%d,\"gpus\":%u,\"nodes\":[%s],\"mib\":%zu}\n", getpid(), ngpus, nodes,
	       keep_bytes >> 20);
	fflush(stdout);

	while (!term) {
		if (usr1) {
			uint64_t bytes;

			usr1 = 0;
			bytes = check_keep(sig, buf);
			loops_json(loops, sizeof(loops));
			snprintf(f, sizeof(f), "\"loops\":[%s],\"bytes\":%" PRIu64 ",\"in_flight\":%u", loops, bytes,
				 in_flight());
			failed |= nerr != 0;
			report(f);
		} else if (usr2) {
			unsigned int released;
			uint64_t bytes;

			usr2 = 0;
			bytes = release(sig, buf, &released);
			snprintf(f, sizeof(f), "\"released\":%u,\"bytes\":%" PRIu64, released, bytes);
			failed |= nerr != 0;
			report(f);
		} else {
			usleep(20000);
		}
	}

	/* SIGTERM: the last check, then everything freed. */
	{
		unsigned int released;
		uint64_t bytes = release(sig, buf, &released);

		__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
		for (unsigned int i = 0; i < ngpus; i++)
			pthread_join(gpus[i].thread, NULL);
		bytes += check_keep(sig, buf);
		loops_json(loops, sizeof(loops));
		for (unsigned int i = 0; i < ngpus; i++) {
			struct gpu *g = &gpus[i];

			if (hsa_amd_memory_pool_free(g->keep) != HSA_STATUS_SUCCESS ||
			    hsa_amd_memory_pool_free(g->gated_dst) != HSA_STATUS_SUCCESS ||
			    hsa_amd_memory_pool_free(g->gated_src) != HSA_STATUS_SUCCESS ||
			    hsa_amd_memory_pool_free(g->bounce) != HSA_STATUS_SUCCESS)
				error("node %u: freeing its memory failed", g->node);
			hsa_signal_destroy(g->gated_done);
		}
		hsa_amd_memory_pool_free(buf);
		hsa_signal_destroy(sig);
		hsa_signal_destroy(gate);
		if (hsa_shut_down() != HSA_STATUS_SUCCESS)
			error("hsa_shut_down failed");
		snprintf(f, sizeof(f), "\"loops\":[%s],\"bytes\":%" PRIu64, loops, bytes);
		failed |= nerr != 0;
		report(f);
	}
	return failed ? 1 : 0;
}
