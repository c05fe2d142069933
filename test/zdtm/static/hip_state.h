/* SPDX-License-Identifier: GPL-2.0-only */
// HIP state held across checkpoints, shared by criu-rocm's HIP tests: the zdtm tests
// gpu_hip_* (test/zdtm/static) and test/hip-cr's hold program. On every GPU HIP sees, as
// asked: device buffers filled by a kernel (buffers); hipHostMalloc memory and malloc'ed
// memory given to hipHostRegister, written by kernels through their device pointers
// (host); three non-blocking streams and two events on which a round runs a chain of
// kernels, the second stream waiting for an event of the first, the third for one of the
// second (streams); peer access from GPU 0 to every other GPU, and a hipMemcpyPeer of GPU
// 0's buffer to each every round (peer); a kernel spinning on a flag in host memory, on a
// stream of its own, in flight between rounds (spin): a round first sets the flag, and the
// kernel must end having seen it; a new spinner starts as the round's last work. Nothing
// waits for the whole device (hipDeviceSynchronize, hipFree) while a spinner is in flight:
// it would wait for the spinner, which ends only when the host sets its flag.
// hs_round() checks that everything held still has the contents last written, then runs new
// kernels on every GPU and stream and into a new allocation, and checks them on the host;
// with `corrupt` it damages a dword of the new allocation first, so that the round fails.
//
// The includer defines hip_state_fail(file, line, call, error), called on any HIP error;
// it must not return.
#pragma once

#include <hip/hip_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

[[noreturn]] static void hip_state_fail(const char *file, int line, const char *call, hipError_t err);

#define HS_CHECK(call)                                                           \
	do {                                                                     \
		hipError_t err_ = (call);                                        \
		if (err_ != hipSuccess)                                          \
			hip_state_fail(__FILE__, __LINE__, #call, err_);         \
	} while (0)

static void hs_host_copy(uint32_t *host, const uint32_t *dev, size_t n)
{
	HS_CHECK(hipMemcpy(host, dev, n * sizeof(uint32_t), hipMemcpyDeviceToHost));
}

#define N (64 * 1024)

// The value element i holds after `gen` rounds of fill and bump with seed `seed`.
__host__ __device__ static uint32_t value(uint32_t i, uint32_t seed, int gen)
{
	uint32_t v = i * 2654435761u ^ seed;
	for (int g = 0; g < gen; g++)
		v = v * 3u + 1u;
	return v;
}

__global__ void fill(uint32_t *p, uint32_t seed)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < N)
		p[i] = value(i, seed, 0);
}

__global__ void bump(uint32_t *p)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < N)
		p[i] = p[i] * 3u + 1u;
}

// The streams' chain: b = 2a + 1 on the second stream, c = b ^ a on the third.
__global__ void twice(const uint32_t *a, uint32_t *b)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < N)
		b[i] = 2u * a[i] + 1u;
}

__global__ void mix(const uint32_t *a, const uint32_t *b, uint32_t *c)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < N)
		c[i] = b[i] ^ a[i];
}

// Spins until *flag is set, saying so in out[1] on its first turn; then writes what it
// saw and whether it spun.
__global__ void spin_on(volatile uint32_t *flag, uint32_t *out)
{
	uint32_t n = 0;
	while (*flag == 0) {
		if (n++ == 0 && blockIdx.x == 0 && threadIdx.x == 0)
			((volatile uint32_t *)out)[1] = 1;
		__builtin_amdgcn_s_sleep(2);
	}
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		out[0] = *flag;
		out[1] = n != 0;
	}
}

static void launch_fill(uint32_t *p, uint32_t seed, hipStream_t s = 0)
{
	hipLaunchKernelGGL(fill, dim3(N / 256), dim3(256), 0, s, p, seed);
	HS_CHECK(hipGetLastError());
}

static void launch_bump(uint32_t *p, hipStream_t s = 0)
{
	hipLaunchKernelGGL(bump, dim3(N / 256), dim3(256), 0, s, p);
	HS_CHECK(hipGetLastError());
}

// The first element of `got` (host memory) that differs from value(i, seed, gen), or -1.
static long first_bad(const uint32_t *got, uint32_t seed, int gen)
{
	for (uint32_t i = 0; i < N; i++)
		if (got[i] != value(i, seed, gen))
			return i;
	return -1;
}

