// A kernel spinning on a flag in host memory until the host sets it; meanwhile a kernel on
// another stream (another hardware queue) runs to its end: a spinning wave stalls no other
// queue. Then the spinner finishes and reports what it saw.
#include "check.h"
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
	Check c("spin-flag");
	int *flag, *out, *d;
	HIP_CHECK(hipHostMalloc(&flag, sizeof(int)));
	HIP_CHECK(hipHostMalloc(&out, 2 * sizeof(int)));
	HIP_CHECK(hipMalloc(&d, 4096 * sizeof(int)));
	*flag = 0;
	out[0] = out[1] = -1;
	hipStream_t s1, s2;
	HIP_CHECK(hipStreamCreateWithFlags(&s1, hipStreamNonBlocking));
	HIP_CHECK(hipStreamCreateWithFlags(&s2, hipStreamNonBlocking));
	hipLaunchKernelGGL(spin, dim3(1), dim3(64), 0, s1, flag, out);
	HIP_CHECK(hipGetLastError());
	usleep(200 * 1000);
	c.expect("the spinner runs while the flag is clear", hipStreamQuery(s1) == hipErrorNotReady);
	hipLaunchKernelGGL(fill, dim3(16), dim3(256), 0, s2, d, 7);
	HIP_CHECK(hipStreamSynchronize(s2));
	int h[4096];
	HIP_CHECK(hipMemcpyAsync(h, d, sizeof(h), hipMemcpyDeviceToHost, s2));
	HIP_CHECK(hipStreamSynchronize(s2));
	long bad = 0;
	for (int i = 0; i < 4096; i++)
		bad += h[i] != 7;
	c.report("the other stream's kernel, beside the spinner", bad, 4096);
	c.expect("the spinner still runs", hipStreamQuery(s1) == hipErrorNotReady);
	__atomic_store_n(flag, 5, __ATOMIC_SEQ_CST);
	HIP_CHECK(hipStreamSynchronize(s1));
	c.expect("the spinner saw the host's flag after spinning", out[0] == 5 && out[1] == 1);
	HIP_CHECK(hipStreamDestroy(s1));
	HIP_CHECK(hipStreamDestroy(s2));
	HIP_CHECK(hipHostFree(flag));
	HIP_CHECK(hipHostFree(out));
	HIP_CHECK(hipFree(d));
	return c.finish();
}
