"""Where a chunk's images come from (chunk_streams.ChunkSource): a host batch copied in, images already in device
memory, or CSV text copied in and parsed on the device."""

from __future__ import annotations

from typing import Any

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM
from cnnlab.cuda.chunk_streams import ChunkStream
from cnnlab.cuda.csv_parser import host_values
from cnnlab.cuda.memory import HostCopier


class HostImages:
    """Chunks of a host batch: copied straight from page-locked memory, or staged there first by `copier`."""

    def __init__(self, images: np.ndarray, chunk: int, page_locked: bool, copier: HostCopier) -> None:
        self._images, self._chunk, self._page_locked, self._copier = images, chunk, page_locked, copier

    def start(self, chunk_stream: ChunkStream, index: int) -> None:
        images = self._images[index * self._chunk : (index + 1) * self._chunk]
        if not self._page_locked:
            staged = chunk_stream.staging(len(images))
            self._copier.copy(staged, images)
            images = staged
        chunk_stream.copy_in(images)

    def images(self, chunk_stream: ChunkStream, index: int) -> int:
        return int(chunk_stream.images)


class ResidentImages:
    """Chunks of images already in device memory: nothing to copy. Where `ready` is given (an image buffer's event, its
    fill's last copy), each stream's kernels wait for it on the device."""

    def __init__(self, address: int, chunk: int, ready: Any = None) -> None:
        self._address, self._chunk, self._ready = address, chunk, ready

    def start(self, chunk_stream: ChunkStream, index: int) -> None:
        if self._ready is not None:
            chunk_stream.stream.wait_for_event(self._ready)

    def images(self, chunk_stream: ChunkStream, index: int) -> int:
        return self._address + index * self._chunk * IMAGE_BYTES


class CsvTextChunks:
    """Chunks of a batch of CSV text (csv_batch.CsvBatch): copied to the chunk stream, parsed there into its images.

    Whatever the device could not take (a bad line, a value it cannot prove correctly rounded) is
    done on the host: the values it lists are converted with float() and patched in; anything else
    sends the chunk to the host's parser, which names a bad line as it always has, or converts it.
    """

    def __init__(self, batch: Any, chunk: int, module: Any) -> None:
        self._batch, self._module, self._chunk = batch, module, chunk
        self._pieces = batch.span.pieces(chunk * INPUT_DIM)

    def start(self, chunk_stream: ChunkStream, index: int) -> None:
        piece = self._pieces[index]
        nbytes = piece.end - piece.start
        csv = chunk_stream.csv_parse(self._module, nbytes)
        with chunk_stream.trace.span("copy text in", chunk_stream.stream, bytes=nbytes):
            chunk_stream.driver.memcpy_htod_async(csv.texts[0], piece.data[piece.start : piece.end], chunk_stream.stream)
        first_row = self._batch.first_row(index, self._chunk)
        layout, trace = self._batch.layout, chunk_stream.trace
        images = chunk_stream.images_for(piece.rows // INPUT_DIM)
        csv.queue(chunk_stream.stream, csv.texts[0], nbytes, images, 0, piece.rows, layout, first_row, trace)

    def images(self, chunk_stream: ChunkStream, index: int) -> int:
        piece, csv = self._pieces[index], chunk_stream.csv
        assert csv is not None
        result = csv.result()
        if result.ok:
            csv.patch(chunk_stream.stream, chunk_stream.images, 0, host_values(piece.data[piece.start : piece.end], result))
        else:
            staged = chunk_stream.staging(piece.rows // INPUT_DIM)
            self._batch.parse_on_host(piece, self._batch.first_row(index, self._chunk), staged.reshape(-1))
            chunk_stream.copy_in(staged)
        return int(chunk_stream.images)
