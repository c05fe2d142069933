// SPDX-License-Identifier: GPL-2.0-only
/*
 * Helpers of criu-rocm's zdtm tests on ROCr; see rocr_common.h.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zdtmtst.h"
#include "gpu_pattern.h"
#include "rocr_common.h"

/* Bytes of each buffer of rocr_new_work(): under 1 MiB, so a copy within one GPU is SDMA's. */
#define NEW_WORK_BYTES (512 << 10)

uint64_t rocr_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *status_text(hsa_status_t s)
{
	const char *m = NULL;

	if (hsa_status_string(s, &m) != HSA_STATUS_SUCCESS || !m)
		return "no description";
	return m;
}

/* pr_err for a failed HSA call: the call's text and ROCr's own words. */
static int hsa_err(hsa_status_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int hsa_err(hsa_status_t s, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	pr_err("%s: HSA status %#x: %s\n", what, s, status_text(s));
	return -1;
}

/* The pool an agent's search wants: a GPU's coarse-grained or a CPU's fine-grained one. */
struct pool_want {
	bool gpu, found;
	hsa_amd_memory_pool_t pool;
};

static hsa_status_t pool_cb(hsa_amd_memory_pool_t pool, void *data)
{
	struct pool_want *want = data;
	hsa_amd_segment_t seg;
	uint32_t flags = 0;
	bool alloc = false;

	if (want->found)
		return HSA_STATUS_SUCCESS;
	if (hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg) != HSA_STATUS_SUCCESS ||
	    seg != HSA_AMD_SEGMENT_GLOBAL)
		return HSA_STATUS_SUCCESS;
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED, &alloc);
	if (!alloc)
		return HSA_STATUS_SUCCESS;
	if (want->gpu ? (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED) :
			(flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED)) {
		want->pool = pool;
		want->found = true;
	}
	return HSA_STATUS_SUCCESS;
}

static hsa_status_t agent_cb(hsa_agent_t a, void *data)
{
	struct rocr *r = data;
	hsa_device_type_t type;
	struct pool_want want = { 0 };
	hsa_status_t s;

	if (hsa_agent_get_info(a, HSA_AGENT_INFO_DEVICE, &type) != HSA_STATUS_SUCCESS)
		return HSA_STATUS_ERROR;
	if (type == HSA_DEVICE_TYPE_CPU && r->cpu.handle)
		return HSA_STATUS_SUCCESS;
	if (type != HSA_DEVICE_TYPE_CPU && type != HSA_DEVICE_TYPE_GPU)
		return HSA_STATUS_SUCCESS;
	want.gpu = type == HSA_DEVICE_TYPE_GPU;
	s = hsa_amd_agent_iterate_memory_pools(a, pool_cb, &want);
	if (s != HSA_STATUS_SUCCESS)
		return s;
	if (!want.found) {
		pr_err("a %s agent has no allocatable %s global pool\n", want.gpu ? "GPU" : "CPU",
		       want.gpu ? "coarse-grained" : "fine-grained");
		return HSA_STATUS_ERROR;
	}
	if (!want.gpu) {
		r->cpu = a;
		r->host = want.pool;
		return HSA_STATUS_SUCCESS;
	}
	if (r->ngpus == ROCR_MAX_GPUS) {
		pr_err("more than %d GPU agents\n", ROCR_MAX_GPUS);
		return HSA_STATUS_ERROR;
	}
	r->gpu[r->ngpus].agent = a;
	r->gpu[r->ngpus].vram = want.pool;
	hsa_agent_get_info(a, HSA_AGENT_INFO_NAME, r->gpu[r->ngpus].name);
	hsa_agent_get_info(a, (hsa_agent_info_t)HSA_AMD_AGENT_INFO_DRIVER_NODE_ID, &r->gpu[r->ngpus].node);
	r->ngpus++;
	return HSA_STATUS_SUCCESS;
}

