// hipcc-flags: -O2 -lrocsparse
// rocSPARSE (Debian's librocsparse0) as a solver's inner loop calls it: y = alpha*A*x + beta*y
// with a CSR matrix of irregular rows (empty rows, short rows, one long row), in f32 and f64,
// through rocsparse_Xcsrmv without analysis (the row-per-wave kernels) and after
// rocsparse_Xcsrmv_analysis (the adaptive kernels), and the transposed product; each checked
// against a host SpMV within a tolerance.
#include "check.h"

#include <rocsparse/rocsparse.h>

#include <vector>

#define SP_CHECK(call)                                                                    \
	do {                                                                              \
		rocsparse_status st_ = (call);                                            \
		if (st_ != rocsparse_status_success) {                                    \
			fprintf(stderr, "%s:%d: %s: rocsparse status %d\n", __FILE__, __LINE__, \
				#call, (int)st_);                                         \
			exit(2);                                                          \
		}                                                                         \
	} while (0)

// A CSR matrix: m rows, n columns.
struct Csr {
	int m, n;
	std::vector<int> ptr, col;
	std::vector<double> val;
};

// Rows of 0 to 40 entries, every 97th row empty, row 7 with 3000 entries.
static Csr make_matrix(int m, int n)
{
	Csr a{m, n, {0}, {}, {}};
	Rng rng(77);
	for (int r = 0; r < m; r++) {
		int len = r == 7 ? 3000 : (r % 97 == 0 ? 0 : (int)(rng.next() % 41));
		int c = (int)(rng.next() % 5);
		for (int k = 0; k < len && c < n; k++) {
			a.col.push_back(c);
			a.val.push_back(rng.uniform(-1.0f, 1.0f));
			c += 1 + (int)(rng.next() % (r == 7 ? 3 : 64));
		}
		a.ptr.push_back((int)a.col.size());
	}
	return a;
}

// y = alpha * op(A) * x + beta * y on the host, in double.
static std::vector<double> host_spmv(const Csr &a, bool trans, double alpha,
				     const std::vector<double> &x, double beta,
				     std::vector<double> y)
{
	std::vector<double> ax(trans ? a.n : a.m, 0.0);
	for (int r = 0; r < a.m; r++)
		for (int k = a.ptr[r]; k < a.ptr[r + 1]; k++) {
			if (trans)
				ax[a.col[k]] += a.val[k] * x[r];
			else
				ax[r] += a.val[k] * x[a.col[k]];
		}
	for (size_t i = 0; i < y.size(); i++)
		y[i] = alpha * ax[i] + beta * y[i];
	return y;
}

rocsparse_status csrmv(rocsparse_handle h, rocsparse_operation op, int m, int n, int nnz,
		       const float *alpha, rocsparse_mat_descr d, const float *v, const int *p,
		       const int *c, rocsparse_mat_info info, const float *x, const float *beta,
		       float *y)
{
	return rocsparse_scsrmv(h, op, m, n, nnz, alpha, d, v, p, c, info, x, beta, y);
}

rocsparse_status csrmv(rocsparse_handle h, rocsparse_operation op, int m, int n, int nnz,
		       const double *alpha, rocsparse_mat_descr d, const double *v, const int *p,
		       const int *c, rocsparse_mat_info info, const double *x, const double *beta,
		       double *y)
{
	return rocsparse_dcsrmv(h, op, m, n, nnz, alpha, d, v, p, c, info, x, beta, y);
}

rocsparse_status analyse(rocsparse_handle h, rocsparse_operation op, int m, int n, int nnz,
			 rocsparse_mat_descr d, const float *v, const int *p, const int *c,
			 rocsparse_mat_info info)
{
	return rocsparse_scsrmv_analysis(h, op, m, n, nnz, d, v, p, c, info);
}

rocsparse_status analyse(rocsparse_handle h, rocsparse_operation op, int m, int n, int nnz,
			 rocsparse_mat_descr d, const double *v, const int *p, const int *c,
			 rocsparse_mat_info info)
{
	return rocsparse_dcsrmv_analysis(h, op, m, n, nnz, d, v, p, c, info);
}

// One product on the device in precision T, compared with the host's.
template <typename T>
static void spmv_case(Check &c, rocsparse_handle h, const Csr &a, bool trans, bool analysed,
		      const char *what, double tol)
{
	const int nnz = (int)a.col.size(), xn = trans ? a.m : a.n, yn = trans ? a.n : a.m;
	const rocsparse_operation op =
		trans ? rocsparse_operation_transpose : rocsparse_operation_none;
	std::vector<double> x(xn), y(yn);
	Rng rng(5);
	for (double &v : x)
		v = rng.uniform(-2.0f, 2.0f);
	for (double &v : y)
		v = rng.uniform(-1.0f, 1.0f);
	const double alpha = 1.5, beta = -0.5;
	std::vector<double> want = host_spmv(a, trans, alpha, x, beta, y);

	std::vector<T> tv(a.val.begin(), a.val.end()), tx(x.begin(), x.end()),
		ty(y.begin(), y.end());
	T *dv = device_copy(tv.data(), nnz), *dx = device_copy(tx.data(), xn),
	  *dy = device_copy(ty.data(), yn);
	int *dp = device_copy(a.ptr.data(), a.m + 1), *dc = device_copy(a.col.data(), nnz);
	rocsparse_mat_descr descr;
	rocsparse_mat_info info;
	SP_CHECK(rocsparse_create_mat_descr(&descr));
	SP_CHECK(rocsparse_create_mat_info(&info));
	if (analysed)
		SP_CHECK(analyse(h, op, a.m, a.n, nnz, descr, dv, dp, dc, info));
	T ta = (T)alpha, tb = (T)beta;
	SP_CHECK(csrmv(h, op, a.m, a.n, nnz, &ta, descr, dv, dp, dc, info, dx, &tb, dy));
	HIP_CHECK(hipDeviceSynchronize());
	host_copy(ty.data(), dy, yn);
	long bad = 0;
	for (int i = 0; i < yn; i++)
		bad += !close_to(ty[i], want[i], tol);
	c.report(what, bad, yn);
	SP_CHECK(rocsparse_destroy_mat_info(info));
	SP_CHECK(rocsparse_destroy_mat_descr(descr));
	for (void *p : {(void *)dv, (void *)dx, (void *)dy, (void *)dp, (void *)dc})
		HIP_CHECK(hipFree(p));
}

int main()
{
	Check c("rocsparse");
	rocsparse_handle h;
	SP_CHECK(rocsparse_create_handle(&h));
	Csr a = make_matrix(20011, 9973);
	printf("rocsparse: a %dx%d CSR matrix with %zu entries\n", a.m, a.n, a.col.size());
	spmv_case<float>(c, h, a, false, false, "f32 csrmv", 1e-3);
	spmv_case<double>(c, h, a, false, false, "f64 csrmv", 1e-12);
	spmv_case<float>(c, h, a, false, true, "f32 csrmv after analysis (adaptive)", 1e-3);
	spmv_case<double>(c, h, a, false, true, "f64 csrmv after analysis (adaptive)", 1e-12);
	spmv_case<double>(c, h, a, true, false, "f64 transposed csrmv", 1e-12);
	SP_CHECK(rocsparse_destroy_handle(h));
	return c.finish();
}
