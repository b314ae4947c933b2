#pragma once
// Document masking (data.document_masking) under context parallelism. Every attention path takes
// each position's document over the whole sequence, int64 [B, T] (numbered 0, 1, ... in each
// sample, in the data's order). At cp 1 and in Ulysses' gathered sequence each document runs alone
// (causal_sdpa.h). Ring attention's ranks hold zigzag parts of the sequence (zigzag.h); with
// documents the sequence is first reordered (document_layout) so that those parts balance the
// documents' attention work: a document longer than a chunk is split into 2 cp pieces, piece j in
// chunk j (zigzag per document: every rank gets an equal share of its causal work), and shorter
// documents go whole, longest first, into a chunk of the rank with the least work so far.
//
// The reordering keeps each document's tokens in their order (a document's pieces sit in
// increasing chunks), and documents keep their numbers: a position's offset in its document and
// its place in the data follow from the ids alone (document_offsets, document_order), and inside a
// document causality is the order of the reordered sequence.
#include <ATen/core/Tensor.h>

#include <vector>

namespace trainer::parallel {

// For each position: how many earlier positions of its sample belong to its document, int64 [B, T].
at::Tensor document_offsets(const at::Tensor& documents);

// For each position: its place in the data's order (the lengths of the documents numbered before
// its own, plus its offset), int64 [B, T]; arange(T) for every sample not reordered.
at::Tensor document_order(const at::Tensor& documents);

// The reordering of one sample whose documents have `lengths` (in order, summing to T, a multiple
// of 2 cp): position i of the reordered sequence holds the data's position result[i].
std::vector<int64_t> document_layout(const std::vector<int64_t>& lengths, int64_t cp);

// document_layout for each sample of `documents` [B, T]: int64 [B, T] on documents' device.
at::Tensor document_layout(const at::Tensor& documents, int64_t cp);

}  // namespace trainer::parallel
