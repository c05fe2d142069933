// Several GPUs with peer access, as a multi-GPU job uses them: hipDeviceCanAccessPeer and
// hipDeviceEnablePeerAccess between every pair, hipMemcpyPeer and hipMemcpyPeerAsync around
// a ring of GPUs (each GPU transforms what the previous one sent), a kernel on one GPU that
// reads and writes another GPU's memory directly, and a device-to-device hipMemcpy between
// GPUs; every byte checked on the host.
// hip-test: needs-gpus 2
#include "check.h"

#include <vector>

// y[i] = x[i] * 3 + g.
__global__ void step(const int *x, int *y, int g, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = x[i] * 3 + g;
}

// Adds this GPU's v to the peer's p, in place, through the peer mapping.
__global__ void add_into_peer(int *peer, const int *v, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		peer[i] += v[i];
}

int main()
{
	Check c("peer");
	int ngpu = 0;
	HIP_CHECK(hipGetDeviceCount(&ngpu));
	c.expect("two GPUs or more", ngpu >= 2);
	if (ngpu < 2)
		return c.finish();
	const int n = 262147, block = 256, grid = (n + block - 1) / block;
	const size_t bytes = n * sizeof(int);

	int pairs = 0, can = 0;
	for (int a = 0; a < ngpu; a++) {
		HIP_CHECK(hipSetDevice(a));
		for (int b = 0; b < ngpu; b++) {
			if (a == b)
				continue;
			int ok = 0;
			HIP_CHECK(hipDeviceCanAccessPeer(&ok, a, b));
			pairs++;
			can += ok;
			if (ok)
				HIP_CHECK(hipDeviceEnablePeerAccess(b, 0));
		}
	}
	c.report("GPU pairs with peer access", pairs - can, pairs);

	std::vector<int *> buf(ngpu), in(ngpu);
	std::vector<hipStream_t> st(ngpu);
	for (int g = 0; g < ngpu; g++) {
		HIP_CHECK(hipSetDevice(g));
		HIP_CHECK(hipMalloc(&buf[g], bytes));
		HIP_CHECK(hipMalloc(&in[g], bytes));
		HIP_CHECK(hipStreamCreate(&st[g]));
	}
	std::vector<int> h(n), want(n);
	for (int i = 0; i < n; i++)
		h[i] = want[i] = i ^ 0x5a5a;
	HIP_CHECK(hipSetDevice(0));
	HIP_CHECK(hipMemcpy(buf[0], h.data(), bytes, hipMemcpyHostToDevice));

	// The ring: GPU g receives from g-1 (hipMemcpyPeer for the first hop, async after),
	// transforms, and the last GPU's result comes back to GPU 0.
	for (int g = 1; g < ngpu; g++) {
		HIP_CHECK(hipSetDevice(g));
		if (g == 1)
			HIP_CHECK(hipMemcpyPeer(in[g], g, buf[g - 1], g - 1, bytes));
		else
			HIP_CHECK(hipMemcpyPeerAsync(in[g], g, buf[g - 1], g - 1, bytes, st[g]));
		hipLaunchKernelGGL(step, dim3(grid), dim3(block), 0, st[g], in[g], buf[g], g, n);
		HIP_CHECK(hipGetLastError());
		HIP_CHECK(hipStreamSynchronize(st[g]));
		for (int i = 0; i < n; i++)
			want[i] = want[i] * 3 + g;
	}
	HIP_CHECK(hipSetDevice(0));
	HIP_CHECK(hipMemcpyPeerAsync(in[0], 0, buf[ngpu - 1], ngpu - 1, bytes, st[0]));
	HIP_CHECK(hipStreamSynchronize(st[0]));
	HIP_CHECK(hipMemcpy(h.data(), in[0], bytes, hipMemcpyDeviceToHost));
	long bad = 0;
	for (int i = 0; i < n; i++)
		bad += h[i] != want[i];
	c.report("a ring of peer copies through every GPU", bad, n);

	// GPU 1's kernel adds its buffer into GPU 0's memory through the peer mapping.
	if (can == pairs) {
		HIP_CHECK(hipSetDevice(1));
		hipLaunchKernelGGL(add_into_peer, dim3(grid), dim3(block), 0, st[1], in[0], buf[1],
				   n);
		HIP_CHECK(hipGetLastError());
		HIP_CHECK(hipStreamSynchronize(st[1]));
		HIP_CHECK(hipSetDevice(0));
		HIP_CHECK(hipMemcpy(h.data(), in[0], bytes, hipMemcpyDeviceToHost));
		bad = 0;
		for (int i = 0; i < n; i++)
			bad += h[i] != want[i] + (((i ^ 0x5a5a) * 3) + 1);
		c.report("a kernel on GPU 1 updating GPU 0's memory", bad, n);
	}

	// A plain device-to-device hipMemcpy from the last GPU to GPU 0 (unified addressing).
	HIP_CHECK(hipMemcpy(buf[0] + 1, buf[ngpu - 1] + 3, bytes - 5 * sizeof(int),
			    hipMemcpyDeviceToDevice));
	std::vector<int> last(n);
	HIP_CHECK(hipSetDevice(ngpu - 1));
	HIP_CHECK(hipMemcpy(last.data(), buf[ngpu - 1], bytes, hipMemcpyDeviceToHost));
	HIP_CHECK(hipSetDevice(0));
	HIP_CHECK(hipMemcpy(h.data(), buf[0], bytes, hipMemcpyDeviceToHost));
	bad = h[0] != (0 ^ 0x5a5a);
	for (int i = 1; i < n - 4; i++)
		bad += h[i] != last[i + 2];
	c.report("hipMemcpy device-to-device between GPUs", bad, n - 4);

	for (int g = 0; g < ngpu; g++) {
		HIP_CHECK(hipSetDevice(g));
		HIP_CHECK(hipStreamDestroy(st[g]));
		HIP_CHECK(hipFree(buf[g]));
		HIP_CHECK(hipFree(in[g]));
	}
	return c.finish();
}
