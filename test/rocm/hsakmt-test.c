// SPDX-License-Identifier: GPL-2.0-only
/*
 * hsakmt-test: Debian's libhsakmt (ROCm 5.2, /usr/include/hsakmt.h, -lhsakmt) driven
 * unchanged against whatever serves /dev/kfd and the render nodes: on this project,
 * kfd-emu (`kfd-emu run --profile P -- hsakmt-test --topology T ...`).
 *
 *   hsakmt-test --topology FILE --cpus N --gpus M [--marketing NAME]
 *
 * libhsakmt's view is checked against KFD's sysfs tree at its real path, which is what
 * libhsakmt reads, and that tree against FILE, `kfd-emu topology --profile P` (sections
 * "== nodes/N/properties ==" and so on): the profile's topology. --cpus and --gpus are the
 * machine the profile describes (counted independently of FILE). --marketing is the name
 * libdrm gives the GPUs (libhsakmt asks libdrm through the render node).
 *
 * It opens KFD, checks the version, the topology of every node (properties, memory banks,
 * caches, IO links, including the indirect links libhsakmt derives), reads the clock
 * counters of every node, allocates VRAM, GTT, paged system memory and registered user
 * memory, maps them to one and to all GPUs, writes and reads patterns with the CPU, drives
 * events (set, reset, auto reset, timeouts, a set from another thread, several at once),
 * and on every GPU runs an SDMA queue whose ring it fills with real SDMA v4 packets
 * (COPY_LINEAR from GTT, from another GPU's VRAM, into two kinds of user memory, FENCE,
 * the event mailbox FENCE and TRAP, as ROCr does), rings the doorbell and checks every
 * byte, the fence, the read pointer and the event. Then it frees everything and closes.
 *
 * One line per check ("ok   ..." or "FAIL ...: reason"); exit status 1 when any check
 * failed, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hsakmt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ull * 1024)
#define BUF_SIZE (4 * MiB)	/* each test buffer */
#define PEER_SIZE (1 * MiB)	/* the VRAM of the first GPU that every GPU's SDMA reads */
#define CHUNK (1 * MiB)		/* bytes per COPY_LINEAR packet */
#define RING_SIZE (16 * 1024)	/* SDMA ring, bytes */
#define MAX_NODES 64
#define KFD_SYSFS_TOPOLOGY "/sys/devices/virtual/kfd/kfd/topology"
#define KFD_SYSFS_NODES KFD_SYSFS_TOPOLOGY "/nodes"

#include "report.h"

static const char *status_name(HSAKMT_STATUS s)
{
	switch (s) {
	case HSAKMT_STATUS_SUCCESS: return "SUCCESS";
	case HSAKMT_STATUS_ERROR: return "ERROR";
	case HSAKMT_STATUS_DRIVER_MISMATCH: return "DRIVER_MISMATCH";
	case HSAKMT_STATUS_INVALID_PARAMETER: return "INVALID_PARAMETER";
	case HSAKMT_STATUS_INVALID_HANDLE: return "INVALID_HANDLE";
	case HSAKMT_STATUS_INVALID_NODE_UNIT: return "INVALID_NODE_UNIT";
	case HSAKMT_STATUS_NO_MEMORY: return "NO_MEMORY";
	case HSAKMT_STATUS_BUFFER_TOO_SMALL: return "BUFFER_TOO_SMALL";
	case HSAKMT_STATUS_NOT_IMPLEMENTED: return "NOT_IMPLEMENTED";
	case HSAKMT_STATUS_NOT_SUPPORTED: return "NOT_SUPPORTED";
	case HSAKMT_STATUS_UNAVAILABLE: return "UNAVAILABLE";
	case HSAKMT_STATUS_OUT_OF_RESOURCES: return "OUT_OF_RESOURCES";
	case HSAKMT_STATUS_KERNEL_IO_CHANNEL_NOT_OPENED: return "KERNEL_IO_CHANNEL_NOT_OPENED";
	case HSAKMT_STATUS_KERNEL_COMMUNICATION_ERROR: return "KERNEL_COMMUNICATION_ERROR";
	case HSAKMT_STATUS_KERNEL_ALREADY_OPENED: return "KERNEL_ALREADY_OPENED";
	case HSAKMT_STATUS_HSAMMU_UNAVAILABLE: return "HSAMMU_UNAVAILABLE";
	case HSAKMT_STATUS_WAIT_FAILURE: return "WAIT_FAILURE";
	case HSAKMT_STATUS_WAIT_TIMEOUT: return "WAIT_TIMEOUT";
	case HSAKMT_STATUS_MEMORY_ALREADY_REGISTERED: return "MEMORY_ALREADY_REGISTERED";
	case HSAKMT_STATUS_MEMORY_NOT_REGISTERED: return "MEMORY_NOT_REGISTERED";
	case HSAKMT_STATUS_MEMORY_ALIGNMENT: return "MEMORY_ALIGNMENT";
	default: return "UNKNOWN_STATUS";
	}
}

/*
 * A libhsakmt call that must succeed: one check line. libhsakmt keeps the errno of the
 * failed ioctl or mmap in most paths, so it is printed too (as "last errno").
 */
static bool kmt_ok(HSAKMT_STATUS s, int err, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (s == HSAKMT_STATUS_SUCCESS) {
		pass("%s", what);
		return true;
	}
	fail("%s: HSAKMT_STATUS_%s (%d), last errno %d (%s)", what, status_name(s), s, err,
	     err ? strerror(err) : "none");
	return false;
}

#define KMT(call, ...) ({ errno = 0; HSAKMT_STATUS s_ = (call); kmt_ok(s_, errno, __VA_ARGS__); })

static uint64_t now_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* --- the sysfs side: `kfd-emu topology` output ------------------------------------- */

struct tentry {
	char path[64];
	char key[48];
	uint64_t val;
};

struct tree {
	struct tentry *e;
	size_t n, cap;
};

/* live: KFD's sysfs as this process sees it (what libhsakmt reads); prof: the profile's. */
static struct tree live, prof;
#define topo (live.e)
#define ntopo (live.n)

static bool tree_add(struct tree *t, const char *path, const char *key, uint64_t v)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 1024;
		t->e = realloc(t->e, t->cap * sizeof(*t->e));
		if (!t->e) {
			fail("out of memory reading the topology");
			return false;
		}
	}
	snprintf(t->e[t->n].path, sizeof(t->e[t->n].path), "%s", path);
	snprintf(t->e[t->n].key, sizeof(t->e[t->n].key), "%s", key);
	t->e[t->n].val = v;
	t->n++;
	return true;
}

/*
 * Numeric "key value" lines (a lone number is key "value"); with dump, "== PATH ==" lines
 * name the file the following lines come from.
 */
static bool parse_lines(struct tree *t, FILE *f, const char *path, bool dump)
{
	char line[8192], sec[64];

	snprintf(sec, sizeof(sec), "%s", path);
	while (fgets(line, sizeof(line), f)) {
		char key[48], rest[8192], *end;
		uint64_t v;

		line[strcspn(line, "\n")] = 0;
		if (dump && !strncmp(line, "== ", 3)) {
			char *e = strstr(line + 3, " ==");

			if (e)
				*e = 0;
			snprintf(sec, sizeof(sec), "%.63s", line + 3);
			continue;
		}
		if (sscanf(line, "%47s %8191[^\n]", key, rest) == 2) {
			errno = 0;
			v = strtoull(rest, &end, 0);
			if (errno || *end)
				continue; /* not a number (e.g. sibling_map) */
		} else if (sscanf(line, "%8191s", rest) == 1) {
			errno = 0;
			v = strtoull(rest, &end, 0);
			if (errno || *end)
				continue;
			snprintf(key, sizeof(key), "value");
		} else {
			continue;
		}
		if (!tree_add(t, sec, key, v))
			return false;
	}
	return true;
}

