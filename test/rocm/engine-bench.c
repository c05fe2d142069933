/*
 * The gfx9 shader engine's rate inside kfd-emu (make bench): Debian's HIP 5.2, unchanged,
 * loads one of test/hip's committed code objects (rust/gfx9/tests/fixtures/hip) with
 * hipModuleLoad and launches one of its kernels over N items, again and again for at least
 * SECS seconds, then checks the results of the last launch on the host.
 *
 *   engine-bench valu   CODE_OBJECT N SECS   transcendental's f32_fns (seven libm functions
 *                                             per item: VALU-heavy)
 *   engine-bench memory CODE_OBJECT N SECS   saxpy (two loads and a store per item:
 *                                             memory-heavy)
 *
 * The engine's own counts come from kfd-emu's log (KFD_EMU_LOG=debug: one line per
 * dispatch with its wave instructions, lane operations and the CPU time of the worker that
 * ran it); scripts/bench-engine.sh reads them. Prints the launches it made; exits non-zero,
 * naming the call or the item, when something fails.
 */
#define __HIP_PLATFORM_AMD__ 1
#include <hip/hip_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                           \
	do {                                                                                  \
		hipError_t e_ = (call);                                                       \
		if (e_ != hipSuccess) {                                                       \
			fprintf(stderr, "engine-bench: %s: %s\n", #call, hipGetErrorString(e_)); \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

#define NFN 7 /* transcendental.hip's functions per item */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* hipModuleLaunchKernel's argument buffer: the kernel's explicit arguments, packed. */
struct saxpy_args {
	int n;
	float a;
	const float *x;
	float *y;
};

struct fns_args {
	int n;
	const float *x;
	float *o;
};

/* Launches f over n items in groups of 256 until secs have passed; returns the launches. */
static int launch_for(hipFunction_t f, void *args, size_t size, int n, double secs)
{
	void *config[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, args, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size,
			  HIP_LAUNCH_PARAM_END};
	double start = now();
	int launches = 0;
	do {
		CHECK(hipModuleLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, NULL, config));
		CHECK(hipDeviceSynchronize());
		launches++;
	} while (now() - start < secs);
	return launches;
}

static float *device_copy(const float *host, size_t count)
{
	float *d;
	CHECK(hipMalloc((void **)&d, count * sizeof(float)));
	CHECK(hipMemcpy(d, host, count * sizeof(float), hipMemcpyHostToDevice));
	return d;
}

/* saxpy's y grows by a*x per launch: after k launches y = y0 + k*a*x (exact in f32 here). */
static int memory(hipModule_t m, int n, double secs)
{
	hipFunction_t f;
	CHECK(hipModuleGetFunction(&f, m, "_Z5saxpyifPKfPf"));
	float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
	for (int i = 0; i < n; i++) {
		x[i] = (float)(i % 8);
		y[i] = (float)(i % 5);
	}
	struct saxpy_args a = {n, 0.5f, device_copy(x, n), device_copy(y, n)};
	int k = launch_for(f, &a, sizeof(a), n, secs);
	float *out = malloc(n * sizeof(float));
	CHECK(hipMemcpy(out, a.y, n * sizeof(float), hipMemcpyDeviceToHost));
	for (int i = 0; i < n; i++) {
		float want = y[i] + (float)k * 0.5f * x[i];
		if (out[i] != want) {
			fprintf(stderr, "engine-bench: saxpy item %d after %d launches: %g, want %g\n", i, k,
				out[i], want);
			return -1;
		}
	}
	return k;
}

/* f32_fns: sinf of each item within a few ulps of the host's (the device library's sin is
 * not the host's, so an exact match is not expected). */
static int valu(hipModule_t m, int n, double secs)
{
	hipFunction_t f;
	CHECK(hipModuleGetFunction(&f, m, "_Z7f32_fnsiPKfPf"));
	float *x = malloc(n * sizeof(float));
	for (int i = 0; i < n; i++)
		x[i] = (float)(i % 97) * 0.37f - 18.0f;
	float *o;
	CHECK(hipMalloc((void **)&o, (size_t)n * NFN * sizeof(float)));
	struct fns_args a = {n, device_copy(x, n), o};
	int k = launch_for(f, &a, sizeof(a), n, secs);
	float *out = malloc((size_t)n * NFN * sizeof(float));
	CHECK(hipMemcpy(out, o, (size_t)n * NFN * sizeof(float), hipMemcpyDeviceToHost));
	for (int i = 0; i < n; i++) {
		float got = out[NFN * i], want = sinf(x[i]);
		if (!(fabsf(got - want) <= 1e-5f)) {
			fprintf(stderr, "engine-bench: f32_fns item %d: sin(%g) = %g, want %g\n", i, x[i],
				got, want);
			return -1;
		}
	}
	return k;
}

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "valu") && strcmp(argv[1], "memory"))) {
		fprintf(stderr, "usage: engine-bench valu|memory CODE_OBJECT N SECS\n");
		return 2;
	}
	int n = atoi(argv[3]);
	double secs = atof(argv[4]);
	if (n <= 0 || n % 256) {
		fprintf(stderr, "engine-bench: N must be a positive multiple of 256, not %s\n", argv[3]);
		return 2;
	}
	hipModule_t m;
	CHECK(hipModuleLoad(&m, argv[2]));
	int k = strcmp(argv[1], "valu") ? memory(m, n, secs) : valu(m, n, secs);
	if (k < 0)
		return 1;
	printf("engine-bench: %s: %d launches of %d items\n", argv[1], k, n);
	return 0;
}
