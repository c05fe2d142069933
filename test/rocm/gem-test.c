/*
 * gem-test: Debian's libdrm_amdgpu on a render node's GEM side, as a video or graphics
 * client uses it (issue 29): BOs allocated (amdgpu_bo_alloc) in VRAM and GTT, mapped by
 * the CPU (amdgpu_bo_cpu_map through the render file), mapped in the GPU VM
 * (amdgpu_bo_va_op), metadata and placement queried (amdgpu_bo_query_info), exported as
 * dma-buf fds and imported again (amdgpu_bo_export/import, on the same GPU and, with two,
 * on the other), a copy submitted on the SDMA ring (amdgpu_cs_submit), and Linux 6.18's
 * ioctls libdrm 2.4.114 has no call for (GEM_LIST_HANDLES, GEM_OP GET_MAPPING_INFO,
 * GEM_CHANGE_HANDLE) issued raw.
 *
 *   usage: gem-test [--change-handle] [--kfd]
 *          gem-test --hold [--kfd] [--ctx] [--big MIB [--sparse]]
 *     --change-handle  the kernel renames GEM handles (6.18.0-6.18.35); without it, it
 *                      must refuse with EINVAL (7.1, 6.18.36+)
 *     --kfd            the process also uses KFD through libhsakmt (hsaKmtOpenKFD, a VRAM
 *                      allocation mapped to the GPU) before and while it uses GEM
 *     --hold           for checkpoint/restore (test/gpu/run.sh's gem_cr cases): GEM BOs
 *                      with handles 1, 3 and 4 (2 freed: a hole) in VRAM and GTT, filled,
 *                      mapped in the GPU VM and kept mapped by the CPU; prints "ready",
 *                      then on each SIGUSR1 checks everything ("round N: ok" or FAIL
 *                      lines): the bytes through the CPU mappings made before, the
 *                      handles (GEM_LIST_HANDLES), the GPU mappings (GET_MAPPING_INFO) and
 *                      an SDMA copy between the mapped VAs; on SIGTERM once more, then
 *                      "PASS" and exit 0 (or FAIL and 1)
 *     --ctx            with --hold: keeps a submission context (amdgpu_cs_ctx_create) all
 *                      along, which a dump must refuse (contexts are not saved)
 *     --big MIB        with --hold: one more GTT BO of MIB MiB (handle 5), kept mapped by
 *                      the CPU, filled in sixteenths; on each SIGUSR2 the next sixteenth is
 *                      rewritten with new bytes ("rewrote N": for incremental dumps); every
 *                      round checks all of it
 *     --sparse         with --big: only the BO's first page is written, the rest stays
 *                      zeros (a dump writes it as holes)
 *
 * Export and import need `kfd-emu supervise` (the dma-buf fds are handed out through it).
 * With two GPUs the import on the second runs in a child (`gem-test --import-on MINOR FD`).
 * Prints one "ok" line per check passed and "FAIL" lines; exits 0 only if none failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <hsakmt.h>
#include <xf86drm.h>

/* Linux 6.18's uapi, newer than Debian's headers (include/uapi/drm/amdgpu_drm.h, drm.h). */
#define DRM_AMDGPU_GEM_LIST_HANDLES 0x19
#define AMDGPU_GEM_OP_GET_MAPPING_INFO 2
#define AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT (1 << 0)
struct gem_op618 {
	uint32_t handle, op;
	uint64_t value;
	uint32_t num_entries, padding;
};
struct gem_vm_entry {
	uint64_t addr, size, offset, flags;
};
struct gem_list_handles {
	uint64_t entries;
	uint32_t num_entries, padding;
};
struct gem_list_entry {
	uint32_t gem_handle, flags;
	uint64_t size, preferred_domains, alloc_flags, alignment;
};
struct gem_change_handle {
	uint32_t handle, new_handle;
};
#define DRM_IOCTL_GEM_CHANGE_HANDLE DRM_IOWR(0xd2, struct gem_change_handle)

_Static_assert(sizeof(struct gem_op618) == 24, "drm_amdgpu_gem_op of 6.18");
_Static_assert(sizeof(struct gem_list_entry) == 40, "drm_amdgpu_gem_list_handles_entry");

#define SZ (64u << 10)
#define MAX_NODES 8

static int failures;

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	failures++;
}

static void ok(const char *what)
{
	printf("ok %s\n", what);
}