int rocr_init(struct rocr *r)
{
	hsa_status_t s;

	memset(r, 0, sizeof(*r));
	s = hsa_init();
	if (s != HSA_STATUS_SUCCESS)
		return hsa_err(s, "hsa_init (is this running under kfd-emu?)");
	s = hsa_system_get_info(HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY, &r->ts_freq);
	if (s != HSA_STATUS_SUCCESS || !r->ts_freq)
		return hsa_err(s, "hsa_system_get_info(TIMESTAMP_FREQUENCY)");
	s = hsa_iterate_agents(agent_cb, r);
	if (s != HSA_STATUS_SUCCESS)
		return hsa_err(s, "hsa_iterate_agents");
	if (!r->cpu.handle || !r->ngpus) {
		pr_err("ROCr shows %s CPU agent and %u GPU agents\n", r->cpu.handle ? "a" : "no", r->ngpus);
		return -1;
	}
	r->all[0] = r->cpu;
	for (unsigned int i = 0; i < r->ngpus; i++)
		r->all[i + 1] = r->gpu[i].agent;
	return 0;
}

int rocr_shut_down(void)
{
	hsa_status_t s = hsa_shut_down();

	if (s != HSA_STATUS_SUCCESS) {
		errno = 0;
		fail("hsa_shut_down: HSA status %#x: %s", s, status_text(s));
		return -1;
	}
	return 0;
}

void *rocr_host_alloc(struct rocr *r, size_t bytes, const char *what)
{
	void *p = NULL;
	hsa_status_t s;

	s = hsa_amd_memory_pool_allocate(r->host, bytes, 0, &p);
	if (s != HSA_STATUS_SUCCESS) {
		hsa_err(s, "allocate %s (%zu KiB of host memory)", what, bytes >> 10);
		return NULL;
	}
	s = hsa_amd_agents_allow_access(r->ngpus + 1, r->all, NULL, p);
	if (s != HSA_STATUS_SUCCESS) {
		hsa_err(s, "let every GPU reach %s", what);
		hsa_amd_memory_pool_free(p);
		return NULL;
	}
	return p;
}

void *rocr_vram_alloc(struct rocr *r, unsigned int g, size_t bytes, const char *what)
{
	void *p = NULL;
	hsa_status_t s;

	s = hsa_amd_memory_pool_allocate(r->gpu[g].vram, bytes, 0, &p);
	if (s != HSA_STATUS_SUCCESS) {
		hsa_err(s, "allocate %s (%zu KiB of VRAM on node %u)", what, bytes >> 10, r->gpu[g].node);
		return NULL;
	}
	return p;
}

int rocr_free(void *p, const char *what)
{
	hsa_status_t s;

	if (!p)
		return 0;
	s = hsa_amd_memory_pool_free(p);
	if (s != HSA_STATUS_SUCCESS) {
		errno = 0;
		fail("free %s: HSA status %#x: %s", what, s, status_text(s));
		return -1;
	}
	return 0;
}

bool rocr_peer(struct rocr *r, unsigned int a, unsigned int b)
{
	hsa_amd_memory_pool_access_t ab = HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED;
	hsa_amd_memory_pool_access_t ba = HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED;

	if (a == b)
		return true;
	hsa_amd_agent_memory_pool_get_info(r->gpu[b].agent, r->gpu[a].vram, HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS,
					   &ab);
	hsa_amd_agent_memory_pool_get_info(r->gpu[a].agent, r->gpu[b].vram, HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS,
					   &ba);
	return ab != HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED && ba != HSA_AMD_MEMORY_POOL_ACCESS_NEVER_ALLOWED;
}

int rocr_allow_pair(struct rocr *r, unsigned int a, unsigned int b, void *p, const char *what)
{
	hsa_agent_t pair[2] = { r->gpu[a].agent, r->gpu[b].agent };
	hsa_status_t s;

	s = hsa_amd_agents_allow_access(a == b ? 1 : 2, pair, NULL, p);
	if (s != HSA_STATUS_SUCCESS) {
		errno = 0;
		fail("let nodes %u and %u reach %s: HSA status %#x: %s", r->gpu[a].node, r->gpu[b].node, what, s,
		     status_text(s));
		return -1;
	}
	return 0;
}

