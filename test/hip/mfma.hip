// Matrix cores: a 16x16x16 f32 product C = A*B on one wave with
// __builtin_amdgcn_mfma_f32_16x16x4f32 (four k-steps, accumulating), and a 32x32x2 one with
// __builtin_amdgcn_mfma_f32_32x32x2f32, against the host. Operand layouts as AMD's ISA guides
// give them: A's lane i + n*k holds A[i][k], B's lane j + n*k holds B[k][j], the result's
// register r of lane l holds row 4*(l/n) + r%4 + 8*(r/4) (n = 32) or 4*(l/16) + r (n = 16),
// column l%n. Inputs are small integers, so the sums are exact.
#include "check.h"

typedef float floatx4 __attribute__((ext_vector_type(4)));
typedef float floatx16 __attribute__((ext_vector_type(16)));

__global__ void mfma16(const float *a, const float *b, float *c)
{
	int l = threadIdx.x;
	floatx4 acc = {0, 0, 0, 0};
	for (int k0 = 0; k0 < 16; k0 += 4) {
		float x = a[(l % 16) * 16 + k0 + l / 16];
		float y = b[(k0 + l / 16) * 16 + l % 16];
		acc = __builtin_amdgcn_mfma_f32_16x16x4f32(x, y, acc, 0, 0, 0);
	}
	for (int r = 0; r < 4; r++)
		c[(4 * (l / 16) + r) * 16 + l % 16] = acc[r];
}

__global__ void mfma32(const float *a, const float *b, float *c)
{
	int l = threadIdx.x;
	floatx16 acc = {};
	acc = __builtin_amdgcn_mfma_f32_32x32x2f32(a[(l % 32) * 2 + l / 32], b[(l / 32) * 32 + l % 32],
						   acc, 0, 0, 0);
	for (int r = 0; r < 16; r++)
		c[(4 * (l / 32) + r % 4 + 8 * (r / 4)) * 32 + l % 32] = acc[r];
}

// C[n x n] = A[n x k] * B[k x n] on the device, compared exactly with the host.
static long run(void (*kernel)(const float *, const float *, float *), int n, int k)
{
	float *a = new float[n * k], *b = new float[k * n], *c = new float[n * n];
	for (int i = 0; i < n * k; i++)
		a[i] = (float)((i * 7) % 9 - 4);
	for (int i = 0; i < k * n; i++)
		b[i] = (float)((i * 5) % 7 - 3);
	float *da = device_copy(a, n * k), *db = device_copy(b, k * n), *dc;
	HIP_CHECK(hipMalloc(&dc, n * n * sizeof(float)));
	hipLaunchKernelGGL(kernel, dim3(1), dim3(64), 0, 0, da, db, dc);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(c, dc, n * n);
	long bad = 0;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++) {
			float want = 0;
			for (int l = 0; l < k; l++)
				want += a[i * k + l] * b[l * n + j];
			bad += c[i * n + j] != want;
		}
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	HIP_CHECK(hipFree(dc));
	return bad;
}

int main()
{
	Check c("mfma");
	c.report("16x16x16 product with v_mfma_f32_16x16x4f32 (exact)", run(mfma16, 16, 16), 256);
	c.report("32x32x2 product with v_mfma_f32_32x32x2f32 (exact)", run(mfma32, 32, 2), 1024);
	return c.finish();
}