#define CHECK(cond, ...)                   \
	do {                               \
		if (!(cond)) {             \
			fail(__VA_ARGS__); \
			return -1;         \
		}                          \
	} while (0)

/* A GPU as the test uses it. */
struct gpu {
	int fd;
	unsigned minor;
	amdgpu_device_handle dev;
};

static int open_gpus(struct gpu *g, int max)
{
	int n = 0;

	for (unsigned minor = 128; minor < 192 && n < max; minor++) {
		char path[64];
		uint32_t major, minor_v;
		int fd;

		snprintf(path, sizeof(path), "/dev/dri/renderD%u", minor);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (amdgpu_device_initialize(fd, &major, &minor_v, &g[n].dev)) {
			fail("amdgpu_device_initialize(%s)", path);
			close(fd);
			continue;
		}
		g[n].fd = fd;
		g[n].minor = minor;
		n++;
	}
	return n;
}

static int alloc_bo(struct gpu *g, uint32_t heap, uint64_t flags, amdgpu_bo_handle *bo, uint32_t *handle)
{
	struct amdgpu_bo_alloc_request req = {
		.alloc_size = SZ,
		.phys_alignment = 4096,
		.preferred_heap = heap,
		.flags = flags,
	};

	CHECK(!amdgpu_bo_alloc(g->dev, &req, bo), "amdgpu_bo_alloc(heap %#x, flags %#" PRIx64 ")", heap,
	      flags);
	CHECK(!amdgpu_bo_export(*bo, amdgpu_bo_handle_type_kms, handle), "amdgpu_bo_export(kms)");
	return 0;
}

static int fill(amdgpu_bo_handle bo, uint8_t seed)
{
	uint8_t *p;

	CHECK(!amdgpu_bo_cpu_map(bo, (void **)&p), "amdgpu_bo_cpu_map");
	for (unsigned i = 0; i < SZ; i++)
		p[i] = (uint8_t)(seed + i * 7);
	CHECK(!amdgpu_bo_cpu_unmap(bo), "amdgpu_bo_cpu_unmap");
	return 0;
}

static int verify(amdgpu_bo_handle bo, uint8_t seed, const char *what)
{
	uint8_t *p;

	CHECK(!amdgpu_bo_cpu_map(bo, (void **)&p), "amdgpu_bo_cpu_map(%s)", what);
	for (unsigned i = 0; i < SZ; i++)
		if (p[i] != (uint8_t)(seed + i * 7)) {
			amdgpu_bo_cpu_unmap(bo);
			fail("%s: byte %u is %#x, not %#x", what, i, p[i], (uint8_t)(seed + i * 7));
			return -1;
		}
	CHECK(!amdgpu_bo_cpu_unmap(bo), "amdgpu_bo_cpu_unmap(%s)", what);
	return 0;
}

/* Maps BO at a fresh VA of its GPU. */
static int va_map(struct gpu *g, amdgpu_bo_handle bo, uint64_t *va, amdgpu_va_handle *vh)
{
	CHECK(!amdgpu_va_range_alloc(g->dev, amdgpu_gpu_va_range_general, SZ, 4096, 0, va, vh, 0),
	      "amdgpu_va_range_alloc");
	CHECK(!amdgpu_bo_va_op(bo, 0, SZ, *va, AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
			       AMDGPU_VA_OP_MAP),
	      "amdgpu_bo_va_op(MAP)");
	return 0;
}

/* Copies SZ bytes from SRC_VA to DST_VA with one SDMA COPY_LINEAR on GPU g (SDMA 4 packets:
 * GFX9 and gfx942) and waits for its fence. */