struct Gpu {
	uint32_t *buf = nullptr;                       // --buffers
	uint32_t *pinned = nullptr, *registered = nullptr; // --host (host pointers)
	uint32_t *pinned_d = nullptr, *registered_d = nullptr;
	hipStream_t s[3] = {};                         // --streams
	hipEvent_t e[2] = {};
	uint32_t *a = nullptr, *b = nullptr, *c = nullptr;
	uint32_t *peer = nullptr;                      // --peer (on GPUs 1..)
	uint32_t *flag = nullptr, *spun = nullptr;     // --spin (host memory)
	hipStream_t spin_s = nullptr;
};

struct State {
	bool buffers = false, host = false, streams = false, peer = false, spin = false;
	bool corrupt = false; // damage a dword of each round's new buffer (zdtm's self-test)
	int gpus = 0, gen = 0, round = 0;
	Gpu g[16];
	uint32_t *scratch = nullptr; // host copy buffer
};

static void launch_spin(Gpu &g)
{
	__atomic_store_n(g.flag, 0u, __ATOMIC_SEQ_CST);
	g.spun[0] = g.spun[1] = 0;
	hipLaunchKernelGGL(spin_on, dim3(1), dim3(64), 0, g.spin_s, g.flag, g.spun);
	HS_CHECK(hipGetLastError());
}

// A spinner on every GPU that has a spinner stream; the last work of a setup or a round.
static void start_spinners(State &st)
{
	for (int d = 0; d < st.gpus; d++) {
		if (!st.g[d].spin_s)
			continue;
		HS_CHECK(hipSetDevice(d));
		launch_spin(st.g[d]);
	}
}

static uint32_t seed_of(int dev, int what) { return 0x9e3779b9u * (dev + 1) + 0x85ebca6bu * what; }

static void hs_setup(State &st)
{
	HS_CHECK(hipInit(0));
	HS_CHECK(hipGetDeviceCount(&st.gpus));
	if (st.gpus > 16)
		st.gpus = 16;
	st.scratch = new uint32_t[N];
	for (int d = 0; d < st.gpus; d++) {
		Gpu &g = st.g[d];
		if (!st.buffers && !st.host && !st.streams && !st.peer && !st.spin)
			break;
		HS_CHECK(hipSetDevice(d));
		if (st.buffers) {
			HS_CHECK(hipMalloc(&g.buf, N * sizeof(uint32_t)));
			launch_fill(g.buf, seed_of(d, 1));
		}
		if (st.host) {
			HS_CHECK(hipHostMalloc(&g.pinned, N * sizeof(uint32_t)));
			HS_CHECK(hipHostGetDevicePointer((void **)&g.pinned_d, g.pinned, 0));
			if (posix_memalign((void **)&g.registered, 4096, N * sizeof(uint32_t)))
				hip_state_fail(__FILE__, __LINE__, "posix_memalign", hipErrorOutOfMemory);
			HS_CHECK(hipHostRegister(g.registered, N * sizeof(uint32_t), hipHostRegisterDefault));
			HS_CHECK(hipHostGetDevicePointer((void **)&g.registered_d, g.registered, 0));
			launch_fill(g.pinned_d, seed_of(d, 2));
			launch_fill(g.registered_d, seed_of(d, 3));
		}
		if (st.streams) {
			for (auto &s : g.s)
				HS_CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
			for (auto &e : g.e)
				HS_CHECK(hipEventCreateWithFlags(&e, hipEventDisableTiming));
			HS_CHECK(hipMalloc(&g.a, N * sizeof(uint32_t)));
			HS_CHECK(hipMalloc(&g.b, N * sizeof(uint32_t)));
			HS_CHECK(hipMalloc(&g.c, N * sizeof(uint32_t)));
		}
		if (st.spin) {
			HS_CHECK(hipHostMalloc(&g.flag, sizeof(uint32_t)));
			HS_CHECK(hipHostMalloc(&g.spun, 2 * sizeof(uint32_t)));
			HS_CHECK(hipStreamCreateWithFlags(&g.spin_s, hipStreamNonBlocking));
		}
		if (st.peer && d > 0) {
			int can = 0;
			HS_CHECK(hipDeviceCanAccessPeer(&can, 0, d));
			if (!can)
				hip_state_fail(__FILE__, __LINE__, "hipDeviceCanAccessPeer(0, d)", hipErrorPeerAccessUnsupported);
			HS_CHECK(hipMalloc(&g.peer, N * sizeof(uint32_t)));
		}
		HS_CHECK(hipDeviceSynchronize());
	}
	if (st.peer) {
		HS_CHECK(hipSetDevice(0));
		for (int d = 1; d < st.gpus; d++)
			HS_CHECK(hipDeviceEnablePeerAccess(d, 0));
	}
	start_spinners(st);
}

