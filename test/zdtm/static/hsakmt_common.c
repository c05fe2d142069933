// SPDX-License-Identifier: GPL-2.0-only
/*
 * Helpers of criu-rocm's zdtm tests on libhsakmt; see hsakmt_common.h.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_pattern.h"
#include "hsakmt_common.h"

#define RING_BYTES (16 << 10)
/* Bytes per COPY_LINEAR packet (its count field has 22 bits). */
#define CHUNK (1 << 20)
#define NEW_WORK_BYTES (1 << 20)

/* SDMA 4.x packets (GFX9 and later), as ROCr's BlitSdma writes them. */
enum { OP_COPY = 1, OP_FENCE = 5, OP_TRAP = 6 };

uint64_t kmt_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int kmt_open(struct kmt *k)
{
	HSAKMT_STATUS s;

	memset(k, 0, sizeof(*k));
	s = hsaKmtOpenKFD();
	if (s != HSAKMT_STATUS_SUCCESS) {
		pr_err("hsaKmtOpenKFD: status %d (is this running under kfd-emu?)\n", s);
		return -1;
	}
	s = hsaKmtAcquireSystemProperties(&k->sys);
	if (s != HSAKMT_STATUS_SUCCESS) {
		pr_err("hsaKmtAcquireSystemProperties: status %d\n", s);
		return -1;
	}
	for (uint32_t n = 0; n < k->sys.NumNodes; n++) {
		HsaNodeProperties p;

		s = hsaKmtGetNodeProperties(n, &p);
		if (s != HSAKMT_STATUS_SUCCESS) {
			pr_err("hsaKmtGetNodeProperties(%u): status %d\n", n, s);
			return -1;
		}
		if (!p.NumFComputeCores)
			continue;
		if (k->ngpus == KMT_MAX_GPUS) {
			pr_err("more than %d GPU nodes\n", KMT_MAX_GPUS);
			return -1;
		}
		k->gpu[k->ngpus++] = n;
	}
	if (!k->ngpus) {
		pr_err("the topology has no GPU node\n");
		return -1;
	}
	return 0;
}

int kmt_close(void)
{
	HSAKMT_STATUS s = hsaKmtReleaseSystemProperties();

	if (s == HSAKMT_STATUS_SUCCESS)
		s = hsaKmtCloseKFD();
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("hsaKmtReleaseSystemProperties/hsaKmtCloseKFD: status %d", s);
		return -1;
	}
	return 0;
}

void *kmt_alloc(enum kmt_mem kind, uint32_t node, uint64_t bytes, unsigned int nnodes, uint32_t *nodes,
		const char *what)
{
	HsaMemMapFlags mf = { 0 };
	HsaMemFlags f = { 0 };
	HSAuint64 va = 0;
	HSAKMT_STATUS s;
	void *p = NULL;

	f.ui32.HostAccess = 1;
	f.ui32.NonPaged = kind == KMT_PAGED ? 0 : 1;
	f.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	if (kind == KMT_VRAM)
		f.ui32.NoSubstitute = 1;
	else
		node = 0;
	s = hsaKmtAllocMemory(node, bytes, f, &p);
	if (s != HSAKMT_STATUS_SUCCESS || !p) {
		pr_err("hsaKmtAllocMemory(%s, node %u, %lu KiB): status %d\n", what, node,
		       (unsigned long)(bytes >> 10), s);
		return NULL;
	}
	s = hsaKmtMapMemoryToGPUNodes(p, bytes, &va, mf, nnodes, nodes);
	if (s != HSAKMT_STATUS_SUCCESS) {
		pr_err("hsaKmtMapMemoryToGPUNodes(%s, %u node(s)): status %d\n", what, nnodes, s);
		hsaKmtFreeMemory(p, bytes);
		return NULL;
	}
	return p;
}

int kmt_free(void *p, uint64_t bytes, const char *what)
{
	HSAKMT_STATUS s;

	if (!p)
		return 0;
	s = hsaKmtUnmapMemoryToGPU(p);
	if (s == HSAKMT_STATUS_SUCCESS)
		s = hsaKmtFreeMemory(p, bytes);
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("unmap and free %s: status %d", what, s);
		return -1;
	}
	return 0;
}

void *kmt_user(struct kmt *k, uint64_t bytes, uint64_t *gpu_va, const char *what)
{
	HsaMemMapFlags mf = { 0 };
	HSAuint64 va = 0;
	HSAKMT_STATUS s;
	void *p;

	if (posix_memalign(&p, 4096, bytes)) {
		pr_perror("posix_memalign(%s)", what);
		return NULL;
	}
	memset(p, 0, bytes);
	s = hsaKmtRegisterMemory(p, bytes);
	if (s != HSAKMT_STATUS_SUCCESS) {
		pr_err("hsaKmtRegisterMemory(%s): status %d\n", what, s);
		free(p);
		return NULL;
	}
	s = hsaKmtMapMemoryToGPUNodes(p, bytes, &va, mf, k->ngpus, k->gpu);
	if (s != HSAKMT_STATUS_SUCCESS || !va) {
		pr_err("hsaKmtMapMemoryToGPUNodes(%s): status %d, GPU address %#lx\n", what, s, (unsigned long)va);
		hsaKmtDeregisterMemory(p);
		free(p);
		return NULL;
	}
	*gpu_va = va;
	return p;
}

