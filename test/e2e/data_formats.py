"""Writes the documents of a trainer token dataset again with the reference writers of the other
formats, for the test that the same tokens in any format give the same samples (test_data.cpp).
usage: data_formats.py TRAINER_PREFIX OUT_DIR
  OUT_DIR/megatron.bin/.idx: Megatron-LM's own IndexedDatasetBuilder (megatron-core), uint16 tokens,
                             one document per document;
  OUT_DIR/shard_000.bin, shard_001.bin: llm.c shards (its documented header: 256 int32, magic
                             20240520, version 1, token count; uint16 tokens), the tokens split
                             between the two files at an arbitrary point."""
import os
import struct
import sys

import numpy
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

prefix, out = sys.argv[1], sys.argv[2]
with open(prefix + ".bin", "rb") as f:
    magic, version, width, count, _largest = struct.unpack("<8sIIQQ", f.read(32))
    assert magic == b"TRAINTOK" and width == 2, (magic, width)
    tokens = numpy.frombuffer(f.read(), dtype=numpy.uint16)
with open(prefix + ".idx", "rb") as f:
    magic, version, _reserved, documents, total = struct.unpack("<8sIIQQ", f.read(32))
    offsets = numpy.frombuffer(f.read(), dtype=numpy.uint64)
assert len(tokens) == count == total and len(offsets) == documents + 1

builder = IndexedDatasetBuilder(os.path.join(out, "megatron.bin"), dtype=numpy.uint16)
for d in range(documents):
    builder.add_item(torch.from_numpy(tokens[offsets[d]:offsets[d + 1]].astype(numpy.int64)))
    builder.end_document()
builder.finalize(os.path.join(out, "megatron.idx"))

cut = len(tokens) * 2 // 5
for k, part in enumerate((tokens[:cut], tokens[cut:])):
    header = numpy.zeros(256, dtype=numpy.int32)
    header[0], header[1], header[2] = 20240520, 1, len(part)
    with open(os.path.join(out, f"shard_{k:03d}.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(part.astype(numpy.uint16).tobytes())
print(f"{documents} documents, {len(tokens)} tokens written as megatron.bin/.idx and 2 llm.c shards")