// Checks what GPU d holds (generation st.gen); returns a reason, or nullptr.
static const char *check_held(State &st, int d, char *why, size_t len)
{
	Gpu &g = st.g[d];
	long bad;
	if (g.buf) {
		hs_host_copy(st.scratch, g.buf, N);
		if ((bad = first_bad(st.scratch, seed_of(d, 1), st.gen)) >= 0)
			return snprintf(why, len, "GPU %d: device buffer[%ld] = %08x, want %08x", d, bad,
					st.scratch[bad], value(bad, seed_of(d, 1), st.gen)), why;
	}
	if (g.pinned) {
		if ((bad = first_bad(g.pinned, seed_of(d, 2), st.gen)) >= 0)
			return snprintf(why, len, "GPU %d: hipHostMalloc memory[%ld] = %08x, want %08x", d,
					bad, g.pinned[bad], value(bad, seed_of(d, 2), st.gen)), why;
		if ((bad = first_bad(g.registered, seed_of(d, 3), st.gen)) >= 0)
			return snprintf(why, len, "GPU %d: hipHostRegister memory[%ld] = %08x, want %08x",
					d, bad, g.registered[bad], value(bad, seed_of(d, 3), st.gen)), why;
	}
	return nullptr;
}

// GPU d's spinner, in flight since the last round, ends when its flag is set to `v`.
// Returns a reason, or nullptr.
static const char *release_spinner(State &st, int d, uint32_t v, char *why, size_t len)
{
	Gpu &g = st.g[d];
	if (hipStreamQuery(g.spin_s) != hipErrorNotReady)
		return snprintf(why, len, "GPU %d: the spinning kernel ended before its flag was set", d), why;
	// A spinner launched as the last round's last work may not have run yet: the flag is
	// set once it spins, so that it must see the flag change (up to 60 s).
	for (int i = 0; i < 60000 && __atomic_load_n(&g.spun[1], __ATOMIC_SEQ_CST) != 1; i++)
		usleep(1000);
	if (__atomic_load_n(&g.spun[1], __ATOMIC_SEQ_CST) != 1)
		return snprintf(why, len, "GPU %d: the spinning kernel did not spin within 60 s", d), why;
	__atomic_store_n(g.flag, v, __ATOMIC_SEQ_CST);
	HS_CHECK(hipStreamSynchronize(g.spin_s));
	if (g.spun[0] != v || g.spun[1] != 1)
		return snprintf(why, len, "GPU %d: the spinning kernel saw %u (spun: %u), want %u (1)", d,
				g.spun[0], g.spun[1], v), why;
	return nullptr;
}

// The streams' chain on GPU d with seed `seed`; returns a reason, or nullptr.
static const char *chain(State &st, int d, uint32_t seed, char *why, size_t len)
{
	Gpu &g = st.g[d];
	launch_fill(g.a, seed, g.s[0]);
	HS_CHECK(hipEventRecord(g.e[0], g.s[0]));
	HS_CHECK(hipStreamWaitEvent(g.s[1], g.e[0], 0));
	hipLaunchKernelGGL(twice, dim3(N / 256), dim3(256), 0, g.s[1], g.a, g.b);
	HS_CHECK(hipEventRecord(g.e[1], g.s[1]));
	HS_CHECK(hipStreamWaitEvent(g.s[2], g.e[1], 0));
	hipLaunchKernelGGL(mix, dim3(N / 256), dim3(256), 0, g.s[2], g.a, g.b, g.c);
	HS_CHECK(hipGetLastError());
	HS_CHECK(hipMemcpyAsync(st.scratch, g.c, N * sizeof(uint32_t), hipMemcpyDeviceToHost, g.s[2]));
	HS_CHECK(hipStreamSynchronize(g.s[2]));
	if (hipEventQuery(g.e[0]) != hipSuccess || hipEventQuery(g.e[1]) != hipSuccess)
		return snprintf(why, len, "GPU %d: an event of the chain is not complete after it", d), why;
	for (uint32_t i = 0; i < N; i++) {
		uint32_t a = value(i, seed, 0), want = (2u * a + 1u) ^ a;
		if (st.scratch[i] != want)
			return snprintf(why, len, "GPU %d: stream chain c[%u] = %08x, want %08x", d, i,
					st.scratch[i], want), why;
	}
	return nullptr;
}

