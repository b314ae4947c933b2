"""Writes trainer token files (docs/data.md's format) of short random documents, each ending with
token 0 (the separator of data.document_separator_token=0), for the document-masking comparison
with transformers (test_hf.cpp).
usage: write_documents.py PREFIX SEED DOCUMENTS
Lengths 1 to 30 tokens (separator included), token ids 1..255 before it."""
import random
import struct
import sys

prefix, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
tokens, offsets = [], [0]
for _ in range(count):
    length = rng.randint(1, 30)
    tokens += [rng.randrange(1, 256) for _ in range(length - 1)] + [0]
    offsets.append(len(tokens))
with open(prefix + ".bin", "wb") as f:
    f.write(b"TRAINTOK" + struct.pack("<IIQQ", 1, 2, len(tokens), max(tokens)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
with open(prefix + ".idx", "wb") as f:
    f.write(b"TRAINIDX" + struct.pack("<IIQQ", 1, 0, count, len(tokens)))
    f.write(struct.pack(f"<{len(offsets)}Q", *offsets))
