// Rung 12, l2_resident: the design card's two kernels, their activations kept in L2 between them.
//
// What changes from rung 7 (coarsened) and why: rungs 4 to 7 write each chunk's 4,000 activations an
// image (32 KB) to device memory and read them back, 144 KB an image where 80 KB is the least: the cap
// of 56% of the copy bound every two-kernel rung meets. That cap assumes the activations reach HBM. An
// H100 has 50 MB of L2 (an H200 60 MB): here the host launches the two kernels a pass of the chunk at a
// time (cnnlab/cuda/launchers.py: l2_pass_images), each pass small enough that its activations, with
// those of the other lanes' passes in flight, fill at most half of the L2; the dense kernel then reads
// them from L2, and device memory sees each image once. conv2d_relu reads the images evict-first
// (CONV_STREAMING_LOADS: ld.global.cs), so the 80 KB an image streaming through L2 do not push the
// activations out before they are read.
//
// Threads to data: conv2d_relu is rung 6's (kernel/kernel.cu), dense_coarsened rung 7's
// (07_coarsened.cu: each weight load serves COARSE_IMAGES images, so the weights' traffic from L2 is
// 320 KB / COARSE_IMAGES an image), both compiled here into one module.
//
// Exactness: the conv is bit-exact; the dense sums per thread, per warp, per segment: within the
// lab's rule.
//
// Napkin math per image: device memory 80,000 bytes of image and 320 bytes of partials (the
// activations, 64 KB written and read, in L2); L2 traffic ~80 KB of weights at 4 images a weight load
// plus the 64 KB of activations, at L2's ~5 TB/s under 30 ns, the image's 80 KB from HBM at 3 TB/s
// ~27 ns: both kernels near the copy bound where the passes are large enough to fill the device and
// small enough to stay in L2.
#include "../kernel.cu"
#include "07_coarsened.cu"
