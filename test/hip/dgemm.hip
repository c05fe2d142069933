// f64 matrix cores (gfx90a; gfx942 under HIP 6.4): DGEMM C = A*B + C0 with __builtin_amdgcn_mfma_f64_16x16x4f64,
// one wave per 16x16 tile of a 64x48 result, K = 128 in steps of 4; and a batch of 4x4x8
// products with __builtin_amdgcn_mfma_f64_4x4x4f64. Operand layouts as AMD's matrix-cores
// lab notes give them: 16x16x4: A's lane i + 16k holds A[i][k], B's lane j + 16k holds
// B[k][j], register pair r of lane l holds row 4r + l/16, column l%16; 4x4x4: A's lane
// i + 4b + 16k holds block b's A[i][k] (B alike), lane j + 4b + 16i holds D[b][i][j].
// Checked on the host against a plain CPU DGEMM: bit for bit with dyadic inputs (every
// partial sum exact, whatever order the hardware adds in), and within the rounding bound
// (K + 2) * 2^-53 * (|c| + sum |a*b|) with random inputs.
// hip-test: needs-isa gfx90a gfx942
#include "check.h"

#include <vector>

typedef double double4_t __attribute__((ext_vector_type(4)));

enum { M = 64, N = 48, K = 128, BATCH = 32, BK = 8 };

__global__ void dgemm16(const double *a, const double *b, double *c)
{
#if defined(__gfx90a__) || defined(__gfx942__)
	int l = threadIdx.x, row0 = blockIdx.y * 16, col0 = blockIdx.x * 16;
	double4_t d;
	for (int r = 0; r < 4; r++)
		d[r] = c[(row0 + 4 * r + l / 16) * N + col0 + l % 16];
	for (int k0 = 0; k0 < K; k0 += 4) {
		double x = a[(row0 + l % 16) * K + k0 + l / 16];
		double y = b[(k0 + l / 16) * N + col0 + l % 16];
		d = __builtin_amdgcn_mfma_f64_16x16x4f64(x, y, d, 0, 0, 0);
	}
	for (int r = 0; r < 4; r++)
		c[(row0 + 4 * r + l / 16) * N + col0 + l % 16] = d[r];
#else
	__builtin_trap();
#endif
}

// Four blocks per wave: batch entry 4*blockIdx.x + b is a 4xBK times BKx4 product.
__global__ void dgemm4(const double *a, const double *b, double *c)
{
#if defined(__gfx90a__) || defined(__gfx942__)
	int l = threadIdx.x, i = l % 4, blk = 4 * blockIdx.x + l / 4 % 4, k = l / 16;
	int drow = l / 16, dcol = l % 4;
	double d = c[blk * 16 + drow * 4 + dcol];
	for (int k0 = 0; k0 < BK; k0 += 4) {
		double x = a[blk * 4 * BK + i * BK + k0 + k];
		double y = b[blk * BK * 4 + (k0 + k) * 4 + i];
		d = __builtin_amdgcn_mfma_f64_4x4x4f64(x, y, d, 0, 0, 0);
	}
	c[blk * 16 + drow * 4 + dcol] = d;
#else
	__builtin_trap();
#endif
}

static double *to_device(const std::vector<double> &v)
{
	double *d;
	HIP_CHECK(hipMalloc(&d, v.size() * sizeof(double)));
	HIP_CHECK(hipMemcpy(d, v.data(), v.size() * sizeof(double), hipMemcpyHostToDevice));
	return d;
}

static std::vector<double> from_device(double *d, size_t n)
{
	std::vector<double> v(n);
	HIP_CHECK(hipMemcpy(v.data(), d, n * sizeof(double), hipMemcpyDeviceToHost));
	HIP_CHECK(hipFree(d));
	return v;
}