int kmt_user_free(void *p, const char *what)
{
	HSAKMT_STATUS s = hsaKmtUnmapMemoryToGPU(p);

	if (s == HSAKMT_STATUS_SUCCESS)
		s = hsaKmtDeregisterMemory(p);
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("unmap and deregister %s: status %d", what, s);
		return -1;
	}
	free(p);
	return 0;
}

int kmt_sdma_create(struct kmt_sdma *q, uint32_t node)
{
	HsaEventDescriptor d = { 0 };
	HSAKMT_STATUS s;

	memset(q, 0, sizeof(*q));
	q->node = node;
	q->ring = kmt_alloc(KMT_GTT, 0, RING_BYTES + 4096, 1, &node, "SDMA ring and fences");
	if (!q->ring)
		return -1;
	memset(q->ring, 0, RING_BYTES + 4096);
	q->fence = q->ring + RING_BYTES / 4;
	d.EventType = HSA_EVENTTYPE_SIGNAL;
	s = hsaKmtCreateEvent(&d, false, false, &q->event);
	if (s != HSAKMT_STATUS_SUCCESS || !q->event) {
		pr_err("hsaKmtCreateEvent: status %d\n", s);
		return -1;
	}
	s = hsaKmtCreateQueue(node, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_NORMAL, q->ring, RING_BYTES, NULL,
			      &q->qr);
	if (s != HSAKMT_STATUS_SUCCESS || !q->qr.Queue_DoorBell || !q->qr.Queue_write_ptr || !q->qr.Queue_read_ptr) {
		pr_err("hsaKmtCreateQueue(node %u, SDMA): status %d\n", node, s);
		return -1;
	}
	q->wptr = *(volatile uint64_t *)q->qr.Queue_write_ptr_aql;
	return 0;
}

int kmt_sdma_destroy(struct kmt_sdma *q)
{
	HSAKMT_STATUS s = hsaKmtDestroyQueue(q->qr.QueueId);

	if (s == HSAKMT_STATUS_SUCCESS)
		s = hsaKmtDestroyEvent(q->event);
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("destroy the SDMA queue of node %u and its event: status %d", q->node, s);
		return -1;
	}
	return kmt_free(q->ring, RING_BYTES + 4096, "SDMA ring");
}

static void emit(struct kmt_sdma *q, uint32_t dw)
{
	q->ring[(q->wptr % RING_BYTES) / 4] = dw;
	q->wptr += 4;
}

/* Room for `dws` more dwords: the engine must have read what they overwrite. */
static int room(struct kmt_sdma *q, unsigned int dws, const char *what)
{
	uint64_t t0 = kmt_now_ms();

	while (q->wptr + dws * 4 - __atomic_load_n((volatile uint64_t *)q->qr.Queue_read_ptr_aql, __ATOMIC_ACQUIRE) >
	       RING_BYTES) {
		if (kmt_now_ms() - t0 > KMT_WAIT_MS) {
			errno = 0;
			fail("%s: the SDMA ring of node %u stays full", what, q->node);
			return -1;
		}
		usleep(100);
	}
	return 0;
}

static void doorbell(struct kmt_sdma *q)
{
	__atomic_store_n((volatile uint64_t *)q->qr.Queue_write_ptr_aql, q->wptr, __ATOMIC_RELEASE);
	__atomic_store_n((volatile uint64_t *)q->qr.Queue_DoorBell_aql, q->wptr, __ATOMIC_RELEASE);
}

int kmt_sdma_copy(struct kmt_sdma *q, uint64_t dst, uint64_t src, uint64_t bytes, const char *what)
{
	uint64_t fence_va = (uintptr_t)q->fence, t0;
	uint32_t value = ++q->fence_value;
	HSAKMT_STATUS s;

	for (uint64_t done = 0; done < bytes; done += CHUNK) {
		uint64_t n = bytes - done < CHUNK ? bytes - done : CHUNK;

		if (room(q, 7, what))
			return -1;
		emit(q, OP_COPY);		/* COPY, sub-op LINEAR */
		emit(q, (uint32_t)(n - 1));	/* bytes - 1 on SDMA 4.x */
		emit(q, 0);			/* no swap */
		emit(q, (uint32_t)(src + done));
		emit(q, (uint32_t)((src + done) >> 32));
		emit(q, (uint32_t)(dst + done));
		emit(q, (uint32_t)((dst + done) >> 32));
	}
	if (room(q, 10, what))
		return -1;
	emit(q, OP_FENCE);
	emit(q, (uint32_t)fence_va);
	emit(q, (uint32_t)(fence_va >> 32));
	emit(q, value);
	/* ROCr's completion: the event id into the event's mailbox, then TRAP. */
	emit(q, OP_FENCE);
	emit(q, (uint32_t)q->event->EventData.HWData2);
	emit(q, (uint32_t)(q->event->EventData.HWData2 >> 32));
	emit(q, q->event->EventId);
	emit(q, OP_TRAP);
	emit(q, q->event->EventId & 0x0fffffff);
	doorbell(q);

	t0 = kmt_now_ms();
	s = hsaKmtWaitOnEvent(q->event, KMT_WAIT_MS);
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("%s: SDMA of node %u signalled no completion event in %d s (status %d; read pointer %#lx of %#lx)",
		     what, q->node, KMT_WAIT_MS / 1000, s,
		     (unsigned long)*(volatile uint64_t *)q->qr.Queue_read_ptr_aql, (unsigned long)q->wptr);
		return -1;
	}
	while (__atomic_load_n((volatile uint64_t *)q->qr.Queue_read_ptr_aql, __ATOMIC_ACQUIRE) != q->wptr) {
		if (kmt_now_ms() - t0 > KMT_WAIT_MS) {
			errno = 0;
			fail("%s: SDMA of node %u: read pointer %#lx, write pointer %#lx", what, q->node,
			     (unsigned long)*(volatile uint64_t *)q->qr.Queue_read_ptr_aql, (unsigned long)q->wptr);
			return -1;
		}
		usleep(100);
	}
	if (*q->fence != value) {
		errno = 0;
		fail("%s: SDMA fence of node %u holds %#x, not %#x", what, q->node, *q->fence, value);
		return -1;
	}
	return 0;
}

