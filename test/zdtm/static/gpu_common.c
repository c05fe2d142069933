// SPDX-License-Identifier: GPL-2.0-only
/*
 * Helpers of criu-rocm's zdtm GPU tests; see gpu_common.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>

#include "zdtmtst.h"
#include "gpu_common.h"
/* Upstream CRIU's copy of the KFD uapi (plugins/amdgpu), version 1.8. */
#include "kfd_ioctl.h"

#define GPU_WAIT_MS 60000
/* What a read-back buffer holds before SDMA overwrites it. */
#define GPU_POISON 0xdeadbeefU

const char *gpu_errtext(int ret)
{
	static __thread char buf[512];

	buf[0] = '\0';
	kfd_client_last_error(buf, sizeof(buf));
	if (!buf[0])
		snprintf(buf, sizeof(buf), "%s", strerror(ret < 0 ? -ret : ret));
	errno = ret < 0 ? -ret : ret;
	return buf;
}

uint64_t gpu_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int gpu_open(struct kfd_client **c, uint32_t *ngpus)
{
	int ret;

	ret = kfd_client_open(c);
	if (ret) {
		gpu_err(ret, "cannot open /dev/kfd and its GPUs (is this running under kfd-emu?)");
		return -1;
	}
	ret = kfd_client_gpu_count(*c, ngpus);
	if (ret) {
		gpu_err(ret, "cannot count GPUs");
		return -1;
	}
	if (*ngpus == 0) {
		pr_err("/dev/kfd shows no GPU\n");
		return -1;
	}
	return 0;
}

int gpu_open_at_most(struct kfd_client **c, uint32_t *ngpus, uint32_t max)
{
	if (gpu_open(c, ngpus))
		return -1;
	if (*ngpus > max) {
		pr_err("%u GPUs, the test handles %u\n", *ngpus, max);
		return -1;
	}
	return 0;
}

uint32_t gpu_id_of(struct kfd_client *c, uint32_t index)
{
	uint32_t id, minor;
	int ret;

	ret = kfd_client_gpu_info(c, index, &id, &minor);
	if (ret) {
		gpu_err(ret, "no GPU with index %u", index);
		return 0;
	}
	return id;
}

uint32_t gpu_open_one(struct kfd_client **c, uint32_t *ngpus, uint32_t index)
{
	if (gpu_open(c, ngpus))
		return 0;
	return gpu_id_of(*c, index);
}

struct kfd_client_queue *gpu_queue(struct kfd_client *c, uint32_t gpu_id)
{
	struct kfd_client_queue *q;
	int ret = kfd_client_sdma_queue_create(c, gpu_id, 64 << 10, &q);

	if (ret) {
		gpu_err(ret, "GPU %#x: cannot create an SDMA queue", gpu_id);
		return NULL;
	}
	return q;
}

int gpu_bo_alloc(struct kfd_client *c, struct gpu_bo *b, const char *name, uint32_t gpu_id, uint32_t kind,
		 uint64_t size)
{
	int ret;

	memset(b, 0, sizeof(*b));
	b->name = name;
	b->gpu_id = gpu_id;
	b->kind = kind;
	b->size = size;
	ret = kfd_client_bo_alloc(c, gpu_id, size, kind, &b->va, &b->bo);
	if (ret) {
		gpu_err(ret, "GPU %#x: cannot allocate %s BO %s of %#llx bytes", gpu_id, gpu_kind_name(kind), name,
			(unsigned long long)size);
		return -1;
	}
	return 0;
}

int gpu_bo_free(struct gpu_bo *b)
{
	int ret;

	ret = kfd_client_bo_free(b->bo);
	if (ret) {
		gpu_fail(ret, "GPU %#x: cannot free BO %s at %#llx", b->gpu_id, b->name, (unsigned long long)b->va);
		return -1;
	}
	b->bo = NULL;
	return 0;
}

uint32_t gpu_expected(const struct gpu_bo *b, uint64_t index)
{
	if (b->is_fill)
		return b->fill;
	return gpu_pattern(b->seed, b->rot ? (index + b->rot) % (b->size / 4) : index);
}

void gpu_bo_fill_cpu(struct gpu_bo *b, uint64_t off, uint64_t len)
{
	uint32_t *p = gpu_ptr(b->va + off);
	uint64_t i;

	for (i = 0; i < len / 4; i++)
		p[i] = gpu_expected(b, off / 4 + i);
}

