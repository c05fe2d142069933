// gfx942's 8-bit floats and xf32 (HIP 6.4 on MI300X): f32 -> fp8 (E4M3FNUZ) -> f32 with
// __builtin_amdgcn_cvt_pk_fp8_f32 and __builtin_amdgcn_cvt_f32_fp8 against a host rounding
// (nearest even by a search of all 255 codes; NaN, infinities and magnitudes above 240 give
// the NaN code 0x80), a 16x16x32 product with __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8 and
// a 16x16x8 one with __builtin_amdgcn_mfma_f32_16x16x8_xf32 (inputs carry noise in the 13
// mantissa bits xf32 drops: the hardware truncates them), each against the host exactly.
// Layouts: A's lane i + 16g holds row i, k = 8g..8g+7 (fp8; 2g, 2g+1 for xf32), B's lane
// j + 16g column j alike; D's register r of lane l holds row 4(l/16) + r, column l%16.
// hip-test: needs-isa gfx942
#include "check.h"

#include <vector>

typedef float floatx4 __attribute__((ext_vector_type(4)));
typedef float floatx2 __attribute__((ext_vector_type(2)));

__global__ void round_trip(const float *x, unsigned *codes, float *back, int pairs)
{
#if defined(__gfx942__)
	int t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= pairs)
		return;
	int pk = __builtin_amdgcn_cvt_pk_fp8_f32(x[2 * t], x[2 * t + 1], 0, false);
	codes[t] = pk;
	back[2 * t] = __builtin_amdgcn_cvt_f32_fp8(pk, 0);
	back[2 * t + 1] = __builtin_amdgcn_cvt_f32_fp8(pk, 1);
#else
	__builtin_trap();
#endif
}

// a: 16 rows of 32 fp8 codes; bt: 16 columns of 32 codes (B transposed); c: 16x16.
__global__ void mfma_fp8(const long *a, const long *bt, float *c)
{
#if defined(__gfx942__)
	int l = threadIdx.x;
	floatx4 d = {0, 0, 0, 0};
	d = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a[(l % 16) * 4 + l / 16],
						       bt[(l % 16) * 4 + l / 16], d, 0, 0, 0);
	for (int r = 0; r < 4; r++)
		c[(4 * (l / 16) + r) * 16 + l % 16] = d[r];
#else
	__builtin_trap();
#endif
}

// a: 16x8, bt: 16 columns of 8 (B transposed), c: 16x16.
__global__ void mfma_xf32(const float *a, const float *bt, float *c)
{
#if defined(__gfx942__)
	int l = threadIdx.x, k = 2 * (l / 16);
	floatx2 x = {a[(l % 16) * 8 + k], a[(l % 16) * 8 + k + 1]};
	floatx2 y = {bt[(l % 16) * 8 + k], bt[(l % 16) * 8 + k + 1]};
	floatx4 d = {0, 0, 0, 0};
	d = __builtin_amdgcn_mfma_f32_16x16x8_xf32(x, y, d, 0, 0, 0);
	for (int r = 0; r < 4; r++)
		c[(4 * (l / 16) + r) * 16 + l % 16] = d[r];
#else
	__builtin_trap();
#endif
}

// The value of E4M3FNUZ code c (bias 8, three mantissa bits); NaN for 0x80.
static double fp8_value(unsigned c)
{
	if (c == 0x80)
		return NAN;
	int e = (c >> 3) & 15, m = c & 7;
	double v = e ? std::ldexp(1.0 + m / 8.0, e - 8) : std::ldexp(m / 8.0, -7);
	return c & 0x80 ? -v : v;
}

// Round to nearest even by search.
static unsigned fp8_nearest(float x)
{
	if (!std::isfinite(x) || std::fabs(x) > 240.0f)
		return 0x80;
	unsigned best = 0;
	for (unsigned c = 0; c < 256; c++) {
		if (c == 0x80)
			continue;
		double d = std::fabs(fp8_value(c) - x), db = std::fabs(fp8_value(best) - x);
		if (d < db || (d == db && !(c & 1) && (best & 1)))
			best = c;
	}
	return fp8_value(best) == 0 ? 0 : best;
}

template <typename T> static T *to_device(const std::vector<T> &v)
{
	T *d;
	HIP_CHECK(hipMalloc(&d, v.size() * sizeof(T)));
	HIP_CHECK(hipMemcpy(d, v.data(), v.size() * sizeof(T), hipMemcpyHostToDevice));
	return d;
}

template <typename T> static std::vector<T> from_device(T *d, size_t n)
{
	std::vector<T> v(n);
	HIP_CHECK(hipDeviceSynchronize());
	HIP_CHECK(hipMemcpy(v.data(), d, n * sizeof(T), hipMemcpyDeviceToHost));
	HIP_CHECK(hipFree(d));
	return v;
}