static bool load_dump(struct tree *t, const char *file)
{
	FILE *f = fopen(file, "r");
	bool ok;

	if (!f) {
		fail("read topology file %s: %s", file, strerror(errno));
		return false;
	}
	ok = parse_lines(t, f, "", true);
	fclose(f);
	return ok;
}

static bool load_sysfs_file(struct tree *t, const char *rel)
{
	char path[256];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "%s/%s", KFD_SYSFS_TOPOLOGY, rel);
	f = fopen(path, "r");
	if (!f) {
		fail("read %s: %s", path, strerror(errno));
		return false;
	}
	ok = parse_lines(t, f, rel, false);
	fclose(f);
	return ok;
}

/* The subdirectories 0, 1, ... of a sysfs directory: their count. */
static unsigned count_numbered(const char *rel)
{
	char path[256];
	unsigned n = 0;

	for (;;) {
		snprintf(path, sizeof(path), "%s/%s/%u", KFD_SYSFS_TOPOLOGY, rel, n);
		if (access(path, F_OK))
			return n;
		n++;
	}
}

/* KFD's sysfs topology at its real path, in the dump's layout. */
static bool load_sysfs(struct tree *t)
{
	static const char *const subs[] = { "mem_banks", "caches", "io_links", "p2p_links" };
	unsigned nodes = count_numbered("nodes");
	char rel[128];

	if (!nodes) {
		fail("%s/nodes has no node", KFD_SYSFS_TOPOLOGY);
		return false;
	}
	if (!load_sysfs_file(t, "generation_id") || !load_sysfs_file(t, "system_properties"))
		return false;
	for (unsigned n = 0; n < nodes; n++) {
		snprintf(rel, sizeof(rel), "nodes/%u/gpu_id", n);
		if (!load_sysfs_file(t, rel))
			return false;
		snprintf(rel, sizeof(rel), "nodes/%u/properties", n);
		if (!load_sysfs_file(t, rel))
			return false;
		for (unsigned s = 0; s < sizeof(subs) / sizeof(subs[0]); s++) {
			char dir[64];
			unsigned k;

			snprintf(dir, sizeof(dir), "nodes/%u/%s", n, subs[s]);
			k = count_numbered(dir);
			for (unsigned i = 0; i < k; i++) {
				snprintf(rel, sizeof(rel), "%s/%u/properties", dir, i);
				if (!load_sysfs_file(t, rel))
					return false;
			}
		}
	}
	return true;
}

static const struct tentry *tree_find(const struct tree *t, const char *path, const char *key)
{
	for (size_t i = 0; i < t->n; i++)
		if (!strcmp(t->e[i].path, path) && !strcmp(t->e[i].key, key))
			return &t->e[i];
	return NULL;
}

static bool tfind(uint64_t *out, const char *key, const char *fmt, ...);

static bool host_has_apicid(uint64_t id)
{
	char line[256];
	unsigned v;
	bool hit = false;
	FILE *f = fopen("/proc/cpuinfo", "r");

	while (f && !hit && fgets(line, sizeof(line), f))
		hit = sscanf(line, "apicid : %u", &v) == 1 && v == id;
	if (f)
		fclose(f);
	return hit;
}

/*
 * The live tree must be the profile's, value for value, but for one thing the emulator
 * does on purpose: a CPU node's cpu_core_id_base is the APIC id of the host CPU that backs
 * it (libhsakmt names the node after that /proc/cpuinfo entry).
 */
static void compare_with_profile(void)
{
	int bad = 0, apic = 0;

	for (size_t i = 0; i < prof.n && bad < 5; i++) {
		const struct tentry *p = &prof.e[i], *l = tree_find(&live, p->path, p->key);
		uint64_t gpu = 1;
		unsigned node;

		if (!l) {
			fail("%s/%s has no %s, the profile's topology does", KFD_SYSFS_TOPOLOGY, p->path, p->key);
			bad++;
			continue;
		}
		if (l->val == p->val)
			continue;
		if (!strcmp(p->key, "cpu_core_id_base") && sscanf(p->path, "nodes/%u/", &node) == 1 &&
		    tfind(&gpu, "value", "nodes/%u/gpu_id", node) && gpu == 0 && host_has_apicid(l->val)) {
			apic++;
			continue;
		}
		fail("%s/%s: %s %" PRIu64 ", the profile's topology says %" PRIu64, KFD_SYSFS_TOPOLOGY,
		     p->path, p->key, l->val, p->val);
		bad++;
	}
	for (size_t i = 0; i < live.n && bad < 5; i++)
		if (!tree_find(&prof, live.e[i].path, live.e[i].key)) {
			fail("%s/%s: %s is not in the profile's topology", KFD_SYSFS_TOPOLOGY,
			     live.e[i].path, live.e[i].key);
			bad++;
		}
	if (!bad)
		pass("KFD's sysfs at %s is the profile's topology (%zu values; the host's APIC id "
		     "as cpu_core_id_base of %d CPU node%s)", KFD_SYSFS_TOPOLOGY, live.n, apic,
		     apic == 1 ? "" : "s");
}

static bool tfind(uint64_t *out, const char *key, const char *fmt, ...)
{
	char path[64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	for (size_t i = 0; i < ntopo; i++)
		if (!strcmp(topo[i].path, path) && !strcmp(topo[i].key, key)) {
			*out = topo[i].val;
			return true;
		}
	return false;
}

/* A sysfs value the test needs; missing one is a failure of the topology file. */
static uint64_t tget(const char *key, const char *fmt, int a, int b)
{
	char path[64];
	uint64_t v;

	snprintf(path, sizeof(path), fmt, a, b);
	if (!tfind(&v, key, "%s", path)) {
		fail("topology file: no %s in %s", key, path);
		return 0;
	}
	return v;
}

static unsigned sysfs_node_count(void)
{
	unsigned n = 0;
	uint64_t v;

	while (n < MAX_NODES && tfind(&v, "value", "nodes/%u/gpu_id", n))
		n++;
	return n;
}

/* --- patterns ------------------------------------------------------------------------ */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Word i of the pattern `seed` is mix(seed << 32 | i): position dependent. */
static void fill(void *buf, size_t bytes, uint32_t seed, size_t first_word)
{
	uint64_t *p = buf;

	for (size_t i = 0; i < bytes / 8; i++)
		p[i] = mix((uint64_t)seed << 32 | (first_word + i));
}

/* Offset of the first byte that differs from the pattern, or -1. */
static long long mismatch(const void *buf, size_t bytes, uint32_t seed, size_t first_word)
{
	const volatile uint64_t *p = buf;

	for (size_t i = 0; i < bytes / 8; i++)
		if (p[i] != mix((uint64_t)seed << 32 | (first_word + i)))
			return (long long)(i * 8);
	return -1;
}

static bool verify(const char *what, const void *buf, size_t bytes, uint32_t seed, size_t first_word)
{
	long long off = mismatch(buf, bytes, seed, first_word);

	if (off < 0) {
		pass("%s: %zu bytes verified", what, bytes);
		return true;
	}
	fail("%s: byte %lld of %zu differs (word %#" PRIx64 ", expected %#" PRIx64 ")", what, off,
	     bytes, ((const volatile uint64_t *)buf)[off / 8],
	     mix((uint64_t)seed << 32 | (first_word + (size_t)off / 8)));
	return false;
}

/* --- topology checks ----------------------------------------------------------------- */

static unsigned nnodes;
static HsaNodeProperties props[MAX_NODES];
static bool is_gpu[MAX_NODES];
static unsigned gpus[MAX_NODES], ngpus, ncpus;

#define CHECK_FIELD(node, field, key) do {						\
	uint64_t want_ = tget(key, "nodes/%d/properties", (int)(node), 0);		\
	if ((uint64_t)props[node].field != want_) {					\
		fail("node %u: %s = %" PRIu64 ", sysfs %s says %" PRIu64, node, #field,	\
		     (uint64_t)props[node].field, key, want_);				\
		bad++;									\
	}										\
} while (0)

