"""The sizes the native code gets: the network's (the lab's cnn.rs), which the C++ forward and every CUDA kernel are built
with, and kernel/kernel.cu's own, each defined here once and handed to g++ and nvcc as -D flags (the sources have no
defaults, so the two sides cannot disagree); and the glossary of the words cnnlab uses for sizes, buffers and schedules.

Plain Python, importing nothing: the build (setup.py, build.py) reads them before numpy need be installed.
"""

from __future__ import annotations

# One word per idea, everywhere in cnnlab (code, docs, the bench). Sizes:
#   image    one 100x100 input matrix; its outputs are one row of OUT_LAYER_SIZE values.
#   batch    the images of one backend.compute() call; a run's host buffers hold one batch (--batch).
#   step     the images one reader.read_into() call fills: a batch is read a step at a time.
#   pass     the images computed in one go so that what they make stays in cache: the CPU's numpy forward's
#            vectorised pass; the GPU's two-kernel rung's launch of both kernels over part of a chunk.
#   chunk    (GPU) the images one chunk stream holds on the device and runs through the kernels at once.
#   segment  (GPU) a slice of the 4000 flattened values: flattened_to_dense writes one partial dot
#            product per segment, and the host adds them up.
#   shard    (GPU) one GPU's part of a batch, where several GPUs compute it (cuda/multi_gpu.py).
#   window   (CSV) a host buffer the file's bytes are read into (page-locked for the GPU); two take turns.
#   span     (CSV) the whole lines of a window that make one batch (or one step).
#   piece    (CSV) a span's lines cut for one parse: 16 images for a host thread, a chunk for the GPU
#            (kernel/csv.cu and cuda/csv_parser.py call the piece they parse a "block").
#   range    (CSV, GPU) the bytes of a regular file one text buffer takes, cut just after a row.
# Buffers and schedules:
#   slot           one of a run's reader turns (two with read-ahead): a host buffer it fills, or only a turn
#                  where the input fills none (run.py).
#   staging buffer a page-locked host buffer that pageable bytes are copied into on their way to the device: a
#                  chunk stream's, and the file copier's (two a thread, each a task of the file).
#   chunk stream   (GPU) a CUDA stream with the device buffers of one chunk; a batch's chunks are dealt
#                  round-robin over the chunk streams (cuda/chunk_streams.py).
#   image buffer   (GPU) device memory for a batch of images, filled straight from a .npy file by the file
#                  copier, or parsed into from CSV text; its `ready` event says the fill has arrived.
#   text buffer    (GPU) device memory for a range of a CSV file's text, filled by the file copier.
#   double buffer  (GPU) two text buffers and two image buffers taking turns: one fills while the other is
#                  parsed or computed (cuda/csv_double_buffer.py numbers the steps).
#   task           the bytes one host copy thread takes at a time (4 MiB: cuda/memory.py's TASK_BYTES).
#   file copier    (GPU) the threads that read a file's bytes into staging buffers and copy them to a device
#                  buffer, a task at a time (cuda/file_copier.py).
#   A CUDA "thread block" is always called that in full; a "lane" is only ever a thread of a warp.
INPUT_DIM = 100  # an image is INPUT_DIM x INPUT_DIM
FILTER_DIM = 5  # each convolution filter is FILTER_DIM x FILTER_DIM, applied at stride FILTER_DIM
CONV_LAYER_SIZE = 10  # number of filters
CONV_OUT_DIM = INPUT_DIM // FILTER_DIM  # each filter gives a CONV_OUT_DIM x CONV_OUT_DIM map
OUT_NEURON_DIM = CONV_LAYER_SIZE * CONV_OUT_DIM * CONV_OUT_DIM  # 4000 flattened values
OUT_LAYER_SIZE = 10  # number of output neurons
IMAGE_BYTES = INPUT_DIM * INPUT_DIM * 8  # 80,000 bytes of float64 per image
MIN_ROW_BYTES = 2 * INPUT_DIM  # the shortest row of an input CSV: 100 one-character values, 99 commas and a line end

# Floating-point operations per image: a multiply and an add per convolution tap and per weight.
FLOPS_PER_IMAGE = 2 * (CONV_LAYER_SIZE * CONV_OUT_DIM * CONV_OUT_DIM * FILTER_DIM * FILTER_DIM + OUT_LAYER_SIZE * OUT_NEURON_DIM)


def network_sizes() -> dict[str, int]:
    """The network's sizes by name, as the native code gets them (-D flags: the CUDA kernels' and the C++ forward's)."""
    return {
        "INPUT_DIM": INPUT_DIM,
        "FILTER_DIM": FILTER_DIM,
        "CONV_LAYER_SIZE": CONV_LAYER_SIZE,
        "CONV_OUT_DIM": CONV_OUT_DIM,
        "OUT_NEURON_DIM": OUT_NEURON_DIM,
        "OUT_LAYER_SIZE": OUT_LAYER_SIZE,
    }


CONV_BANDS_PER_BLOCK = 8  # output rows (bands of 5 input rows) one conv2d_relu thread block handles at a time
DENSE_MAX_THREADS = 1024  # flattened_to_dense's largest thread block (its shared memory is sized for it)


def kernel_sizes() -> dict[str, int]:
    """Every size kernel.cu uses, by the name nvcc gets it as."""
    return {
        **network_sizes(),
        "CONV_BANDS_PER_BLOCK": CONV_BANDS_PER_BLOCK,
        "DENSE_MAX_THREADS": DENSE_MAX_THREADS,
    }
