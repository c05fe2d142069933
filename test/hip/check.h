// Shared by the self-checking HIP programs of test/hip: HIP error checks and the tally of
// host-reference comparisons. Each program prints one line per check and exits 1 on any
// mismatch (2 on a HIP error), 0 when everything matched.
#pragma once

#include <hip/hip_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define HIP_CHECK(call)                                                                  \
	do {                                                                             \
		hipError_t err_ = (call);                                                \
		if (err_ != hipSuccess) {                                                \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,    \
				hipGetErrorString(err_));                                \
			exit(2);                                                         \
		}                                                                        \
	} while (0)

// Counts mismatches of one named check and prints its verdict.
struct Check {
	const char *prog;
	int failed_checks = 0;

	explicit Check(const char *p) : prog(p) {}

	// `bad` of `n` compared values differ from the host reference.
	void report(const char *what, long bad, long n)
	{
		printf("%s: %s: %ld values checked, %ld mismatches: %s\n", prog, what, n, bad,
		       bad ? "FAIL" : "ok");
		if (bad)
			failed_checks++;
	}

	// A single condition.
	void expect(const char *what, bool ok)
	{
		report(what, ok ? 0 : 1, 1);
	}

	int finish()
	{
		printf("%s: %s\n", prog, failed_checks ? "FAILED" : "PASSED");
		return failed_checks ? 1 : 0;
	}
};

// |got - want| within an absolute-or-relative tolerance; NaN matches NaN.
static inline bool close_to(double got, double want, double tol)
{
	if (std::isnan(want))
		return std::isnan(got);
	if (std::isinf(want))
		return got == want;
	return std::fabs(got - want) <= tol * std::fmax(1.0, std::fabs(want));
}

// A small deterministic generator for test data (xorshift32).
struct Rng {
	uint32_t s;
	explicit Rng(uint32_t seed) : s(seed ? seed : 1) {}
	uint32_t next()
	{
		s ^= s << 13;
		s ^= s >> 17;
		s ^= s << 5;
		return s;
	}
	// Uniform in [lo, hi).
	float uniform(float lo, float hi)
	{
		return lo + (hi - lo) * (float)(next() >> 8) / 16777216.0f;
	}
};

template <typename T> static T *device_copy(const T *host, size_t n)
{
	T *d = nullptr;
	HIP_CHECK(hipMalloc(&d, n * sizeof(T)));
	HIP_CHECK(hipMemcpy(d, host, n * sizeof(T), hipMemcpyHostToDevice));
	return d;
}

template <typename T> static void host_copy(T *host, const T *dev, size_t n)
{
	HIP_CHECK(hipMemcpy(host, dev, n * sizeof(T), hipMemcpyDeviceToHost));
}