static void utf16_to_ascii(const HSAuint16 *in, size_t n, char *out)
{
	size_t i;

	for (i = 0; i < n - 1 && in[i]; i++)
		out[i] = in[i] < 128 ? (char)in[i] : '?';
	out[i] = 0;
}

static bool has_public_vram(unsigned node)
{
	uint64_t nb = tget("mem_banks_count", "nodes/%d/properties", (int)node, 0);

	for (uint64_t b = 0; b < nb; b++)
		if (tget("heap_type", "nodes/%d/mem_banks/%d/properties", (int)node, (int)b) ==
		    HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC)
			return true;
	return false;
}

static void check_node(unsigned n, const char *marketing)
{
	HsaNodeProperties *p = &props[n];
	uint64_t gpu_id = tget("value", "nodes/%d/gpu_id", (int)n, 0);
	int bad = 0;

	if (!KMT(hsaKmtGetNodeProperties(n, p), "hsaKmtGetNodeProperties(node %u)", n))
		return;
	is_gpu[n] = gpu_id != 0;
	/*
	 * libhsakmt 5.2 keeps the gpu_id to itself; it names the GPU in every ioctl, so the
	 * allocations and queues below use it.
	 */
	CHECK_FIELD(n, NumCPUCores, "cpu_cores_count");
	CHECK_FIELD(n, NumFComputeCores, "simd_count");
	CHECK_FIELD(n, CComputeIdLo, "cpu_core_id_base");
	CHECK_FIELD(n, FComputeIdLo, "simd_id_base");
	CHECK_FIELD(n, VendorId, "vendor_id");
	CHECK_FIELD(n, DeviceId, "device_id");
	CHECK_FIELD(n, LocationId, "location_id");
	CHECK_FIELD(n, DrmRenderMinor, "drm_render_minor");
	CHECK_FIELD(n, HiveID, "hive_id");
	CHECK_FIELD(n, MaxEngineClockMhzCCompute, "max_engine_clk_ccompute");
	if (is_gpu[n]) {
		uint64_t gfxv = tget("gfx_target_version", "nodes/%d/properties", (int)n, 0);
		unsigned maj = (unsigned)(gfxv / 10000), min = (unsigned)(gfxv / 100 % 100),
			 step = (unsigned)(gfxv % 100);

		CHECK_FIELD(n, NumCaches, "caches_count");
		CHECK_FIELD(n, LDSSizeInKB, "lds_size_in_kb");
		CHECK_FIELD(n, WaveFrontSize, "wave_front_size");
		CHECK_FIELD(n, NumSIMDPerCU, "simd_per_cu");
		CHECK_FIELD(n, NumShaderBanks, "array_count");
		CHECK_FIELD(n, MaxWavesPerSIMD, "max_waves_per_simd");
		CHECK_FIELD(n, NumSdmaEngines, "num_sdma_engines");
		CHECK_FIELD(n, NumSdmaXgmiEngines, "num_sdma_xgmi_engines");
		CHECK_FIELD(n, NumCpQueues, "num_cp_queues");
		CHECK_FIELD(n, MaxEngineClockMhzFCompute, "max_engine_clk_fcompute");
		CHECK_FIELD(n, Capability.Value, "capability");
		if (p->EngineId.ui32.Major != maj || p->EngineId.ui32.Minor != min ||
		    p->EngineId.ui32.Stepping != step) {
			fail("node %u: EngineId %u.%u.%u, sysfs gfx_target_version %" PRIu64, n,
			     p->EngineId.ui32.Major, p->EngineId.ui32.Minor,
			     p->EngineId.ui32.Stepping, gfxv);
			bad++;
		}
		if (marketing) {
			char name[HSA_PUBLIC_NAME_SIZE];

			utf16_to_ascii(p->MarketingName, HSA_PUBLIC_NAME_SIZE, name);
			if (strcmp(name, marketing)) {
				fail("node %u: MarketingName \"%s\" (libhsakmt asks libdrm through "
				     "renderD%d), expected \"%s\"", n, name, p->DrmRenderMinor,
				     marketing);
				bad++;
			}
		}
	}
	if (!bad)
		pass("node %u: %s gpu_id %#" PRIx64 ", %u CPU cores, %u SIMDs, render minor %d, gfx %u.%u.%u"
		     " match sysfs", n, is_gpu[n] ? "GPU" : "CPU", gpu_id, p->NumCPUCores,
		     p->NumFComputeCores, p->DrmRenderMinor, p->EngineId.ui32.Major,
		     p->EngineId.ui32.Minor, p->EngineId.ui32.Stepping);
}

static void check_memory_banks(unsigned n)
{
	uint64_t sysfs_banks = tget("mem_banks_count", "nodes/%d/properties", (int)n, 0);
	HsaMemoryProperties mem[32];
	unsigned nb = props[n].NumMemoryBanks;
	bool lds = false, scratch = false;
	int bad = 0;

	if (nb < sysfs_banks || nb > 32) {
		fail("node %u: NumMemoryBanks %u, sysfs has %" PRIu64 " banks (libhsakmt adds its "
		     "apertures on GPU nodes)", n, nb, sysfs_banks);
		return;
	}
	if (is_gpu[n] && nb == sysfs_banks) {
		fail("node %u: NumMemoryBanks %u: no LDS/scratch apertures added to a GPU node", n, nb);
		return;
	}
	if (!KMT(hsaKmtGetNodeMemoryProperties(n, nb, mem), "hsaKmtGetNodeMemoryProperties(node %u, %u banks)", n, nb))
		return;
	for (unsigned b = 0; b < sysfs_banks; b++) {
		uint64_t heap = tget("heap_type", "nodes/%d/mem_banks/%d/properties", (int)n, (int)b);
		uint64_t size = tget("size_in_bytes", "nodes/%d/mem_banks/%d/properties", (int)n, (int)b);

		if (mem[b].HeapType != heap || mem[b].SizeInBytes != size) {
			fail("node %u bank %u: heap %u size %" PRIu64 ", sysfs heap %" PRIu64 " size %" PRIu64,
			     n, b, mem[b].HeapType, (uint64_t)mem[b].SizeInBytes, heap, size);
			bad++;
		}
		if (is_gpu[n] && heap != HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC &&
		    heap != HSA_HEAPTYPE_FRAME_BUFFER_PRIVATE) {
			fail("node %u bank %u: a GPU's sysfs bank of heap type %" PRIu64, n, b, heap);
			bad++;
		}
		if (!is_gpu[n] && heap != HSA_HEAPTYPE_SYSTEM) {
			fail("node %u bank %u: a CPU's sysfs bank of heap type %" PRIu64, n, b, heap);
			bad++;
		}
	}
	for (unsigned b = (unsigned)sysfs_banks; b < nb; b++) {
		lds |= mem[b].HeapType == HSA_HEAPTYPE_GPU_LDS;
		scratch |= mem[b].HeapType == HSA_HEAPTYPE_GPU_SCRATCH;
	}
	if (is_gpu[n] && (!lds || !scratch)) {
		fail("node %u: libhsakmt's apertures lack %s%s (its GPU VM apertures were not set up)",
		     n, lds ? "" : "LDS ", scratch ? "" : "scratch");
		bad++;
	}
	if (!bad)
		pass("node %u: %u memory banks (%" PRIu64 " from sysfs, first %s %" PRIu64 " MiB)", n,
		     nb, sysfs_banks,
		     mem[0].HeapType == HSA_HEAPTYPE_SYSTEM ? "system" :
		     mem[0].HeapType == HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC ? "public VRAM" : "private VRAM",
		     (uint64_t)(mem[0].SizeInBytes / MiB));
}

