// Rung 12, l2_resident: two kernels, as the design card has them, their activations kept in L2 between them.
//
// What changes from rung 7 (coarsened) and why: rungs 4 to 7 write each chunk's 4,000 activations an
// image (32 KB) to device memory and read them back, 144 KB an image where 80 KB is the least: the cap
// of 56% of the copy bound those rungs are said to meet. That cap assumes the activations reach HBM. An
// H100 has 50 MB of L2 (an H200 60 MB): here the host launches the two kernels a pass of the chunk at a
// time (cnnlab/cuda/launchers.py: l2_pass_images), each pass small enough that its activations, with
// those of the other lanes' passes in flight, fill at most half of the L2; the dense kernel reads them
// from L2, and device memory sees each image once. Measured first with rung 6's conv2d_relu (its images
// read evict-first) and rung 7's dense kernel: no faster than rung 7, whose activations do reach HBM, so
// that pair is bound by its kernels' instructions, not by the round trip (BENCHMARKS.md). So the conv
// here is rung 9's, alone: conv_tiled, tiles of 8 images walked a band at a time, the bands streamed into
// shared memory by cp.async while the last is computed.
//
// Threads to data: conv_tiled is 09_fused_tiled.cu built with FT_CONV_ONLY (thread (i, c) computes
// column c of image i of its tile, 10 filters a patch, and writes them where conv2d_relu would);
// dense_coarsened is 07_coarsened.cu's (each weight load serves COARSE_IMAGES images, so the weights'
// traffic from L2 is 320 KB / COARSE_IMAGES an image). Both compiled here into one module.
//
// Exactness: the conv is bit-exact; the dense sums per thread, per warp, per segment: within the
// lab's rule.
//
// Napkin math per image: device memory 80,000 bytes of image and 320 bytes of partials (the
// activations, 64 KB written and read, in L2); from L2 also 80 KB of weights at 4 images a weight
// load. The conv's 200,000 separately rounded FP64 instructions an image at 16.7 T/s (H100): ~12 us
// a million images, under the ~27 us it takes to read them: the two kernels can near the copy bound
// where each fills the device and their passes stay in L2.
#include "09_fused_tiled.cu"
#include "07_coarsened.cu"
