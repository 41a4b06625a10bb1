// The Lab 3 CNN's two layers as CUDA kernels over a batch of images, all float64.
//
// Build:  python build.py            (nvcc to kernel/kernel.fatbin with the sizes as -D flags: machine code
//                                     for sm_75..sm_90 and compute_75 PTX for any newer GPU)
// Run:    python -m cnnlab cuda      (cnnlab/cuda/context.py loads kernel/kernel.fatbin and launches these)
// Check:  pytest -m gpu tests/test_cuda.py   (outputs against the numpy CPU backend, the reference)
//
// Data layout (row-major, as the lab's files):
//   images   [batch][100][100]      the input
//   conv_out [batch][10][20][20]    after convolution and ReLU, i.e. [batch][4000] flattened
//   weights  [10][4000]             the output layer
//   partials [segments][stride][10] one partial dot product per segment of the 4000 inputs;
//                                   the host adds the segments up (cnnlab/cuda/chunk_streams.py), or sum_segments
//                                   does, into a caller's device array
//   outputs  [batch][10]            sum_segments' result
//
// Rung 6 of the optimization ladder (warp_shuffle, docs/ladder.md; the rungs in
// kernel/ladder/): what changes from rung 5 (block_sweep) and why: flattened_to_dense reads its
// activations and weights 16 bytes at a time, and reduces each warp's sums with shuffles (register
// to register, no shared memory, no barrier) instead of a shared-memory tree; only the warps' totals
// meet in shared memory.
//
// Napkin math per image: 80,000 bytes of input read, 32,000 written and read back between the
// kernels, 80 * segments bytes of partials out: ~144 KB of device memory traffic, so at ~3 TB/s
// about 48 ns, ~20 million images/s. 100,000 + 40,000 multiply-adds: 0.28 MFLOP, 5.6 TFLOP/s at
// that rate, well under the FP64 peak. Both kernels are bound by memory, not arithmetic.

// Every size below comes from cnnlab/network.py and cnnlab/cuda/kernels.py, passed by the build step as
// -D flags (cnnlab.kernels.nvcc_defines()); they are defined there once, never here.
#if !defined(CONV_BANDS_PER_BLOCK) || !defined(DENSE_MAX_THREADS)
#error "kernel sizes missing: build with `python build.py`, which passes them as -D flags"
#endif
#include "cnn.h"  // the other sizes' guard, conv_relu_exact, block_totals

// The filters are read by every thread at the same time and address: constant memory broadcasts them.
__constant__ double filters[CONV_LAYER_SIZE * FILTER_TAPS];

// conv2d_relu: convolution (10 filters, 5x5, stride 5) and ReLU for a batch of images.
//
// A "band" is one output row r of one image: input rows 5r..5r+4, 500 doubles that lie
// contiguously in memory, so consecutive bands are one contiguous run. Each block copies
// CONV_BANDS_PER_BLOCK bands into shared memory with coalesced 16-byte loads, then thread
// (band, c) of the block computes the 10 filter outputs of patch (r, c) from shared memory and
// writes them, 20 consecutive threads to 20 consecutive doubles of each output row. A grid-stride
// loop walks the batch, so any grid size covers any batch.
//
// Each sum runs over the 25 taps in cpu.rs's order with separately rounded multiplies and adds
// (__dmul_rn/__dadd_rn are never fused into FMAs), so conv_out equals the CPU's bit for bit.
//
// Every image value passes through a register on its way to the tile, so the kernel also checks it
// there: a NaN or an infinity sets *nonfinite to 1 (the Python API refuses such images; files are
// checked as they are parsed). Two compares per 16-byte load cost nothing in a kernel bound by memory.
#define CONV_THREADS (CONV_BANDS_PER_BLOCK * CONV_OUT_DIM)  // launch with this block size

extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv2d_relu(const double *__restrict__ images, double *__restrict__ conv_out, int batch, int *__restrict__ nonfinite)
{
    __shared__ double2 tile[CONV_BANDS_PER_BLOCK * BAND_DOUBLES / 2];
    const long long total_bands = (long long)batch * CONV_OUT_DIM;
    const int band_in_tile = threadIdx.x / CONV_OUT_DIM;
    const int c = threadIdx.x % CONV_OUT_DIM;
    bool finite = true;

    for (long long first = (long long)blockIdx.x * CONV_BANDS_PER_BLOCK; first < total_bands;
         first += (long long)gridDim.x * CONV_BANDS_PER_BLOCK) {
        const int bands = (int)min((long long)CONV_BANDS_PER_BLOCK, total_bands - first);
        const double2 *source = reinterpret_cast<const double2 *>(images + first * BAND_DOUBLES);
        for (int k = threadIdx.x; k < bands * BAND_DOUBLES / 2; k += blockDim.x) {
            const double2 values = source[k];
            finite &= isfinite(values.x) & isfinite(values.y);
            tile[k] = values;
        }
        __syncthreads();

        if (band_in_tile < bands) {
            double taps[FILTER_TAPS];
            load_taps(taps, reinterpret_cast<const double *>(tile) + band_in_tile * BAND_DOUBLES + c * FILTER_DIM, INPUT_DIM);
            const long long band = first + band_in_tile;
            const long long image = band / CONV_OUT_DIM;
            const int r = (int)(band % CONV_OUT_DIM);
            double *out = conv_out + image * OUT_NEURON_DIM + r * CONV_OUT_DIM + c;
#pragma unroll
            for (int f = 0; f < CONV_LAYER_SIZE; ++f)
                out[f * CONV_OUT_DIM * CONV_OUT_DIM] = conv_relu_exact(taps, filters + f * FILTER_TAPS);
        }
        __syncthreads();  // the tile is refilled next round
    }
    if (!finite)
        *nonfinite = 1;  // every writer writes the same value: no atomic needed
}