static int sdma_copy(struct gpu *g, amdgpu_bo_handle src, amdgpu_bo_handle dst, uint64_t src_va,
		     uint64_t dst_va)
{
	amdgpu_bo_handle ib;
	uint32_t h, *dw;
	uint64_t ib_va;
	amdgpu_va_handle ib_vh;
	amdgpu_context_handle ctx;
	amdgpu_bo_list_handle list;
	amdgpu_bo_handle bos[3];
	uint32_t expired = 0;

	if (alloc_bo(g, AMDGPU_GEM_DOMAIN_GTT, 0, &ib, &h) || va_map(g, ib, &ib_va, &ib_vh))
		return -1;
	CHECK(!amdgpu_bo_cpu_map(ib, (void **)&dw), "amdgpu_bo_cpu_map(IB)");
	memset(dw, 0, 32);
	dw[0] = 1; /* COPY, LINEAR */
	dw[1] = SZ - 1;
	dw[3] = (uint32_t)src_va;
	dw[4] = (uint32_t)(src_va >> 32);
	dw[5] = (uint32_t)dst_va;
	dw[6] = (uint32_t)(dst_va >> 32);
	/* dw[2] parameters and dw[7] a NOP: 0. */
	amdgpu_bo_cpu_unmap(ib);
	bos[0] = src, bos[1] = dst, bos[2] = ib;
	CHECK(!amdgpu_cs_ctx_create(g->dev, &ctx), "amdgpu_cs_ctx_create");
	CHECK(!amdgpu_bo_list_create(g->dev, 3, bos, NULL, &list), "amdgpu_bo_list_create");
	struct amdgpu_cs_ib_info ibi = { .ib_mc_address = ib_va, .size = 8 };
	struct amdgpu_cs_request req = {
		.ip_type = AMDGPU_HW_IP_DMA,
		.resources = list,
		.number_of_ibs = 1,
		.ibs = &ibi,
	};
	CHECK(!amdgpu_cs_submit(ctx, 0, &req, 1), "amdgpu_cs_submit(SDMA)");
	struct amdgpu_cs_fence fence = {
		.context = ctx,
		.ip_type = AMDGPU_HW_IP_DMA,
		.fence = req.seq_no,
	};
	CHECK(!amdgpu_cs_query_fence_status(&fence, 1000000000ull, 0, &expired) && expired,
	      "amdgpu_cs_query_fence_status");
	amdgpu_bo_list_destroy(list);
	amdgpu_cs_ctx_free(ctx);
	amdgpu_bo_va_op(ib, 0, SZ, ib_va, 0, AMDGPU_VA_OP_UNMAP);
	amdgpu_va_range_free(ib_vh);
	amdgpu_bo_free(ib);
	return 0;
}

static int list_handles(int fd, struct gem_list_entry *e, uint32_t room, uint32_t *n)
{
	struct gem_list_handles a = { .entries = (uintptr_t)e, .num_entries = room };

	CHECK(!drmCommandWriteRead(fd, DRM_AMDGPU_GEM_LIST_HANDLES, &a, sizeof(a)),
	      "GEM_LIST_HANDLES: %s", strerror(errno));
	*n = a.num_entries;
	return 0;
}

