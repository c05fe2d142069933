// A tiled matrix multiply C = A*B with 16x16 tiles in shared memory, on sizes that are no
// multiple of the tile (the edge tiles load zeros), against the host in double.
#include "check.h"

#define TILE 16

__global__ void matmul(int m, int n, int k, const float *a, const float *b, float *c)
{
	__shared__ float ta[TILE][TILE];
	__shared__ float tb[TILE][TILE + 1];
	int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
	float acc = 0.0f;
	for (int t0 = 0; t0 < k; t0 += TILE) {
		int ka = t0 + threadIdx.x, kb = t0 + threadIdx.y;
		ta[threadIdx.y][threadIdx.x] = row < m && ka < k ? a[row * k + ka] : 0.0f;
		tb[threadIdx.y][threadIdx.x] = kb < k && col < n ? b[kb * n + col] : 0.0f;
		__syncthreads();
		for (int j = 0; j < TILE; j++)
			acc += ta[threadIdx.y][j] * tb[j][threadIdx.x];
		__syncthreads();
	}
	if (row < m && col < n)
		c[row * n + col] = acc;
}

int main()
{
	Check chk("matmul");
	const int m = 70, n = 50, k = 36;
	float *a = new float[m * k], *b = new float[k * n], *c = new float[m * n];
	Rng r(23);
	for (int i = 0; i < m * k; i++)
		a[i] = r.uniform(-1, 1);
	for (int i = 0; i < k * n; i++)
		b[i] = r.uniform(-1, 1);
	float *da = device_copy(a, m * k), *db = device_copy(b, k * n), *dc;
	HIP_CHECK(hipMalloc(&dc, m * n * sizeof(float)));
	HIP_CHECK(hipMemset(dc, 0xff, m * n * sizeof(float)));
	dim3 grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE), block(TILE, TILE);
	hipLaunchKernelGGL(matmul, grid, block, 0, 0, m, n, k, da, db, dc);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(c, dc, m * n);
	long bad = 0;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double want = 0;
			for (int l = 0; l < k; l++)
				want += (double)a[i * k + l] * b[l * n + j];
			bad += !close_to(c[i * n + j], want, 1e-5);
		}
	chk.report("C[70x50] = A[70x36] * B[36x50], 16x16 LDS tiles (tolerance 1e-5)", bad, m * n);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	HIP_CHECK(hipFree(dc));
	return chk.finish();
}
