"""The CUDA backend (the lab's cuda.rs) and its build step (the lab's build.rs).

context.py     CudaContext: owns the driver context, the modules, the weights, the chunk streams and the memory
driver.py      the driver started early, imported through PyCUDA (typed here: Driver), its errors as one-line DeviceErrors
gpus.py        which GPUs the driver is shown (the command line: only its run's), and the user's numbers for its ordinals
teardown.py    the helper, forked before the driver starts, that closes the driver's files after the run's process ends
memory.py      Allocator: device and page-locked host memory
file_copier.py FileCopier and DeviceImageBuffer: a file's bytes straight into device memory, through staging buffers
file_buffers.py  FileBuffers: a context's image buffers and CSV double buffers, and the file copier that fills them
chunk_streams.py  ChunkStreams: a call's chunks dealt over streams, and where their outputs go
chunk_sources.py  where a chunk's images come from: host arrays, device memory, CSV text parsed on the device
kernels.py     one launcher per kernel of kernel/kernel.cu (its sizes are cnnlab/constants.py's)
ladder.py      the optimization ladder: the rungs, what each teaches, how exact it is, the launch configuration
builds.py      each rung's build sizes, defined once, and every ladder fatbin the build step makes (no numpy)
launchers.py   each rung's launch sizes and launcher
device_setup.py  what the launchers need of the context (DeviceSetup): the device's limits, modules loaded on need
csv_parser.py  kernel/csv.cu's launchers, and CsvParse: the lab's input CSV parsed on the GPU
csv_double_buffer.py  a regular CSV file's text double-buffered on the device: two text and two image buffers
nvcc.py        one kernel source compiled by nvcc to PTX and a fatbin, where stale
multi_gpu.py   MultiGpuBackend: several GPUs as one backend, each batch split in input order into a shard a GPU
buildstep.py   `python build.py`: every kernel source and ladder variant built, one nvcc per core

Nothing is imported here: `python -m cnnlab cuda` imports driver.py before numpy, to start the driver sooner.
"""