int rocr_lock(struct rocr *r, void *p, size_t bytes, void **agent_ptr, const char *what)
{
	hsa_status_t s;

	s = hsa_amd_memory_lock(p, bytes, &r->all[1], r->ngpus, agent_ptr);
	if (s != HSA_STATUS_SUCCESS || !*agent_ptr) {
		errno = 0;
		fail("hsa_amd_memory_lock(%s, %zu KiB): HSA status %#x: %s", what, bytes >> 10, s, status_text(s));
		return -1;
	}
	return 0;
}

int rocr_unlock(void *p, const char *what)
{
	hsa_status_t s = hsa_amd_memory_unlock(p);

	if (s != HSA_STATUS_SUCCESS) {
		errno = 0;
		fail("hsa_amd_memory_unlock(%s): HSA status %#x: %s", what, s, status_text(s));
		return -1;
	}
	return 0;
}

int rocr_signal(hsa_signal_t *sig)
{
	hsa_status_t s = hsa_signal_create(1, 0, NULL, sig);

	if (s != HSA_STATUS_SUCCESS)
		return hsa_err(s, "hsa_signal_create");
	return 0;
}

int rocr_copy(struct rocr *r, void *dst, hsa_agent_t dst_agent, const void *src, hsa_agent_t src_agent,
	      size_t bytes, hsa_signal_t sig, const char *what)
{
	uint64_t t0 = rocr_now_ms();
	hsa_signal_value_t v;
	hsa_status_t s;

	hsa_signal_store_screlease(sig, 1);
	s = hsa_amd_memory_async_copy(dst, dst_agent, src, src_agent, bytes, 0, NULL, sig);
	if (s != HSA_STATUS_SUCCESS) {
		errno = 0;
		fail("%s: hsa_amd_memory_async_copy of %zu KiB: HSA status %#x: %s", what, bytes >> 10, s,
		     status_text(s));
		return -1;
	}
	/* The wait may span a checkpoint: the copy must complete after the restore. */
	do {
		v = hsa_signal_wait_scacquire(sig, HSA_SIGNAL_CONDITION_LT, 1, r->ts_freq, HSA_WAIT_STATE_BLOCKED);
	} while (v != 0 && rocr_now_ms() - t0 < ROCR_WAIT_MS);
	if (v != 0) {
		errno = 0;
		fail("%s: the copy of %zu KiB did not complete in %d s (completion signal %" PRId64 ")", what,
		     bytes >> 10, ROCR_WAIT_MS / 1000, (int64_t)v);
		return -1;
	}
	return 0;
}

void rocr_fill(void *p, size_t bytes, uint32_t seed)
{
	gpu_pattern_fill(p, bytes, seed);
}

int rocr_check(const void *p, size_t bytes, uint32_t seed, const char *what)
{
	return gpu_pattern_check(p, bytes, seed, what);
}

int rocr_check_vram(struct rocr *r, unsigned int g, const void *dev, size_t bytes, uint32_t seed, void *bounce,
		    hsa_signal_t sig, const char *what)
{
	memset(bounce, 0, bytes);
	if (rocr_copy(r, bounce, r->cpu, dev, r->gpu[g].agent, bytes, sig, what))
		return -1;
	return rocr_check(bounce, bytes, seed, what);
}

bool rocr_corrupt_requested(void)
{
	const char *v = getenv("ZDTM_GPU_CORRUPT");

	return v && v[0] && strcmp(v, "0");
}

int rocr_corrupt(struct rocr *r, unsigned int g, void *dev, size_t off, hsa_signal_t sig)
{
	uint32_t *bad = rocr_host_alloc(r, 4096, "the damage");
	int ret;

	if (!bad)
		return -1;
	bad[0] = 0xbadc0de5;
	ret = rocr_copy(r, (char *)dev + off, r->gpu[g].agent, bad, r->cpu, 4, sig, "ZDTM_GPU_CORRUPT");
	test_msg("ZDTM_GPU_CORRUPT: damaged byte %zu of VRAM on node %u\n", off, r->gpu[g].node);
	return rocr_free(bad, "the damage") ? -1 : ret;
}

