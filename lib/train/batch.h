#pragma once
// Turning global sample indices into a micro-batch (DESIGN.md invariant 2): global batch k holds
// samples [k*G, (k+1)*G) of the dataset's global order; data-parallel rank r, in micro-batch m of
// its A accumulation steps, reads the micro_batch_size samples starting at
// consumed + (r*A + m) * micro_batch_size.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

#include "data/dataset.h"
#include "model/token_context.h"
#include "recipe/recipe.h"

namespace trainer::train {

struct MicroBatch {
  at::Tensor inputs;   // int64 [B, T]
  at::Tensor targets;  // int64 [B, T]; model::kIgnoreIndex where a target is left out of the loss
  model::TokenContext context;  // multi-token prediction's tokens ahead, documents, positions
};

// What a micro-batch is made with besides its samples.
struct BatchOptions {
  std::optional<int64_t> loss_mask_token;  // data.loss_mask_token: those targets become kIgnoreIndex
  int64_t mtp_depth = 0;                   // model.num_nextn_predict_layers: context.mtp_ahead
  // data.document_masking and its keys: context.documents (and positions), targets across a
  // document start left out unless predict_across_documents.
  bool document_masking = false, reset_positions = true, predict_across_documents = false;
  std::optional<int64_t> document_separator_token;

  static BatchOptions of(const recipe::Recipe& recipe);
};

// The first global sample index of micro-batch `micro` on data-parallel rank `dp_rank`.
uint64_t first_sample_of(uint64_t consumed_samples, int64_t dp_rank, int64_t accumulation_steps, int64_t micro,
                         int64_t micro_batch_size);

// The global samples `samples` (in this order) as `options` say. Document masking without a
// separator token needs the dataset's document index (std::logic_error otherwise: open_dataset
// refuses such data first).
MicroBatch make_micro_batch(const data::Dataset& dataset, const std::vector<uint64_t>& samples, int64_t seq_len,
                            c10::Device device, const BatchOptions& options = {});
// Samples first_sample .. + micro_batch_size - 1.
MicroBatch make_micro_batch(const data::Dataset& dataset, uint64_t first_sample, int64_t micro_batch_size,
                            int64_t seq_len, c10::Device device, const BatchOptions& options = {});

// Each data-parallel rank's micro-batches of the global batch that starts at sample
// `consumed_samples`: [dp rank][micro-batch] -> global sample indices. Contiguous (first_sample_of),
// or with `balance` (data.balance resolved, document masking) chosen by the samples' attention
// work (data/batch_balance.h), which reads every sample's documents.
std::vector<std::vector<std::vector<uint64_t>>> global_batch_samples(const data::Dataset& dataset,
                                                                     uint64_t consumed_samples, int64_t dp,
                                                                     int64_t accumulation, int64_t micro_batch_size,
                                                                     int64_t seq_len, const BatchOptions& options,
                                                                     bool balance);

// Sum over the samples of the squares of their documents' lengths: documents int64 [B, T] (each
// position's document, increasing along T) -> an int64 scalar on its device.
at::Tensor document_squares(const at::Tensor& documents);

// Under context parallelism: cp rank `rank`'s zigzag part of every sequence (parallel/context/
// zigzag.h), inputs, targets and the context alike (but the documents, which stay whole); the batch
// itself for cp = 1. With `reorder_documents` (ring attention with document masking) each sample is
// first reordered by parallel::document_layout so that the parts balance the documents' attention
// work; the documents are reordered too, and the rotary positions, the data's places when they do
// not restart per document. Every token keeps its target, so the loss is the same up to summation
// order.
MicroBatch context_part(const MicroBatch& batch, int64_t cp, int64_t rank, bool reorder_documents = false);

}  // namespace trainer::train
