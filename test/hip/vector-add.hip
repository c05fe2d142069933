// Vector add: c = a + b over 1,000,003 floats (a partial last workgroup), checked on the host.
#include "hip-test.h"
#include <vector>

__global__ void add(const float *a, const float *b, float *c, unsigned n)
{
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		c[i] = a[i] + b[i];
}

int main()
{
	const unsigned n = 1000003;
	std::vector<float> a(n), b(n), c(n);
	for (unsigned i = 0; i < n; i++) {
		a[i] = i * 0.5f;
		b[i] = 3.0f - i;
	}
	float *da, *db, *dc;
	CHECK(hipMalloc(&da, n * sizeof(float)));
	CHECK(hipMalloc(&db, n * sizeof(float)));
	CHECK(hipMalloc(&dc, n * sizeof(float)));
	CHECK(hipMemcpy(da, a.data(), n * sizeof(float), hipMemcpyHostToDevice));
	CHECK(hipMemcpy(db, b.data(), n * sizeof(float), hipMemcpyHostToDevice));
	hipLaunchKernelGGL(add, dim3((n + 255) / 256), dim3(256), 0, 0, da, db, dc, n);
	CHECK(hipGetLastError());
	CHECK(hipMemcpy(c.data(), dc, n * sizeof(float), hipMemcpyDeviceToHost));
	for (unsigned i = 0; i < n; i++) {
		if (c[i] != a[i] + b[i])
			FAIL("vector-add: c[%u] = %g, expected %g", i, c[i], a[i] + b[i]);
	}
	CHECK(hipFree(da));
	CHECK(hipFree(db));
	CHECK(hipFree(dc));
	printf("vector-add: %u elements correct\n", n);
	return 0;
}