static void check_caches(unsigned n)
{
	unsigned nc = props[n].NumCaches;
	HsaCacheProperties *c;
	int bad = 0;

	if (!nc) {
		if (is_gpu[n])
			fail("node %u: a GPU node without caches", n);
		else
			pass("node %u: no CPU caches listed (libhsakmt reads them from this host's "
			     "/sys/devices/system/node)", n);
		return;
	}
	c = calloc(nc, sizeof(*c));
	if (!c) {
		fail("out of memory");
		return;
	}
	if (!KMT(hsaKmtGetNodeCacheProperties(n, is_gpu[n] ? props[n].FComputeIdLo : props[n].CComputeIdLo, nc, c),
		 "hsaKmtGetNodeCacheProperties(node %u, %u caches)", n, nc)) {
		free(c);
		return;
	}
	if (is_gpu[n]) {
		for (unsigned i = 0; i < nc; i++) {
			uint64_t lvl = tget("level", "nodes/%d/caches/%d/properties", (int)n, (int)i);
			uint64_t size = tget("size", "nodes/%d/caches/%d/properties", (int)n, (int)i);
			uint64_t lo = tget("processor_id_low", "nodes/%d/caches/%d/properties", (int)n, (int)i);

			if (c[i].CacheLevel != lvl || c[i].CacheSize != size || c[i].ProcessorIdLow != lo) {
				fail("node %u cache %u: level %u size %u KiB processor %u, sysfs level %"
				     PRIu64 " size %" PRIu64 " processor %" PRIu64, n, i, c[i].CacheLevel,
				     c[i].CacheSize, c[i].ProcessorIdLow, lvl, size, lo);
				bad++;
				break;
			}
		}
	}
	if (!bad)
		pass("node %u: %u caches%s", n, nc, is_gpu[n] ? " match sysfs" : " (this host's CPU caches)");
	free(c);
}

/*
 * The IO links libhsakmt 5.2 reports. A kernel that lists p2p_links_count (5.19 and later:
 * the indirect GPU <-> other-socket CPU links and, with CONFIG_HSA_AMD_P2P, GPU <-> GPU
 * PCIe peers, under p2p_links/) gets exactly its io_links then its p2p_links, in sysfs
 * order. An older kernel's direct links come first, then the indirect ones libhsakmt
 * derives itself between every pair of nodes that is not two CPUs, not two members of one
 * XGMI hive, and not towards a GPU without CPU-visible VRAM.
 */
struct link_want {
	unsigned type, to, weight;
	bool known;	/* type and weight known (a sysfs link), else only reachability */
};

/* The first sysfs io_link of a node (a GPU's: to its own CPU), or false. */
static bool first_link(unsigned n, unsigned *to, unsigned *type, unsigned *weight)
{
	uint64_t c = 0, v;

	if (!tfind(&c, "io_links_count", "nodes/%u/properties", n) || !c)
		return false;
	if (!tfind(&v, "node_to", "nodes/%u/io_links/0/properties", n))
		return false;
	*to = (unsigned)v;
	tfind(&v, "type", "nodes/%u/io_links/0/properties", n);
	*type = (unsigned)v;
	tfind(&v, "weight", "nodes/%u/io_links/0/properties", n);
	*weight = (unsigned)v;
	return true;
}

/* The weight of CPU node a's sysfs io_link to node b, or 0 when there is none. */
static unsigned cpu_link_weight(unsigned a, unsigned b)
{
	uint64_t c = 0, v;

	tfind(&c, "io_links_count", "nodes/%u/properties", a);
	for (uint64_t i = 0; i < c; i++)
		if (tfind(&v, "node_to", "nodes/%u/io_links/%u/properties", a, (unsigned)i) && v == b &&
		    tfind(&v, "weight", "nodes/%u/io_links/%u/properties", a, (unsigned)i))
			return (unsigned)v;
	return 0;
}

/*
 * What a kernel that lists p2p_links adds for every GPU (kfd_create_indirect_link_prop):
 * a link from the GPU to each CPU node other than its own, of its own CPU link's type and
 * the weight of that link plus the weight of the CPU-CPU link, and, for a GPU with
 * CPU-visible VRAM, the same link back from that CPU node to the GPU.
 */
static int check_indirect_links(unsigned n, const HsaIoLinkProperties *l, unsigned nl)
{
	int bad = 0;

	for (unsigned g = 0; g < nnodes; g++) {
		unsigned local, type, w, from, to;

		if (!is_gpu[g] || !first_link(g, &local, &type, &w))
			continue;
		for (unsigned c = 0; c < nnodes; c++) {
			const HsaIoLinkProperties *hit = NULL;
			unsigned want_w;

			if (is_gpu[c] || c == local)
				continue;
			if (g == n) {
				from = g, to = c;
			} else if (c == n && has_public_vram(g)) {
				from = c, to = g;
			} else {
				continue;
			}
			want_w = w + cpu_link_weight(c, local);
			for (unsigned i = 0; i < nl; i++)
				if (l[i].NodeTo == to)
					hit = &l[i];
			if (!hit) {
				fail("node %u: no link to node %u: a kernel with p2p_links links GPU %u with "
				     "every CPU node beyond its own %u (through it)", from, to, g, local);
				bad++;
			} else if (hit->IoLinkType != type || hit->Weight != want_w) {
				fail("node %u: link to node %u of type %u weight %u; the kernel's indirect "
				     "link has type %u, weight %u + %u", from, to, hit->IoLinkType,
				     hit->Weight, type, w, want_w - w);
				bad++;
			}
		}
	}
	return bad;
}

static void check_io_links(unsigned n)
{
	uint64_t direct = tget("io_links_count", "nodes/%d/properties", (int)n, 0), p2p = 0;
	bool has_p2p = tfind(&p2p, "p2p_links_count", "nodes/%d/properties", n);
	struct link_want want[2 * MAX_NODES];
	unsigned nl = props[n].NumIOLinks, nwant = 0;
	HsaIoLinkProperties *l;
	unsigned seen[MAX_NODES] = { 0 };
	bool linked[MAX_NODES] = { false };
	int bad = 0;

	for (uint64_t i = 0; i < direct + p2p && nwant < 2 * MAX_NODES; i++) {
		const char *dir = i < direct ? "io_links" : "p2p_links";
		int k = (int)(i < direct ? i : i - direct);
		char path[64];

		snprintf(path, sizeof(path), "nodes/%%d/%s/%%d/properties", dir);
		want[nwant] = (struct link_want){
			.type = (unsigned)tget("type", path, (int)n, k),
			.to = (unsigned)tget("node_to", path, (int)n, k),
			.weight = (unsigned)tget("weight", path, (int)n, k),
			.known = true,
		};
		if (want[nwant].to < nnodes)
			linked[want[nwant].to] = true;
		nwant++;
	}
	for (unsigned j = 0; !has_p2p && j < nnodes; j++)
		if (j != n && !linked[j] && (is_gpu[n] || is_gpu[j]) &&
		    !(is_gpu[n] && is_gpu[j] && props[n].HiveID && props[n].HiveID == props[j].HiveID) &&
		    (!is_gpu[j] || has_public_vram(j)))
			want[nwant++] = (struct link_want){ .to = j };
	if (nl != nwant) {
		fail("node %u: %u IO links, expected %u (%" PRIu64 " io_links + %s)", n, nl, nwant,
		     direct, has_p2p ? "the kernel's p2p_links" : "those libhsakmt derives");
		return;
	}
	if (!nl) {
		pass("node %u: no IO links (none expected)", n);
		return;
	}
	l = calloc(nl, sizeof(*l));
	if (!l) {
		fail("out of memory");
		return;
	}
	if (!KMT(hsaKmtGetNodeIoLinkProperties(n, nl, l), "hsaKmtGetNodeIoLinkProperties(node %u, %u links)", n, nl)) {
		free(l);
		return;
	}
	for (unsigned i = 0; i < nl; i++) {
		if (l[i].NodeFrom != n || l[i].NodeTo >= nnodes || l[i].NodeTo == n) {
			fail("node %u link %u: %u -> %u", n, i, l[i].NodeFrom, l[i].NodeTo);
			bad++;
			continue;
		}
		seen[l[i].NodeTo]++;
		if (want[i].known && (l[i].IoLinkType != want[i].type || l[i].NodeTo != want[i].to ||
				      l[i].Weight != want[i].weight)) {
			fail("node %u link %u: type %u to %u weight %u, sysfs type %u to %u weight %u", n,
			     i, l[i].IoLinkType, l[i].NodeTo, l[i].Weight, want[i].type, want[i].to,
			     want[i].weight);
			bad++;
		}
		if (!want[i].known && linked[l[i].NodeTo]) {
			fail("node %u link %u: a derived link to node %u, which a sysfs link reaches", n, i,
			     l[i].NodeTo);
			bad++;
		}
		if (is_gpu[n] && is_gpu[l[i].NodeTo] && props[n].HiveID &&
		    props[n].HiveID == props[l[i].NodeTo].HiveID && l[i].IoLinkType != HSA_IOLINK_TYPE_XGMI) {
			fail("node %u link %u: to hive peer %u of type %u, not XGMI", n, i, l[i].NodeTo,
			     l[i].IoLinkType);
			bad++;
		}
	}
	for (unsigned j = 0; j < nnodes; j++)
		if (seen[j] > 1) {
			fail("node %u: %u links to node %u", n, seen[j], j);
			bad++;
		}
	if (has_p2p)
		bad += check_indirect_links(n, l, nl);
	if (!bad)
		pass("node %u: %u IO links (%" PRIu64 " io_links, %u %s), hive peers over XGMI", n, nl,
		     direct, nl - (unsigned)direct, has_p2p ? "p2p_links" : "derived by libhsakmt");
	free(l);
}

