// A kernel spinning on a flag in host memory until the host sets it; meanwhile a kernel on
// another stream (another hardware queue) runs to its end: a spinning wave stalls no other
// queue. Then the spinner finishes and reports what it saw.
#include "hip-test.h"
#include <unistd.h>

__global__ void spin(volatile int *flag, int *out)
{
	long n = 0;
	while (*flag == 0)
		n++;
	if (threadIdx.x == 0)
		out[0] = *flag, out[1] = n > 0;
}

__global__ void fill(int *p, int v)
{
	p[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

int main()
{
	int *flag, *out, *d;
	CHECK(hipHostMalloc(&flag, sizeof(int)));
	CHECK(hipHostMalloc(&out, 2 * sizeof(int)));
	CHECK(hipMalloc(&d, 4096 * sizeof(int)));
	*flag = 0;
	out[0] = out[1] = -1;
	hipStream_t s1, s2;
	CHECK(hipStreamCreateWithFlags(&s1, hipStreamNonBlocking));
	CHECK(hipStreamCreateWithFlags(&s2, hipStreamNonBlocking));
	hipLaunchKernelGGL(spin, dim3(1), dim3(64), 0, s1, flag, out);
	CHECK(hipGetLastError());
	usleep(200 * 1000);
	if (hipStreamQuery(s1) != hipErrorNotReady)
		FAIL("spin-flag: the spinning kernel ended before the flag was set");
	hipLaunchKernelGGL(fill, dim3(16), dim3(256), 0, s2, d, 7);
	CHECK(hipStreamSynchronize(s2));
	int h[4096];
	CHECK(hipMemcpyAsync(h, d, sizeof(h), hipMemcpyDeviceToHost, s2));
	CHECK(hipStreamSynchronize(s2));
	for (int i = 0; i < 4096; i++)
		if (h[i] != 7)
			FAIL("spin-flag: the other stream's kernel wrote %d at %d", h[i], i);
	if (hipStreamQuery(s1) != hipErrorNotReady)
		FAIL("spin-flag: the spinning kernel ended before the flag was set");
	__atomic_store_n(flag, 5, __ATOMIC_SEQ_CST);
	CHECK(hipStreamSynchronize(s1));
	if (out[0] != 5 || out[1] != 1)
		FAIL("spin-flag: the kernel saw flag %d, spun %d", out[0], out[1]);
	CHECK(hipStreamDestroy(s1));
	CHECK(hipStreamDestroy(s2));
	CHECK(hipHostFree(flag));
	CHECK(hipHostFree(out));
	CHECK(hipFree(d));
	printf("spin-flag: the kernel waited for the host; the other stream ran meanwhile\n");
	return 0;
}
