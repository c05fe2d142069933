// A ROCr process whose GPU use rocm-smi shows (test/rocm64's rocm-smi-live-* cases): it
// allocates MIB MiB in the device-local (coarse-grained) pool of every GPU agent and creates
// an AQL queue on each (KFD lists a process' GPUs by its queues), prints "vram-hold: holding
// N GPUs, MIB MiB each", and waits for SIGUSR1; then it frees everything, shuts ROCr down and
// exits 0 ("vram-hold: released").
//
//   usage: vram-hold MIB
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_GPUS 16

static hsa_agent_t gpus[MAX_GPUS];
static int ngpus;

static hsa_status_t add_gpu(hsa_agent_t a, void *data)
{
	hsa_device_type_t t;
	(void)data;
	if (hsa_agent_get_info(a, HSA_AGENT_INFO_DEVICE, &t) == HSA_STATUS_SUCCESS &&
	    t == HSA_DEVICE_TYPE_GPU && ngpus < MAX_GPUS)
		gpus[ngpus++] = a;
	return HSA_STATUS_SUCCESS;
}

// The agent's global coarse-grained pool: its VRAM.
static hsa_status_t find_vram(hsa_amd_memory_pool_t p, void *data)
{
	hsa_amd_segment_t seg;
	uint32_t flags;
	if (hsa_amd_memory_pool_get_info(p, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg) ||
	    seg != HSA_AMD_SEGMENT_GLOBAL ||
	    hsa_amd_memory_pool_get_info(p, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags) ||
	    !(flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED))
		return HSA_STATUS_SUCCESS;
	*(hsa_amd_memory_pool_t *)data = p;
	return HSA_STATUS_INFO_BREAK;
}

static void fail(const char *what, hsa_status_t s)
{
	const char *msg = "";
	hsa_status_string(s, &msg);
	fprintf(stderr, "vram-hold: %s: %s\n", what, msg);
	exit(1);
}

int main(int argc, char **argv)
{
	size_t bytes = (argc > 1 ? strtoull(argv[1], NULL, 0) : 64) << 20;
	void *mem[MAX_GPUS];
	hsa_queue_t *queues[MAX_GPUS];
	hsa_status_t s;
	sigset_t usr1;
	int sig, i;

	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL);
	if ((s = hsa_init()))
		fail("hsa_init", s);
	hsa_iterate_agents(add_gpu, NULL);
	if (!ngpus)
		fail("no GPU agent", HSA_STATUS_ERROR);
	for (i = 0; i < ngpus; i++) {
		hsa_amd_memory_pool_t pool = { 0 };
		if (hsa_amd_agent_iterate_memory_pools(gpus[i], find_vram, &pool) != HSA_STATUS_INFO_BREAK)
			fail("no VRAM pool", HSA_STATUS_ERROR);
		if ((s = hsa_amd_memory_pool_allocate(pool, bytes, 0, &mem[i])))
			fail("hsa_amd_memory_pool_allocate", s);
		if ((s = hsa_queue_create(gpus[i], 64, HSA_QUEUE_TYPE_SINGLE, NULL, NULL, UINT32_MAX,
					  UINT32_MAX, &queues[i])))
			fail("hsa_queue_create", s);
	}
	printf("vram-hold: holding %d GPUs, %zu MiB each\n", ngpus, bytes >> 20);
	fflush(stdout);
	sigwait(&usr1, &sig);
	for (i = 0; i < ngpus; i++) {
		hsa_queue_destroy(queues[i]);
		hsa_amd_memory_pool_free(mem[i]);
	}
	hsa_shut_down();
	printf("vram-hold: released\n");
	return 0;
}
