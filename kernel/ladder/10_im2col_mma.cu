// Rung 10, im2col_mma: both layers as matrix products, on the FP64 tensor cores (mma.sync m8n8k4).
//
// What changes from rung 9 (fused_tiled) and why: a step sideways, to the formulation the
// frameworks use and the tensor cores need. With a stride equal to the filter size the patches do
// not overlap, so im2col is a reshape, not a copy: patch p = (r, c) of an image is row p of a
// 400 x 25 matrix whose element (p, t) is image[5r + t / 5][5c + t % 5]. The conv is then that
// matrix times the 25 x 10 filter matrix, and the dense layer the batch's 4,000 activations times
// the 4,000 x 10 weight matrix. Rungs 4 and 7 already are these two products written as SIMT
// loops; here each runs on the FP64 tensor cores (sm_80 and newer): one warp instruction
// multiplies an 8 x 4 tile of A by a 4 x 8 tile of B into an 8 x 8 accumulator, 256
// multiply-adds. The shapes fit the tiles badly (10 filters and 10 neurons fill 16 columns, 25
// taps fill 28), which is the lesson as much as the speed: tensor cores pay where the matrices
// are large in every dimension.
//
// Threads to data: fragments as the PTX ISA lays them out for m8n8k4 .f64 (lane = 4 g + q):
// A element (g, q), B element (q, g), accumulator elements (g, 2q) and (g, 2q + 1).
// - conv_mma: a warp per 8 consecutive patches of an image (A: 8 patches x 4 taps; B: 4 taps x 8
//   filters, held in registers for the whole kernel: 7 k-steps x 2 filter tiles), writing conv_out
//   as rung 6 does ([image][10][20][20]).
// - dense_mma: a thread block per MMA_IMAGES images; its 8 warps split the 4,000 activations, each
//   warp accumulating MMA_IMAGES / 8 image tiles x 2 neuron tiles, then the warps' sums are added
//   in shared memory in warp order (segments = 1).
//
// Exactness: neither layer is bit-exact. A tensor-core step adds four products to the accumulator
// in the hardware's own order and rounding (IEEE double operations, but not cpu.rs's sequence), so
// conv outputs may differ from the CPU's in the last bits; outputs stay within the lab's rule.
//
// Napkin math per image: as rung 6 in device memory (80,000 + 64,000 + 80 bytes). Tensor-core
// instructions: conv 50 tiles x 14 = 700, dense 250; each 256 multiply-adds of which 56% (conv)
// and 62% (dense) are real. On an H100 the FP64 tensor cores peak at twice the FP64 SIMT rate,
// so neither layer is bound by arithmetic; the round trip of the activations is the bound.
#include "../cnn.h"

#if !defined(MMA_IMAGES)
#error "im2col_mma's sizes missing: build with `python build.py`"
#endif
#define MMA_WARPS 8                  // dense_mma's warps: launch with 256 threads
#define MMA_K 4                      // the m8n8k4 tile's depth
#define TAP_STEPS ((FILTER_TAPS + MMA_K - 1) / MMA_K)  // 7: 25 taps padded to 28
#define IMAGE_TILES (MMA_IMAGES / 8)
#define SLICE (OUT_NEURON_DIM / MMA_WARPS)             // activations per warp of dense_mma
static_assert(MMA_IMAGES % 8 == 0 && SLICE % MMA_K == 0 && MAP_SIZE % 8 == 0, "whole tiles");

__constant__ double filters[CONV_LAYER_SIZE * FILTER_TAPS];

// d (8 x 8, this lane's two elements) += a (8 x 4) * b (4 x 8).
__device__ __forceinline__ void mma_8x8x4(double (&d)[2], double a, double b)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a), "d"(b));
#else
    __trap();  // no FP64 tensor cores: cnnlab/cuda/ladder.py refuses this rung before sm_80
#endif
}