/* One GPU's part of rocr_new_work(). */
static int new_work_on(struct rocr *r, unsigned int g, uint32_t seed, void *host, void *bounce, hsa_signal_t sig)
{
	size_t n = NEW_WORK_BYTES;
	unsigned int next = (g + 1) % r->ngpus;
	void *a, *b, *peer = NULL, *user = NULL, *user_gpu = NULL;
	char what[128];
	int ret = -1;

	snprintf(what, sizeof(what), "new VRAM on node %u", r->gpu[g].node);
	a = rocr_vram_alloc(r, g, n, what);
	b = rocr_vram_alloc(r, g, n, what);
	if (!a || !b)
		goto out;
	if (posix_memalign(&user, 4096, n)) {
		pr_perror("posix_memalign");
		user = NULL;
		goto out;
	}
	if (rocr_lock(r, user, n, &user_gpu, "new user memory"))
		goto out;

	rocr_fill(host, n, seed);
	snprintf(what, sizeof(what), "new work: host -> VRAM of node %u", r->gpu[g].node);
	if (rocr_copy(r, a, r->gpu[g].agent, host, r->cpu, n, sig, what))
		goto unlock;
	if (rocr_corrupt_requested() && rocr_corrupt(r, g, a, n / 2, sig))
		goto unlock;
	snprintf(what, sizeof(what), "new work: VRAM -> VRAM on node %u", r->gpu[g].node);
	if (rocr_copy(r, b, r->gpu[g].agent, a, r->gpu[g].agent, n, sig, what))
		goto unlock;
	memset(user, 0, n);
	snprintf(what, sizeof(what), "new work: VRAM of node %u -> locked user memory", r->gpu[g].node);
	if (rocr_copy(r, user_gpu, r->cpu, b, r->gpu[g].agent, n, sig, what) || rocr_check(user, n, seed, what))
		goto unlock;

	if (next != g && rocr_peer(r, g, next)) {
		snprintf(what, sizeof(what), "new VRAM on node %u", r->gpu[next].node);
		peer = rocr_vram_alloc(r, next, n, what);
		if (!peer || rocr_allow_pair(r, g, next, b, "new VRAM") ||
		    rocr_allow_pair(r, g, next, peer, "new peer VRAM"))
			goto unlock;
		snprintf(what, sizeof(what), "new work: VRAM of node %u -> VRAM of node %u", r->gpu[g].node,
			 r->gpu[next].node);
		if (rocr_copy(r, peer, r->gpu[next].agent, b, r->gpu[g].agent, n, sig, what) ||
		    rocr_check_vram(r, next, peer, n, seed, bounce, sig, what))
			goto unlock;
	}
	ret = 0;
unlock:
	if (rocr_unlock(user, "new user memory"))
		ret = -1;
out:
	free(user);
	if (rocr_free(peer, "new peer VRAM") | rocr_free(b, "new VRAM") | rocr_free(a, "new VRAM"))
		ret = -1;
	return ret;
}

int rocr_new_work(struct rocr *r, uint32_t seed)
{
	void *host, *bounce;
	hsa_signal_t sig;
	int ret = 0;

	if (rocr_signal(&sig))
		return -1;
	host = rocr_host_alloc(r, NEW_WORK_BYTES, "new host memory");
	bounce = rocr_host_alloc(r, NEW_WORK_BYTES, "new host memory");
	if (!host || !bounce)
		ret = -1;
	for (unsigned int g = 0; !ret && g < r->ngpus; g++)
		ret = new_work_on(r, g, seed + g, host, bounce, sig);
	if (rocr_free(bounce, "new host memory") | rocr_free(host, "new host memory"))
		ret = -1;
	hsa_signal_destroy(sig);
	return ret;
}