/* Allocation, CPU mapping, handles as the idr gives them, LIST_HANDLES, metadata. */
static int check_alloc(struct gpu *g, amdgpu_bo_handle *vram, amdgpu_bo_handle *gtt)
{
	amdgpu_bo_handle hidden, extra;
	uint32_t hv, hg, hh, hx, n;
	struct gem_list_entry e[8];
	struct amdgpu_bo_info info;
	struct amdgpu_bo_metadata md = { .flags = 3, .tiling_info = 0x55, .size_metadata = 8 };

	if (alloc_bo(g, AMDGPU_GEM_DOMAIN_VRAM, AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED, vram, &hv) ||
	    alloc_bo(g, AMDGPU_GEM_DOMAIN_GTT, AMDGPU_GEM_CREATE_CPU_GTT_USWC, gtt, &hg) ||
	    alloc_bo(g, AMDGPU_GEM_DOMAIN_VRAM, AMDGPU_GEM_CREATE_NO_CPU_ACCESS, &hidden, &hh))
		return -1;
	CHECK(hv == 1 && hg == 2 && hh == 3, "handles %u %u %u, not 1 2 3", hv, hg, hh);
	void *p;
	CHECK(amdgpu_bo_cpu_map(hidden, &p) != 0, "a NO_CPU_ACCESS BO was mapped");
	amdgpu_bo_free(hidden);
	if (alloc_bo(g, AMDGPU_GEM_DOMAIN_GTT, 0, &extra, &hx))
		return -1;
	CHECK(hx == 3, "after freeing handle 3 the next BO got %u (the idr gives the lowest free)",
	      hx);
	amdgpu_bo_free(extra);
	ok("handles 1, 2, 3; the lowest free one again after a free");

	if (fill(*vram, 0x11) || fill(*gtt, 0x22) || verify(*vram, 0x11, "VRAM BO") ||
	    verify(*gtt, 0x22, "GTT BO"))
		return -1;
	ok("CPU mapping of VRAM and GTT BOs through the render file (GEM_MMAP)");

	CHECK(list_handles(g->fd, e, 0, &n) == 0 && n == 2, "GEM_LIST_HANDLES count %u, not 2", n);
	CHECK(list_handles(g->fd, e, 1, &n) == 0 && n == 2, "GEM_LIST_HANDLES with room for 1: %u", n);
	CHECK(list_handles(g->fd, e, 8, &n) == 0 && n == 2, "GEM_LIST_HANDLES: %u entries", n);
	CHECK(e[0].gem_handle == 1 && e[1].gem_handle == 2, "handles listed %u %u", e[0].gem_handle,
	      e[1].gem_handle);
	CHECK(e[0].size == SZ && e[0].preferred_domains == AMDGPU_GEM_DOMAIN_VRAM && e[0].alignment == 1,
	      "VRAM entry: size %" PRIu64 " domains %" PRIu64 " alignment %" PRIu64, e[0].size,
	      e[0].preferred_domains, e[0].alignment);
	CHECK(e[1].alloc_flags & AMDGPU_GEM_CREATE_CPU_GTT_USWC, "GTT entry flags %#" PRIx64,
	      e[1].alloc_flags);
	CHECK(!(e[0].alloc_flags & AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED),
	      "CPU_ACCESS_REQUIRED is not kept past the placement");
	ok("GEM_LIST_HANDLES: count, too small a buffer, 40-byte entries");

	md.umd_metadata[0] = 0xdeadbeef;
	md.umd_metadata[1] = 0xfeedf00d;
	CHECK(!amdgpu_bo_set_metadata(*vram, &md), "amdgpu_bo_set_metadata");
	CHECK(!amdgpu_bo_query_info(*vram, &info), "amdgpu_bo_query_info");
	CHECK(info.alloc_size == SZ && info.phys_alignment == 4096 &&
		      info.preferred_heap == AMDGPU_GEM_DOMAIN_VRAM && info.metadata.tiling_info == 0x55 &&
		      info.metadata.size_metadata == 8 && info.metadata.umd_metadata[1] == 0xfeedf00d,
	      "amdgpu_bo_query_info: size %" PRIu64 " alignment %" PRIu64 " heap %u tiling %#" PRIx64
	      " metadata %u bytes",
	      info.alloc_size, info.phys_alignment, info.preferred_heap, info.metadata.tiling_info,
	      info.metadata.size_metadata);
	bool busy = true;
	CHECK(!amdgpu_bo_wait_for_idle(*vram, 0, &busy) && !busy, "amdgpu_bo_wait_for_idle");
	ok("GEM_METADATA, GEM_OP GET_GEM_CREATE_INFO, GEM_WAIT_IDLE");
	return 0;
}

static int check_mapping_info(struct gpu *g, uint32_t handle, uint64_t va)
{
	struct gem_vm_entry e[2] = { 0 };
	struct gem_op618 op = { .handle = handle, .op = AMDGPU_GEM_OP_GET_MAPPING_INFO,
				.value = (uintptr_t)e };

	CHECK(!drmCommandWriteRead(g->fd, DRM_AMDGPU_GEM_OP, &op, sizeof(op)),
	      "GEM_OP GET_MAPPING_INFO: %s", strerror(errno));
	CHECK(op.num_entries == 1, "GET_MAPPING_INFO with no room: %u, not 1", op.num_entries);
	op.num_entries = 2;
	CHECK(!drmCommandWriteRead(g->fd, DRM_AMDGPU_GEM_OP, &op, sizeof(op)),
	      "GEM_OP GET_MAPPING_INFO: %s", strerror(errno));
	CHECK(op.num_entries == 1 && e[0].addr == va && e[0].size == SZ && e[0].offset == 0 &&
		      /* amdgpu_bo_va_op maps readable, writeable and executable whatever it is asked */
		      e[0].flags == (AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE |
				     AMDGPU_VM_PAGE_EXECUTABLE),
	      "GET_MAPPING_INFO: %u entries, %#" PRIx64 "+%#" PRIx64 " flags %#" PRIx64 " (mapped at %#" PRIx64 ")",
	      op.num_entries, e[0].addr, e[0].size, e[0].flags, va);
	ok("GEM_OP GET_MAPPING_INFO (24-byte drm_amdgpu_gem_op)");
	return 0;
}

