// Vector add: c = a + b over 1,000,003 floats (a partial last workgroup), checked on the host.
#include "check.h"

#include <vector>

__global__ void add(const float *a, const float *b, float *c, unsigned n)
{
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		c[i] = a[i] + b[i];
}

int main()
{
	Check c("vector-add");
	const unsigned n = 1000003;
	std::vector<float> a(n), b(n), out(n);
	for (unsigned i = 0; i < n; i++) {
		a[i] = i * 0.5f;
		b[i] = 3.0f - i;
	}
	float *da = device_copy(a.data(), n), *db = device_copy(b.data(), n), *dc;
	HIP_CHECK(hipMalloc(&dc, n * sizeof(float)));
	hipLaunchKernelGGL(add, dim3((n + 255) / 256), dim3(256), 0, 0, da, db, dc, n);
	HIP_CHECK(hipGetLastError());
	host_copy(out.data(), dc, n);
	long bad = 0;
	for (unsigned i = 0; i < n; i++)
		bad += out[i] != a[i] + b[i];
	c.report("c = a + b", bad, n);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	HIP_CHECK(hipFree(dc));
	return c.finish();
}
