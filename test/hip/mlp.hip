// A small multi-layer perceptron (8 inputs, 32 tanh hidden units, 4 linear outputs) trained
// with plain SGD on a fixed synthetic batch: a stand-in for a training job. Each step runs
// a forward/backward kernel (per-sample gradients, no atomics), a kernel that sums the
// gradients of each weight over the batch in a fixed order and updates it, and an LDS
// reduction of the loss. Everything is deterministic: two trainings agree bit for bit.
//
//   mlp [--steps N] [--delay-ms MS] [--hold-at STEP[,STEP...]] [--checksum] [--once]
//
// Prints the loss of every step. Checks: the loss falls, the GPU's losses follow a host
// reference of the same model, and (unless --once) a second training from the same seed
// ends with bit-identical weights. --checksum prints each step's loss with its bits and an
// FNV-1a digest of the final weights (for comparing a checkpointed and restored run with an
// uninterrupted one, bit for bit); --delay-ms sleeps between steps so that a checkpoint can
// land mid-training. --hold-at holds the forward/backward kernel of each STEP in flight:
// its waves compute their samples' hidden layer, count themselves in, and wait (holding
// the activations in registers) at a gate in host memory that SIGUSR1 opens; once all have
// counted in, "mlp: step S in flight: W waves hold" is printed, so that a checkpoint lands
// mid-kernel. Every held step's waves must have counted in exactly once (a kernel started
// over after a restore would count again). The gate is in every run's kernel, open when the
// step is not held, so held and unheld runs execute the same code and agree bit for bit.
#include "check.h"

#include <csignal>
#include <unistd.h>

#define IN 8
#define HID 32
#define OUT 4
#define BATCH 128
// Offsets of the parameters in one flat array.
#define W1 0
#define B1 (W1 + HID * IN)
#define W2 (B1 + HID)
#define B2 (W2 + OUT * HID)
#define NPARAM (B2 + OUT)

static const float LR = 0.1f;

// Nothing between the hidden layer and the rest (the host's reference).
struct NoGate {
	__host__ __device__ void operator()() const {}
};

// One sample's forward and backward pass: returns its loss, writes its gradients to g;
// `gate()` runs once the hidden layer is computed.
template <typename Gate>
__host__ __device__ static float sample_grad(const float *w, const float *x, const float *y,
					     float *g, Gate gate)
{
	float h[HID], out[OUT], dout[OUT], loss = 0.0f;
	for (int j = 0; j < HID; j++) {
		float a = w[B1 + j];
		for (int i = 0; i < IN; i++)
			a += w[W1 + j * IN + i] * x[i];
		h[j] = tanhf(a);
	}
	gate();
	for (int k = 0; k < OUT; k++) {
		float o = w[B2 + k];
		for (int j = 0; j < HID; j++)
			o += w[W2 + k * HID + j] * h[j];
		out[k] = o;
		float d = o - y[k];
		loss += 0.5f * d * d;
		dout[k] = d / BATCH;
		g[B2 + k] = dout[k];
		for (int j = 0; j < HID; j++)
			g[W2 + k * HID + j] = dout[k] * h[j];
	}
	for (int j = 0; j < HID; j++) {
		float dh = 0.0f;
		for (int k = 0; k < OUT; k++)
			dh += w[W2 + k * HID + j] * dout[k];
		dh *= 1.0f - h[j] * h[j];
		g[B1 + j] = dh;
		for (int i = 0; i < IN; i++)
			g[W1 + j * IN + i] = dh * x[i];
	}
	return loss / BATCH;
}

// The gate of --hold-at in host memory: `open` is the first step whose kernel must wait
// (steps before it run through), `waves` counts the waves of a held step that reached it.
struct GateWords {
	uint32_t open, waves;
};

// On the device: each wave counts itself in, then waits until its step is let through.
struct DeviceGate {
	volatile GateWords *gw;
	uint32_t step;
	__device__ void operator()() const
	{
		if (gw->open > step)
			return;
		if (threadIdx.x % 64 == 0)
			atomicAdd_system((uint32_t *)&gw->waves, 1u);
		while (gw->open <= step)
			__builtin_amdgcn_s_sleep(2);
	}
};

__global__ void forward_backward(const float *w, const float *x, const float *y, float *grads,
				 float *losses, volatile GateWords *gw, uint32_t step)
{
	int s = blockIdx.x * blockDim.x + threadIdx.x;
	if (s < BATCH)
		losses[s] = sample_grad(w, x + s * IN, y + s * OUT, grads + (size_t)s * NPARAM,
					DeviceGate{gw, step});
}

