// SPDX-License-Identifier: GPL-2.0-only
/*
 * A USERPTR BO: ordinary anonymous memory registered with KFD and mapped on
 * the GPU at its CPU address. CRIU dumps its pages like any other memory;
 * KFD must know the BO again after restore so that the GPU can still read
 * and write it there.
 *
 * Before the dump the CPU writes a pattern into the first part, SDMA copies
 * that part into a VRAM BO and fills the last part with a constant (GPU
 * writes into user memory). After restore: the CPU sees both parts, the
 * VRAM copy is intact, SDMA can still read the userptr memory and write into
 * it, the BO can be unregistered, and a new userptr BO works.
 *
 * The kfd-client C ABI has no userptr call, so registration uses the raw
 * KFD ioctls on the client's /dev/kfd fd (KFD contexts are per process).
 */
#include <sys/mman.h>

#include "zdtmtst.h"
#include "gpu_common.h"

const char *test_doc = "GPU userptr memory keeps its contents and GPU mapping across C/R";
const char *test_author = "criu-rocm";

#define UP_SIZE	  ((8 << 20) + (12 << 10))
#define UP_FILLED (64 << 10) /* the tail written by an SDMA fill */
#define UP_SEED	  0x05e2
#define UP_FILL	  0x0ddba11U

/* The userptr range as a gpu_bo, so that the common checks can name it. */
static void userptr_bo(struct gpu_bo *b, const char *name, uint32_t gpu, void *addr, uint64_t size, uint32_t seed)
{
	memset(b, 0, sizeof(*b));
	b->name = name;
	b->gpu_id = gpu;
	b->kind = KFD_CLIENT_MEM_GTT;
	b->va = (uintptr_t)addr;
	b->size = size;
	b->seed = seed;
}

static void *map_anon(uint64_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		pr_perror("mmap %#llx anonymous bytes", (unsigned long long)size);
		return NULL;
	}
	return p;
}

int main(int argc, char **argv)
{
	struct gpu_bo up_head, up_tail, vram, staging, up2;
	struct kfd_client_queue *q;
	struct kfd_client *c;
	uint64_t handle, handle2;
	uint32_t n, gpu;
	void *mem, *mem2;
	int kfd, ret;

	test_init(argc, argv);

	/* The last GPU: userptr memory is not tied to the first one. */
	if (gpu_open(&c, &n))
		return 1;
	gpu = gpu_id_of(c, n - 1);
	if (!gpu)
		return 1;
	kfd = gpu_kfd_fd();
	if (kfd < 0)
		return 1;
	mem = map_anon(UP_SIZE);
	if (!mem)
		return 1;
	userptr_bo(&up_head, "userptr-head", gpu, mem, UP_SIZE - UP_FILLED, UP_SEED);
	userptr_bo(&up_tail, "userptr-tail", gpu, (char *)mem + UP_SIZE - UP_FILLED, UP_FILLED, 0);
	up_tail.is_fill = true;
	up_tail.fill = UP_FILL;
	gpu_bo_fill_cpu(&up_head, 0, up_head.size);

	ret = gpu_userptr_register(kfd, gpu, mem, UP_SIZE, &handle);
	if (ret) {
		errno = -ret;
		pr_perror("GPU %#x: cannot register userptr BO at %p (%#x bytes)", gpu, mem, UP_SIZE);
		return 1;
	}
	if (gpu_bo_alloc(c, &vram, "vram-copy", gpu, KFD_CLIENT_MEM_VRAM, up_head.size) ||
	    gpu_bo_alloc(c, &staging, "staging", gpu, KFD_CLIENT_MEM_GTT, 1 << 20))
		return 1;
	vram.seed = UP_SEED;
	q = gpu_queue(c, gpu);
	if (!q)
		return 1;
	ret = kfd_client_sdma_copy(q, up_head.va, vram.va, up_head.size);
	if (!ret)
		ret = kfd_client_sdma_fill(q, up_tail.va, UP_FILL, UP_FILLED);
	if (!ret)
		ret = kfd_client_sdma_wait_idle(q, 60000);
	if (ret) {
		gpu_err(ret, "GPU %#x: SDMA copy from / fill into userptr memory", gpu);
		return 1;
	}
	if (gpu_bo_check_cpu(&up_head) || gpu_bo_check_cpu(&up_tail) || gpu_bo_check(q, &vram, &staging))
		return 1;
	test_msg("GPU %#x: userptr BO %p + %#x registered, copied to VRAM, tail filled by SDMA\n", gpu, mem, UP_SIZE);

	test_daemon();
	test_waitsig();

	if (gpu_corrupt_requested() && gpu_corrupt(q, &up_head, 0x1234))
		return 1;

	/* CRIU's view: the anonymous pages, GPU-written tail included. */
	if (gpu_bo_check_cpu(&up_head) || gpu_bo_check_cpu(&up_tail))
		return 1;
	/* The GPU's view of the VRAM copy and of the userptr memory itself. */
	if (gpu_bo_check(q, &vram, &staging) || gpu_bo_check_sdma(q, &up_head, &staging) ||
	    gpu_bo_check_sdma(q, &up_tail, &staging))
		return 1;
	/* The GPU can still write into it. */
	up_tail.fill = ~UP_FILL;
	ret = kfd_client_sdma_fill(q, up_tail.va, up_tail.fill, UP_FILLED);
	if (!ret)
		ret = kfd_client_sdma_wait_idle(q, 60000);
	if (ret)
		return gpu_fail(ret, "GPU %#x: SDMA fill into restored userptr memory at %p", gpu, gpu_ptr(up_tail.va));
	if (gpu_bo_check_cpu(&up_tail))
		return 1;

	ret = gpu_userptr_unregister(kfd, gpu, handle);
	if (ret) {
		errno = -ret;
		return fail("GPU %#x: cannot unmap/free the restored userptr BO (handle %#llx)", gpu,
			    (unsigned long long)handle);
	}

	/* A new userptr BO after restore. */
	mem2 = map_anon(1 << 20);
	if (!mem2)
		return 1;
	userptr_bo(&up2, "new-userptr", gpu, mem2, 1 << 20, UP_SEED + 1);
	ret = gpu_userptr_register(kfd, gpu, mem2, 1 << 20, &handle2);
	if (ret) {
		errno = -ret;
		return fail("GPU %#x: cannot register a new userptr BO after restore", gpu);
	}
	gpu_bo_fill_cpu(&up2, 0, up2.size);
	if (gpu_bo_check_sdma(q, &up2, &staging))
		return 1;
	ret = gpu_userptr_unregister(kfd, gpu, handle2);
	if (ret) {
		errno = -ret;
		return fail("GPU %#x: cannot free the new userptr BO", gpu);
	}

	if (gpu_new_work(c, gpu, 0x05e3))
		return 1;

	pass();
	return 0;
}
