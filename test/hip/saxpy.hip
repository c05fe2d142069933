// saxpy in fp32: y = a*x + y over a length that is no multiple of the block size, checked
// bit for bit against the host (one fused multiply-add per element on both sides).
#include "check.h"

__global__ void saxpy(int n, float a, const float *x, float *y)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = fmaf(a, x[i], y[i]);
}

int main()
{
	Check c("saxpy");
	const int n = 10007;
	const float a = 2.5f;
	float *x = new float[n], *y = new float[n], *out = new float[n];
	Rng r(7);
	for (int i = 0; i < n; i++) {
		x[i] = r.uniform(-100, 100);
		y[i] = r.uniform(-100, 100);
	}
	float *dx = device_copy(x, n), *dy = device_copy(y, n);
	hipLaunchKernelGGL(saxpy, dim3((n + 255) / 256), dim3(256), 0, 0, n, a, dx, dy);
	HIP_CHECK(hipGetLastError());
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(out, dy, n);
	long bad = 0;
	for (int i = 0; i < n; i++)
		bad += out[i] != fmaf(a, x[i], y[i]);
	c.report("y = fma(a, x, y), n = 10007, block 256", bad, n);
	HIP_CHECK(hipFree(dx));
	HIP_CHECK(hipFree(dy));
	return c.finish();
}