static int check_change_handle(struct gpu *g, uint32_t handle, bool enabled)
{
	struct gem_change_handle a = { .handle = handle, .new_handle = 40 };
	int r = ioctl(g->fd, DRM_IOCTL_GEM_CHANGE_HANDLE, &a);

	if (!enabled) {
		CHECK(r == -1 && errno == EINVAL, "GEM_CHANGE_HANDLE: %d (%s), not EINVAL", r,
		      r ? strerror(errno) : "done");
		ok("GEM_CHANGE_HANDLE refused with EINVAL (Linux 7.1, 6.18.36+)");
		return 0;
	}
	CHECK(r == 0, "GEM_CHANGE_HANDLE %u -> 40: %s", handle, strerror(errno));
	a = (struct gem_change_handle){ .handle = 40, .new_handle = 1 };
	CHECK(ioctl(g->fd, DRM_IOCTL_GEM_CHANGE_HANDLE, &a) == -1 && errno == ENOSPC,
	      "GEM_CHANGE_HANDLE onto a taken handle: not ENOSPC");
	a = (struct gem_change_handle){ .handle = 40, .new_handle = handle };
	CHECK(ioctl(g->fd, DRM_IOCTL_GEM_CHANGE_HANDLE, &a) == 0, "GEM_CHANGE_HANDLE back: %s",
	      strerror(errno));
	ok("GEM_CHANGE_HANDLE renames (6.18.0-6.18.35), ENOSPC onto a taken handle");
	return 0;
}

/* Export of the VRAM BO, import on the same GPU (the same BO, the same handle) and on another
 * (a new BO there, flagged as an import, read by that GPU's SDMA). */
static int check_prime(struct gpu *g, int ngpus, amdgpu_bo_handle vram, uint32_t vram_handle)
{
	uint32_t fd;
	struct amdgpu_bo_import_result r;

	CHECK(!amdgpu_bo_export(vram, amdgpu_bo_handle_type_dma_buf_fd, &fd),
	      "amdgpu_bo_export(dma_buf_fd): %s", strerror(errno));
	CHECK(lseek((int)fd, 0, SEEK_END) == SZ, "the dma-buf's size is not the BO's");
	CHECK(!amdgpu_bo_import(g[0].dev, amdgpu_bo_handle_type_dma_buf_fd, fd, &r),
	      "amdgpu_bo_import(same GPU)");
	uint32_t h;
	amdgpu_bo_export(r.buf_handle, amdgpu_bo_handle_type_kms, &h);
	CHECK(h == vram_handle && r.buf_handle == vram, "an import on the same GPU gave handle %u", h);
	amdgpu_bo_free(r.buf_handle);
	ok("dma-buf export; imported on the same GPU it is the same BO and handle");
	if (ngpus < 2) {
		close((int)fd);
		return 0;
	}
	/* libdrm keeps one amdgpu_device per process for every render node it cannot tell
	 * apart (fd_compare: no primary node name), so the other GPU is used from a new
	 * process, which inherits the dma-buf fd: an import from another process too. */
	char fdarg[16], minor[16];
	int status;
	pid_t pid;

	int inherit = dup((int)fd); /* libdrm exports with DRM_CLOEXEC */

	CHECK(inherit >= 0, "dup: %s", strerror(errno));
	snprintf(fdarg, sizeof(fdarg), "%d", inherit);
	snprintf(minor, sizeof(minor), "%u", g[1].minor);
	pid = fork();
	if (pid == 0) {
		execl("/proc/self/exe", "gem-test", "--import-on", minor, fdarg, (char *)NULL);
		_exit(127);
	}
	close((int)fd);
	close(inherit);
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status),
	      "the import on the other GPU failed (status %#x)", status);
	return 0;
}

/* The child's part of check_prime: imports dma-buf FD on render minor MINOR, checks it is
 * listed as an import, and copies it with that GPU's SDMA. */
static int import_on(unsigned minor, int fd)
{
	struct gpu g = { .minor = minor };
	char path[64];
	uint32_t maj, min, n, hd;
	struct amdgpu_bo_import_result r;
	struct gem_list_entry e[8];
	amdgpu_bo_handle dst, imp;
	uint64_t va_imp, va_dst;
	amdgpu_va_handle vh_imp, vh_dst;

	snprintf(path, sizeof(path), "/dev/dri/renderD%u", minor);
	g.fd = open(path, O_RDWR | O_CLOEXEC);
	CHECK(g.fd >= 0 && !amdgpu_device_initialize(g.fd, &maj, &min, &g.dev), "%s", path);
	CHECK(!amdgpu_bo_import(g.dev, amdgpu_bo_handle_type_dma_buf_fd, (uint32_t)fd, &r),
	      "amdgpu_bo_import(other GPU)");
	imp = r.buf_handle;
	CHECK(r.alloc_size == SZ, "import size %" PRIu64, r.alloc_size);
	CHECK(list_handles(g.fd, e, 8, &n) == 0 && n == 1 &&
		      (e[0].flags & AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT),
	      "the other GPU lists %u handles, flags %#x", n, e[0].flags);
	if (alloc_bo(&g, AMDGPU_GEM_DOMAIN_GTT, 0, &dst, &hd) || va_map(&g, imp, &va_imp, &vh_imp) ||
	    va_map(&g, dst, &va_dst, &vh_dst) || sdma_copy(&g, imp, dst, va_imp, va_dst) ||
	    verify(dst, 0x11, "other GPU's copy of the imported BO"))
		return -1;
	ok("imported in another process on another GPU: IS_IMPORT, its SDMA reads the exporter's bytes");
	return 0;
}