void kmt_fill(void *p, uint64_t bytes, uint32_t seed)
{
	gpu_pattern_fill(p, bytes, seed);
}

int kmt_check(const void *p, uint64_t bytes, uint32_t seed, const char *what)
{
	return gpu_pattern_check(p, bytes, seed, what);
}

bool kmt_corrupt_requested(void)
{
	const char *v = getenv("ZDTM_GPU_CORRUPT");

	return v && v[0] && strcmp(v, "0");
}

int kmt_corrupt(struct kmt_sdma *q, uint64_t va)
{
	volatile uint32_t *bad = q->fence + 16;

	*bad = 0xbadc0de5;
	test_msg("ZDTM_GPU_CORRUPT: damaging the dword at GPU address %#lx through SDMA of node %u\n",
		 (unsigned long)va, q->node);
	return kmt_sdma_copy(q, va, (uintptr_t)bad, 4, "ZDTM_GPU_CORRUPT");
}

/* A signal event set by the CPU wakes a wait; an unset one times out. */
static int events_work(void)
{
	HsaEventDescriptor d = { 0 };
	HsaEvent *e = NULL;
	HSAKMT_STATUS s;

	d.EventType = HSA_EVENTTYPE_SIGNAL;
	s = hsaKmtCreateEvent(&d, true, false, &e);
	if (s != HSAKMT_STATUS_SUCCESS || !e) {
		errno = 0;
		fail("new work: hsaKmtCreateEvent: status %d", s);
		return -1;
	}
	s = hsaKmtWaitOnEvent(e, 10);
	if (s != HSAKMT_STATUS_WAIT_TIMEOUT) {
		errno = 0;
		fail("new work: waiting on an unset event: status %d, not a timeout", s);
		return -1;
	}
	s = hsaKmtSetEvent(e);
	if (s == HSAKMT_STATUS_SUCCESS)
		s = hsaKmtWaitOnEvent(e, 1000);
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("new work: a set event: status %d", s);
		return -1;
	}
	s = hsaKmtDestroyEvent(e);
	if (s != HSAKMT_STATUS_SUCCESS) {
		errno = 0;
		fail("new work: hsaKmtDestroyEvent: status %d", s);
		return -1;
	}
	return 0;
}

int kmt_new_work(struct kmt *k, uint32_t seed)
{
	uint64_t n = NEW_WORK_BYTES;
	char what[128];

	if (events_work())
		return -1;
	for (unsigned int i = 0; i < k->ngpus; i++) {
		uint32_t g = k->gpu[i];
		struct kmt_sdma q;
		void *vram, *in, *out;
		int ret = -1;

		snprintf(what, sizeof(what), "new work on node %u", g);
		vram = kmt_alloc(KMT_VRAM, g, n, 1, &g, what);
		in = kmt_alloc(KMT_GTT, 0, n, 1, &g, what);
		out = kmt_alloc(KMT_PAGED, 0, n, 1, &g, what);
		if (!vram || !in || !out || kmt_sdma_create(&q, g))
			return -1;
		kmt_fill(in, n, seed + g);
		memset(out, 0, n);
		if (kmt_sdma_copy(&q, (uintptr_t)vram, (uintptr_t)in, n, what))
			goto out;
		if (kmt_corrupt_requested() && kmt_corrupt(&q, (uintptr_t)vram + n / 2))
			goto out;
		if (kmt_sdma_copy(&q, (uintptr_t)out, (uintptr_t)vram, n, what) || kmt_check(out, n, seed + g, what) ||
		    kmt_check(vram, n, seed + g, what))
			goto out;
		ret = 0;
out:
		if (kmt_sdma_destroy(&q) | kmt_free(out, n, what) | kmt_free(in, n, what) | kmt_free(vram, n, what))
			ret = -1;
		if (ret)
			return -1;
	}
	return 0;
}
