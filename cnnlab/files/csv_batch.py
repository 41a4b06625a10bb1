"""A batch of the lab's input file as its text, for a backend that parses CSV itself (the GPU), and the errors of an
input file that ends before the images its first line announces.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from cnnlab.constants import INPUT_DIM
from cnnlab.errors import InputFileError
from cnnlab.files.lines import Span
from cnnlab.files.rows import Layout, RowPlace, parse_rows


@dataclass(frozen=True)
class CsvBatch:
    """A batch of images as the text of their lines, for a backend that parses CSV itself (the GPU).

    The span's bytes lie in the reader's window (page-locked, from the backend's allocator) and stay
    there until the reader has taken two batches more. `first_image` counts the file's images before
    the batch's, and `layout` says where its blank lines may stand (rows.Layout).
    """

    path: str | os.PathLike
    span: Span
    images: int
    first_image: int = 0
    layout: Layout = Layout(INPUT_DIM, "image")
    count: int = 0  # the images the file announces
    cut_line: int | None = None  # the file's last line where it has no line end: a bad one is where the file was cut
    def __len__(self) -> int:
        return self.images

    def split(self, parts: int, every: int) -> list[CsvBatch]:
        """The batch as up to `parts` batches in order, each of whole pieces of `every` images (the span's pieces of the
        device's chunk), as even in images as whole pieces allow: a shard of the batch for each of several GPUs."""
        pieces = self.span.pieces(every * INPUT_DIM)
        shards = [pieces[len(pieces) * k // parts : len(pieces) * (k + 1) // parts] for k in range(parts)]
        batches, first_image = [], self.first_image
        for shard in filter(None, shards):
            rows = sum(piece.rows for piece in shard)
            span = Span(self.span.data, shard[0].start, shard[-1].end, rows, shard[0].line_before, tuple(shard))
            batches.append(CsvBatch(self.path, span, rows // INPUT_DIM, first_image, self.layout, self.count, self.cut_line))
            first_image += rows // INPUT_DIM
        return batches

    def first_row(self, piece: int, every: int) -> int:
        """The file's row (counted from its first image's first, 0) that piece `piece` of the span's pieces of `every`
        images starts with."""
        return (self.first_image + piece * every) * INPUT_DIM

    def parse_on_host(self, piece: Span, first_row: int, out: np.ndarray) -> None:
        """Parse a piece of the span, starting at the file's row `first_row`, here: what the device declined, which names
        a bad line as the host always does (and a bad last line with no line end as where the file was cut)."""
        try:
            parse_rows(self.path, piece, INPUT_DIM, out, RowPlace(self.layout, first_row, self.span.start))
        except InputFileError as error:
            if error.line is None or error.line != self.cut_line:
                raise
            raise file_ends(self.path, self.count, first_row + piece.rows, error.line, cut_short=True) from None


def file_ends(path: str | os.PathLike, count: int, rows: int, line: int | None, cut_short: bool = False) -> InputFileError:
    """The error of an input file whose first line announces `count` images and whose text ends after `rows` rows (the
    last of them `cut_short`: a line with no line end that is not a row), at line `line`."""
    image, row = divmod(rows - 1 if cut_short else rows, INPUT_DIM)
    inside = f"file ends inside image {image + 1} of the {count} the first line announces"
    if cut_short:
        return InputFileError(path, f"{inside}: its row {row + 1} is cut short", line)
    if row:
        return InputFileError(path, f"{inside}, after {row} of its {INPUT_DIM} rows", line)
    return InputFileError(path, f"file ends after {image} of {announced(count)}", line)


def announced(count: int) -> str:
    """The images the count line announces, as messages name them."""
    return "the 1 image the first line announces" if count == 1 else f"the {count} images the first line announces"