static int kfd_start(void)
{
	HsaSystemProperties sp;
	HsaMemFlags f = { 0 };
	HSAuint64 alt = 0;
	void *p = NULL;
	unsigned gpu_node = 0;

	CHECK(hsaKmtOpenKFD() == HSAKMT_STATUS_SUCCESS, "hsaKmtOpenKFD");
	CHECK(hsaKmtAcquireSystemProperties(&sp) == HSAKMT_STATUS_SUCCESS,
	      "hsaKmtAcquireSystemProperties");
	for (unsigned n = 0; n < sp.NumNodes; n++) {
		HsaNodeProperties np;

		if (hsaKmtGetNodeProperties(n, &np) == HSAKMT_STATUS_SUCCESS && np.NumFComputeCores) {
			gpu_node = n;
			break;
		}
	}
	CHECK(gpu_node, "no GPU node in the KFD topology");
	f.ui32.HostAccess = 1;
	f.ui32.NonPaged = 1;
	f.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	CHECK(hsaKmtAllocMemory(gpu_node, 2u << 20, f, &p) == HSAKMT_STATUS_SUCCESS, "hsaKmtAllocMemory");
	CHECK(hsaKmtMapMemoryToGPU(p, 2u << 20, &alt) == HSAKMT_STATUS_SUCCESS, "hsaKmtMapMemoryToGPU");
	memset(p, 0x5c, 2u << 20);
	ok("KFD (libhsakmt): opened, 2 MiB mapped to the GPU, next to the GEM BOs");
	return 0;
}

/* --hold's state: the BOs (handles 1 VRAM, 3 GTT, 4 the copy target, 5 --big's) and their
 * VAs; --big's BO in sixteenths, each zeros (seed 0), its first page only (--sparse at
 * setup) or whole with its seed's bytes. */
struct held {
	struct gpu *g;
	amdgpu_bo_handle vram, gtt, dst, big;
	uint64_t va_vram, va_gtt, va_dst;
	uint8_t *big_p;
	uint64_t big_size;
	uint8_t seeds[16];
	bool sparse;
	unsigned rewrites;
};

/* The byte at offset I of a sixteenth written with SEED. */
static uint8_t big_byte(uint8_t seed, uint64_t i)
{
	return (uint8_t)(seed + i * 7 + (i >> 12) * 13);
}

/* How many bytes of sixteenth K hold its seed's bytes (the rest: zeros). */
static uint64_t big_written(struct held *h, unsigned k)
{
	if (!h->seeds[k])
		return 0;
	return h->sparse && k == 0 && h->rewrites == 0 ? 4096 : h->big_size / 16;
}

static void big_write(struct held *h, unsigned k, uint8_t seed)
{
	uint64_t part = h->big_size / 16, n;

	h->seeds[k] = seed;
	n = big_written(h, k);
	for (uint64_t i = 0; i < part; i++)
		h->big_p[k * part + i] = i < n ? big_byte(seed, i) : 0;
}

static int big_verify(struct held *h)
{
	uint64_t part = h->big_size / 16;

	for (unsigned k = 0; k < 16; k++) {
		uint64_t n = big_written(h, k);

		for (uint64_t i = 0; i < part; i++) {
			uint8_t want = i < n ? big_byte(h->seeds[k], i) : 0;

			if (h->big_p[k * part + i] != want) {
				fail("--big BO (handle 5): byte %" PRIu64 " is %#x, not %#x", k * part + i,
				     h->big_p[k * part + i], want);
				return -1;
			}
		}
	}
	return 0;
}

