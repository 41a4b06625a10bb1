// Rung 9, fused_tiled: conv and dense in one kernel, over a tile of images at a time, with the
// images and the dense weights streamed through shared memory by asynchronous copies.
//
// What changes from rung 8 (fused) and why: rung 8 keeps each image's 4,000 activations in shared
// memory, but every image still reads all 320 KB of dense weights (from L2): four times its own
// 80 KB. Here a thread block takes a tile of FT_TILE_IMAGES images and walks it one band at a time
// (band r: image rows 5r..5r+4, 4 KB of each image; with it the 16 KB of weights that band's
// outputs meet). Each band of weights is loaded once for the whole tile, so the weights cost
// 320 KB / FT_TILE_IMAGES per image, from L2, and the activations never leave registers: a
// thread computes its patch's 10 filter outputs and at once adds their 100 products with the
// weights into 10 running sums, one per neuron. FT_STAGES buffers take turns: while the block
// computes band r, the copies of the next band are in flight (cp.async, sm_80 and newer), so
// memory and arithmetic overlap without more threads.
//
// Threads to data: FT_TILE_IMAGES x 20 threads; thread (i, c) owns column c of image i of the
// tile and, over the 20 bands, its 20 patches (5r.., 5c..). A warp holds 32 / FT_TILE_IMAGES
// columns of every image of the tile, so its threads read at most that many distinct weights at a
// time (one shared-memory wavefront: the rest are broadcasts), and the image stride in shared
// memory (FT_IMAGE_STRIDE, chosen by cnnlab/cuda/launchers.py) puts each half-warp's 16 tap loads in 16
// distinct bank pairs. After the 20th band a tile's sums are added across its 20 columns in shared
// memory, in a fixed order, and written as one partial per neuron (segments = 1).
//
// Exactness: the conv is bit-exact (cpu.rs's order for each filter, no FMA); the dense sums run
// per column over bands and filters with FMAs, then across columns: within the lab's rule.
//
// Napkin math per image: 80,000 bytes read once from device memory, 80 written; 320 KB /
// FT_TILE_IMAGES of weights from L2 (40 KB at 8). 100,000 multiplies and 100,000 adds for the
// conv (separately rounded) and 40,000 FMAs: 240,000 FP64 instructions, 280,000 FLOPs. On an
// H100 (132 SMs x 64 FP64 units x 1.98 GHz = 16.7 T instructions/s) that is ~14 us per million
// images, against ~27 us per million to read them at the device-to-device rate (~3.0 TB/s): bound
// by memory, with the FP64 pipe over half busy at that bound, so arithmetic must overlap the
// copies well. The bound it is measured against: reading each image once at the device-to-device
// copy rate. Measured on the H100 (BENCHMARKS.md): 77% of it; rung 11 shows what holds it there.
#include "../cnn.h"

#if !defined(FT_TILE_IMAGES) || !defined(FT_STAGES) || !defined(FT_IMAGE_STRIDE) || !defined(FT_EXACT_CONV) || !defined(FT_CONV_ONLY)
#error "fused_tiled's sizes missing: build with `python build.py`"
#endif
#define FT_THREADS (FT_TILE_IMAGES * CONV_OUT_DIM)
#define FT_COLUMNS_PER_WARP (WARP / FT_TILE_IMAGES)
#define BAND_WEIGHTS (OUT_LAYER_SIZE * CONV_LAYER_SIZE * CONV_OUT_DIM)  // [neuron][filter][column] of one band
// FT_CONV_ONLY (rung 12 builds this file so): the conv alone, conv_tiled, which writes the activations for a
// dense kernel to read next; its stages then hold the images' bands only.
#define STAGE_DOUBLES (FT_TILE_IMAGES * FT_IMAGE_STRIDE + (FT_CONV_ONLY ? 0 : BAND_WEIGHTS))
#define BAND_COPIES (BAND_DOUBLES / 2)  // 16-byte copies per band of one image
static_assert(WARP % FT_TILE_IMAGES == 0, "a warp holds whole columns of the tile");
static_assert(FT_IMAGE_STRIDE % 2 == 0 && FT_IMAGE_STRIDE >= BAND_DOUBLES, "16-byte aligned image slots");

__constant__ double filters[CONV_LAYER_SIZE * FILTER_TAPS];

// One filter over one patch, then ReLU: bit-exact (conv_relu_exact) unless FT_EXACT_CONV is 0, as
// rung 11 builds this file: then the 25 products are summed by FMAs, in cpu.rs's order but each
// product unrounded, which halves the conv's FP64 instructions and gives up its bit-exactness.
__device__ __forceinline__ double conv_relu(const double (&taps)[FILTER_TAPS], const double *filter)
{
#if FT_EXACT_CONV
    return conv_relu_exact(taps, filter);
#else
    double sum = taps[0] * filter[0];
#pragma unroll
    for (int t = 1; t < FILTER_TAPS; ++t)
        sum = fma(taps[t], filter[t], sum);
    return sum < 0.0 ? 0.0 : sum;
#endif
}