// GPU 0's buffer copied to GPU d's with hipMemcpyPeer; returns a reason, or nullptr.
static const char *peer_copy(State &st, int d, char *why, size_t len)
{
	long bad;
	HS_CHECK(hipMemcpyPeer(st.g[d].peer, d, st.g[0].buf, 0, N * sizeof(uint32_t)));
	HS_CHECK(hipSetDevice(d));
	hs_host_copy(st.scratch, st.g[d].peer, N);
	if ((bad = first_bad(st.scratch, seed_of(0, 1), st.gen)) >= 0)
		return snprintf(why, len, "peer copy GPU 0 -> GPU %d: [%ld] = %08x, want %08x", d, bad,
				st.scratch[bad], value(bad, seed_of(0, 1), st.gen)), why;
	return nullptr;
}

// A kernel into a new allocation on GPU d, checked and freed; returns a reason, or nullptr.
static const char *fresh(State &st, int d, char *why, size_t len)
{
	uint32_t *p;
	long bad;
	uint32_t seed = seed_of(d, 100 + st.round);
	HS_CHECK(hipMalloc(&p, N * sizeof(uint32_t)));
	launch_fill(p, seed);
	if (st.corrupt) {
		uint32_t bad = 0xbadc0de5;
		HS_CHECK(hipMemcpy(p + 1234, &bad, sizeof bad, hipMemcpyHostToDevice));
	}
	hs_host_copy(st.scratch, p, N);
	HS_CHECK(hipFree(p));
	if ((bad = first_bad(st.scratch, seed, 0)) >= 0)
		return snprintf(why, len, "GPU %d: a new buffer [%ld] = %08x, want %08x", d, bad,
				st.scratch[bad], value(bad, seed, 0)), why;
	return nullptr;
}

// One round: what is held, then new work; returns a reason, or nullptr.
static const char *hs_round(State &st, char *why, size_t len)
{
	const char *r;
	st.round++;
	for (int d = 0; d < st.gpus; d++) {
		HS_CHECK(hipSetDevice(d));
		if (st.g[d].spin_s && (r = release_spinner(st, d, st.round, why, len)))
			return r;
	}
	for (int d = 0; d < st.gpus; d++) {
		HS_CHECK(hipSetDevice(d));
		if ((r = check_held(st, d, why, len)))
			return r;
	}
	for (int d = 0; d < st.gpus; d++) {
		Gpu &g = st.g[d];
		HS_CHECK(hipSetDevice(d));
		if (g.buf)
			launch_bump(g.buf);
		if (g.pinned) {
			launch_bump(g.pinned_d);
			launch_bump(g.registered_d);
		}
		HS_CHECK(hipDeviceSynchronize());
		if ((r = fresh(st, d, why, len)))
			return r;
		if (g.a && (r = chain(st, d, seed_of(d, 200 + st.round), why, len)))
			return r;
	}
	st.gen++;
	for (int d = 0; d < st.gpus; d++) {
		HS_CHECK(hipSetDevice(d));
		if ((r = check_held(st, d, why, len)))
			return r;
	}
	for (int d = 1; st.peer && d < st.gpus; d++) {
		HS_CHECK(hipSetDevice(0));
		if ((r = peer_copy(st, d, why, len)))
			return r;
	}
	start_spinners(st);
	return nullptr;
}

static void hs_teardown(State &st)
{
	// The spinners of every GPU end first: hipFree and hipHostFree wait for them all.
	for (int d = 0; d < st.gpus; d++)
		if (st.g[d].spin_s)
			__atomic_store_n(st.g[d].flag, 1u, __ATOMIC_SEQ_CST);
	for (int d = 0; d < st.gpus; d++) {
		Gpu &g = st.g[d];
		if (!g.spin_s)
			continue;
		HS_CHECK(hipSetDevice(d));
		HS_CHECK(hipStreamSynchronize(g.spin_s));
		HS_CHECK(hipStreamDestroy(g.spin_s));
		HS_CHECK(hipHostFree(g.flag));
		HS_CHECK(hipHostFree(g.spun));
	}
	for (int d = 0; d < st.gpus; d++) {
		Gpu &g = st.g[d];
		HS_CHECK(hipSetDevice(d));
		if (g.buf)
			HS_CHECK(hipFree(g.buf));
		if (g.pinned) {
			HS_CHECK(hipHostFree(g.pinned));
			HS_CHECK(hipHostUnregister(g.registered));
			free(g.registered);
		}
		for (auto s : g.s)
			if (s)
				HS_CHECK(hipStreamDestroy(s));
		for (auto e : g.e)
			if (e)
				HS_CHECK(hipEventDestroy(e));
		for (auto p : {g.a, g.b, g.c, g.peer})
			if (p)
				HS_CHECK(hipFree(p));
	}
	delete[] st.scratch;
}
