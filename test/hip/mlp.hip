// A small multi-layer perceptron (8 inputs, 32 tanh hidden units, 4 linear outputs) trained
// with plain SGD on a fixed synthetic batch: a stand-in for a training job. Each step runs
// a forward/backward kernel (per-sample gradients, no atomics), a kernel that sums the
// gradients of each weight over the batch in a fixed order and updates it, and an LDS
// reduction of the loss. Everything is deterministic: two trainings agree bit for bit.
//
//   mlp [--steps N] [--delay-ms MS] [--checksum] [--once]
//
// Prints the loss of every step. Checks: the loss falls, the GPU's losses follow a host
// reference of the same model, and (unless --once) a second training from the same seed
// ends with bit-identical weights. --checksum prints each step's loss with its bits and an
// FNV-1a digest of the final weights (for comparing a checkpointed and restored run with an
// uninterrupted one, bit for bit); --delay-ms
// sleeps between steps so that a checkpoint can land mid-training.
#include "check.h"

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

// One sample's forward and backward pass: returns its loss, writes its gradients to g.
__host__ __device__ static float sample_grad(const float *w, const float *x, const float *y,
					     float *g)
{
	float h[HID], out[OUT], dout[OUT], loss = 0.0f;
	for (int j = 0; j < HID; j++) {
		float a = w[B1 + j];
		for (int i = 0; i < IN; i++)
			a += w[W1 + j * IN + i] * x[i];
		h[j] = tanhf(a);
	}
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

__global__ void forward_backward(const float *w, const float *x, const float *y, float *grads,
				 float *losses)
{
	int s = blockIdx.x * blockDim.x + threadIdx.x;
	if (s < BATCH)
		losses[s] = sample_grad(w, x + s * IN, y + s * OUT, grads + (size_t)s * NPARAM);
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
};

// Trains on the GPU; fills losses[steps] and the final weights.
static void train_gpu(const Data &d, const Options &o, float *losses, float *w, bool print)
{
	float *dw = device_copy(d.w0, NPARAM), *dx = device_copy(d.x, BATCH * IN);
	float *dy = device_copy(d.y, BATCH * OUT), *dg, *dl, *dtot;
	HIP_CHECK(hipMalloc(&dg, (size_t)BATCH * NPARAM * sizeof(float)));
	HIP_CHECK(hipMalloc(&dl, BATCH * sizeof(float)));
	HIP_CHECK(hipMalloc(&dtot, sizeof(float)));
	for (int step = 0; step < o.steps; step++) {
		hipLaunchKernelGGL(forward_backward, dim3(BATCH / 64), dim3(64), 0, 0, dw, dx, dy, dg, dl);
		hipLaunchKernelGGL(update, dim3((NPARAM + 63) / 64), dim3(64), 0, 0, dw, dg);
		hipLaunchKernelGGL(loss_sum, dim3(1), dim3(BATCH), 0, 0, dl, dtot);
		HIP_CHECK(hipGetLastError());
		host_copy(&losses[step], dtot, 1);
		if (print) {
			uint32_t bits;
			memcpy(&bits, &losses[step], sizeof bits);
			printf("mlp: step %d loss %.6f", step, losses[step]);
			if (o.checksum)
				printf(" (bits %08x)", bits);
			printf("\n");
			fflush(stdout);
		}
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
}

// The same training on the host (sums in the same order; the device may contract
// multiply-adds and its tanhf differs in the last bits, hence a tolerance on comparisons).
static void train_host(const Data &d, int steps, float *losses)
{
	float *w = new float[NPARAM], *g = new float[(size_t)BATCH * NPARAM], l[BATCH];
	memcpy(w, d.w0, sizeof d.w0);
	for (int step = 0; step < steps; step++) {
		for (int s = 0; s < BATCH; s++)
			l[s] = sample_grad(w, d.x + s * IN, d.y + s * OUT, g + (size_t)s * NPARAM);
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
		fprintf(stderr, "usage: mlp [--steps N (>= 2)] [--delay-ms MS] [--checksum] [--once]\n");
		return 2;
	}
	Check c("mlp");
	static Data d;
	make_data(d);
	float *loss = new float[o.steps], *loss2 = new float[o.steps], *href = new float[o.steps];
	float w[NPARAM], w2[NPARAM];
	train_gpu(d, o, loss, w, true);
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
	return c.finish();
}
