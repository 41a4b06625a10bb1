// What the CNN's kernels share (kernel.cu and the optimization ladder's, kernel/ladder/): the sizes'
// guard, the bit-exact convolution sum, the block-wide reduction of warp shuffles, and the
// asynchronous 16-byte copy (cp.async on sm_80 and newer, a plain load and store before).
//
// Every size comes from Python (cnnlab/network.py, cnnlab/cuda/kernels.py, cnnlab/cuda/launchers.py) as -D
// flags passed by the build step; nothing here has a default, so the two sides cannot disagree.
#pragma once

#if !defined(INPUT_DIM) || !defined(FILTER_DIM) || !defined(CONV_LAYER_SIZE) || !defined(CONV_OUT_DIM) || \
    !defined(OUT_NEURON_DIM) || !defined(OUT_LAYER_SIZE)
#error "kernel sizes missing: build with `python build.py`, which passes them as -D flags"
#endif

#define WARP 32
#define FILTER_TAPS (FILTER_DIM * FILTER_DIM)
#define IMAGE_DOUBLES (INPUT_DIM * INPUT_DIM)
#define BAND_DOUBLES (FILTER_DIM * INPUT_DIM)        // 5 image rows: the input of one output row
#define MAP_SIZE (CONV_OUT_DIM * CONV_OUT_DIM)       // 400 outputs per filter, 400 patches per image

// One filter over one patch, then ReLU: the 25 products summed in cpu.rs's order, each product and
// each sum rounded on its own (__dmul_rn/__dadd_rn are never fused into an FMA), so the value is
// the CPU's bit for bit. `filter` may point into constant, shared or global memory.
__device__ __forceinline__ double conv_relu_exact(const double (&taps)[FILTER_TAPS], const double *filter)
{
    double sum = __dmul_rn(taps[0], filter[0]);
#pragma unroll
    for (int t = 1; t < FILTER_TAPS; ++t)
        sum = __dadd_rn(sum, __dmul_rn(taps[t], filter[t]));
    return sum < 0.0 ? 0.0 : sum;  // ReLU as cpu.rs writes it: -0.0 stays -0.0
}

// The 25 taps of the patch whose top-left value is at `patch`, in rows `row_stride` doubles apart.
__device__ __forceinline__ void load_taps(double (&taps)[FILTER_TAPS], const double *patch, int row_stride)
{
#pragma unroll
    for (int t = 0; t < FILTER_TAPS; ++t)
        taps[t] = patch[(t / FILTER_DIM) * row_stride + t % FILTER_DIM];
}

// 16 bytes from global to shared memory without passing through registers, completing later
// (sm_80 and newer: cp.async, in groups that wait_copies waits for); before sm_80 a plain copy.
__device__ __forceinline__ void copy16_async(double *shared, const double *global)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(shared)),
                 "l"(global));
#else
    *reinterpret_cast<double2 *>(shared) = __ldg(reinterpret_cast<const double2 *>(global));
#endif
}

__device__ __forceinline__ void commit_copies()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most `pending` of this thread's committed groups are still in flight.
template <int pending> __device__ __forceinline__ void wait_copies()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// The block-wide totals of every thread's `sums` (N running sums each): a shuffle tree within each
// warp (5 levels, no shared memory, no barrier), then the warps' totals added in warp order in
// shared memory. Thread j < N returns total j; `warp_sums` holds N doubles per warp of the block.
template <int N> __device__ __forceinline__ double block_totals(double (&sums)[N], double *warp_sums)
{
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
#pragma unroll
    for (int j = 0; j < N; ++j)
        for (int offset = WARP / 2; offset > 0; offset /= 2)
            sums[j] += __shfl_down_sync(0xffffffffu, sums[j], offset);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < N; ++j)
            warp_sums[warp * N + j] = sums[j];
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x < N) {
        total = warp_sums[threadIdx.x];
        for (int w = 1; w < warps; ++w)
            total += warp_sums[w * N + threadIdx.x];
    }
    __syncthreads();  // warp_sums may be written again at once
    return total;
}
