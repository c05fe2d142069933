// A stream with a CU mask, its kernel's waves held (test/hip-cr/run.sh).
//
//   cu-mask
//
// hipExtStreamCreateWithCUMask gives a stream its own queue with a CU mask (ROCr's
// hsa_amd_queue_cu_set_mask, KFD's SET_CU_MASK); the mask here enables bit 1 only, which
// KFD maps to CU 0 of shader array 0 of shader engine 1 on any GPU of several shader
// engines (bit 0 is SE0's CU 0, bit 1 SE1's, ...). A kernel of WAVES
// one-wave workgroups runs there: each wave counts itself in, records its HW_ID (the shader
// engine, shader array and CU it runs on), holds until the host's go word is set, and
// records its HW_ID again. Once the count stands still the program prints "cu-mask: N waves
// resident on 1 CU" (the dump comes then, with those waves held); SIGTERM or SIGUSR1
// releases them. Then every wave must have run on SE1 SH0 CU0, before and after the hold,
// no more waves been resident at once than a CU has wave slots (40: 4 SIMDs of 10), fewer
// than the kernel has, and every wave counted itself in exactly once.
//
// Ends with one line per check and "cu-mask: PASSED" (status 0) or "cu-mask: FAILED" (1;
// 2 on a HIP error).
#include "../hip/check.h"

#include <hip/hip_ext.h>

#include <csignal>
#include <unistd.h>

constexpr int WAVES = 64;
// Wave slots of a GFX9 CU at most: 4 SIMDs of 10.
constexpr uint32_t CU_SLOTS = 40;
// s_getreg_b32's operand for all 32 bits of HW_ID (hwreg 4).
constexpr int HW_ID_ALL = 4 | 31 << 11;

struct Words {
	uint32_t go, started;
};

__global__ void held(volatile Words *w, uint32_t *before, uint32_t *after)
{
	uint32_t b = blockIdx.x;
	if (threadIdx.x == 0) {
		atomicAdd_system((uint32_t *)&w->started, 1u);
		before[b] = __builtin_amdgcn_s_getreg(HW_ID_ALL);
	}
	while (!w->go)
		__builtin_amdgcn_s_sleep(1);
	if (threadIdx.x == 0)
		after[b] = __builtin_amdgcn_s_getreg(HW_ID_ALL);
}

// HW_ID's shader engine, shader array and CU (GCN and CDNA: 15:13, 12, 11:8), and those of
// CU 0 of shader array 0 of shader engine 1.
static uint32_t cu_of(uint32_t hw_id) { return hw_id >> 8 & 0xff; }
constexpr uint32_t SE1_SH0_CU0 = 1 << 5;

static Words *words;
static volatile sig_atomic_t release;

static void on_release(int) { release = 1; }

// The waves counted in once the count stood still for half a second (at most a minute).
static uint32_t resident()
{
	uint32_t last = 0;
	for (int t = 0, still = 0; t < 6000 && still < 50; t++, usleep(10 * 1000)) {
		uint32_t n = __atomic_load_n(&words->started, __ATOMIC_SEQ_CST);
		still = n > 0 && n == last ? still + 1 : 0;
		last = n;
	}
	return last;
}

// Every wave's HW_ID in `ids` names SE1 SH0 CU0.
static void on_cu0(Check &c, const char *when, const uint32_t *ids)
{
	char what[96];
	long bad = 0;
	for (int b = 0; b < WAVES; b++)
		bad += cu_of(ids[b]) != SE1_SH0_CU0;
	snprintf(what, sizeof what, "every wave ran on SE1 SH0 CU0 %s", when);
	c.report(what, bad, WAVES);
}

int main()
{
	Check c("cu-mask");
	uint32_t mask = 2, *before, *after;
	hipStream_t s;
	HIP_CHECK(hipHostMalloc(&words, sizeof *words, hipHostMallocPortable));
	memset(words, 0, sizeof *words);
	HIP_CHECK(hipMalloc(&before, WAVES * sizeof(uint32_t)));
	HIP_CHECK(hipMalloc(&after, WAVES * sizeof(uint32_t)));
	HIP_CHECK(hipExtStreamCreateWithCUMask(&s, 1, &mask));
	signal(SIGUSR1, on_release);
	signal(SIGTERM, on_release);
	hipLaunchKernelGGL(held, dim3(WAVES), dim3(64), 0, s, words, before, after);
	HIP_CHECK(hipGetLastError());
	uint32_t n = resident();
	printf("cu-mask: %u waves resident on 1 CU\n", n);
	fflush(stdout);
	while (!release)
		usleep(10 * 1000);
	__atomic_store_n(&words->go, 1u, __ATOMIC_SEQ_CST);
	HIP_CHECK(hipStreamSynchronize(s));
	static uint32_t h[2][WAVES];
	HIP_CHECK(hipMemcpy(h[0], before, sizeof h[0], hipMemcpyDeviceToHost));
	HIP_CHECK(hipMemcpy(h[1], after, sizeof h[1], hipMemcpyDeviceToHost));
	c.expect("fewer waves resident than the kernel has, at most a CU's slots",
		 n > 0 && n < WAVES && n <= CU_SLOTS);
	on_cu0(c, "before its hold", h[0]);
	on_cu0(c, "after its hold", h[1]);
	c.expect("every wave counted in once", words->started == WAVES);
	HIP_CHECK(hipStreamDestroy(s));
	HIP_CHECK(hipFree(before));
	HIP_CHECK(hipFree(after));
	HIP_CHECK(hipHostFree(words));
	return c.finish();
}