// conv_mma(images, conv_out, batch): any grid of whole warps.
extern "C" __global__ void conv_mma(const double *__restrict__ images, double *__restrict__ conv_out, int batch)
{
    const int lane = threadIdx.x % WARP, g = lane / 4, q = lane % 4;
    double b[TAP_STEPS][2];  // B[t][n] = filter n's tap t, zero past 25 taps and 10 filters
#pragma unroll
    for (int j = 0; j < TAP_STEPS; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int t = MMA_K * j + q, n = 8 * h + g;  // the padding reads a real filter value, then drops it
            const double value = filters[min(n, CONV_LAYER_SIZE - 1) * FILTER_TAPS + min(t, FILTER_TAPS - 1)];
            b[j][h] = t < FILTER_TAPS && n < CONV_LAYER_SIZE ? value : 0.0;
        }
    const long long tiles = (long long)batch * (MAP_SIZE / 8);
    const long long warps = (long long)gridDim.x * blockDim.x / WARP;
    for (long long tile = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / WARP; tile < tiles; tile += warps) {
        const long long image = tile / (MAP_SIZE / 8);
        const int p = (int)(tile % (MAP_SIZE / 8)) * 8 + g;  // this lane's row of A: patch p
        const double *patch = images + image * IMAGE_DOUBLES + p / CONV_OUT_DIM * BAND_DOUBLES + p % CONV_OUT_DIM * FILTER_DIM;
        double d[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
#pragma unroll
        for (int j = 0; j < TAP_STEPS; ++j) {
            const int t = min(MMA_K * j + q, FILTER_TAPS - 1);  // past 25: a real tap, dropped
            const double tap = patch[t / FILTER_DIM * INPUT_DIM + t % FILTER_DIM];
            const double a = MMA_K * j + q < FILTER_TAPS ? tap : 0.0;
            mma_8x8x4(d[0], a, b[j][0]);
            mma_8x8x4(d[1], a, b[j][1]);
        }
        // This lane holds patch (tile's 8 patches)[g] for filters 8h + 2q and 8h + 2q + 1.
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int n = 8 * h + 2 * q + e;
                if (n < CONV_LAYER_SIZE)
                    conv_out[image * OUT_NEURON_DIM + n * MAP_SIZE + p] = d[h][e] < 0.0 ? 0.0 : d[h][e];
            }
    }
}

// dense_mma(conv_out, weights, partials, batch): partials [batch][10] (segments = 1); 256 threads.
extern "C" __global__ void __launch_bounds__(MMA_WARPS * WARP)
dense_mma(const double *__restrict__ conv_out, const double *__restrict__ weights, double *__restrict__ partials, int batch)
{
    __shared__ double warp_sums[MMA_WARPS][MMA_IMAGES][OUT_LAYER_SIZE];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane / 4, q = lane % 4;
    const long long groups = (batch + MMA_IMAGES - 1) / MMA_IMAGES;
    // B[k][n] = weights[n][k]: this lane's column n = g (tile 0) and 8 + g (tile 1, zero past 10 neurons).
    const double *weight0 = weights + g * OUT_NEURON_DIM + q;
    const double *weight1 = weights + (8 + g < OUT_LAYER_SIZE ? 8 + g : 0) * OUT_NEURON_DIM + q;
    for (long long group = blockIdx.x; group < groups; group += gridDim.x) {
        const long long first = group * MMA_IMAGES;
        double d[IMAGE_TILES][2][2] = {};
        const double *rows[IMAGE_TILES];  // this lane's row of A in each image tile: image first + 8m + g
        bool real[IMAGE_TILES];           // past the batch: the last image is read, and zeros used
#pragma unroll
        for (int m = 0; m < IMAGE_TILES; ++m) {
            const long long image = first + 8 * m + g;
            real[m] = image < batch;
            rows[m] = conv_out + (real[m] ? image : batch - 1) * OUT_NEURON_DIM + q;
        }
        for (int k = warp * SLICE; k < (warp + 1) * SLICE; k += MMA_K) {
            const double b0 = __ldg(weight0 + k), b1 = 8 + g < OUT_LAYER_SIZE ? __ldg(weight1 + k) : 0.0;
#pragma unroll
            for (int m = 0; m < IMAGE_TILES; ++m) {
                const double a = real[m] ? rows[m][k] : 0.0;
                mma_8x8x4(d[m][0], a, b0);
                mma_8x8x4(d[m][1], a, b1);
            }
        }
#pragma unroll
        for (int m = 0; m < IMAGE_TILES; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int n = 8 * h + 2 * q + e;
                    if (n < OUT_LAYER_SIZE)
                        warp_sums[warp][8 * m + g][n] = d[m][h][e];
                }
        __syncthreads();
        for (int j = threadIdx.x; j < MMA_IMAGES * OUT_LAYER_SIZE; j += blockDim.x) {
            const int image_in_group = j / OUT_LAYER_SIZE, n = j % OUT_LAYER_SIZE;
            double total = warp_sums[0][image_in_group][n];
            for (int w = 1; w < MMA_WARPS; ++w)
                total += warp_sums[w][image_in_group][n];
            if (first + image_in_group < batch)
                partials[(first + image_in_group) * OUT_LAYER_SIZE + n] = total;
        }
        __syncthreads();
    }
}