// One thread per weight: the batch's gradient summed in sample order, then the SGD step.
__global__ void update(float *w, const float *grads)
{
	int p = blockIdx.x * blockDim.x + threadIdx.x;
	if (p >= NPARAM)
		return;
	float g = 0.0f;
	for (int s = 0; s < BATCH; s++)
		g += grads[(size_t)s * NPARAM + p];
	w[p] -= LR * g;
}

// The batch loss: a tree in LDS, one block of BATCH threads.
__global__ void loss_sum(const float *losses, float *total)
{
	__shared__ float part[BATCH];
	int t = threadIdx.x;
	part[t] = losses[t];
	__syncthreads();
	for (int s = BATCH / 2; s > 0; s >>= 1) {
		if (t < s)
			part[t] += part[t + s];
		__syncthreads();
	}
	if (t == 0)
		*total = part[0];
}

struct Data {
	float x[BATCH * IN], y[BATCH * OUT], w0[NPARAM];
};

// The batch (targets are a fixed smooth function of the inputs) and the initial weights.
static void make_data(Data &d)
{
	Rng r(31);
	for (int s = 0; s < BATCH; s++) {
		float *x = d.x + s * IN;
		for (int i = 0; i < IN; i++)
			x[i] = r.uniform(-1, 1);
		for (int k = 0; k < OUT; k++)
			d.y[s * OUT + k] = 0.8f * sinf(x[k] + 0.5f * x[k + 4]) + 0.3f * x[(k + 1) % IN];
	}
	for (int p = 0; p < NPARAM; p++)
		d.w0[p] = p < B1 ? r.uniform(-0.6f, 0.6f) : p < W2 ? 0.0f : p < B2 ? r.uniform(-0.3f, 0.3f) : 0.0f;
}