static void check_clocks(unsigned n)
{
	HsaClockCounters c1, c2;
	uint64_t r0, r1, b0, b1;
	HSAKMT_STATUS s;

	r0 = now_ns(CLOCK_MONOTONIC_RAW);
	b0 = now_ns(CLOCK_BOOTTIME);
	errno = 0;
	s = hsaKmtGetClockCounters(n, &c1);
	r1 = now_ns(CLOCK_MONOTONIC_RAW);
	b1 = now_ns(CLOCK_BOOTTIME);
	if (!kmt_ok(s, errno, "hsaKmtGetClockCounters(node %u)", n))
		return;
	usleep(2000);
	if (!KMT(hsaKmtGetClockCounters(n, &c2), "hsaKmtGetClockCounters(node %u) again", n))
		return;
	/* KFD: CPU counter = raw monotonic ns, system = boottime ns, frequency 1 GHz. */
	if (c1.SystemClockFrequencyHz != 1000000000ull)
		fail("node %u: SystemClockFrequencyHz %" PRIu64 ", KFD reports 1 GHz (ns counters)", n,
		     (uint64_t)c1.SystemClockFrequencyHz);
	else if (c1.CPUClockCounter < r0 || c1.CPUClockCounter > r1)
		fail("node %u: CPUClockCounter %" PRIu64 " outside CLOCK_MONOTONIC_RAW [%" PRIu64 ", %"
		     PRIu64 "] around the call", n, (uint64_t)c1.CPUClockCounter, r0, r1);
	else if (c1.SystemClockCounter < b0 || c1.SystemClockCounter > b1)
		fail("node %u: SystemClockCounter %" PRIu64 " outside CLOCK_BOOTTIME [%" PRIu64 ", %"
		     PRIu64 "] around the call", n, (uint64_t)c1.SystemClockCounter, b0, b1);
	else if (c2.CPUClockCounter <= c1.CPUClockCounter || c2.SystemClockCounter <= c1.SystemClockCounter)
		fail("node %u: CPU/system counters did not advance over 2 ms", n);
	else if (is_gpu[n] && (c1.GPUClockCounter == 0 || c2.GPUClockCounter <= c1.GPUClockCounter))
		fail("node %u: GPU clock counter %" PRIu64 " then %" PRIu64 " (must be running)", n,
		     (uint64_t)c1.GPUClockCounter, (uint64_t)c2.GPUClockCounter);
	else if (!is_gpu[n] && c1.GPUClockCounter != 0)
		fail("node %u: a CPU node's GPU clock counter is %" PRIu64 ", KFD reports 0", n,
		     (uint64_t)c1.GPUClockCounter);
	else
		pass("node %u: clock counters (GPU %" PRIu64 " -> %" PRIu64 ", CPU and system in ns, 1 GHz)",
		     n, (uint64_t)c1.GPUClockCounter, (uint64_t)c2.GPUClockCounter);
}

/* --- events ------------------------------------------------------------------------- */

static HsaEvent *new_event(bool manual, bool signaled, const char *what)
{
	HsaEventDescriptor d = { 0 };
	HsaEvent *e = NULL;

	d.EventType = HSA_EVENTTYPE_SIGNAL;
	d.NodeId = 0;
	d.SyncVar.SyncVar.UserData = NULL;
	d.SyncVar.SyncVarSize = 0;
	if (!KMT(hsaKmtCreateEvent(&d, manual, signaled, &e), "hsaKmtCreateEvent(%s)", what))
		return NULL;
	if (!e) {
		fail("hsaKmtCreateEvent(%s) returned no event", what);
		return NULL;
	}
	return e;
}

/* A wait with an expected outcome and, for timeouts, a check that it really waited. */
static void expect_wait(HsaEvent *e, unsigned ms, HSAKMT_STATUS want, const char *what)
{
	uint64_t t0 = now_ns(CLOCK_MONOTONIC), dt;
	HSAKMT_STATUS s;

	errno = 0;
	s = hsaKmtWaitOnEvent(e, ms);
	dt = (now_ns(CLOCK_MONOTONIC) - t0) / 1000000;
	if (s != want)
		fail("%s: hsaKmtWaitOnEvent(%u ms) = %s after %" PRIu64 " ms, expected %s (errno %d)",
		     what, ms, status_name(s), dt, status_name(want), errno);
	else if (want == HSAKMT_STATUS_WAIT_TIMEOUT && dt + 1 < ms)
		fail("%s: timed out after %" PRIu64 " ms, before its %u ms", what, dt, ms);
	else
		pass("%s: %s after %" PRIu64 " ms", what, status_name(s), dt);
}

struct setter {
	HsaEvent *e;
	unsigned delay_ms;
	HSAKMT_STATUS status;
};

static void *set_later(void *arg)
{
	struct setter *s = arg;

	usleep(s->delay_ms * 1000);
	s->status = hsaKmtSetEvent(s->e);
	return NULL;
}

