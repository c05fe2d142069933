/*
 * drm-probe: checks that libdrm's amdgpu layer works on every GPU's render node the way
 * ROCm uses it (libhsakmt takes the marketing name from amdgpu_device_initialize +
 * amdgpu_get_marketing_name), and that what the render node reports agrees with the KFD
 * topology in sysfs, the other view user space has of the same GPU.
 *
 *   usage: drm-probe MINOR:PCI_REV:NAME...
 *
 * One argument per GPU of the KFD topology, in any order: its render minor, the PCI
 * revision its render node must report, and the marketing name libdrm must give. Every
 * GPU node of the topology must be named by exactly one argument.
 *
 * Prints one "ok" or "FAIL" line per GPU (with the first failed check) and exits 0 only if
 * every GPU passed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#define TOPOLOGY "/sys/class/kfd/kfd/topology/nodes"
#define MAX_GPUS 64
/* AMDGPU_VM_RESERVED_VRAM: the VRAM amdgpu keeps out of the usable heap. */
#define VM_RESERVED_VRAM (8ull << 20)

struct gpu {
	/* From the KFD topology. */
	unsigned node;
	unsigned minor;
	uint64_t device_id, gfx_target_version, simd_count, simd_per_cu, fw_version,
		sdma_fw_version, sdma_engines, vram;
	/* From the command line. */
	unsigned pci_rev;
	/* Whether the profile's DMA rings take user submissions (amdgpu_hw_ip_info counts them). */
	int dma_user_submission;
	const char *name;
	int expected;
};

static struct gpu gpus[MAX_GPUS];
static unsigned ngpus;

/* The value of "key value" line KEY of FILE, or -1. */
static int64_t prop(const char *file, const char *key)
{
	char line[256], k[128];
	unsigned long long v;
	int64_t r = -1;
	FILE *f = fopen(file, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%127s %llu", k, &v) == 2 && !strcmp(k, key)) {
			r = (int64_t)v;
			break;
		}
	fclose(f);
	return r;
}

static int by_node(const void *a, const void *b)
{
	const struct gpu *x = a, *y = b;

	return (x->node > y->node) - (x->node < y->node);
}

static int read_topology(void)
{
	DIR *d = opendir(TOPOLOGY);
	struct dirent *e;
	char path[512];

	if (!d) {
		printf("FAIL: %s: %s\n", TOPOLOGY, strerror(errno));
		return -1;
	}
	while ((e = readdir(d))) {
		struct gpu *g;
		int64_t minor;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), TOPOLOGY "/%s/properties", e->d_name);
		minor = prop(path, "drm_render_minor");
		if (minor <= 0 || prop(path, "simd_count") <= 0)
			continue; /* a CPU node */
		if (ngpus == MAX_GPUS) {
			printf("FAIL: more than %d GPU nodes\n", MAX_GPUS);
			closedir(d);
			return -1;
		}
		g = &gpus[ngpus++];
		g->node = (unsigned)atoi(e->d_name);
		g->minor = (unsigned)minor;
		g->device_id = (uint64_t)prop(path, "device_id");
		g->gfx_target_version = (uint64_t)prop(path, "gfx_target_version");
		g->simd_count = (uint64_t)prop(path, "simd_count");
		g->simd_per_cu = (uint64_t)prop(path, "simd_per_cu");
		g->fw_version = (uint64_t)prop(path, "fw_version");
		g->sdma_fw_version = (uint64_t)prop(path, "sdma_fw_version");
		g->sdma_engines = (uint64_t)(prop(path, "num_sdma_engines") +
					     prop(path, "num_sdma_xgmi_engines"));
		snprintf(path, sizeof(path), TOPOLOGY "/%s/mem_banks/0/properties", e->d_name);
		g->vram = (uint64_t)prop(path, "size_in_bytes");
	}
	closedir(d);
	if (!ngpus) {
		printf("FAIL: no GPU node in %s\n", TOPOLOGY);
		return -1;
	}
	qsort(gpus, ngpus, sizeof(gpus[0]), by_node);
	return 0;
}

static char why[512];

static int failed(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return -1;
}

#define CHECK(cond, ...)                           \
	do {                                       \
		if (!(cond))                       \
			return failed(__VA_ARGS__); \
	} while (0)

