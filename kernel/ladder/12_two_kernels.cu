// Rung 12, two_kernels: the design card's two kernels at their best: rung 9's conv alone, then rung 7's dense.
//
// What changes from rung 7 (coarsened) and why: rungs 4 to 7 write each chunk's 4,000 activations an
// image (32 KB) to device memory and read them back, 144 KB an image where 80 KB is the least: a cap of
// 56% of the copy bound, if the kernels were bound by memory. They are not. Measured alone on the H200
// (BENCHMARKS.md): rung 6's conv2d_relu runs at 39% of the bound, rung 9's conv (tiles of images,
// cp.async, the 10 filters of a patch in registers) at 61%, rung 6's flattened_to_dense at 60% and rung
// 7's dense_coarsened at 84%. Two kernels run one after the other, so the pair is capped by the sum of
// their times: 1 / (1/0.61 + 1/0.84) = 35% of the bound with the fastest of each, whatever the
// activations cost. Keeping them in L2 between the kernels (passes of a chunk small enough for their
// activations to stay there) was measured too: a pass that fits half of the H200's 60 MB (~900 images)
// cannot fill the device (8-image tiles on 132 multiprocessors want ~3,200), and rung 12 ran slower the
// smaller its passes: 2.4% of the bound at 64 images a pass, 30.8% at 2,048. So this rung takes the
// fastest conv and the fastest dense kernel the ladder has, a pass at a time just large enough to fill
// the device, and the 56% cap does not bind: the kernels' own instructions do.
//
// Threads to data: conv_tiled is 09_fused_tiled.cu built with FT_CONV_ONLY (thread (i, c) computes
// column c of image i of its tile, 10 filters a patch, and writes them where conv2d_relu would);
// dense_coarsened is 07_coarsened.cu's (each weight load serves COARSE_IMAGES images). Both compiled
// here into one module; the host launches them a pass of the chunk at a time (cnnlab/cuda/launchers.py).
//
// Exactness: the conv is bit-exact; the dense sums per thread, per warp, per segment: within the
// lab's rule.
//
// Napkin math per image: 80,000 bytes of image read, 32,000 of activations written and read back,
// 320 of partials: ~144 KB of device memory. The conv's 200,000 separately rounded FP64 instructions
// (16.7 T/s on an H100: ~12 us a million images) and the dense kernel's 40,000 FMAs with their loads,
// one kernel after the other: ~35% of the copy bound at the kernels' measured rates.
#include "09_fused_tiled.cu"
#include "07_coarsened.cu"
