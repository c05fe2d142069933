// SPDX-License-Identifier: GPL-2.0-only
// A HIP process (Debian's HIP 5.2, built with hipcc for gfx908 and gfx90a) checkpointed
// between kernels while it holds, on every GPU: device buffers, hipHostMalloc and
// hipHostRegister memory written by kernels, three streams with two events, peer access
// from GPU 0 (hip_state.h). After each restore and at SIGTERM, everything held must have
// its contents, and new kernels on every GPU and stream, a stream chain ordered by events,
// peer copies and a new allocation must work, all checked on the host. Built with
// -DHIP_STATE_IDLE it is gpu_hip_idle: checkpointed right after hipInit with nothing
// allocated, then the same new work. ZDTM_GPU_CORRUPT=1 damages a dword of the new work's
// buffer, so the test must fail.
extern "C" {
#include "zdtmtst.h"
#include "gpu_round.h"
}
#include "hip_state.h"

#ifdef HIP_STATE_IDLE
const char *test_doc = "HIP right after hipInit works after C/R";
#else
const char *test_doc = "HIP buffers, host memory, streams and events, peer access survive C/R";
#endif
const char *test_author = "criu-rocm";

static void hip_state_fail(const char *file, int line, const char *call, hipError_t err)
{
	fail("%s:%d: %s: %s", file, line, call, hipGetErrorString(err));
	exit(1);
}

static int round_fn(void *arg, unsigned int n)
{
	char why[256];
	const char *r = hs_round(*(State *)arg, why, sizeof why);

	if (r) {
		fail("round %u: %s", n, r);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static State st;
	const char *v = getenv("ZDTM_GPU_CORRUPT");
	int ret;

	test_init(argc, argv);
#ifndef HIP_STATE_IDLE
	st.buffers = st.host = st.streams = st.peer = true;
#endif
	st.corrupt = v && v[0] && strcmp(v, "0");
	hs_setup(st);
	test_msg("HIP: %d GPU(s)%s\n", st.gpus, st.buffers ? "" : "; nothing allocated");
	if (gpu_rounds_init(NULL))
		return 1;

	test_daemon();
	ret = gpu_wait_rounds(round_fn, &st);

	if (round_fn(&st, 0) || ret)
		return 1;
	hs_teardown(st);
	pass();
	return 0;
}