static int check_queries(amdgpu_device_handle h, int fd, const struct gpu *g)
{
	struct amdgpu_gpu_info info;
	struct amdgpu_heap_info heap;
	struct drm_amdgpu_info_hw_ip ip;
	struct drm_amdgpu_memory_info mem;
	uint32_t u32, ver, feature, count;
	unsigned gfx_major;
	uint64_t u64;
	drm_magic_t magic;
	const char *name;
	int r;

	CHECK(!amdgpu_query_gpu_info(h, &info), "amdgpu_query_gpu_info failed");
	CHECK(info.asic_id == g->device_id, "device id %#x, the topology says %#" PRIx64,
	      info.asic_id, g->device_id);
	CHECK(info.pci_rev_id == g->pci_rev, "PCI revision %#x, expected %#x", info.pci_rev_id,
	      g->pci_rev);
	if (g->gfx_target_version / 10000 == 9)
		CHECK(info.family_id == AMDGPU_FAMILY_AI, "family %u for a gfx9 target",
		      info.family_id);
	CHECK(info.chip_external_rev > info.chip_rev, "external revision %#x, chip revision %#x",
	      info.chip_external_rev, info.chip_rev);
	CHECK(g->simd_per_cu && info.cu_active_number == g->simd_count / g->simd_per_cu,
	      "%u active CUs, the topology says %" PRIu64, info.cu_active_number,
	      g->simd_per_cu ? g->simd_count / g->simd_per_cu : 0);
	CHECK(info.gb_addr_cfg != 0, "GB_ADDR_CONFIG reads 0");

	name = amdgpu_get_marketing_name(h);
	CHECK(name && !strcmp(name, g->name), "marketing name \"%s\", expected \"%s\"",
	      name ? name : "(null)", g->name);

	CHECK(!amdgpu_query_info(h, AMDGPU_INFO_ACCEL_WORKING, sizeof(u32), &u32) && u32 == 1,
	      "ACCEL_WORKING");

	/* Memory: the topology's VRAM less what amdgpu reserves. */
	CHECK(!amdgpu_query_heap_info(h, AMDGPU_GEM_DOMAIN_VRAM, 0, &heap),
	      "heap info (VRAM) failed");
	CHECK(heap.heap_size == g->vram - VM_RESERVED_VRAM,
	      "VRAM heap %" PRIu64 ", topology VRAM %" PRIu64, (uint64_t)heap.heap_size, g->vram);
	CHECK(heap.heap_usage <= heap.heap_size, "VRAM usage %" PRIu64 " > heap",
	      (uint64_t)heap.heap_usage);
	CHECK(!amdgpu_query_heap_info(h, AMDGPU_GEM_DOMAIN_VRAM,
				      AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED, &heap),
	      "heap info (visible VRAM) failed");
	CHECK(!amdgpu_query_heap_info(h, AMDGPU_GEM_DOMAIN_GTT, 0, &heap) && heap.heap_size > 0,
	      "heap info (GTT) failed or empty");
	CHECK(!amdgpu_query_info(h, AMDGPU_INFO_MEMORY, sizeof(mem), &mem),
	      "AMDGPU_INFO_MEMORY failed");
	CHECK(mem.vram.total_heap_size == g->vram, "MEMORY: VRAM %" PRIu64 ", topology %" PRIu64,
	      (uint64_t)mem.vram.total_heap_size, g->vram);
	CHECK(mem.cpu_accessible_vram.total_heap_size <= mem.vram.total_heap_size &&
		      mem.gtt.total_heap_size > 0,
	      "MEMORY: visible VRAM or GTT out of range");
	CHECK(!amdgpu_query_info(h, AMDGPU_INFO_VRAM_USAGE, sizeof(u64), &u64) &&
		      !amdgpu_query_info(h, AMDGPU_INFO_GTT_USAGE, sizeof(u64), &u64) &&
		      !amdgpu_query_info(h, AMDGPU_INFO_VIS_VRAM_USAGE, sizeof(u64), &u64),
	      "VRAM/GTT/visible VRAM usage queries");

	/* Firmware: the MEC and SDMA versions the topology shows. */
	CHECK(!amdgpu_query_firmware_version(h, AMDGPU_INFO_FW_GFX_MEC, 0, 0, &ver, &feature) &&
		      ver == g->fw_version,
	      "MEC firmware %u, the topology says %" PRIu64, ver, g->fw_version);
	CHECK(!amdgpu_query_firmware_version(h, AMDGPU_INFO_FW_SDMA, 0, 0, &ver, &feature) &&
		      ver == g->sdma_fw_version,
	      "SDMA firmware %u, the topology says %" PRIu64, ver, g->sdma_fw_version);
	r = amdgpu_query_firmware_version(h, AMDGPU_INFO_FW_SDMA, 0, (unsigned)g->sdma_engines,
					  &ver, &feature);
	CHECK(r == -EINVAL, "SDMA firmware of engine %" PRIu64 " (of %" PRIu64 "): %d, not -EINVAL",
	      g->sdma_engines, g->sdma_engines, r);

	/*
	 * IP blocks: SDMA engines as in the topology (SDMA 4 on GFX9, 5 on GFX10, 6 on GFX11,
	 * 7 on GFX12), compute rings, no graphics ring on the compute-only GFX9 parts and one on
	 * RDNA.
	 */
	gfx_major = (unsigned)(g->gfx_target_version / 10000);
	CHECK(!amdgpu_query_hw_ip_count(h, AMDGPU_HW_IP_DMA, &count) && count == g->sdma_engines,
	      "%u SDMA instances, the topology says %" PRIu64, count, g->sdma_engines);
	CHECK(!amdgpu_query_hw_ip_info(h, AMDGPU_HW_IP_DMA, 0, &ip) &&
		      ip.available_rings == (g->dma_user_submission ? 3u : 0u) &&
		      ip.hw_ip_version_major == gfx_major - 5,
	      "SDMA: rings %#x, version %u", ip.available_rings, ip.hw_ip_version_major);
	CHECK(!amdgpu_query_hw_ip_info(h, AMDGPU_HW_IP_COMPUTE, 0, &ip) &&
		      ip.available_rings == 0xf && ip.hw_ip_version_major == gfx_major,
	      "compute: rings %#x, version %u", ip.available_rings, ip.hw_ip_version_major);
	CHECK(!amdgpu_query_hw_ip_info(h, AMDGPU_HW_IP_GFX, 0, &ip) &&
		      ip.available_rings == (gfx_major >= 10 ? 1u : 0u),
	      "graphics rings %#x on gfx%u", ip.available_rings, gfx_major);
	CHECK(amdgpu_query_hw_ip_count(h, AMDGPU_HW_IP_VCE, &count) == -EINVAL,
	      "HW_IP_COUNT(VCE) of a GPU without VCE is not -EINVAL");

	/* The kernel's answers on a render node: unknown query, legacy authentication. */
	CHECK(amdgpu_query_info(h, 0x7777, sizeof(u32), &u32) == -EINVAL,
	      "unknown query is not -EINVAL");
	r = drmGetMagic(fd, &magic);
	CHECK(r == -EACCES, "GET_MAGIC on a render node: %d, not -EACCES", r);
	return 0;
}

