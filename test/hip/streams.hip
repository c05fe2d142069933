// Several streams ordered by events, as a user's pipeline is: a producer stream held back by
// a host flag, consumers that hipStreamWaitEvent on its event (they must not run before it),
// a diamond of four streams joined by events, hipEventSynchronize/Query/ElapsedTime, and a
// stream callback; every result checked on the host.
#include "check.h"

#include <unistd.h>
#include <vector>

// Waits for the host's flag, then writes x[i] = i * 3 + 1.
__global__ void produce(volatile int *flag, int *x, int n)
{
	if (threadIdx.x == 0)
		while (*flag == 0)
			;
	__syncthreads();
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] = i * 3 + 1;
}

// y[i] = x[i] * k + c.
__global__ void affine(const int *x, int *y, int k, int c, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = x[i] * k + c;
}

// z[i] = a[i] + b[i].
__global__ void join(const int *a, const int *b, int *z, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		z[i] = a[i] + b[i];
}

static void on_done(hipStream_t, hipError_t status, void *arg)
{
	*(int *)arg = status == hipSuccess ? 1 : -1;
}

static long count_bad(const std::vector<int> &got, int (*want)(int))
{
	long bad = 0;
	for (size_t i = 0; i < got.size(); i++)
		bad += got[i] != want((int)i);
	return bad;
}

int main()
{
	Check c("streams");
	const int n = 100003, block = 256, grid = (n + block - 1) / block;
	const size_t bytes = n * sizeof(int);
	int *flag, *x, *y, *z, *w, *v;
	HIP_CHECK(hipHostMalloc(&flag, sizeof(int)));
	*flag = 0;
	HIP_CHECK(hipMalloc(&x, bytes));
	HIP_CHECK(hipMalloc(&y, bytes));
	HIP_CHECK(hipMalloc(&z, bytes));
	HIP_CHECK(hipMalloc(&w, bytes));
	HIP_CHECK(hipMalloc(&v, bytes));
	hipStream_t s[4];
	for (auto &st : s)
		HIP_CHECK(hipStreamCreateWithFlags(&st, hipStreamNonBlocking));
	hipEvent_t produced, left, right, t0, t1;
	HIP_CHECK(hipEventCreate(&produced));
	HIP_CHECK(hipEventCreate(&left));
	HIP_CHECK(hipEventCreate(&right));
	HIP_CHECK(hipEventCreate(&t0));
	HIP_CHECK(hipEventCreate(&t1));

	// s0 produces x once the host says so; s1 and s2 wait on its event.
	HIP_CHECK(hipEventRecord(t0, s[0]));
	hipLaunchKernelGGL(produce, dim3(grid), dim3(block), 0, s[0], flag, x, n);
	HIP_CHECK(hipGetLastError());
	HIP_CHECK(hipEventRecord(produced, s[0]));
	HIP_CHECK(hipStreamWaitEvent(s[1], produced, 0));
	hipLaunchKernelGGL(affine, dim3(grid), dim3(block), 0, s[1], x, y, 2, 5, n);
	HIP_CHECK(hipEventRecord(left, s[1]));
	HIP_CHECK(hipStreamWaitEvent(s[2], produced, 0));
	hipLaunchKernelGGL(affine, dim3(grid), dim3(block), 0, s[2], x, z, -1, 7, n);
	HIP_CHECK(hipEventRecord(right, s[2]));
	// s3 joins both branches.
	HIP_CHECK(hipStreamWaitEvent(s[3], left, 0));
	HIP_CHECK(hipStreamWaitEvent(s[3], right, 0));
	hipLaunchKernelGGL(join, dim3(grid), dim3(block), 0, s[3], y, z, w, n);
	HIP_CHECK(hipGetLastError());
	int called = 0;
	HIP_CHECK(hipStreamAddCallback(s[3], on_done, &called, 0));
	HIP_CHECK(hipEventRecord(t1, s[3]));

	usleep(300 * 1000);
	c.expect("the producer waits for the host", hipEventQuery(produced) == hipErrorNotReady);
	c.expect("the consumers wait for the producer's event",
		 hipStreamQuery(s[1]) == hipErrorNotReady &&
			 hipStreamQuery(s[2]) == hipErrorNotReady);
	c.expect("the join waits for both branches", hipEventQuery(t1) == hipErrorNotReady &&
							     called == 0);
	__atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
	HIP_CHECK(hipEventSynchronize(left));
	std::vector<int> h(n);
	HIP_CHECK(hipMemcpy(h.data(), y, bytes, hipMemcpyDeviceToHost));
	c.report("a consumer after hipEventSynchronize", count_bad(h, [](int i) {
			 return (i * 3 + 1) * 2 + 5;
		 }), n);
	HIP_CHECK(hipEventSynchronize(t1));
	c.expect("the events have completed", hipEventQuery(produced) == hipSuccess &&
						      hipEventQuery(right) == hipSuccess &&
						      hipEventQuery(t1) == hipSuccess);
	HIP_CHECK(hipMemcpy(h.data(), w, bytes, hipMemcpyDeviceToHost));
	c.report("the join of both branches", count_bad(h, [](int i) {
			 return (i * 3 + 1) * 2 + 5 + 7 - (i * 3 + 1);
		 }), n);
	HIP_CHECK(hipStreamSynchronize(s[3]));
	c.expect("the stream callback ran after the join", called == 1);
	float ms = -1;
	HIP_CHECK(hipEventElapsedTime(&ms, t0, t1));
	c.expect("the elapsed time covers the host's wait", ms >= 250.0f && ms < 600000.0f);

	// A ping-pong between two streams through events, with async copies in between:
	// v = ((x + 1) * 2 + 1) * 2 + 1 ... eight rounds, each on the other stream.
	HIP_CHECK(hipMemcpyAsync(v, x, bytes, hipMemcpyDeviceToDevice, s[0]));
	hipEvent_t e[8];
	for (int r = 0; r < 8; r++) {
		hipStream_t st = s[r & 1];
		HIP_CHECK(hipEventCreateWithFlags(&e[r], hipEventDisableTiming));
		if (r > 0)
			HIP_CHECK(hipStreamWaitEvent(st, e[r - 1], 0));
		hipLaunchKernelGGL(affine, dim3(grid), dim3(block), 0, st, v, v, 2, 1, n);
		HIP_CHECK(hipEventRecord(e[r], st));
	}
	HIP_CHECK(hipStreamWaitEvent(s[2], e[7], 0));
	HIP_CHECK(hipMemcpyAsync(h.data(), v, bytes, hipMemcpyDeviceToHost, s[2]));
	HIP_CHECK(hipStreamSynchronize(s[2]));
	c.report("eight rounds across two streams", count_bad(h, [](int i) {
			 int a = i * 3 + 1;
			 for (int r = 0; r < 8; r++)
				 a = a * 2 + 1;
			 return a;
		 }), n);

	for (auto &ev : e)
		HIP_CHECK(hipEventDestroy(ev));
	for (auto ev : {produced, left, right, t0, t1})
		HIP_CHECK(hipEventDestroy(ev));
	for (auto &st : s)
		HIP_CHECK(hipStreamDestroy(st));
	for (int *p : {x, y, z, w, v})
		HIP_CHECK(hipFree(p));
	HIP_CHECK(hipHostFree(flag));
	return c.finish();
}
