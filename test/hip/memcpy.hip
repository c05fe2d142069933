// hipMemcpy host->device, device->host and device->device on one GPU (ROCclr's copy kernels
// or SDMA), hipMemcpyAsync on a stream, unaligned offsets and odd sizes; every byte checked.
#include "hip-test.h"
#include <cstring>
#include <vector>

int main()
{
	const size_t n = (4 << 20) + 13;
	std::vector<unsigned char> src(n), got(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)(i * 7 + (i >> 11));
	unsigned char *a, *b;
	CHECK(hipMalloc(&a, n));
	CHECK(hipMalloc(&b, n));
	CHECK(hipMemcpy(a, src.data(), n, hipMemcpyHostToDevice));
	CHECK(hipMemcpy(b, a, n, hipMemcpyDeviceToDevice));
	CHECK(hipMemcpy(got.data(), b, n, hipMemcpyDeviceToHost));
	if (memcmp(got.data(), src.data(), n) != 0)
		FAIL("memcpy: host->device->device->host differs");

	// Unaligned device->device within one buffer's range, then async on a stream.
	CHECK(hipMemcpy(b + 1, a + 5, 777777, hipMemcpyDeviceToDevice));
	hipStream_t s;
	CHECK(hipStreamCreate(&s));
	std::vector<unsigned char> tail(4099);
	CHECK(hipMemcpyAsync(tail.data(), b + 1, tail.size(), hipMemcpyDeviceToHost, s));
	CHECK(hipStreamSynchronize(s));
	if (memcmp(tail.data(), src.data() + 5, tail.size()) != 0)
		FAIL("memcpy: unaligned device->device copy differs");
	CHECK(hipMemcpy(got.data(), b, n, hipMemcpyDeviceToHost));
	if (memcmp(got.data() + 1, src.data() + 5, 777777) != 0 || got[0] != src[0] ||
	    memcmp(got.data() + 777778, src.data() + 777778, n - 777778) != 0)
		FAIL("memcpy: device->device copy touched bytes outside its range");
	CHECK(hipStreamDestroy(s));
	CHECK(hipFree(a));
	CHECK(hipFree(b));
	printf("memcpy: %zu bytes correct in every direction\n", n);
	return 0;
}