static void test_events(void)
{
	HsaEvent *m = new_event(true, false, "manual reset, unsignaled");
	HsaEvent *a = new_event(false, true, "auto reset, signaled");
	HsaEvent *both[2];
	pthread_t t;
	struct setter st;
	uint64_t t0, dt;
	HSAKMT_STATUS s;

	if (!m || !a)
		return;
	if (m->EventId == a->EventId)
		fail("two events share id %u", m->EventId);
	else
		pass("events have ids %u and %u", m->EventId, a->EventId);
	if (!m->EventData.HWData2)
		fail("signal event %u has no mailbox slot (HWData2 = 0)", m->EventId);
	else
		pass("signal event %u has its mailbox slot at %#" PRIx64, m->EventId,
		     (uint64_t)m->EventData.HWData2);

	expect_wait(m, 20, HSAKMT_STATUS_WAIT_TIMEOUT, "manual event, unsignaled");
	KMT(hsaKmtSetEvent(m), "hsaKmtSetEvent(manual)");
	expect_wait(m, 0, HSAKMT_STATUS_SUCCESS, "manual event, set");
	expect_wait(m, 0, HSAKMT_STATUS_SUCCESS, "manual event stays set after a wait");
	KMT(hsaKmtResetEvent(m), "hsaKmtResetEvent(manual)");
	expect_wait(m, 20, HSAKMT_STATUS_WAIT_TIMEOUT, "manual event after reset");

	expect_wait(a, 0, HSAKMT_STATUS_SUCCESS, "auto event created signaled");
	expect_wait(a, 20, HSAKMT_STATUS_WAIT_TIMEOUT, "auto event reset by the wait");

	st = (struct setter){ .e = a, .delay_ms = 50, .status = HSAKMT_STATUS_ERROR };
	if (pthread_create(&t, NULL, set_later, &st)) {
		fail("pthread_create: %s", strerror(errno));
	} else {
		t0 = now_ns(CLOCK_MONOTONIC);
		errno = 0;
		s = hsaKmtWaitOnEvent(a, 5000);
		dt = (now_ns(CLOCK_MONOTONIC) - t0) / 1000000;
		pthread_join(t, NULL);
		if (st.status != HSAKMT_STATUS_SUCCESS)
			fail("hsaKmtSetEvent from another thread: %s", status_name(st.status));
		else if (s != HSAKMT_STATUS_SUCCESS || dt < 45 || dt > 4000)
			fail("wait for a set 50 ms later from another thread: %s after %" PRIu64 " ms",
			     status_name(s), dt);
		else
			pass("wait woken by a set from another thread after %" PRIu64 " ms", dt);
	}

	both[0] = m;
	both[1] = a;
	KMT(hsaKmtSetEvent(m), "hsaKmtSetEvent(manual) again");
	errno = 0;
	s = hsaKmtWaitOnMultipleEvents(both, 2, false, 1000);
	if (s != HSAKMT_STATUS_SUCCESS)
		fail("hsaKmtWaitOnMultipleEvents(any of 2, one set) = %s (errno %d)", status_name(s), errno);
	else
		pass("hsaKmtWaitOnMultipleEvents(any of 2, one set) = SUCCESS");
	errno = 0;
	s = hsaKmtWaitOnMultipleEvents(both, 2, true, 20);
	if (s != HSAKMT_STATUS_WAIT_TIMEOUT)
		fail("hsaKmtWaitOnMultipleEvents(all of 2, one unset) = %s, expected WAIT_TIMEOUT (errno %d)",
		     status_name(s), errno);
	else
		pass("hsaKmtWaitOnMultipleEvents(all of 2, one unset) = WAIT_TIMEOUT");
	KMT(hsaKmtSetEvent(a), "hsaKmtSetEvent(auto)");
	errno = 0;
	s = hsaKmtWaitOnMultipleEvents(both, 2, true, 1000);
	if (s != HSAKMT_STATUS_SUCCESS)
		fail("hsaKmtWaitOnMultipleEvents(all of 2, both set) = %s (errno %d)", status_name(s), errno);
	else
		pass("hsaKmtWaitOnMultipleEvents(all of 2, both set) = SUCCESS");

	KMT(hsaKmtDestroyEvent(m), "hsaKmtDestroyEvent(manual)");
	KMT(hsaKmtDestroyEvent(a), "hsaKmtDestroyEvent(auto)");
}

/* --- memory ------------------------------------------------------------------------- */

static void *alloc_mem(unsigned node, uint64_t size, bool vram, bool paged, const char *what)
{
	HsaMemFlags f = { 0 };
	void *p = NULL;

	f.ui32.HostAccess = 1;
	f.ui32.NonPaged = paged ? 0 : 1;
	f.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	if (vram)
		f.ui32.NoSubstitute = 1;
	if (!KMT(hsaKmtAllocMemory(node, size, f, &p), "hsaKmtAllocMemory(%s, node %u, %" PRIu64 " KiB)",
		 what, node, size / 1024))
		return NULL;
	if (!p || ((uintptr_t)p & 4095)) {
		fail("%s: address %p is not page aligned", what, p);
		return NULL;
	}
	return p;
}

static bool map_nodes(void *p, uint64_t size, unsigned n, unsigned *nodes, const char *what)
{
	HsaMemMapFlags mf = { 0 };
	HSAuint64 alt = 0;

	return KMT(hsaKmtMapMemoryToGPUNodes(p, size, &alt, mf, n, nodes),
		   "hsaKmtMapMemoryToGPUNodes(%s, %u GPU%s)", what, n, n == 1 ? "" : "s");
}

static bool cpu_pattern(void *p, uint64_t size, uint32_t seed, const char *what)
{
	char w[128];

	fill(p, size, seed, 0);
	snprintf(w, sizeof(w), "%s: CPU writes and reads back a pattern", what);
	return verify(w, p, size, seed, 0);
}

/* --- SDMA --------------------------------------------------------------------------- */

/* SDMA v4 packets (gfx9 and newer through KFD user queues), as ROCr's BlitSdma writes them. */
enum { OP_COPY = 1, OP_FENCE = 5, OP_TRAP = 6 };

struct ring {
	uint32_t *base;
	uint64_t wptr; /* bytes, monotonic (SOC15: the doorbell and write pointer are 64-bit) */
	HsaQueueResource qr;
};

static void emit(struct ring *r, uint32_t dw)
{
	r->base[(r->wptr % RING_SIZE) / 4] = dw;
	r->wptr += 4;
}

static void copy_linear(struct ring *r, uint64_t dst, uint64_t src, uint64_t bytes)
{
	for (uint64_t done = 0; done < bytes; done += CHUNK) {
		uint64_t n = bytes - done < CHUNK ? bytes - done : CHUNK;

		emit(r, OP_COPY | 0 << 8);	/* COPY, sub-op LINEAR */
		emit(r, (uint32_t)(n - 1));	/* count: bytes - 1 on SDMA v4 */
		emit(r, 0);			/* parameter: no swap */
		emit(r, (uint32_t)(src + done));
		emit(r, (uint32_t)((src + done) >> 32));
		emit(r, (uint32_t)(dst + done));
		emit(r, (uint32_t)((dst + done) >> 32));
	}
}

static void fence(struct ring *r, uint64_t addr, uint32_t value)
{
	emit(r, OP_FENCE);
	emit(r, (uint32_t)addr);
	emit(r, (uint32_t)(addr >> 32));
	emit(r, value);
}

static void trap(struct ring *r, uint32_t ctx)
{
	emit(r, OP_TRAP);
	emit(r, ctx & 0x0fffffff);
}

static void ring_doorbell(struct ring *r)
{
	__atomic_store_n((volatile uint64_t *)r->qr.Queue_write_ptr_aql, r->wptr, __ATOMIC_RELEASE);
	__atomic_store_n((volatile uint64_t *)r->qr.Queue_DoorBell_aql, r->wptr, __ATOMIC_RELEASE);
}

static bool wait_rptr(struct ring *r, unsigned ms)
{
	uint64_t t0 = now_ns(CLOCK_MONOTONIC);

	while (__atomic_load_n((volatile uint64_t *)r->qr.Queue_read_ptr_aql, __ATOMIC_ACQUIRE) != r->wptr) {
		if (now_ns(CLOCK_MONOTONIC) - t0 > (uint64_t)ms * 1000000)
			return false;
		usleep(200);
	}
	return true;
}

struct bufs {
	void *gtt;	/* BUF_SIZE of GTT, pattern A, mapped to all GPUs */
	void *peer;	/* PEER_SIZE of VRAM on the first GPU, pattern B, mapped to all GPUs */
	void *paged;	/* BUF_SIZE of paged system memory (a userptr BO), mapped to all GPUs */
	void *user;	/* BUF_SIZE from posix_memalign, registered, mapped to all GPUs */
	uint64_t user_gpuva;
	void *ctl;	/* 4 KiB of GTT for fences, mapped to all GPUs */
};