/* --big: the BO (handle 5), mapped by the CPU for good, its sixteenths written. */
static int big_setup(struct held *h)
{
	struct amdgpu_bo_alloc_request req = {
		.alloc_size = h->big_size,
		.phys_alignment = 4096,
		.preferred_heap = AMDGPU_GEM_DOMAIN_GTT,
	};
	uint32_t hb;

	CHECK(!amdgpu_bo_alloc(h->g->dev, &req, &h->big), "amdgpu_bo_alloc(--big %" PRIu64 " bytes)",
	      h->big_size);
	CHECK(!amdgpu_bo_export(h->big, amdgpu_bo_handle_type_kms, &hb) && hb == 5,
	      "--big BO: handle %u, not 5", hb);
	CHECK(!amdgpu_bo_cpu_map(h->big, (void **)&h->big_p), "amdgpu_bo_cpu_map(--big)");
	for (unsigned k = 0; k < 16; k++)
		big_write(h, k, h->sparse && k ? 0 : (uint8_t)(0x31 + k));
	return 0;
}

/* SIGUSR2: the next sixteenth of --big's BO rewritten with new bytes. */
static void big_rewrite(struct held *h)
{
	unsigned k = h->rewrites % 16;

	h->rewrites++;
	big_write(h, k, (uint8_t)(0x90 + h->rewrites));
	printf("rewrote %u\n", h->rewrites);
}

static int hold_setup(struct gpu *g, struct held *h)
{
	amdgpu_bo_handle hole;
	amdgpu_va_handle vh;
	uint32_t hv, hh, hg, hd;
	void *p;

	h->g = g;
	if (alloc_bo(g, AMDGPU_GEM_DOMAIN_VRAM, AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED, &h->vram, &hv) ||
	    alloc_bo(g, AMDGPU_GEM_DOMAIN_GTT, 0, &hole, &hh) ||
	    alloc_bo(g, AMDGPU_GEM_DOMAIN_GTT, 0, &h->gtt, &hg) ||
	    alloc_bo(g, AMDGPU_GEM_DOMAIN_GTT, 0, &h->dst, &hd))
		return -1;
	CHECK(hv == 1 && hh == 2 && hg == 3 && hd == 4, "handles %u %u %u %u, not 1-4", hv, hh, hg, hd);
	if (h->big_size && big_setup(h))
		return -1;
	CHECK(!amdgpu_bo_free(hole), "amdgpu_bo_free(handle 2)");
	if (fill(h->vram, 0x11) || fill(h->gtt, 0x22) || va_map(g, h->vram, &h->va_vram, &vh) ||
	    va_map(g, h->gtt, &h->va_gtt, &vh) || va_map(g, h->dst, &h->va_dst, &vh))
		return -1;
	/* Kept mapped by the CPU across checkpoint/restore: libdrm hands out the same pointer. */
	CHECK(!amdgpu_bo_cpu_map(h->vram, &p) && !amdgpu_bo_cpu_map(h->gtt, &p) &&
		      !amdgpu_bo_cpu_map(h->dst, &p),
	      "amdgpu_bo_cpu_map (kept)");
	return 0;
}

/* One round of --hold's checks. */
static int hold_check(struct held *h)
{
	struct gem_list_entry e[8];
	uint32_t n, want = h->big_size ? 4 : 3;
	void *p;

	if (verify(h->vram, 0x11, "VRAM BO (handle 1)") || verify(h->gtt, 0x22, "GTT BO (handle 3)"))
		return -1;
	if (h->big_size && big_verify(h))
		return -1;
	if (list_handles(h->g->fd, e, 8, &n))
		return -1;
	CHECK(n == want && e[0].gem_handle == 1 && e[1].gem_handle == 3 && e[2].gem_handle == 4 &&
		      (want == 3 || (e[3].gem_handle == 5 && e[3].size == h->big_size)),
	      "GEM_LIST_HANDLES: %u handles (%u %u %u), not 1, 3, 4%s", n, n > 0 ? e[0].gem_handle : 0,
	      n > 1 ? e[1].gem_handle : 0, n > 2 ? e[2].gem_handle : 0, want == 3 ? "" : ", 5");
	CHECK(e[0].size == SZ && e[0].preferred_domains == AMDGPU_GEM_DOMAIN_VRAM &&
		      e[1].preferred_domains == AMDGPU_GEM_DOMAIN_GTT,
	      "GEM_LIST_HANDLES: sizes or domains changed");
	if (check_mapping_info(h->g, 1, h->va_vram) || check_mapping_info(h->g, 3, h->va_gtt))
		return -1;
	CHECK(!amdgpu_bo_cpu_map(h->dst, &p), "amdgpu_bo_cpu_map(copy target)");
	memset(p, 0, SZ);
	amdgpu_bo_cpu_unmap(h->dst);
	if (sdma_copy(h->g, h->vram, h->dst, h->va_vram, h->va_dst) ||
	    verify(h->dst, 0x11, "SDMA copy of the VRAM BO after restore"))
		return -1;
	return 0;
}

