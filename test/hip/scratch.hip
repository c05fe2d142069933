// An -O0 build: every value lives in scratch (MUBUF spills through ROCr's scratch V#, flat
// pointers into the private aperture, 64-bit spills), and the kernel's 16 KiB stack makes the
// queue ask ROCr's dynamic scratch handler for more scratch (queue error 1, then resume).
// hip-test: flags -O0
#include "hip-test.h"

__device__ int helper(const int *a, int i)
{
	int arr[8];
	for (int k = 0; k < 8; k++)
		arr[k] = a[i] + k;
	return arr[i % 8];
}

__global__ void k(const int *a, int *b, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		b[i] = helper(a, i);
}

int main()
{
	const int n = 10000;
	static int h[n];
	for (int i = 0; i < n; i++)
		h[i] = i * 3;
	int *a, *b;
	CHECK(hipMalloc(&a, sizeof h));
	CHECK(hipMalloc(&b, sizeof h));
	CHECK(hipMemcpy(a, h, sizeof h, hipMemcpyHostToDevice));
	hipLaunchKernelGGL(k, dim3((n + 255) / 256), dim3(256), 0, 0, a, b, n);
	CHECK(hipGetLastError());
	CHECK(hipMemcpy(h, b, sizeof h, hipMemcpyDeviceToHost));
	for (int i = 0; i < n; i++)
		if (h[i] != i * 3 + i % 8)
			FAIL("scratch: b[%d] = %d, expected %d", i, h[i], i * 3 + i % 8);
	printf("scratch: %d results correct\n", n);
	return 0;
}