enum { SEED_GTT = 0xa, SEED_PEER = 0xb, SEED_VRAM = 0x100 };

static void sdma_on_gpu(unsigned g, void *vram, struct bufs *b)
{
	struct ring r = { 0 };
	HsaEvent *ev;
	void *ring_mem;
	volatile uint32_t *fence_word = (volatile uint32_t *)b->ctl + 2 * g;
	uint32_t fval = 0x5d3a0000u | g;
	uint64_t t0, mbox;
	HSAKMT_STATUS s;
	char what[128];

	ring_mem = alloc_mem(0, RING_SIZE, false, false, "SDMA ring (GTT)");
	if (!ring_mem)
		return;
	if (!map_nodes(ring_mem, RING_SIZE, 1, &g, "SDMA ring"))
		goto free_ring;
	memset(ring_mem, 0, RING_SIZE);
	r.base = ring_mem;
	ev = new_event(false, false, "SDMA completion, auto reset");
	if (!ev)
		goto free_ring;
	mbox = ev->EventData.HWData2;
	if (!ev->EventId) {
		fail("node %u: the SDMA event got id 0 although event id 0 is taken", g);
		goto free_event;
	}
	if (!KMT(hsaKmtCreateQueue(g, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_NORMAL, ring_mem,
				   RING_SIZE, NULL, &r.qr), "hsaKmtCreateQueue(node %u, SDMA, %u-byte ring)",
		 g, RING_SIZE))
		goto free_event;
	if (!r.qr.Queue_DoorBell || !r.qr.Queue_write_ptr || !r.qr.Queue_read_ptr) {
		fail("node %u: SDMA queue without doorbell, write or read pointer", g);
		goto destroy;
	}
	r.wptr = *(volatile uint64_t *)r.qr.Queue_write_ptr_aql;

	memset(b->paged, 0, BUF_SIZE);
	memset(b->user, 0, BUF_SIZE);
	*fence_word = 0;
	/* GTT -> VRAM, the first GPU's VRAM over its tail (a peer read on other GPUs), then
	 * VRAM -> both kinds of user memory; ROCr's completion: fence, mailbox, TRAP. */
	copy_linear(&r, (uintptr_t)vram, (uintptr_t)b->gtt, BUF_SIZE);
	copy_linear(&r, (uintptr_t)vram + BUF_SIZE - PEER_SIZE, (uintptr_t)b->peer, PEER_SIZE);
	copy_linear(&r, b->user_gpuva, (uintptr_t)vram, BUF_SIZE);
	copy_linear(&r, (uintptr_t)b->paged, (uintptr_t)vram, BUF_SIZE);
	fence(&r, (uintptr_t)fence_word, fval);
	fence(&r, mbox, ev->EventId);
	trap(&r, ev->EventId);
	ring_doorbell(&r);

	t0 = now_ns(CLOCK_MONOTONIC);
	errno = 0;
	s = hsaKmtWaitOnEvent(ev, 10000);
	if (s != HSAKMT_STATUS_SUCCESS)
		fail("node %u: SDMA TRAP did not signal event %u: hsaKmtWaitOnEvent = %s after %" PRIu64
		     " ms (read pointer %#" PRIx64 " of %#" PRIx64 ")", g, ev->EventId, status_name(s),
		     (now_ns(CLOCK_MONOTONIC) - t0) / 1000000,
		     *(volatile uint64_t *)r.qr.Queue_read_ptr_aql, r.wptr);
	else
		pass("node %u: SDMA FENCE to the mailbox + TRAP signalled event %u after %" PRIu64 " ms",
		     g, ev->EventId, (now_ns(CLOCK_MONOTONIC) - t0) / 1000000);
	if (!wait_rptr(&r, 2000))
		fail("node %u: SDMA read pointer %#" PRIx64 ", write pointer %#" PRIx64 " (queue stuck?)", g,
		     *(volatile uint64_t *)r.qr.Queue_read_ptr_aql, r.wptr);
	else
		pass("node %u: SDMA read pointer reached the write pointer %#" PRIx64, g, r.wptr);
	if (*fence_word != fval)
		fail("node %u: fence %#x, expected %#x", g, *fence_word, fval);
	else
		pass("node %u: SDMA FENCE wrote %#x", g, fval);
	snprintf(what, sizeof(what), "node %u: SDMA GTT -> VRAM", g);
	verify(what, vram, BUF_SIZE - PEER_SIZE, SEED_GTT, 0);
	snprintf(what, sizeof(what), "node %u: SDMA VRAM of node %u -> VRAM%s", g, gpus[0],
		 g == gpus[0] ? "" : " (peer)");
	verify(what, (char *)vram + BUF_SIZE - PEER_SIZE, PEER_SIZE, SEED_PEER, 0);
	snprintf(what, sizeof(what), "node %u: SDMA VRAM -> registered user memory", g);
	if (verify(what, b->user, BUF_SIZE - PEER_SIZE, SEED_GTT, 0))
		verify(what, (char *)b->user + BUF_SIZE - PEER_SIZE, PEER_SIZE, SEED_PEER, 0);
	snprintf(what, sizeof(what), "node %u: SDMA VRAM -> paged system memory", g);
	if (verify(what, b->paged, BUF_SIZE - PEER_SIZE, SEED_GTT, 0))
		verify(what, (char *)b->paged + BUF_SIZE - PEER_SIZE, PEER_SIZE, SEED_PEER, 0);
	expect_wait(ev, 20, HSAKMT_STATUS_WAIT_TIMEOUT, "SDMA event after its wait (auto reset)");

	/* KFD signals a TRAP's event only when its mailbox slot was written (the interrupt
	 * handler looks the id up among signalled slots): a bare TRAP wakes no one. */
	trap(&r, ev->EventId);
	ring_doorbell(&r);
	if (!wait_rptr(&r, 2000))
		fail("node %u: a bare TRAP was not consumed", g);
	expect_wait(ev, 50, HSAKMT_STATUS_WAIT_TIMEOUT, "a TRAP without a mailbox write signals nothing");
	/* The queue keeps running: a second fence and completion. */
	fence(&r, (uintptr_t)(fence_word + 1), fval + 1);
	fence(&r, mbox, ev->EventId);
	trap(&r, ev->EventId);
	ring_doorbell(&r);
	expect_wait(ev, 10000, HSAKMT_STATUS_SUCCESS, "second SDMA submission completes");
	if (fence_word[1] != fval + 1)
		fail("node %u: second fence %#x, expected %#x", g, fence_word[1], fval + 1);
	else
		pass("node %u: second SDMA FENCE wrote %#x", g, fval + 1);

destroy:
	KMT(hsaKmtDestroyQueue(r.qr.QueueId), "hsaKmtDestroyQueue(node %u SDMA)", g);
free_event:
	KMT(hsaKmtDestroyEvent(ev), "hsaKmtDestroyEvent(SDMA completion)");
free_ring:
	hsaKmtUnmapMemoryToGPU(ring_mem);
	KMT(hsaKmtFreeMemory(ring_mem, RING_SIZE), "hsaKmtFreeMemory(SDMA ring)");
}

