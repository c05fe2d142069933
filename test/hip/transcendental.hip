// Transcendentals in f32 and f64 (sin, cos, exp, log, sqrt, rsqrt, pow) against the host's
// double-precision libm, within a few ulps of each type.
#include "check.h"

enum { SIN, COS, EXP, LOG, SQRT, RSQRT, POW, NFN };
static const char *const names[NFN] = {"sin", "cos", "exp", "log", "sqrt", "rsqrt", "pow"};

__global__ void f32_fns(int n, const float *x, float *o)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	float v = x[i];
	o[NFN * i + SIN] = sinf(v);
	o[NFN * i + COS] = cosf(v);
	o[NFN * i + EXP] = expf(v * 0.25f);
	o[NFN * i + LOG] = logf(fabsf(v) + 0.001f);
	o[NFN * i + SQRT] = sqrtf(fabsf(v));
	o[NFN * i + RSQRT] = rsqrtf(fabsf(v) + 0.5f);
	o[NFN * i + POW] = powf(fabsf(v) + 0.5f, 1.7f);
}

__global__ void f64_fns(int n, const double *x, double *o)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	double v = x[i];
	o[NFN * i + SIN] = sin(v);
	o[NFN * i + COS] = cos(v);
	o[NFN * i + EXP] = exp(v * 0.25);
	o[NFN * i + LOG] = log(fabs(v) + 0.001);
	o[NFN * i + SQRT] = sqrt(fabs(v));
	o[NFN * i + RSQRT] = rsqrt(fabs(v) + 0.5);
	o[NFN * i + POW] = pow(fabs(v) + 0.5, 1.7);
}

// The reference of function `f` at `v`, in double.
static double reference(int f, double v)
{
	switch (f) {
	case SIN:
		return sin(v);
	case COS:
		return cos(v);
	case EXP:
		return exp(v * 0.25);
	case LOG:
		return log(fabs(v) + 0.001);
	case SQRT:
		return sqrt(fabs(v));
	case RSQRT:
		return 1.0 / sqrt(fabs(v) + 0.5);
	default:
		return pow(fabs(v) + 0.5, 1.7);
	}
}

// Compares n*NFN results of type T with `tol` (relative, absolute below 1; sin and cos are
// compared absolutely, as their results near zero carry the argument's rounding).
template <typename T> static void compare(Check &c, const char *type, const T *x, const T *o, int n,
					  double tol)
{
	for (int f = 0; f < NFN; f++) {
		long bad = 0;
		for (int i = 0; i < n; i++) {
			double want = reference(f, (double)x[i]);
			bad += !close_to((double)o[NFN * i + f], want, tol);
		}
		char what[64];
		snprintf(what, sizeof what, "%s %s (tolerance %g)", type, names[f], tol);
		c.report(what, bad, n);
	}
}

int main()
{
	Check c("transcendental");
	const int n = 2048;
	float *xf = new float[n], *of = new float[NFN * n];
	double *xd = new double[n], *od = new double[NFN * n];
	Rng r(17);
	for (int i = 0; i < n; i++) {
		xf[i] = r.uniform(-20, 20);
		xd[i] = (double)r.uniform(-20, 20) + r.uniform(0, 1) * 1e-9;
	}
	xf[0] = 0.0f;
	xd[0] = 0.0;
	float *dxf = device_copy(xf, n), *dof;
	double *dxd = device_copy(xd, n), *dod;
	HIP_CHECK(hipMalloc(&dof, NFN * n * sizeof(float)));
	HIP_CHECK(hipMalloc(&dod, NFN * n * sizeof(double)));
	hipLaunchKernelGGL(f32_fns, dim3(n / 256), dim3(256), 0, 0, n, dxf, dof);
	hipLaunchKernelGGL(f64_fns, dim3(n / 256), dim3(256), 0, 0, n, dxd, dod);
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(of, dof, NFN * n);
	host_copy(od, dod, NFN * n);
	compare(c, "f32", xf, of, n, 4e-6);
	compare(c, "f64", xd, od, n, 1e-14);
	HIP_CHECK(hipFree(dxf));
	HIP_CHECK(hipFree(dof));
	HIP_CHECK(hipFree(dxd));
	HIP_CHECK(hipFree(dod));
	return c.finish();
}