static uint64_t fnv1a(const float *w, int n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	const unsigned char *b = (const unsigned char *)w;
	for (size_t i = 0; i < n * sizeof(float); i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

struct Options {
	int steps = 20, delay_ms = 0;
	bool checksum = false, once = false;
	const char *hold_at = ""; // --hold-at's list
	bool held(int step) const
	{
		for (const char *p = hold_at; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
			if (atoi(p) == step)
				return true;
		return false;
	}
};

static GateWords *gate;                   // host memory the kernels read
static volatile sig_atomic_t release_to; // what SIGUSR1 opens the gate to

static void on_usr1(int) { __atomic_store_n(&gate->open, (uint32_t)release_to, __ATOMIC_SEQ_CST); }

// The gate before a step's kernels: let through, or (held) closed and its count reset.
static void gate_before(int step, bool held)
{
	if (!held) {
		__atomic_store_n(&gate->open, (uint32_t)step + 1, __ATOMIC_SEQ_CST);
		return;
	}
	__atomic_store_n(&gate->waves, 0u, __ATOMIC_SEQ_CST);
	release_to = step + 1;
}

// A held step: waits (at most a minute) until every wave of its forward/backward kernel
// waits at the gate, and says so.
static void announce_held(int step)
{
	uint32_t n = 0;
	for (int t = 0; t < 6000; t++, usleep(10 * 1000))
		if ((n = __atomic_load_n(&gate->waves, __ATOMIC_SEQ_CST)) == BATCH / 64)
			break;
	printf("mlp: step %d in flight: %u waves hold\n", step, n);
	fflush(stdout);
}

static void print_loss(const Options &o, int step, float loss)
{
	uint32_t bits;
	memcpy(&bits, &loss, sizeof bits);
	printf("mlp: step %d loss %.6f", step, loss);
	if (o.checksum)
		printf(" (bits %08x)", bits);
	printf("\n");
	fflush(stdout);
}

// Trains on the GPU; fills losses[steps] and the final weights. With `print`, prints each
// step and holds the steps of --hold-at; returns how many held steps' waves did not count
// in exactly once.
static long train_gpu(const Data &d, const Options &o, float *losses, float *w, bool print)
{
	float *dw = device_copy(d.w0, NPARAM), *dx = device_copy(d.x, BATCH * IN);
	float *dy = device_copy(d.y, BATCH * OUT), *dg, *dl, *dtot;
	long miscounted = 0;
	HIP_CHECK(hipMalloc(&dg, (size_t)BATCH * NPARAM * sizeof(float)));
	HIP_CHECK(hipMalloc(&dl, BATCH * sizeof(float)));
	HIP_CHECK(hipMalloc(&dtot, sizeof(float)));
	for (int step = 0; step < o.steps; step++) {
		bool held = print && o.held(step);
		gate_before(step, held);
		hipLaunchKernelGGL(forward_backward, dim3(BATCH / 64), dim3(64), 0, 0, dw, dx, dy, dg, dl,
				   gate, (uint32_t)step);
		hipLaunchKernelGGL(update, dim3((NPARAM + 63) / 64), dim3(64), 0, 0, dw, dg);
		hipLaunchKernelGGL(loss_sum, dim3(1), dim3(BATCH), 0, 0, dl, dtot);
		HIP_CHECK(hipGetLastError());
		if (held)
			announce_held(step);
		host_copy(&losses[step], dtot, 1);
		miscounted += held && __atomic_load_n(&gate->waves, __ATOMIC_SEQ_CST) != BATCH / 64;
		if (print)
			print_loss(o, step, losses[step]);
		if (o.delay_ms)
			usleep(o.delay_ms * 1000);
	}
	host_copy(w, dw, NPARAM);
	HIP_CHECK(hipFree(dw));
	HIP_CHECK(hipFree(dx));
	HIP_CHECK(hipFree(dy));
	HIP_CHECK(hipFree(dg));
	HIP_CHECK(hipFree(dl));
	HIP_CHECK(hipFree(dtot));
	return miscounted;
}

// The same training on the host (sums in the same order; the device may contract
// multiply-adds and its tanhf differs in the last bits, hence a tolerance on comparisons).
static void train_host(const Data &d, int steps, float *losses)
{
	float *w = new float[NPARAM], *g = new float[(size_t)BATCH * NPARAM], l[BATCH];
	memcpy(w, d.w0, sizeof d.w0);
	for (int step = 0; step < steps; step++) {
		for (int s = 0; s < BATCH; s++)
			l[s] = sample_grad(w, d.x + s * IN, d.y + s * OUT, g + (size_t)s * NPARAM, NoGate{});
		for (int p = 0; p < NPARAM; p++) {
			float sum = 0.0f;
			for (int s = 0; s < BATCH; s++)
				sum += g[(size_t)s * NPARAM + p];
			w[p] -= LR * sum;
		}
		double total = 0;
		for (int s = 0; s < BATCH; s++)
			total += l[s];
		losses[step] = (float)total;
	}
	delete[] w;
	delete[] g;
}

static bool parse(int argc, char **argv, Options &o)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			o.steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--delay-ms") && i + 1 < argc)
			o.delay_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--hold-at") && i + 1 < argc)
			o.hold_at = argv[++i];
		else if (!strcmp(argv[i], "--checksum"))
			o.checksum = true;
		else if (!strcmp(argv[i], "--once"))
			o.once = true;
		else
			return false;
	}
	return o.steps >= 2 && o.delay_ms >= 0;
}

int main(int argc, char **argv)
{
	Options o;
	if (!parse(argc, argv, o)) {
		fprintf(stderr, "usage: mlp [--steps N (>= 2)] [--delay-ms MS] [--hold-at STEP[,STEP...]]"
				" [--checksum] [--once]\n");
		return 2;
	}
	Check c("mlp");
	static Data d;
	make_data(d);
	float *loss = new float[o.steps], *loss2 = new float[o.steps], *href = new float[o.steps];
	float w[NPARAM], w2[NPARAM];
	HIP_CHECK(hipHostMalloc(&gate, sizeof *gate));
	memset(gate, 0, sizeof *gate);
	signal(SIGUSR1, on_usr1);
	long miscounted = train_gpu(d, o, loss, w, true);
	int held = 0;
	for (int s = 0; s < o.steps; s++)
		held += o.held(s);
	if (held)
		c.report("each held kernel's waves counted in once (none started over)", miscounted, held);
	if (o.checksum)
		printf("mlp: weights checksum %016llx after %d steps\n",
		       (unsigned long long)fnv1a(w, NPARAM), o.steps);
	c.expect("the loss falls (last step below half the first)", loss[o.steps - 1] < 0.5f * loss[0]);
	train_host(d, o.steps, href);
	long bad = 0;
	for (int s = 0; s < o.steps; s++)
		bad += !close_to(loss[s], href[s], 1e-3);
	c.report("per-step loss follows the host reference (rel 1e-3)", bad, o.steps);
	if (!o.once) {
		train_gpu(d, o, loss2, w2, false);
		c.expect("a second training gives bit-identical losses",
			 !memcmp(loss, loss2, o.steps * sizeof(float)));
		c.expect("a second training gives bit-identical weights", !memcmp(w, w2, sizeof w));
	}
	HIP_CHECK(hipHostFree(gate));
	return c.finish();
}