static void test_memory_and_sdma(void)
{
	struct bufs b = { 0 };
	void *vram[MAX_NODES] = { 0 };
	HSAuint64 alt = 0;
	unsigned g0 = gpus[0];
	bool user_registered = false;
	HsaEvent *keeper = NULL;

	b.gtt = alloc_mem(0, BUF_SIZE, false, false, "GTT");
	b.ctl = alloc_mem(0, 4096, false, false, "GTT fences");
	b.paged = alloc_mem(0, BUF_SIZE, false, true, "paged system memory");
	b.peer = alloc_mem(g0, PEER_SIZE, true, false, "VRAM peer source");
	if (!b.gtt || !b.ctl || !b.paged || !b.peer)
		goto out;
	if (posix_memalign(&b.user, 4096, BUF_SIZE)) {
		fail("posix_memalign(%llu)", BUF_SIZE);
		goto out;
	}
	user_registered = KMT(hsaKmtRegisterMemory(b.user, BUF_SIZE), "hsaKmtRegisterMemory(%llu KiB of malloc'd memory)",
			      BUF_SIZE / 1024);
	if (!user_registered)
		goto out;
	if (!KMT(hsaKmtMapMemoryToGPU(b.user, BUF_SIZE, &alt), "hsaKmtMapMemoryToGPU(registered memory)"))
		goto out;
	if (!alt) {
		fail("hsaKmtMapMemoryToGPU(registered memory) gave no GPU address");
		goto out;
	}
	b.user_gpuva = alt;
	pass("registered memory %p is at GPU address %#" PRIx64, b.user, (uint64_t)alt);

	if (!map_nodes(b.gtt, BUF_SIZE, ngpus, gpus, "GTT") ||
	    !map_nodes(b.ctl, 4096, ngpus, gpus, "GTT fences") ||
	    !map_nodes(b.paged, BUF_SIZE, ngpus, gpus, "paged system memory") ||
	    !map_nodes(b.peer, PEER_SIZE, 1, &g0, "VRAM peer source, its own GPU") ||
	    !map_nodes(b.peer, PEER_SIZE, ngpus, gpus, "VRAM peer source, remapped to all"))
		goto out;
	if (!cpu_pattern(b.gtt, BUF_SIZE, SEED_GTT, "GTT") ||
	    !cpu_pattern(b.peer, PEER_SIZE, SEED_PEER, "VRAM peer source") ||
	    !cpu_pattern(b.paged, BUF_SIZE, 0x77, "paged system memory") ||
	    !cpu_pattern(b.user, BUF_SIZE, 0x78, "registered memory"))
		goto out;
	memset(b.ctl, 0, 4096);
	/*
	 * KFD numbers signal events from 0 and reuses freed ids; keep one alive so the SDMA
	 * events' ids are not 0, which a TRAP's context id cannot tell from "no id".
	 */
	keeper = new_event(true, false, "id keeper");
	if (!keeper)
		goto out;

	for (unsigned i = 0; i < ngpus; i++) {
		unsigned g = gpus[i];
		char what[64];

		snprintf(what, sizeof(what), "VRAM of node %u", g);
		vram[i] = alloc_mem(g, BUF_SIZE, true, false, what);
		if (!vram[i] || !map_nodes(vram[i], BUF_SIZE, 1, &g, what) ||
		    !cpu_pattern(vram[i], BUF_SIZE, SEED_VRAM + g, what))
			continue;
		sdma_on_gpu(g, vram[i], &b);
	}

out:
	if (keeper)
		KMT(hsaKmtDestroyEvent(keeper), "hsaKmtDestroyEvent(id keeper)");
	for (unsigned i = 0; i < ngpus; i++)
		if (vram[i]) {
			KMT(hsaKmtUnmapMemoryToGPU(vram[i]), "hsaKmtUnmapMemoryToGPU(VRAM of node %u)", gpus[i]);
			KMT(hsaKmtFreeMemory(vram[i], BUF_SIZE), "hsaKmtFreeMemory(VRAM of node %u)", gpus[i]);
		}
	if (b.user_gpuva)
		KMT(hsaKmtUnmapMemoryToGPU(b.user), "hsaKmtUnmapMemoryToGPU(registered memory)");
	if (user_registered)
		KMT(hsaKmtDeregisterMemory(b.user), "hsaKmtDeregisterMemory");
	free(b.user);
	if (b.peer)
		KMT(hsaKmtFreeMemory(b.peer, PEER_SIZE), "hsaKmtFreeMemory(VRAM peer source)");
	if (b.paged)
		KMT(hsaKmtFreeMemory(b.paged, BUF_SIZE), "hsaKmtFreeMemory(paged system memory)");
	if (b.ctl)
		KMT(hsaKmtFreeMemory(b.ctl, 4096), "hsaKmtFreeMemory(GTT fences)");
	if (b.gtt)
		KMT(hsaKmtFreeMemory(b.gtt, BUF_SIZE), "hsaKmtFreeMemory(GTT)");
}

/* ------------------------------------------------------------------------------------ */

static void usage(void)
{
	fprintf(stderr, "usage: hsakmt-test --topology FILE --cpus N --gpus M [--marketing NAME]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *topo_file = NULL, *marketing = NULL;
	int want_cpus = -1, want_gpus = -1;
	HsaVersionInfo v;
	HsaSystemProperties sp;
	unsigned sysfs_nodes;

	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--topology"))
			topo_file = argv[++i];
		else if (!strcmp(argv[i], "--cpus"))
			want_cpus = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--gpus"))
			want_gpus = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--marketing"))
			marketing = argv[++i];
		else
			usage();
	}
	if (!topo_file || want_cpus < 1 || want_gpus < 1)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (!load_dump(&prof, topo_file) || !load_sysfs(&live))
		return 1;
	compare_with_profile();
	sysfs_nodes = sysfs_node_count();
	if (sysfs_nodes != (unsigned)(want_cpus + want_gpus)) {
		fail("KFD's sysfs has %u nodes, the profile %d CPU + %d GPU nodes", sysfs_nodes,
		     want_cpus, want_gpus);
		return 1;
	}

	if (!KMT(hsaKmtOpenKFD(), "hsaKmtOpenKFD"))
		goto done;
	if (KMT(hsaKmtGetVersion(&v), "hsaKmtGetVersion")) {
		if (v.KernelInterfaceMajorVersion != 1 || v.KernelInterfaceMinorVersion < 7)
			fail("KFD interface %u.%u: libhsakmt needs 1.x, CRIU needs 1.7 or later",
			     v.KernelInterfaceMajorVersion, v.KernelInterfaceMinorVersion);
		else
			pass("KFD interface version %u.%u", v.KernelInterfaceMajorVersion,
			     v.KernelInterfaceMinorVersion);
	}
	if (!KMT(hsaKmtAcquireSystemProperties(&sp), "hsaKmtAcquireSystemProperties"))
		goto close;
	nnodes = sp.NumNodes;
	if (nnodes != sysfs_nodes || nnodes > MAX_NODES) {
		fail("NumNodes %u, expected %u (%d CPU + %d GPU nodes)", nnodes, sysfs_nodes, want_cpus,
		     want_gpus);
		goto release;
	}
	{
		uint64_t oem = 0;

		tfind(&oem, "platform_oem", "system_properties");
		if (sp.PlatformOem != oem)
			fail("PlatformOem %#x, sysfs %#" PRIx64, sp.PlatformOem, oem);
		else
			pass("%u nodes, platform OEM %#x", nnodes, sp.PlatformOem);
	}
	for (unsigned n = 0; n < nnodes; n++) {
		check_node(n, marketing);
		if (is_gpu[n])
			gpus[ngpus++] = n;
		else
			ncpus++;
	}
	if (ngpus != (unsigned)want_gpus || ncpus != (unsigned)want_cpus) {
		fail("libhsakmt sees %u CPU and %u GPU nodes, the profile has %d and %d", ncpus, ngpus,
		     want_cpus, want_gpus);
		goto release;
	}
	pass("%u CPU and %u GPU nodes, as the profile says", ncpus, ngpus);
	for (unsigned n = 0; n < nnodes; n++) {
		check_memory_banks(n);
		check_caches(n);
		check_io_links(n);
		check_clocks(n);
	}
	test_events();
	test_memory_and_sdma();
release:
	KMT(hsaKmtReleaseSystemProperties(), "hsaKmtReleaseSystemProperties");
close:
	KMT(hsaKmtCloseKFD(), "hsaKmtCloseKFD");
done:
	printf("hsakmt-test: %d checks passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
