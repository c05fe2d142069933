// A kernel that stores to an address no BO covers: the GPU reports a page fault, ROCr prints
// "Memory access fault by GPU" and aborts the program. The runner then runs another program in
// the same emulator: the daemon lives on.
// hip-test: expect-abort Memory access fault by GPU
#include "check.h"

__global__ void poke(int *p)
{
	p[threadIdx.x] = 42;
}

int main()
{
	hipLaunchKernelGGL(poke, dim3(1), dim3(64), 0, 0, (int *)0x1000);
	HIP_CHECK(hipGetLastError());
	hipError_t e = hipDeviceSynchronize();
	fprintf(stderr, "fault: the faulting kernel returned %s instead of aborting\n",
		hipGetErrorString(e));
	return 1;
}
