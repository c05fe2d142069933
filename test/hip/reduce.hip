// An LDS reduction: each block sums its slice in shared memory (a tree with __syncthreads),
// then adds its partial sum to a global total with atomicAdd, for int and for float; also
// atomicMax, atomicMin, atomicCAS and LDS atomics.
#include "check.h"

#define BLOCK 256

__global__ void sum_int(int n, const int *x, int *total, int *maxv, unsigned *minv)
{
	__shared__ int part[BLOCK];
	__shared__ int lds_count;
	int t = threadIdx.x, i = blockIdx.x * BLOCK + t;
	if (t == 0)
		lds_count = 0;
	part[t] = i < n ? x[i] : 0;
	__syncthreads();
	if (i < n)
		atomicAdd(&lds_count, 1);
	for (int s = BLOCK / 2; s > 0; s >>= 1) {
		if (t < s)
			part[t] += part[t + s];
		__syncthreads();
	}
	if (i < n) {
		atomicMax(maxv, x[i]);
		atomicMin(minv, (unsigned)x[i]);
	}
	if (t == 0) {
		atomicAdd(total, part[0]);
		// The count of live threads travels through an LDS atomic.
		atomicAdd(total + 1, lds_count);
	}
}

__global__ void sum_float(int n, const float *x, float *total, float *total_ret, int *cas)
{
	__shared__ float part[BLOCK];
	int t = threadIdx.x, i = blockIdx.x * BLOCK + t;
	part[t] = i < n ? x[i] : 0.0f;
	__syncthreads();
	for (int s = BLOCK / 2; s > 0; s >>= 1) {
		if (t < s)
			part[t] += part[t + s];
		__syncthreads();
	}
	if (t == 0) {
		atomicAdd(total, part[0]);
		// With a used return value the add is a different instruction (or a CAS loop).
		float before = atomicAdd(total_ret, part[0]);
		if (before < 0.0f)
			total_ret[1] = before;
		// A counter incremented through a compare-and-swap loop.
		int old = *cas, seen;
		while ((seen = atomicCAS(cas, old, old + 1)) != old)
			old = seen;
	}
}

int main()
{
	Check c("reduce");
	const int n = 100003, blocks = (n + BLOCK - 1) / BLOCK;
	int *xi = new int[n];
	float *xf = new float[n];
	Rng r(19);
	long long want = 0;
	int want_max = -2147483647 - 1;
	unsigned want_min = ~0u;
	double want_f = 0;
	for (int i = 0; i < n; i++) {
		xi[i] = (int)(r.next() % 20001) - 10000;
		xf[i] = r.uniform(0, 1);
		want += xi[i];
		want_max = xi[i] > want_max ? xi[i] : want_max;
		want_min = (unsigned)xi[i] < want_min ? (unsigned)xi[i] : want_min;
		want_f += xf[i];
	}
	int *dx = device_copy(xi, n), *dtot, *dmax, *dcas;
	unsigned *dmin;
	float *dxf = device_copy(xf, n), *dft, *dftr;
	int zero2[2] = {0, 0}, lowest = -2147483647 - 1;
	unsigned highest = ~0u;
	float fzero[2] = {0.0f, 0.0f};
	dtot = device_copy(zero2, 2);
	dmax = device_copy(&lowest, 1);
	dmin = device_copy(&highest, 1);
	dcas = device_copy(zero2, 1);
	dft = device_copy(fzero, 1);
	dftr = device_copy(fzero, 2);
	hipLaunchKernelGGL(sum_int, dim3(blocks), dim3(BLOCK), 0, 0, n, dx, dtot, dmax, dmin);
	hipLaunchKernelGGL(sum_float, dim3(blocks), dim3(BLOCK), 0, 0, n, dxf, dft, dftr, dcas);
	HIP_CHECK(hipDeviceSynchronize());
	int tot[2], got_max, got_cas;
	unsigned got_min;
	float ft, ftr[2];
	host_copy(tot, dtot, 2);
	host_copy(&got_max, dmax, 1);
	host_copy(&got_min, dmin, 1);
	host_copy(&got_cas, dcas, 1);
	host_copy(&ft, dft, 1);
	host_copy(ftr, dftr, 2);
	c.expect("int sum through LDS tree and atomicAdd", tot[0] == (int)want);
	c.expect("LDS atomicAdd counts every live thread", tot[1] == n);
	c.expect("atomicMax (int)", got_max == want_max);
	c.expect("atomicMin (unsigned)", got_min == want_min);
	c.expect("atomicCAS loop counts every block", got_cas == blocks);
	c.expect("float atomicAdd without return (rel 1e-5)", close_to(ft, want_f, 1e-5));
	c.expect("float atomicAdd with return (rel 1e-5)", close_to(ftr[0], want_f, 1e-5));
	c.expect("float atomicAdd returned no negative value", ftr[1] == 0.0f);
	printf("reduce: int sum %d (host %lld), float sum %.3f (host %.3f)\n", tot[0], want, ft,
	       want_f);
	HIP_CHECK(hipFree(dx));
	HIP_CHECK(hipFree(dxf));
	HIP_CHECK(hipFree(dtot));
	HIP_CHECK(hipFree(dmax));
	HIP_CHECK(hipFree(dmin));
	HIP_CHECK(hipFree(dcas));
	HIP_CHECK(hipFree(dft));
	HIP_CHECK(hipFree(dftr));
	return c.finish();
}