// flattened_to_dense: partial dot products of each image's 4000 values with the 10 neurons' weights.
//
// The 4000 inputs are cut into gridDim.y segments; block (x, p) handles segment p for images
// x, x + gridDim.x, ... Its threads stride over the segment two doubles (16 bytes) at a time,
// coalesced, each keeping 10 running sums, one per neuron; the weights of the segment are the same
// for every image the block visits, so they stay in L1/L2. The block then reduces its 10 sums:
// warp shuffles within each warp, shared memory across warps, and writes one partial per neuron to
// partials[p][image][n] (row stride `stride` images). The host adds the gridDim.y partials.
// Launch with a block size that is a multiple of 32, at most DENSE_MAX_THREADS.

extern "C" __global__ void
flattened_to_dense(const double *__restrict__ conv_out, const double *__restrict__ weights,
                   double *__restrict__ partials, int batch, int stride)
{
    __shared__ double warp_sums[DENSE_MAX_THREADS / WARP][OUT_LAYER_SIZE];
    const int segment_length = (OUT_NEURON_DIM / 2 + gridDim.y - 1) / gridDim.y * 2;  // even: 16-byte loads
    const int begin = blockIdx.y * segment_length;
    const int end = min(begin + segment_length, OUT_NEURON_DIM);

    for (long long image = blockIdx.x; image < batch; image += gridDim.x) {
        const double *input = conv_out + image * OUT_NEURON_DIM;
        double sums[OUT_LAYER_SIZE];
#pragma unroll
        for (int n = 0; n < OUT_LAYER_SIZE; ++n)
            sums[n] = 0.0;
        for (int k = begin + 2 * threadIdx.x; k < end; k += 2 * blockDim.x) {
            const double2 x = *reinterpret_cast<const double2 *>(input + k);
#pragma unroll
            for (int n = 0; n < OUT_LAYER_SIZE; ++n) {
                const double2 w = __ldg(reinterpret_cast<const double2 *>(weights + n * OUT_NEURON_DIM + k));
                sums[n] = fma(x.x, w.x, sums[n]);
                sums[n] = fma(x.y, w.y, sums[n]);
            }
        }
        const double total = block_totals(sums, &warp_sums[0][0]);  // its barriers let warp_sums be reused at once
        if (threadIdx.x < OUT_LAYER_SIZE)
            partials[((long long)blockIdx.y * stride + image) * OUT_LAYER_SIZE + threadIdx.x] = total;
    }
}

// sum_segments: each output of `batch` images, the sum of its `segments` partials from
// flattened_to_dense, written to outputs[image][n]: the host's reduction, done where the partials
// are when the outputs go to a caller's device array (the Python API's out=).
//
// It adds in the order the host's numpy does (numpy's sum over the leading axis starts from +0.0
// and adds the segments' rows in turn, each add rounded once), with __dadd_rn, which is never
// contracted: the outputs equal the host-reduced ones bit for bit, so the lab's comparison sees the
// same values whichever side adds them. A thread per output, grid-stride.
extern "C" __global__ void
sum_segments(const double *__restrict__ partials, double *__restrict__ outputs, int batch, int stride, int segments)
{
    const long long total = (long long)batch * OUT_LAYER_SIZE;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (long long)gridDim.x * blockDim.x) {
        double sum = 0.0;
        for (int s = 0; s < segments; ++s)
            sum = __dadd_rn(sum, partials[(long long)s * stride * OUT_LAYER_SIZE + k]);
        outputs[k] = sum;
    }
}

// find_nonfinite: sets *nonfinite to 1 where any of `count` doubles is a NaN or an infinity. It is the
// check conv2d_relu makes as it loads its tile, on its own, for the rungs of the ladder whose kernels
// make none (cnnlab/cuda/chunk_streams.py runs it before them where the images are not known to be finite): one
// more read of the images, 16 bytes a thread at a time, grid-stride, at the copy rate. `count` is a
// whole number of images, so even.
extern "C" __global__ void
find_nonfinite(const double *__restrict__ values, long long count, int *__restrict__ nonfinite)
{
    const double2 *pairs = reinterpret_cast<const double2 *>(values);
    bool finite = true;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < count / 2; k += (long long)gridDim.x * blockDim.x) {
        const double2 pair = pairs[k];
        finite &= isfinite(pair.x) & isfinite(pair.y);
    }
    if (!finite)
        *nonfinite = 1;  // every writer writes the same value: no atomic needed
}