// Queue the copies of one step (band r of tile `tile`): each image's band and the band's weights.
__device__ __forceinline__ void load_step(double *stage, const double *__restrict__ images,
                                          const double *__restrict__ weights, long long tile, int r, int batch)
{
    for (int k = threadIdx.x; k < FT_TILE_IMAGES * BAND_COPIES; k += FT_THREADS) {
        const int i = k / BAND_COPIES, copy = k % BAND_COPIES;
        const long long image = tile * FT_TILE_IMAGES + i;
        if (image < batch)  // past the batch: the slot keeps stale values, computed on and never written
            copy16_async(stage + i * FT_IMAGE_STRIDE + 2 * copy, images + image * IMAGE_DOUBLES + r * BAND_DOUBLES + 2 * copy);
    }
    // weights[n][f * 400 + r * 20 + c] for every (n, f): 100 runs of 20 doubles.
    double *band_weights = stage + FT_TILE_IMAGES * FT_IMAGE_STRIDE;
    for (int k = threadIdx.x; k < (FT_CONV_ONLY ? 0 : BAND_WEIGHTS / 2); k += FT_THREADS) {
        const int run = k / (CONV_OUT_DIM / 2), copy = k % (CONV_OUT_DIM / 2);  // run = n * 10 + f
        copy16_async(band_weights + run * CONV_OUT_DIM + 2 * copy, weights + run * MAP_SIZE + r * CONV_OUT_DIM + 2 * copy);
    }
}

#if FT_CONV_ONLY
// conv_tiled(images, conv_out, batch): the activations, conv_out[image][f][r][c], as conv2d_relu writes them.
extern "C" __global__ void __launch_bounds__(FT_THREADS, 1)
conv_tiled(const double *__restrict__ images, double *__restrict__ conv_out, int batch)
{
    const double *weights = nullptr;  // nothing of the dense layer here (load_step copies none)
#else
extern "C" __global__ void __launch_bounds__(FT_THREADS, 1)
fused_tiled(const double *__restrict__ images, const double *__restrict__ weights, double *__restrict__ partials, int batch)
{
#endif
    extern __shared__ __align__(16) double shared[];
    const int lane = threadIdx.x % WARP;
    const int i = lane / FT_COLUMNS_PER_WARP;
    const int c = threadIdx.x / WARP * FT_COLUMNS_PER_WARP + lane % FT_COLUMNS_PER_WARP;
    const int tiles = (batch + FT_TILE_IMAGES - 1) / FT_TILE_IMAGES;
    const int steps = ((int)blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0) * CONV_OUT_DIM;
    const auto tile_of = [&](int step) { return (long long)blockIdx.x + (long long)(step / CONV_OUT_DIM) * gridDim.x; };

#pragma unroll
    for (int step = 0; step < FT_STAGES - 1; ++step) {
        if (step < steps)
            load_step(shared + step * STAGE_DOUBLES, images, weights, tile_of(step), step % CONV_OUT_DIM, batch);
        commit_copies();  // one group per step, empty or not, so that wait_copies counts steps
    }
#if !FT_CONV_ONLY  // the dense layer's: a thread's partial sums, then the tile's column sums
    double *column_sums = shared + FT_STAGES * STAGE_DOUBLES;  // [neuron][image of tile][column]
    double sums[OUT_LAYER_SIZE];
#pragma unroll
    for (int n = 0; n < OUT_LAYER_SIZE; ++n)
        sums[n] = 0.0;
#endif

    for (int step = 0; step < steps; ++step) {
        const int ahead = step + FT_STAGES - 1;  // into the buffer freed at the end of the last step
        if (ahead < steps)
            load_step(shared + ahead % FT_STAGES * STAGE_DOUBLES, images, weights, tile_of(ahead), ahead % CONV_OUT_DIM, batch);
        commit_copies();
        wait_copies<FT_STAGES - 1>();  // this step's group has landed (this thread's copies) ...
        __syncthreads();               // ... and every other thread's

        const double *stage = shared + step % FT_STAGES * STAGE_DOUBLES;
        double taps[FILTER_TAPS];
        load_taps(taps, stage + i * FT_IMAGE_STRIDE + c * FILTER_DIM, INPUT_DIM);
#if FT_CONV_ONLY
        const long long image = tile_of(step) * FT_TILE_IMAGES + i;
        const int r = step % CONV_OUT_DIM;
        if (image < batch)
#pragma unroll
            for (int f = 0; f < CONV_LAYER_SIZE; ++f)
                conv_out[image * OUT_NEURON_DIM + f * MAP_SIZE + r * CONV_OUT_DIM + c] = conv_relu(taps, filters + f * FILTER_TAPS);
#else
        const double *band_weights = stage + FT_TILE_IMAGES * FT_IMAGE_STRIDE + c;
#pragma unroll
        for (int f = 0; f < CONV_LAYER_SIZE; ++f) {
            const double activation = conv_relu(taps, filters + f * FILTER_TAPS);
#pragma unroll
            for (int n = 0; n < OUT_LAYER_SIZE; ++n)
                sums[n] = fma(activation, band_weights[(n * CONV_LAYER_SIZE + f) * CONV_OUT_DIM], sums[n]);
        }

        if (step % CONV_OUT_DIM == CONV_OUT_DIM - 1) {  // the tile's last band: add its columns, write
#pragma unroll
            for (int n = 0; n < OUT_LAYER_SIZE; ++n) {
                column_sums[(n * FT_TILE_IMAGES + i) * CONV_OUT_DIM + c] = sums[n];
                sums[n] = 0.0;
            }
            __syncthreads();
            if (threadIdx.x < FT_TILE_IMAGES * OUT_LAYER_SIZE) {
                const int image_in_tile = threadIdx.x % FT_TILE_IMAGES, n = threadIdx.x / FT_TILE_IMAGES;
                const double *columns = column_sums + (n * FT_TILE_IMAGES + image_in_tile) * CONV_OUT_DIM;
                double total = columns[0];
                for (int column = 1; column < CONV_OUT_DIM; ++column)
                    total += columns[column];
                const long long image = tile_of(step) * FT_TILE_IMAGES + image_in_tile;
                if (image < batch)
                    partials[image * OUT_LAYER_SIZE + n] = total;
            }
        }
#endif
        __syncthreads();  // this step's buffer is refilled next step; column_sums is read before it is rewritten
    }
    wait_copies<0>();
}