static int gpu_wait(struct kfd_client_queue *q, const struct gpu_bo *b, const char *what)
{
	int ret;

	ret = kfd_client_sdma_wait_idle(q, GPU_WAIT_MS);
	if (ret) {
		gpu_fail(ret, "GPU %#x: SDMA %s of BO %s did not finish", b->gpu_id, what, b->name);
		return -1;
	}
	return 0;
}

int gpu_fill_sdma_range(struct kfd_client_queue *q, struct gpu_bo *b, uint64_t start, uint64_t len,
			struct gpu_bo *staging)
{
	uint32_t *s = gpu_ptr(staging->va);
	uint64_t off, n, i;
	int ret;

	for (off = start; off < start + len; off += n) {
		n = start + len - off < staging->size ? start + len - off : staging->size;
		for (i = 0; i < n / 4; i++)
			s[i] = gpu_expected(b, off / 4 + i);
		ret = kfd_client_sdma_copy(q, staging->va, b->va + off, n);
		if (ret) {
			gpu_err(ret, "GPU %#x: SDMA copy into BO %s at offset %#llx", b->gpu_id, b->name,
				(unsigned long long)off);
			return -1;
		}
		if (gpu_wait(q, b, "fill"))
			return -1;
	}
	return 0;
}

int gpu_bo_fill_sdma(struct kfd_client_queue *q, struct gpu_bo *b, struct gpu_bo *staging)
{
	return gpu_fill_sdma_range(q, b, 0, b->size, staging);
}

int gpu_check_range(const struct gpu_bo *b, const void *data, uint64_t off, uint64_t len, const char *how)
{
	const uint32_t *p = data;
	uint64_t i, bad = 0, first = 0;
	uint32_t got = 0, want = 0;

	for (i = 0; i < len / 4; i++) {
		uint32_t w = gpu_expected(b, off / 4 + i);

		if (p[i] == w)
			continue;
		if (!bad++) {
			first = off + i * 4;
			got = p[i];
			want = w;
		}
	}
	if (!bad)
		return 0;
	errno = 0;
	fail("GPU %#x %s BO %s (va %#llx, %#llx bytes) read %s: offset %#llx holds 0x%08x, expected 0x%08x "
	     "(%llu bad dwords in [%#llx, %#llx))",
	     b->gpu_id, gpu_kind_name(b->kind), b->name, (unsigned long long)b->va, (unsigned long long)b->size,
	     how, (unsigned long long)first, got, want, (unsigned long long)bad, (unsigned long long)off,
	     (unsigned long long)(off + len));
	return 1;
}

int gpu_bo_check_cpu(const struct gpu_bo *b)
{
	return gpu_check_range(b, gpu_ptr(b->va), 0, b->size, "by the CPU");
}

int gpu_check_sdma_range(struct kfd_client_queue *q, const struct gpu_bo *b, uint64_t start, uint64_t len,
			 struct gpu_bo *staging)
{
	uint32_t *s = gpu_ptr(staging->va);
	uint64_t off, n, i;
	int ret;

	for (off = start; off < start + len; off += n) {
		n = start + len - off < staging->size ? start + len - off : staging->size;
		for (i = 0; i < n / 4; i++)
			s[i] = GPU_POISON;
		ret = kfd_client_sdma_copy(q, b->va + off, staging->va, n);
		if (ret) {
			gpu_fail(ret, "GPU %#x: SDMA read-back of BO %s at offset %#llx", b->gpu_id, b->name,
				 (unsigned long long)off);
			return 1;
		}
		if (gpu_wait(q, b, "read-back"))
			return 1;
		if (gpu_check_range(b, s, off, n, "by SDMA"))
			return 1;
	}
	return 0;
}

int gpu_bo_check_sdma(struct kfd_client_queue *q, const struct gpu_bo *b, struct gpu_bo *staging)
{
	return gpu_check_sdma_range(q, b, 0, b->size, staging);
}

int gpu_bo_check(struct kfd_client_queue *q, const struct gpu_bo *b, struct gpu_bo *staging)
{
	return gpu_bo_check_cpu(b) || gpu_bo_check_sdma(q, b, staging);
}

