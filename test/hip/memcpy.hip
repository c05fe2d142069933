// hipMemcpy host->device, device->host and device->device on one GPU (ROCclr's copy kernels
// or SDMA), hipMemcpyAsync on a stream, unaligned offsets and odd sizes; every byte checked.
#include "check.h"

#include <vector>

int main()
{
	Check c("memcpy");
	const size_t n = (4 << 20) + 13, part = 777777;
	std::vector<unsigned char> src(n), got(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)(i * 7 + (i >> 11));
	unsigned char *a = device_copy(src.data(), n), *b;
	HIP_CHECK(hipMalloc(&b, n));
	HIP_CHECK(hipMemcpy(b, a, n, hipMemcpyDeviceToDevice));
	host_copy(got.data(), b, n);
	c.expect("host->device->device->host", memcmp(got.data(), src.data(), n) == 0);

	// Unaligned device->device within one buffer's range, then async on a stream.
	HIP_CHECK(hipMemcpy(b + 1, a + 5, part, hipMemcpyDeviceToDevice));
	hipStream_t s;
	HIP_CHECK(hipStreamCreate(&s));
	std::vector<unsigned char> tail(4099);
	HIP_CHECK(hipMemcpyAsync(tail.data(), b + 1, tail.size(), hipMemcpyDeviceToHost, s));
	HIP_CHECK(hipStreamSynchronize(s));
	c.expect("unaligned device->device, async device->host",
		 memcmp(tail.data(), src.data() + 5, tail.size()) == 0);
	host_copy(got.data(), b, n);
	c.expect("the unaligned copy's whole range", memcmp(got.data() + 1, src.data() + 5, part) == 0);
	c.expect("no byte outside it", got[0] == src[0] &&
		 memcmp(got.data() + part + 1, src.data() + part + 1, n - part - 1) == 0);
	HIP_CHECK(hipStreamDestroy(s));
	HIP_CHECK(hipFree(a));
	HIP_CHECK(hipFree(b));
	return c.finish();
}
