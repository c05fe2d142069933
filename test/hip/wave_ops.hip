// Wave-level operations on 64-lane waves: __shfl (read any lane, a constant lane as
// readlane does), __shfl_up/down/xor, __ballot, __any/__all, __popcll, lane ids.
#include "check.h"

#define WAVES 4

struct Lane {
	int from_rev, from_lane5, up3, down7, xor9, lane;
	unsigned long long ballot;
	int any, all, pop;
};

__global__ void wave_ops(const int *x, Lane *o)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	int v = x[i], lane = __lane_id();
	Lane r;
	r.lane = lane;
	r.from_rev = __shfl(v, 63 - lane);
	r.from_lane5 = __shfl(v, 5);
	r.up3 = __shfl_up(v, 3);
	r.down7 = __shfl_down(v, 7);
	r.xor9 = __shfl_xor(v, 9);
	r.ballot = __ballot(v & 1);
	r.any = __any(v == 42);
	r.all = __all(v >= 0);
	r.pop = (int)__popcll(__ballot(v % 3 == 0));
	o[i] = r;
}

int main()
{
	Check c("wave_ops");
	int dev;
	hipDeviceProp_t prop;
	HIP_CHECK(hipGetDevice(&dev));
	HIP_CHECK(hipGetDeviceProperties(&prop, dev));
	c.expect("warpSize is 64", prop.warpSize == 64);
	const int n = 64 * WAVES;
	int *x = new int[n];
	Rng r(29);
	for (int i = 0; i < n; i++)
		x[i] = (int)(r.next() % 1000) - (i / 64 == 2 ? 500 : 0);
	x[64 + 17] = 42;
	int *dx = device_copy(x, n);
	Lane *dout, *out = new Lane[n];
	HIP_CHECK(hipMalloc(&dout, n * sizeof(Lane)));
	hipLaunchKernelGGL(wave_ops, dim3(2), dim3(n / 2), 0, 0, dx, dout);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(out, dout, n);
	long bad_shfl = 0, bad_vote = 0;
	for (int w = 0; w < WAVES; w++) {
		const int *xv = x + 64 * w;
		unsigned long long ballot = 0, thirds = 0;
		bool any = false, all = true;
		for (int l = 0; l < 64; l++) {
			ballot |= (unsigned long long)(xv[l] & 1) << l;
			thirds |= (unsigned long long)(xv[l] % 3 == 0) << l;
			any |= xv[l] == 42;
			all &= xv[l] >= 0;
		}
		for (int l = 0; l < 64; l++) {
			const Lane &o = out[64 * w + l];
			bad_shfl += o.lane != l;
			bad_shfl += o.from_rev != xv[63 - l];
			bad_shfl += o.from_lane5 != xv[5];
			bad_shfl += o.up3 != xv[l >= 3 ? l - 3 : l];
			bad_shfl += o.down7 != xv[l + 7 < 64 ? l + 7 : l];
			bad_shfl += o.xor9 != xv[l ^ 9];
			bad_vote += o.ballot != ballot;
			bad_vote += o.any != (int)any;
			bad_vote += o.all != (int)all;
			bad_vote += o.pop != __builtin_popcountll(thirds);
		}
	}
	c.report("lane id, __shfl (any lane, constant lane), __shfl_up/down/xor", bad_shfl, 6L * n);
	c.report("__ballot, __any, __all, __popcll of a ballot", bad_vote, 4L * n);
	HIP_CHECK(hipFree(dx));
	HIP_CHECK(hipFree(dout));
	return c.finish();
}