// Compares got with C0 + A*B over `batch` products of rows x cols with depth k: bit for bit
// (exact), or within (k + 2) * 2^-53 * (|c| + sum |a*b|). Returns the mismatches.
static long compare(const std::vector<double> &a, const std::vector<double> &b,
		    const std::vector<double> &c0, const std::vector<double> &got, int batch,
		    int rows, int cols, int k, bool exact)
{
	long bad = 0;
	for (int t = 0; t < batch; t++)
		for (int i = 0; i < rows; i++)
			for (int j = 0; j < cols; j++) {
				size_t at = (size_t)t * rows * cols + i * cols + j;
				long double sum = c0[at], mag = std::fabs(c0[at]);
				for (int kk = 0; kk < k; kk++) {
					long double p = (long double)a[(size_t)t * rows * k + i * k + kk] *
							b[(size_t)t * k * cols + kk * cols + j];
					sum += p;
					mag += std::fabs(p);
				}
				double want = (double)sum;
				bool ok = exact ? got[at] == want
						: std::fabs((long double)got[at] - sum) <=
							  (k + 2) * std::ldexp(1.0L, -53) * mag;
				if (!ok && bad++ < 5)
					printf("dgemm: [%d][%d][%d]: got %.17g, want %.17g\n", t, i, j,
					       got[at], want);
			}
	return bad;
}

// Inputs: dyadic (exact) or random in [-1, 1).
static double value(Rng &rng, bool exact, int x, int y, int mod, double scale)
{
	if (exact)
		return (double)((x * 7 + y * 3) % mod - mod / 2) * scale;
	return rng.uniform(-1, 1) + (double)(rng.next() >> 8) * 0x1p-48;
}

static long run16(bool exact)
{
	Rng rng(exact ? 1 : 12345);
	std::vector<double> a(M * K), b(K * N), c0(M * N);
	for (int i = 0; i < M; i++)
		for (int k = 0; k < K; k++)
			a[i * K + k] = value(rng, exact, i, k, 17, 1.0 / 16);
	for (int k = 0; k < K; k++)
		for (int j = 0; j < N; j++)
			b[k * N + j] = value(rng, exact, k + 3, j * 5, 13, 1.0 / 8);
	for (int i = 0; i < M * N; i++)
		c0[i] = value(rng, exact, i, 1, 29, 1.0);
	double *da = to_device(a), *db = to_device(b), *dc = to_device(c0);
	hipLaunchKernelGGL(dgemm16, dim3(N / 16, M / 16), dim3(64), 0, 0, da, db, dc);
	HIP_CHECK(hipGetLastError());
	HIP_CHECK(hipDeviceSynchronize());
	std::vector<double> got = from_device(dc, M * N);
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	return compare(a, b, c0, got, 1, M, N, K, exact);
}

static long run4(bool exact)
{
	Rng rng(exact ? 2 : 777);
	std::vector<double> a(BATCH * 4 * BK), b(BATCH * BK * 4), c0(BATCH * 16);
	for (size_t i = 0; i < a.size(); i++)
		a[i] = value(rng, exact, (int)i, 2, 11, 1.0 / 4);
	for (size_t i = 0; i < b.size(); i++)
		b[i] = value(rng, exact, (int)i, 5, 9, 1.0 / 32);
	for (size_t i = 0; i < c0.size(); i++)
		c0[i] = value(rng, exact, (int)i, 9, 23, 0.5);
	double *da = to_device(a), *db = to_device(b), *dc = to_device(c0);
	hipLaunchKernelGGL(dgemm4, dim3(BATCH / 4), dim3(64), 0, 0, da, db, dc);
	HIP_CHECK(hipGetLastError());
	HIP_CHECK(hipDeviceSynchronize());
	std::vector<double> got = from_device(dc, c0.size());
	HIP_CHECK(hipFree(da));
	HIP_CHECK(hipFree(db));
	return compare(a, b, c0, got, BATCH, 4, 4, BK, exact);
}

int main()
{
	Check c("dgemm");
	hipDeviceProp_t prop;
	HIP_CHECK(hipGetDeviceProperties(&prop, 0));
	if (strncmp(prop.gcnArchName, "gfx90a", 6) != 0 && strncmp(prop.gcnArchName, "gfx942", 6) != 0) {
		printf("dgemm: f64 MFMA needs gfx90a or gfx942; device 0 is %s\n", prop.gcnArchName);
		return 1;
	}
	c.report("64x48x128 DGEMM with v_mfma_f64_16x16x4f64, dyadic inputs (bit for bit)",
		 run16(true), M * N);
	c.report("64x48x128 DGEMM with v_mfma_f64_16x16x4f64, random inputs (rounding bound)",
		 run16(false), M * N);
	c.report("32 batched 4x4x8 products with v_mfma_f64_4x4x4f64, dyadic (bit for bit)",
		 run4(true), BATCH * 16);
	c.report("32 batched 4x4x8 products with v_mfma_f64_4x4x4f64, random (rounding bound)",
		 run4(false), BATCH * 16);
	return c.finish();
}