int gpu_new_work(struct kfd_client *c, uint32_t gpu_id, uint32_t seed)
{
	const uint64_t size = 1 << 20, tail = 64 << 10;
	struct gpu_bo vram, gtt, fence;
	struct kfd_client_queue *q = NULL;
	uint32_t *f;
	int ret, bad = 1;

	if (gpu_bo_alloc(c, &vram, "new-vram", gpu_id, KFD_CLIENT_MEM_VRAM, size))
		return fail("GPU %#x: no new VRAM BO", gpu_id);
	if (gpu_bo_alloc(c, &gtt, "new-gtt", gpu_id, KFD_CLIENT_MEM_GTT, size)) {
		fail("GPU %#x: no new GTT BO", gpu_id);
		goto free_vram;
	}
	if (gpu_bo_alloc(c, &fence, "new-fence", gpu_id, KFD_CLIENT_MEM_GTT, 4096)) {
		fail("GPU %#x: no new fence BO", gpu_id);
		goto free_gtt;
	}
	ret = kfd_client_sdma_queue_create(c, gpu_id, 64 << 10, &q);
	if (ret) {
		gpu_fail(ret, "GPU %#x: no new SDMA queue", gpu_id);
		goto free_fence;
	}

	gtt.seed = seed;
	vram.seed = seed;
	gpu_bo_fill_cpu(&gtt, 0, size);
	f = gpu_ptr(fence.va);
	f[0] = 0;
	ret = kfd_client_sdma_copy(q, gtt.va, vram.va, size - tail);
	if (!ret)
		ret = kfd_client_sdma_fill(q, vram.va + size - tail, seed ^ 0x5a5a5a5a, tail);
	if (!ret)
		ret = kfd_client_sdma_fence(q, fence.va, seed | 1);
	if (!ret)
		ret = kfd_client_sdma_wait_idle(q, GPU_WAIT_MS);
	if (ret) {
		gpu_fail(ret, "GPU %#x: SDMA copy/fill/fence on a new queue", gpu_id);
		goto destroy;
	}
	if (f[0] != (seed | 1)) {
		errno = 0;
		fail("GPU %#x: new queue's fence wrote %#x, expected %#x", gpu_id, f[0], seed | 1);
		goto destroy;
	}
	if (gpu_check_range(&vram, gpu_ptr(vram.va), 0, size - tail, "by the CPU after new SDMA copy"))
		goto destroy;
	vram.is_fill = true;
	vram.fill = seed ^ 0x5a5a5a5a;
	if (gpu_check_range(&vram, gpu_ptr(vram.va + size - tail), size - tail, tail,
			    "by the CPU after new SDMA fill"))
		goto destroy;
	bad = 0;
destroy:
	ret = kfd_client_sdma_queue_destroy(q);
	if (ret)
		bad = gpu_fail(ret, "GPU %#x: cannot destroy the new SDMA queue", gpu_id);
free_fence:
	bad |= gpu_bo_free(&fence) ? 1 : 0;
free_gtt:
	bad |= gpu_bo_free(&gtt) ? 1 : 0;
free_vram:
	bad |= gpu_bo_free(&vram) ? 1 : 0;
	return bad;
}

bool gpu_corrupt_requested(void)
{
	const char *v = getenv("ZDTM_GPU_CORRUPT");

	return v && v[0] && strcmp(v, "0");
}

int gpu_corrupt(struct kfd_client_queue *q, struct gpu_bo *b, uint64_t off)
{
	uint32_t bad = ~gpu_expected(b, off / 4);
	int ret;

	test_msg("ZDTM_GPU_CORRUPT: GPU %#x BO %s: overwriting offset %#llx with 0x%08x through SDMA\n", b->gpu_id,
		 b->name, (unsigned long long)off, bad);
	ret = kfd_client_sdma_fill(q, b->va + off, bad, 4);
	if (ret) {
		gpu_err(ret, "GPU %#x: SDMA fill to corrupt BO %s", b->gpu_id, b->name);
		return -1;
	}
	return gpu_wait(q, b, "corruption");
}

int gpu_kfd_fd(void)
{
	struct stat want, st;
	struct dirent *de;
	int found = -1;
	DIR *d;

	if (stat("/dev/kfd", &want)) {
		pr_perror("stat /dev/kfd");
		return -1;
	}
	d = opendir("/proc/self/fd");
	if (!d) {
		pr_perror("opendir /proc/self/fd");
		return -1;
	}
	while ((de = readdir(d))) {
		int fd = atoi(de->d_name);

		if (de->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st))
			continue;
		/* A real /dev/kfd is a character device; kfd-emu's is a FUSE file. */
		if (S_ISCHR(want.st_mode) ? S_ISCHR(st.st_mode) && st.st_rdev == want.st_rdev :
					    st.st_dev == want.st_dev && st.st_ino == want.st_ino) {
			found = fd;
			break;
		}
	}
	closedir(d);
	if (found < 0)
		pr_err("no open /dev/kfd in this process\n");
	return found;
}