/* --ctx: --hold keeps a submission context. */
static bool keep_ctx;

/* --big, --sparse: --hold's big BO. */
static uint64_t big_mib;
static bool big_sparse;

/* --hold: sets up, says ready, then answers SIGUSR1 (a round), SIGUSR2 (--big: a rewrite)
 * and SIGTERM (the end). */
static int hold(struct gpu *g)
{
	struct held h = { .big_size = big_mib << 20, .sparse = big_sparse };
	sigset_t set;
	int sig, round = 0;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGUSR2);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	if (hold_setup(g, &h) || hold_check(&h))
		return 1;
	if (keep_ctx) {
		amdgpu_context_handle ctx;

		CHECK(!amdgpu_cs_ctx_create(g->dev, &ctx), "amdgpu_cs_ctx_create (kept)");
	}
	printf("ready %d\n", (int)getpid());
	for (;;) {
		sig = sigwaitinfo(&set, NULL);
		if (sig < 0)
			continue;
		if (sig == SIGUSR2) {
			if (h.big_size)
				big_rewrite(&h);
			continue;
		}
		failures = 0;
		if (hold_check(&h) || failures) {
			printf("round %d: FAIL\n", ++round);
			if (sig == SIGTERM)
				return 1;
			continue;
		}
		if (sig == SIGTERM) {
			printf("PASS\n");
			return 0;
		}
		printf("round %d: ok\n", ++round);
	}
}

int main(int argc, char **argv)
{
	bool change = false, kfd = false, held = false;
	struct gpu g[MAX_NODES];
	amdgpu_bo_handle vram, gtt, dst;
	uint32_t hdst;
	uint64_t va_vram, va_dst;
	amdgpu_va_handle vh_vram, vh_dst;
	int n;

	if (argc == 4 && !strcmp(argv[1], "--import-on")) {
		setvbuf(stdout, NULL, _IOLBF, 0);
		return import_on((unsigned)atoi(argv[2]), atoi(argv[3])) || failures ? 1 : 0;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--change-handle"))
			change = true;
		else if (!strcmp(argv[i], "--kfd"))
			kfd = true;
		else if (!strcmp(argv[i], "--hold"))
			held = true;
		else if (!strcmp(argv[i], "--ctx"))
			keep_ctx = true;
		else if (!strcmp(argv[i], "--big") && i + 1 < argc && atoi(argv[i + 1]) > 0)
			big_mib = (uint64_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--sparse"))
			big_sparse = true;
		else {
			fprintf(stderr, "usage: gem-test [--change-handle] [--kfd] | --hold [--kfd] [--ctx] "
					"[--big MIB [--sparse]]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (kfd && kfd_start())
		return 1;
	n = open_gpus(g, MAX_NODES);
	if (!n) {
		fail("no render node opened");
		return 1;
	}
	if (held)
		return hold(&g[0]);
	if (check_alloc(&g[0], &vram, &gtt) || va_map(&g[0], vram, &va_vram, &vh_vram) ||
	    check_mapping_info(&g[0], 1, va_vram))
		return 1;
	if (alloc_bo(&g[0], AMDGPU_GEM_DOMAIN_GTT, 0, &dst, &hdst) || va_map(&g[0], dst, &va_dst, &vh_dst) ||
	    sdma_copy(&g[0], vram, dst, va_vram, va_dst) || verify(dst, 0x11, "SDMA copy of the VRAM BO"))
		return 1;
	ok("SDMA COPY_LINEAR submitted with amdgpu_cs_submit, fence signalled");
	if (check_change_handle(&g[0], hdst, change) || check_prime(g, n, vram, 1))
		return 1;
	printf("%s: %d GPU%s%s%s\n", failures ? "FAIL" : "PASS", n, n == 1 ? "" : "s",
	       kfd ? ", with KFD" : "", change ? ", GEM_CHANGE_HANDLE enabled" : "");
	return failures ? 1 : 0;
}
