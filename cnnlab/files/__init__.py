"""The lab's files and numpy's (the reading and writing of the lab's main.rs): what a path names, read and written safely.

formats.py  which format a path names (.npy or the lab's CSV), and the readers and writers of either
labcsv.py   the lab's CSV files: the CNN file and the output file, and the input file's text written
csv_reader.py  the lab's input file read in batches, every matrix's rows checked where the layout puts them
csv_batch.py   a batch of it as text, for the GPU's parser, and the errors of a file that ends early
text.py     CSV text read into windows of bytes, a span of whole lines at a time, read ahead
lines.py    spans of lines, the summaries that count them as they are read, the cuts into pieces
npy.py      numpy's .npy files: images in, outputs out
convert.py  `cnnlab convert`: either kind of file between CSV and .npy, every value exact
inputs.py   inputs opened and read with one-line errors
safety.py   outputs written beside the target and renamed on success, never over an input
"""