static int kfd_ioctl(int kfd, unsigned long req, void *arg)
{
	if (ioctl(kfd, req, arg))
		return -errno;
	return 0;
}

int gpu_userptr_register(int kfd, uint32_t gpu_id, void *addr, uint64_t size, uint64_t *handle)
{
	struct kfd_ioctl_alloc_memory_of_gpu_args a = {
		.va_addr = (uintptr_t)addr,
		.size = size,
		.mmap_offset = (uintptr_t)addr,
		.gpu_id = gpu_id,
		.flags = KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE |
			 KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE,
	};
	struct kfd_ioctl_map_memory_to_gpu_args m = {};
	struct kfd_ioctl_free_memory_of_gpu_args f = {};
	int ret;

	ret = kfd_ioctl(kfd, AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a);
	if (ret)
		return ret;
	m.handle = a.handle;
	m.device_ids_array_ptr = (uintptr_t)&gpu_id;
	m.n_devices = 1;
	ret = kfd_ioctl(kfd, AMDKFD_IOC_MAP_MEMORY_TO_GPU, &m);
	if (!ret && m.n_success != 1)
		ret = -EIO;
	if (ret) {
		f.handle = a.handle;
		kfd_ioctl(kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &f);
		return ret;
	}
	*handle = a.handle;
	return 0;
}

int gpu_userptr_unregister(int kfd, uint32_t gpu_id, uint64_t handle)
{
	struct kfd_ioctl_unmap_memory_from_gpu_args u = {
		.handle = handle,
		.device_ids_array_ptr = (uintptr_t)&gpu_id,
		.n_devices = 1,
	};
	struct kfd_ioctl_free_memory_of_gpu_args f = { .handle = handle };
	int ret;

	ret = kfd_ioctl(kfd, AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU, &u);
	if (ret)
		return ret;
	return kfd_ioctl(kfd, AMDKFD_IOC_FREE_MEMORY_OF_GPU, &f);
}

int gpu_event_create(int kfd, uint32_t *event_id)
{
	/*
	 * event_page_offset 0: KFD provides the signal page itself (the
	 * kfd-client C ABI hands out no BO handle to pass instead).
	 */
	struct kfd_ioctl_create_event_args a = {
		.event_type = KFD_IOC_EVENT_SIGNAL,
		.auto_reset = 1,
	};
	int ret;

	ret = kfd_ioctl(kfd, AMDKFD_IOC_CREATE_EVENT, &a);
	if (!ret)
		*event_id = a.event_id;
	return ret;
}

int gpu_event_set(int kfd, uint32_t event_id)
{
	struct kfd_ioctl_set_event_args a = { .event_id = event_id };

	return kfd_ioctl(kfd, AMDKFD_IOC_SET_EVENT, &a);
}

int gpu_event_destroy(int kfd, uint32_t event_id)
{
	struct kfd_ioctl_destroy_event_args a = { .event_id = event_id };

	return kfd_ioctl(kfd, AMDKFD_IOC_DESTROY_EVENT, &a);
}

int gpu_event_wait_once(int kfd, uint32_t event_id, uint32_t timeout_ms)
{
	struct kfd_event_data ev = { .event_id = event_id };
	struct kfd_ioctl_wait_events_args a = {
		.events_ptr = (uintptr_t)&ev,
		.num_events = 1,
		.wait_for_all = 1,
		.timeout = timeout_ms,
	};
	int ret;

	ret = kfd_ioctl(kfd, AMDKFD_IOC_WAIT_EVENTS, &a);
	if (ret)
		return ret;
	switch (a.wait_result) {
	case KFD_IOC_WAIT_RESULT_COMPLETE:
		return GPU_WAIT_COMPLETE;
	case KFD_IOC_WAIT_RESULT_TIMEOUT:
		return GPU_WAIT_TIMEOUT;
	default:
		return GPU_WAIT_FAIL;
	}
}
