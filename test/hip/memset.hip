// hipMemset, hipMemsetD32 and hipMemsetAsync (ROCclr's fill kernels) over odd sizes and
// offsets, checked byte for byte after a copy back.
#include "check.h"

#include <vector>

static long differ(const std::vector<unsigned char> &got, const std::vector<unsigned char> &want)
{
	long bad = 0;
	for (size_t i = 0; i < want.size(); i++)
		bad += got[i] != want[i];
	return bad;
}

int main()
{
	Check c("memset");
	const size_t n = (1 << 20) + 37;
	unsigned char *d;
	HIP_CHECK(hipMalloc(&d, n));
	std::vector<unsigned char> want(n), got(n);

	HIP_CHECK(hipMemset(d, 0xa5, n));
	memset(want.data(), 0xa5, n);
	// An unaligned start and an odd length inside it.
	HIP_CHECK(hipMemset(d + 3, 0x17, 100001));
	memset(want.data() + 3, 0x17, 100001);
	host_copy(got.data(), d, n);
	c.report("hipMemset bytes", differ(got, want), n);

	HIP_CHECK(hipMemsetD32((hipDeviceptr_t)(d + 4096), 0x01020304, 4099));
	for (size_t i = 0; i < 4099; i++)
		memcpy(&want[4096 + 4 * i], "\x04\x03\x02\x01", 4);
	hipStream_t s;
	HIP_CHECK(hipStreamCreate(&s));
	HIP_CHECK(hipMemsetAsync(d + n - 5000, 0, 5000, s));
	memset(want.data() + n - 5000, 0, 5000);
	HIP_CHECK(hipStreamSynchronize(s));
	host_copy(got.data(), d, n);
	c.report("hipMemsetD32 and hipMemsetAsync bytes", differ(got, want), n);
	HIP_CHECK(hipStreamDestroy(s));
	HIP_CHECK(hipFree(d));
	return c.finish();
}