static long check_round_trip()
{
	Rng rng(42);
	std::vector<float> x = {240.0f, -240.0f, 241.0f, 1e-9f, -0.0f, 0.0f, INFINITY, NAN,
				0.0009765625f, 0.00048828125f, 0.000732421875f, 17.0f};
	for (int i = 0; i < 2036; i++)
		x.push_back(rng.uniform(-1, 1) * std::ldexp(1.0f, (int)(rng.next() % 20) - 12));
	int pairs = (int)x.size() / 2;
	float *dx = to_device(x), *dback;
	unsigned *dcodes;
	HIP_CHECK(hipMalloc(&dcodes, pairs * sizeof(unsigned)));
	HIP_CHECK(hipMalloc(&dback, x.size() * sizeof(float)));
	hipLaunchKernelGGL(round_trip, dim3((pairs + 255) / 256), dim3(256), 0, 0, dx, dcodes,
			   dback, pairs);
	HIP_CHECK(hipGetLastError());
	std::vector<unsigned> codes = from_device(dcodes, pairs);
	std::vector<float> back = from_device(dback, x.size());
	HIP_CHECK(hipFree(dx));
	long bad = 0;
	for (size_t i = 0; i < x.size(); i++) {
		unsigned want = fp8_nearest(x[i]), got = (codes[i / 2] >> (8 * (i % 2))) & 0xff;
		double v = fp8_value(want);
		bool ok = got == want && (std::isnan(v) ? std::isnan(back[i]) : back[i] == (float)v);
		if (!ok && bad++ < 5)
			printf("fp8: %a: code %#x, want %#x; back %a\n", x[i], got, want, back[i]);
	}
	return bad;
}

// Small values whose fp8 codes are exact: every product and sum below is exact in f32.
static const float small[] = {0.5f, -1.5f, 2.0f, -0.25f, 3.0f, 0.0f, 1.25f};

static long check_fp8_mfma()
{
	std::vector<unsigned char> a(16 * 32), bt(16 * 32);
	for (int i = 0; i < 16; i++)
		for (int k = 0; k < 32; k++) {
			a[i * 32 + k] = fp8_nearest(small[(i * 3 + k * 5) % 7]);
			bt[i * 32 + k] = fp8_nearest(small[(k * 2 + i * 7 + 1) % 7]);
		}
	std::vector<long> a64(64), b64(64);
	memcpy(a64.data(), a.data(), a.size());
	memcpy(b64.data(), bt.data(), bt.size());
	long *da = to_device(a64), *db = to_device(b64);
	float *dc;
	HIP_CHECK(hipMalloc(&dc, 256 * sizeof(float)));
	hipLaunchKernelGGL(mfma_fp8, dim3(1), dim3(64), 0, 0, da, db, dc);
	HIP_CHECK(hipGetLastError());
	std::vector<float> c = from_device(dc, 256);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	long bad = 0;
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 16; j++) {
			double want = 0;
			for (int k = 0; k < 32; k++)
				want += fp8_value(a[i * 32 + k]) * fp8_value(bt[j * 32 + k]);
			bad += c[i * 16 + j] != (float)want;
		}
	return bad;
}

static float truncate_xf32(float x)
{
	unsigned u;
	memcpy(&u, &x, 4);
	u &= ~0x1fffu;
	memcpy(&x, &u, 4);
	return x;
}

static long check_xf32_mfma()
{
	std::vector<float> a(16 * 8), bt(16 * 8);
	for (int i = 0; i < 16; i++)
		for (int k = 0; k < 8; k++) {
			// Small values with noise in the 13 bits xf32 drops.
			a[i * 8 + k] = small[(i * 3 + k * 5) % 7] * (1.0f + 0x1.8p-20f);
			bt[i * 8 + k] = small[(k * 2 + i * 7 + 1) % 7] * (1.0f + 0x1p-17f);
		}
	float *da = to_device(a), *db = to_device(bt), *dc;
	HIP_CHECK(hipMalloc(&dc, 256 * sizeof(float)));
	hipLaunchKernelGGL(mfma_xf32, dim3(1), dim3(64), 0, 0, da, db, dc);
	HIP_CHECK(hipGetLastError());
	std::vector<float> c = from_device(dc, 256);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	long bad = 0;
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 16; j++) {
			double want = 0;
			for (int k = 0; k < 8; k++)
				want += (double)truncate_xf32(a[i * 8 + k]) * truncate_xf32(bt[j * 8 + k]);
			if (c[i * 16 + j] != (float)want && bad++ < 3)
				printf("fp8: xf32 D[%d][%d] = %a, want %a\n", i, j, c[i * 16 + j], want);
		}
	return bad;
}

int main()
{
	Check c("fp8");
	hipDeviceProp_t prop;
	HIP_CHECK(hipGetDeviceProperties(&prop, 0));
	if (strncmp(prop.gcnArchName, "gfx942", 6) != 0) {
		printf("fp8: fp8 and xf32 need gfx942; device 0 is %s\n", prop.gcnArchName);
		return 1;
	}
	c.report("f32 -> fp8 -> f32 with v_cvt_pk_fp8_f32 and v_cvt_f32_fp8 (nearest even)",
		 check_round_trip(), 2048);
	c.report("16x16x32 product with v_mfma_f32_16x16x32_fp8_fp8 (exact)", check_fp8_mfma(), 256);
	c.report("16x16x8 product with v_mfma_f32_16x16x8_xf32 (inputs truncated, exact)",
		 check_xf32_mfma(), 256);
	return c.finish();
}
