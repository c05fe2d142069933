// SPDX-License-Identifier: GPL-2.0-only
/*
 * A libhsakmt process with 60000 small anonymous mappings besides its GPU
 * memory (large Python and PyTorch processes have tens of thousands): one
 * page each, alternately read-write and read-only so that the kernel
 * cannot merge them, every page holding its own pattern. CRIU writes its
 * memory map as one entry of about 1.8 MB (issue 25: an entry over 1 MiB
 * was refused after a dump that had killed the process). After restore
 * every page holds its pattern and the mappings are still 60000, the VRAM
 * buffer holds its pattern, and new GPU work runs.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zdtmtst.h"
#include "gpu_round.h"
#include "hsakmt_common.h"

const char *test_doc = "libhsakmt process with 60000 mappings survives C/R";
const char *test_author = "criu-rocm";

#define MAPS 60000
/* Mappings the rest of the process may have (libraries, stacks, the thunk's). */
#define OTHERS 1024
#define PAGE 4096
#define VRAM_BYTES (2 << 20)
enum { SEED_MAPS = 0xb0000000, SEED_VRAM = 0xb1000000 };

static struct kmt k;
static char *maps;
static void *vram;

/* vm.max_map_count must leave room for the mappings, or the test cannot run. */
static int room_for_maps(void)
{
	unsigned long max = 0;
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");

	if (!f || fscanf(f, "%lu", &max) != 1) {
		pr_perror("reading /proc/sys/vm/max_map_count");
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	if (max < MAPS + OTHERS) {
		pr_err("vm.max_map_count is %lu: %d mappings need at least %d\n", max, MAPS, MAPS + OTHERS);
		return -1;
	}
	return 0;
}

/* One region of MAPS pages split into MAPS mappings by alternating protections. */
static int setup(void)
{
	unsigned int i;

	maps = mmap(NULL, (size_t)MAPS * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (maps == MAP_FAILED) {
		pr_perror("mmap of %d pages", MAPS);
		return -1;
	}
	for (i = 0; i < MAPS; i++)
		kmt_fill(maps + (size_t)i * PAGE, PAGE, SEED_MAPS + i);
	for (i = 1; i < MAPS; i += 2)
		if (mprotect(maps + (size_t)i * PAGE, PAGE, PROT_READ)) {
			pr_perror("mprotect of page %u", i);
			return -1;
		}
	vram = kmt_alloc(KMT_VRAM, k.gpu[0], VRAM_BYTES, 1, &k.gpu[0], "VRAM");
	if (!vram)
		return -1;
	kmt_fill(vram, VRAM_BYTES, SEED_VRAM);
	return 0;
}

/* The mappings of /proc/self/maps that lie in the region. */
static int count_maps(void)
{
	unsigned long start, end, lo = (unsigned long)maps, hi = lo + (unsigned long)MAPS * PAGE;
	char line[512];
	int n = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f) {
		pr_perror("opening /proc/self/maps");
		return -1;
	}
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx", &start, &end) == 2 && start >= lo && end <= hi)
			n++;
	fclose(f);
	return n;
}

static int check_all(const char *when)
{
	char what[96];
	unsigned int i;
	int n = count_maps();

	if (n != MAPS) {
		fail("%s: %d mappings in the region, not %d", when, n, MAPS);
		return -1;
	}
	for (i = 0; i < MAPS; i++) {
		snprintf(what, sizeof(what), "%s: page %u of the mappings", when, i);
		if (kmt_check(maps + (size_t)i * PAGE, PAGE, SEED_MAPS + i, what))
			return -1;
	}
	snprintf(what, sizeof(what), "%s: VRAM", when);
	return kmt_check(vram, VRAM_BYTES, SEED_VRAM, what);
}

static int round_fn(void *arg, unsigned int n)
{
	char when[32];

	(void)arg;
	snprintf(when, sizeof(when), "round %u", n);
	if (check_all(when))
		return -1;
	return kmt_new_work(&k, 0xb0c00000 + (n << 8));
}

int main(int argc, char **argv)
{
	int ret;

	test_init(argc, argv);

	if (room_for_maps() || kmt_open(&k) || setup())
		return 1;
	/* Everything is right before the dump, or the test itself is wrong. */
	if (check_all("before the dump"))
		return 1;
	test_msg("%d mappings of one page, VRAM on node %u\n", MAPS, k.gpu[0]);
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, NULL);

	if (check_all("at the end") || ret)
		return 1;
	if (kmt_new_work(&k, 0xb0c0) || kmt_free(vram, VRAM_BYTES, "VRAM"))
		return 1;
	if (munmap(maps, (size_t)MAPS * PAGE)) {
		pr_perror("munmap");
		return 1;
	}
	if (kmt_close())
		return 1;
	pass();
	return 0;
}