static int check_gpu(const struct gpu *g)
{
	char path[64];
	amdgpu_device_handle h;
	uint32_t major, minor;
	int fd, r;

	snprintf(path, sizeof(path), "/dev/dri/renderD%u", g->minor);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return failed("open %s: %s", path, strerror(errno));
	r = amdgpu_device_initialize(fd, &major, &minor, &h);
	if (r) {
		close(fd);
		return failed("amdgpu_device_initialize: %d", r);
	}
	if (major != 3)
		r = failed("DRM version %u.%u", major, minor);
	else
		r = check_queries(h, fd, g);
	amdgpu_device_deinitialize(h);
	close(fd);
	return r;
}

int main(int argc, char **argv)
{
	unsigned i, bad = 0;
	int a;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (read_topology())
		return 1;
	for (a = 1; a < argc; a++) {
		char *rev, *dma, *name;
		unsigned long minor = strtoul(argv[a], &rev, 10);

		if (*rev != ':' || !(dma = strchr(rev + 1, ':')) || !(name = strchr(dma + 1, ':'))) {
			fprintf(stderr, "usage: %s MINOR:PCI_REV:DMA_USER_SUBMISSION(0|1):NAME...\n",
				argv[0]);
			return 2;
		}
		for (i = 0; i < ngpus && gpus[i].minor != minor; i++)
			;
		if (i == ngpus || gpus[i].expected) {
			printf("FAIL: renderD%lu is no GPU of the topology, or named twice\n",
			       minor);
			return 1;
		}
		gpus[i].pci_rev = (unsigned)strtoul(rev + 1, NULL, 0);
		gpus[i].dma_user_submission = dma[1] == '1';
		gpus[i].name = name + 1;
		gpus[i].expected = 1;
	}
	for (i = 0; i < ngpus; i++) {
		const struct gpu *g = &gpus[i];

		if (!g->expected) {
			printf("FAIL renderD%u (node %u): no expectation given\n", g->minor, g->node);
			bad++;
		} else if (check_gpu(g)) {
			printf("FAIL renderD%u (node %u): %s\n", g->minor, g->node, why);
			bad++;
		} else {
			printf("ok renderD%u (node %u): %s\n", g->minor, g->node, g->name);
		}
	}
	return bad ? 1 : 0;
}
