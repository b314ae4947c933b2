#include "train/batch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "data/batch_balance.h"
#include "data/documents.h"
#include "model/mtp.h"
#include "model/transformer.h"
#include "parallel/context/document_layout.h"
#include "parallel/context/zigzag.h"

namespace trainer::train {

uint64_t first_sample_of(uint64_t consumed_samples, int64_t dp_rank, int64_t accumulation_steps, int64_t micro,
                         int64_t micro_batch_size) {
  return consumed_samples + uint64_t((dp_rank * accumulation_steps + micro) * micro_batch_size);
}

namespace {

// A host tensor on `device`. To a GPU through pinned memory without blocking the host: a copy from
// pageable memory waits for the stream to drain, so the host sat there until the previous
// micro-batch's kernels had finished (an H200 trace: 150 ms at each micro-batch boundary) and the
// GPU then idled while the next micro-batch's first kernels were launched.
at::Tensor to_device(const at::Tensor& host, c10::Device device) {
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, host.scalar_type(), /*non_blocking=*/true);
}

}  // namespace

BatchOptions BatchOptions::of(const recipe::Recipe& recipe) {
  BatchOptions o;
  o.loss_mask_token = recipe.data.loss_mask_token;
  o.mtp_depth = recipe.model.num_nextn_predict_layers;
  o.document_masking = recipe.data.document_masking;
  o.reset_positions = recipe.data.reset_positions;
  o.predict_across_documents = recipe.data.predict_across_documents;
  o.document_separator_token = recipe.data.document_separator_token;
  return o;
}

MicroBatch make_micro_batch(const data::Dataset& dataset, uint64_t first_sample, int64_t micro_batch_size,
                            int64_t seq_len, c10::Device device, const BatchOptions& options) {
  std::vector<uint64_t> samples;
  for (int64_t b = 0; b < micro_batch_size; ++b) samples.push_back(first_sample + uint64_t(b));
  return make_micro_batch(dataset, samples, seq_len, device, options);
}

std::vector<std::vector<std::vector<uint64_t>>> global_batch_samples(const data::Dataset& dataset,
                                                                     uint64_t consumed_samples, int64_t dp,
                                                                     int64_t accumulation, int64_t micro_batch_size,
                                                                     int64_t seq_len, const BatchOptions& options,
                                                                     bool balance) {
  const int64_t total = dp * accumulation * micro_batch_size;
  std::vector<double> costs(size_t(total), 0.0);
  if (balance) {
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < total; ++i)
      costs[size_t(i)] = double(data::squared_document_lengths(
          data::documents_of_sample(dataset, consumed_samples + uint64_t(i), seq_len, options.document_separator_token,
                                    &tokens),
          seq_len));
  }
  const data::GlobalBatchPlan plan = data::plan_global_batch(costs, dp, accumulation, micro_batch_size, balance);
  std::vector<std::vector<std::vector<uint64_t>>> samples(plan.size());
  for (size_t r = 0; r < plan.size(); ++r)
    for (const auto& micro : plan[r]) {
      samples[r].emplace_back();
      for (const int64_t offset : micro) samples[r].back().push_back(consumed_samples + uint64_t(offset));
    }
  return samples;
}

