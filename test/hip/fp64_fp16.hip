// fp64 and fp16 arithmetic and conversions against the host: f64 fma/div/sqrt/min/max,
// conversions between f64, f32, i32, u32, i64 and f16, scalar and packed (half2) f16
// arithmetic.
#include "check.h"

#include <hip/hip_fp16.h>

struct F64Out {
	double fma, div, sqrt, minmax, from_i32, from_u32, from_i64;
	float to_f32;
	int to_i32;
	unsigned to_u32;
	long long to_i64;
};

__global__ void f64_ops(int n, const double *a, const double *b, const int *k, F64Out *o)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	double x = a[i], y = b[i];
	o[i].fma = fma(x, y, 1.25);
	o[i].div = x / y;
	o[i].sqrt = sqrt(fabs(x));
	o[i].minmax = fmin(x, y) + fmax(x, y) * 0.5;
	o[i].from_i32 = (double)k[i];
	o[i].from_u32 = (double)(unsigned)k[i];
	o[i].from_i64 = (double)((long long)k[i] * 1000003LL);
	o[i].to_f32 = (float)x;
	o[i].to_i32 = (int)(x * 1000.0);
	o[i].to_u32 = (unsigned)fabs(x * 1000.0);
	o[i].to_i64 = (long long)(x * 1e12);
}

struct F16Out {
	float prod, sum, quot, from_i, cvt_back;
	float pk_lo, pk_hi;
	short to_i16;
};

__global__ void f16_ops(int n, const float *a, const float *b, F16Out *o)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	__half x = __float2half(a[i]), y = __float2half(b[i]);
	o[i].prod = __half2float(__hmul(x, y));
	o[i].sum = __half2float(__hadd(x, y));
	o[i].quot = __half2float(__hdiv(x, y));
	o[i].from_i = __half2float(__int2half_rn(i - 128));
	o[i].cvt_back = __half2float(x);
	__half2 p = __halves2half2(x, y);
	__half2 q = __hmul2(__hadd2(p, p), p);
	o[i].pk_lo = __low2float(q);
	o[i].pk_hi = __high2float(q);
	o[i].to_i16 = __half2short_rz(__hmul(x, __float2half(10.0f)));
}

// The host's f16 rounding of a float (round to nearest even), through hip_fp16's host side.
static float h(float v)
{
	return __half2float(__float2half(v));
}

static void check_f64(Check &c)
{
	const int n = 1000;
	double *a = new double[n], *b = new double[n];
	int *k = new int[n];
	Rng r(11);
	for (int i = 0; i < n; i++) {
		a[i] = r.uniform(-50, 50) * (1.0 + r.uniform(0, 1) * 1e-7);
		b[i] = r.uniform(0.5, 8) * (i % 2 ? -1 : 1);
		k[i] = (int)r.next();
	}
	a[0] = 0.0;
	a[1] = -0.0;
	double *da = device_copy(a, n), *db = device_copy(b, n);
	int *dk = device_copy(k, n);
	F64Out *dout, *out = new F64Out[n];
	HIP_CHECK(hipMalloc(&dout, n * sizeof(F64Out)));
	hipLaunchKernelGGL(f64_ops, dim3((n + 127) / 128), dim3(128), 0, 0, n, da, db, dk, dout);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(out, dout, n);
	long bad_arith = 0, bad_cvt = 0;
	for (int i = 0; i < n; i++) {
		double x = a[i], y = b[i];
		const F64Out &o = out[i];
		bad_arith += o.fma != fma(x, y, 1.25);
		bad_arith += o.div != x / y;
		bad_arith += o.sqrt != sqrt(fabs(x));
		bad_arith += o.minmax != fmin(x, y) + fmax(x, y) * 0.5;
		bad_cvt += o.from_i32 != (double)k[i];
		bad_cvt += o.from_u32 != (double)(unsigned)k[i];
		bad_cvt += o.from_i64 != (double)((long long)k[i] * 1000003LL);
		bad_cvt += o.to_f32 != (float)x;
		bad_cvt += o.to_i32 != (int)(x * 1000.0);
		bad_cvt += o.to_u32 != (unsigned)fabs(x * 1000.0);
		bad_cvt += o.to_i64 != (long long)(x * 1e12);
	}
	c.report("f64 fma, div, sqrt, min/max (exact)", bad_arith, 4L * n);
	c.report("f64 <-> f32/i32/u32/i64 conversions (exact)", bad_cvt, 7L * n);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	HIP_CHECK(hipFree(dk));
	HIP_CHECK(hipFree(dout));
}

static void check_f16(Check &c)
{
	const int n = 512;
	float *a = new float[n], *b = new float[n];
	Rng r(13);
	for (int i = 0; i < n; i++) {
		a[i] = r.uniform(-30, 30);
		b[i] = r.uniform(0.25, 4) * (i % 3 ? 1 : -1);
	}
	float *da = device_copy(a, n), *db = device_copy(b, n);
	F16Out *dout, *out = new F16Out[n];
	HIP_CHECK(hipMalloc(&dout, n * sizeof(F16Out)));
	hipLaunchKernelGGL(f16_ops, dim3(n / 64), dim3(64), 0, 0, n, da, db, dout);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(out, dout, n);
	long bad_exact = 0, bad_div = 0, bad_pk = 0;
	for (int i = 0; i < n; i++) {
		float x = h(a[i]), y = h(b[i]);
		const F16Out &o = out[i];
		// One f16 rounding of an exact f32 product/sum: exact on the host too.
		bad_exact += o.prod != h(x * y);
		bad_exact += o.sum != h(x + y);
		bad_exact += o.from_i != h((float)(i - 128));
		bad_exact += o.cvt_back != x;
		bad_exact += o.to_i16 != (short)h(x * 10.0f);
		// Division goes through f32 reciprocal and may differ by one f16 ulp.
		bad_div += !close_to(o.quot, x / y, 1.0 / 512);
		float lo = h(h(x + x) * x), hi = h(h(y + y) * y);
		bad_pk += o.pk_lo != lo || o.pk_hi != hi;
	}
	c.report("f16 mul, add, int->f16, f16->f32, f16->i16 (exact)", bad_exact, 5L * n);
	c.report("f16 div (within 1 ulp)", bad_div, n);
	c.report("half2 add then mul (exact)", bad_pk, n);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	HIP_CHECK(hipFree(dout));
}

int main()
{
	Check c("fp64_fp16");
	check_f64(c);
	check_f16(c);
	return c.finish();
}
