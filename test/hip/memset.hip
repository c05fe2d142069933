// hipMemset, hipMemsetD32 and hipMemsetAsync (ROCclr's fill kernels) over odd sizes and
// offsets, checked byte for byte after a copy back.
#include "hip-test.h"
#include <cstring>
#include <vector>

static void check(const std::vector<unsigned char> &got, const std::vector<unsigned char> &want,
		  const char *what)
{
	for (size_t i = 0; i < want.size(); i++)
		if (got[i] != want[i])
			FAIL("memset: %s: byte %zu is %#x, expected %#x", what, i, got[i], want[i]);
}

int main()
{
	const size_t n = (1 << 20) + 37;
	unsigned char *d;
	CHECK(hipMalloc(&d, n));
	std::vector<unsigned char> want(n), got(n);

	CHECK(hipMemset(d, 0xa5, n));
	memset(want.data(), 0xa5, n);
	// An unaligned start and an odd length inside it.
	CHECK(hipMemset(d + 3, 0x17, 100001));
	memset(want.data() + 3, 0x17, 100001);
	CHECK(hipMemcpy(got.data(), d, n, hipMemcpyDeviceToHost));
	check(got, want, "hipMemset");

	CHECK(hipMemsetD32((hipDeviceptr_t)(d + 4096), 0x01020304, 4099));
	for (size_t i = 0; i < 4099; i++)
		memcpy(&want[4096 + 4 * i], "\x04\x03\x02\x01", 4);
	hipStream_t s;
	CHECK(hipStreamCreate(&s));
	CHECK(hipMemsetAsync(d + n - 5000, 0, 5000, s));
	memset(want.data() + n - 5000, 0, 5000);
	CHECK(hipStreamSynchronize(s));
	CHECK(hipMemcpy(got.data(), d, n, hipMemcpyDeviceToHost));
	check(got, want, "hipMemsetD32/hipMemsetAsync");
	CHECK(hipStreamDestroy(s));
	CHECK(hipFree(d));
	printf("memset: %zu bytes correct\n", n);
	return 0;
}