MicroBatch make_micro_batch(const data::Dataset& dataset, const std::vector<uint64_t>& samples, int64_t seq_len,
                            c10::Device device, const BatchOptions& options) {
  const int64_t count = seq_len + 1, micro_batch_size = int64_t(samples.size());
  std::vector<int32_t> tokens(size_t(micro_batch_size * count));
  for (int64_t b = 0; b < micro_batch_size; ++b) dataset.sample(samples[size_t(b)], seq_len, tokens.data() + b * count);
  const at::Tensor all =
      at::from_blob(tokens.data(), {micro_batch_size, count}, at::TensorOptions().dtype(at::kInt)).to(at::kLong);
  MicroBatch batch;
  batch.inputs = to_device(all.narrow(1, 0, seq_len).contiguous(), device);
  // A copy, never a view of `all`: with one sample per micro-batch the narrowed rows are already
  // contiguous, and masking the targets in place would write kIgnoreIndex into the inputs.
  at::Tensor targets = all.narrow(1, 1, seq_len).clone();
  if (options.loss_mask_token) targets.masked_fill_(targets == *options.loss_mask_token, model::kIgnoreIndex);
  at::Tensor crossing_documents;  // [B, seq_len + 1] when targets across documents are left out
  if (options.document_masking) {
    // Each sample's documents over its seq_len + 1 tokens: the inputs' documents and positions,
    // and the targets that cross into the next document.
    at::Tensor documents = at::empty({micro_batch_size, count}, at::kInt);
    at::Tensor positions = at::empty({micro_batch_size, count}, at::kInt);
    for (int64_t b = 0; b < micro_batch_size; ++b) {
      std::vector<int64_t> starts;
      if (!options.document_separator_token) {
        auto found = dataset.document_starts(samples[size_t(b)], seq_len);
        if (!found) throw std::logic_error("document masking without a separator token needs a document index");
        starts = std::move(*found);
      }
      const data::SampleDocuments sample =
          data::sample_documents(tokens.data() + b * count, count, starts, options.document_separator_token);
      std::copy(sample.document.begin(), sample.document.end(), documents[b].data_ptr<int32_t>());
      std::copy(sample.position.begin(), sample.position.end(), positions[b].data_ptr<int32_t>());
    }
    if (!options.predict_across_documents) {
      targets.masked_fill_(documents.narrow(1, 1, seq_len) != documents.narrow(1, 0, seq_len), model::kIgnoreIndex);
      crossing_documents = documents.to(at::kLong);  // multi-token prediction's targets ahead cross too
    }
    batch.context.documents = to_device(documents.narrow(1, 0, seq_len).to(at::kLong), device);
    if (options.reset_positions) batch.context.positions = to_device(positions.narrow(1, 0, seq_len).to(at::kLong), device);
  }
  batch.targets = to_device(targets, device);
  if (options.mtp_depth > 0)
    batch.context.mtp_ahead = to_device(
        model::mtp_ahead(all.narrow(1, 0, seq_len), targets, options.mtp_depth, crossing_documents), device);
  return batch;
}

at::Tensor document_squares(const at::Tensor& documents) {
  // Each sample's documents are numbered 0, 1, ...: their lengths are the counts of each number.
  const int64_t t = documents.size(1);
  const at::Tensor flat = (documents + at::arange(documents.size(0), documents.options()).unsqueeze(1) * t).reshape({-1});
  const at::Tensor lengths = at::bincount(flat);
  return (lengths * lengths).sum();
}

namespace {

// The sequence (dim 1 of [B, T], dim 3 of mtp_ahead's [2, D, B, T]) in the order `layout` [B, T].
at::Tensor reordered(const at::Tensor& x, const at::Tensor& layout) {
  if (!x.defined()) return x;
  if (x.dim() == 2) return x.gather(1, layout);
  return x.gather(3, layout.view({1, 1, layout.size(0), layout.size(1)}).expand(x.sizes()));
}

}  // namespace

MicroBatch context_part(const MicroBatch& batch, int64_t cp, int64_t rank, bool reorder_documents) {
  if (cp == 1) return batch;
  MicroBatch whole = batch;
  if (reorder_documents && batch.context.documents.defined()) {
    const at::Tensor layout = parallel::document_layout(batch.context.documents, cp);
    whole.inputs = reordered(batch.inputs, layout);
    whole.targets = reordered(batch.targets, layout);
    whole.context.mtp_ahead = reordered(batch.context.mtp_ahead, layout);
    whole.context.documents = reordered(batch.context.documents, layout);
    // Without positions restarting per document the rotary positions are the data's places.
    whole.context.positions = batch.context.positions.defined() ? reordered(batch.context.positions, layout) : layout;
  }
  auto take = [cp, rank](const at::Tensor& x, int64_t dim) {
    return x.defined() ? parallel::zigzag_take(x, dim, cp, rank).contiguous() : at::Tensor();
  };
  MicroBatch part;
  part.inputs = take(whole.inputs, 1);
  part.targets = take(whole.targets, 1);
  part.context.mtp_ahead = take(whole.context.mtp_ahead, 3);
  part.context.documents = whole.context.documents;  // whole: the attention masks' (token_context.h)
  part.context.positions = take(whole.context.positions, 1);
  return part;
}

}  // namespace trainer::train
