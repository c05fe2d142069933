// hipcc-flags: -O0
// Built at -O0: locals live in scratch, values spill, device functions are real calls
// (with a recursive one, so the stack depth depends on the data). Checked against the
// same functions on the host.
#include "check.h"

// The deepest recursion here (collatz_steps(231), 127 calls of a 48-byte frame at -O0) needs
// about 6 KiB of stack per work-item. HIP 6 sizes a kernel's dynamic stack from
// hipLimitStackSize, 1 KiB per thread unless raised: past it a wave's stack runs into the next
// wave's scratch and past the queue's scratch (a GPU page fault). HIP 5.2 has no such limit.
static void raise_stack_limit()
{
#if HIP_VERSION_MAJOR >= 6
	HIP_CHECK(hipDeviceSetLimit(hipLimitStackSize, 8192));
#endif
}

struct Pair {
	int a;
	float b;
};

__host__ __device__ __attribute__((noinline)) int collatz_steps(int v)
{
	if (v <= 1)
		return 0;
	return 1 + collatz_steps(v % 2 ? 3 * v + 1 : v / 2);
}

__host__ __device__ __attribute__((noinline)) Pair mix(Pair p, const int *table, int k)
{
	int local[16];
	for (int j = 0; j < 16; j++)
		local[j] = table[j] * (j + k);
	Pair r;
	r.a = local[k & 15] + local[(k * 7) & 15] + p.a;
	r.b = p.b * 0.5f + (float)local[(k + 3) & 15];
	return r;
}

__global__ void o0_kernel(int n, const int *table, int *steps, Pair *pairs)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	steps[i] = collatz_steps(i + 1);
	Pair p = {i, (float)i};
	pairs[i] = mix(p, table, i);
}

int main()
{
	Check c("o0_calls");
	raise_stack_limit();
	const int n = 300;
	int table[16];
	for (int j = 0; j < 16; j++)
		table[j] = 3 * j - 7;
	int *dtable = device_copy(table, 16), *dsteps, *steps = new int[n];
	Pair *dpairs, *pairs = new Pair[n];
	HIP_CHECK(hipMalloc(&dsteps, n * sizeof(int)));
	HIP_CHECK(hipMalloc(&dpairs, n * sizeof(Pair)));
	hipLaunchKernelGGL(o0_kernel, dim3((n + 63) / 64), dim3(64), 0, 0, n, dtable, dsteps,
			   dpairs);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(steps, dsteps, n);
	host_copy(pairs, dpairs, n);
	long bad_steps = 0, bad_pairs = 0;
	for (int i = 0; i < n; i++) {
		bad_steps += steps[i] != collatz_steps(i + 1);
		Pair p = {i, (float)i};
		Pair want = mix(p, table, i);
		bad_pairs += pairs[i].a != want.a || pairs[i].b != want.b;
	}
	c.report("recursive device call (collatz steps of 1..300)", bad_steps, n);
	c.report("struct by value, local array in scratch", bad_pairs, n);
	HIP_CHECK(hipFree(dtable));
	HIP_CHECK(hipFree(dsteps));
	HIP_CHECK(hipFree(dpairs));
	return c.finish();
}
