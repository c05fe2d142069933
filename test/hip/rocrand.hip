// hipcc-flags: -O2 -lrocrand
// rocRAND (Debian's librocrand1) as a user's job calls it. The device API in our own kernel:
// Philox4x32-10 per thread (rocrand_init with the thread's subsequence), its raw words
// checked bit for bit against a host Philox written from the algorithm (Salmon et al., SC'11;
// the first block is also Random123's known answer), uniform floats and Box-Muller normals
// within a tolerance of the host's. The host API: rocRAND's Philox, XORWOW and MRG32k3a
// generators fill device memory with uniform and normal floats; same seed, same numbers;
// another seed, other numbers (Philox); the moments and a chi-square of the uniforms fit.
#include "check.h"

#include <rocrand/rocrand.h>
#include <rocrand/rocrand_kernel.h>

#include <vector>

#define RAND_CHECK(call)                                                                  \
	do {                                                                              \
		rocrand_status st_ = (call);                                              \
		if (st_ != ROCRAND_STATUS_SUCCESS) {                                      \
			fprintf(stderr, "%s:%d: %s: rocrand status %d\n", __FILE__, __LINE__, \
				#call, (int)st_);                                         \
			exit(2);                                                          \
		}                                                                         \
	} while (0)

// Thread i: eight raw words of subsequence i, then a uniform and a normal float.
__global__ void philox_words(unsigned long long seed, unsigned *words, float *uni, float *nrm,
			     int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	rocrand_state_philox4x32_10 st;
	rocrand_init(seed, i, 0, &st);
	for (int k = 0; k < 8; k++)
		words[i * 8 + k] = rocrand(&st);
	uni[i] = rocrand_uniform(&st);
	nrm[i] = rocrand_normal(&st);
}

// Philox4x32-10 of one counter under one key, from the published algorithm.
static void philox(const uint32_t ctr[4], uint32_t k0, uint32_t k1, uint32_t out[4])
{
	uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
		c0 = n0, c1 = n1, c2 = n2, c3 = n3;
		k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
	}
	out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

// The words of Philox subsequence `sub` from its start: block b of 4 words is the
// counter {b, 0, sub_lo, sub_hi}.
static void philox_stream(uint64_t seed, uint64_t sub, uint32_t *out, int blocks)
{
	for (int b = 0; b < blocks; b++) {
		uint32_t ctr[4] = {(uint32_t)b, 0, (uint32_t)sub, (uint32_t)(sub >> 32)};
		philox(ctr, (uint32_t)seed, (uint32_t)(seed >> 32), out + 4 * b);
	}
}

static void device_api(Check &c)
{
	const int n = 5000;
	const unsigned long long seed = 0x0123456789abcdefull;
	unsigned *dw;
	float *du, *dn;
	HIP_CHECK(hipMalloc(&dw, n * 8 * sizeof(unsigned)));
	HIP_CHECK(hipMalloc(&du, n * sizeof(float)));
	HIP_CHECK(hipMalloc(&dn, n * sizeof(float)));
	hipLaunchKernelGGL(philox_words, dim3((n + 127) / 128), dim3(128), 0, 0, seed, dw, du, dn,
			   n);
	HIP_CHECK(hipGetLastError());
	std::vector<unsigned> w(n * 8);
	std::vector<float> u(n), z(n);
	host_copy(w.data(), dw, w.size());
	host_copy(u.data(), du, n);
	host_copy(z.data(), dn, n);

	uint32_t kat[4], zero[4] = {0, 0, 0, 0};
	philox(zero, 0, 0, kat);
	c.expect("the host Philox gives Random123's known answer",
		 kat[0] == 0x6627e8d5 && kat[1] == 0xe169c58d && kat[2] == 0xbc57ac4c &&
			 kat[3] == 0x9b00dbd8);
	long bad_w = 0, bad_u = 0, bad_n = 0;
	for (int i = 0; i < n; i++) {
		uint32_t want[12];
		philox_stream(seed, i, want, 3);
		for (int k = 0; k < 8; k++)
			bad_w += w[i * 8 + k] != want[k];
		// rocRAND's uniform: (0, 1], (word + 1) * 2^-32.
		const double step = 2.3283064365386963e-10;
		bad_u += !close_to(u[i], (want[8] + 1.0) * step, 1e-6);
		// Box-Muller of the next two words: the sine half comes first.
		double r = sqrt(-2.0 * log((want[9] + 1.0) * step));
		double zs = r * sin(2.0 * M_PI * (want[10] + 1.0) * step);
		bad_n += !close_to(z[i], zs, 1e-4);
	}
	c.report("device Philox words against the host's, bit for bit", bad_w, n * 8L);
	c.report("device rocrand_uniform", bad_u, n);
	c.report("device rocrand_normal (Box-Muller)", bad_n, n);
	HIP_CHECK(hipFree(dw));
	HIP_CHECK(hipFree(du));
	HIP_CHECK(hipFree(dn));
}

// A rocRAND generator of `type` seeded with `seed`, filling device memory.
struct Generator {
	rocrand_generator g;
	float *d = nullptr;
	size_t n;

	Generator(rocrand_rng_type type, unsigned long long seed, size_t count) : n(count)
	{
		RAND_CHECK(rocrand_create_generator(&g, type));
		RAND_CHECK(rocrand_set_seed(g, seed));
		HIP_CHECK(hipMalloc(&d, n * sizeof(float)));
	}
	~Generator()
	{
		HIP_CHECK(hipFree(d));
		RAND_CHECK(rocrand_destroy_generator(g));
	}
	// The next n floats of its sequence: uniform, or normal when `normal`.
	std::vector<float> next(bool normal)
	{
		if (normal)
			RAND_CHECK(rocrand_generate_normal(g, d, n, 0.0f, 1.0f));
		else
			RAND_CHECK(rocrand_generate_uniform(g, d, n));
		HIP_CHECK(hipDeviceSynchronize());
		std::vector<float> h(n);
		host_copy(h.data(), d, n);
		return h;
	}
};

// Mean, variance, range and a 64-bin chi-square of uniforms in (0, 1].
static void check_uniform(Check &c, const char *name, const std::vector<float> &u)
{
	const int bins = 64;
	std::vector<long> hist(bins);
	double sum = 0, sq = 0;
	long out_of_range = 0;
	for (float x : u) {
		out_of_range += !(x > 0.0f && x <= 1.0f);
		sum += x, sq += (double)x * x;
		hist[std::min(bins - 1, (int)(x * bins))]++;
	}
	double n = u.size(), mean = sum / n, var = sq / n - mean * mean, chi = 0;
	for (long h : hist)
		chi += (h - n / bins) * (h - n / bins) / (n / bins);
	char what[160];
	snprintf(what, sizeof(what), "%s uniform: in (0,1], mean %.4f, variance %.4f, chi2(63) %.1f",
		 name, mean, var, chi);
	// chi2 with 63 degrees of freedom exceeds 110 with probability < 1e-4.
	c.report(what, out_of_range + (fabs(mean - 0.5) > 0.005) + (fabs(var - 1.0 / 12) > 0.002) +
			       (chi > 110), (long)u.size());
}

static void check_normal(Check &c, const char *name, const std::vector<float> &z)
{
	double sum = 0, sq = 0;
	long nonfinite = 0, within1 = 0;
	for (float x : z) {
		nonfinite += !std::isfinite(x);
		sum += x, sq += (double)x * x;
		within1 += fabs(x) < 1.0f;
	}
	double n = z.size(), mean = sum / n, sd = sqrt(sq / n - mean * mean), frac = within1 / n;
	char what[160];
	snprintf(what, sizeof(what), "%s normal: mean %.4f, stddev %.4f, %.4f within 1 sigma", name,
		 mean, sd, frac);
	c.report(what, nonfinite + (fabs(mean) > 0.01) + (fabs(sd - 1) > 0.01) +
			       (fabs(frac - 0.682689) > 0.006), (long)z.size());
}

// Philox: the same seed gives the same numbers, another seed others. XORWOW (rocRAND's
// default) and MRG32k3a, whose state setup jumps every thread's state ahead on the device:
// uniforms, then normals, from one generator each (a setup costs the emulator seconds).
static void host_api(Check &c)
{
	const size_t n = 1 << 18;
	{
		Generator a(ROCRAND_RNG_PSEUDO_PHILOX4_32_10, 1234, n);
		Generator b(ROCRAND_RNG_PSEUDO_PHILOX4_32_10, 1234, n);
		Generator o(ROCRAND_RNG_PSEUDO_PHILOX4_32_10, 4321, n);
		std::vector<float> ua = a.next(false), ub = b.next(false), uo = o.next(false);
		c.report("philox: the same seed gives the same numbers",
			 memcmp(ua.data(), ub.data(), n * sizeof(float)) != 0, 1);
		long same = 0;
		for (size_t i = 0; i < n; i++)
			same += ua[i] == uo[i];
		c.report("philox: another seed gives other numbers", same > (long)n / 1000, (long)n);
		check_uniform(c, "philox", ua);
		check_normal(c, "philox", a.next(true));
	}
	const struct {
		rocrand_rng_type type;
		const char *name;
	} gens[] = {
		{ROCRAND_RNG_PSEUDO_XORWOW, "xorwow"},
		{ROCRAND_RNG_PSEUDO_MRG32K3A, "mrg32k3a"},
	};
	for (auto &t : gens) {
		Generator g(t.type, 99, n);
		check_uniform(c, t.name, g.next(false));
		check_normal(c, t.name, g.next(true));
	}
}

int main()
{
	Check c("rocrand");
	device_api(c);
	host_api(c);
	return c.finish();
}
