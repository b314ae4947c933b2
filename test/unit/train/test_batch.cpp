// A micro-batch with document masking: each position's document and restarted position, and the
// target that crosses into the next document left out (unless predict_across_documents), from a
// separator token; split like the inputs under context parallelism.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "data/dataset.h"
#include "model/transformer.h"
#include "train/batch.h"

using namespace trainer;

namespace {

// Sample i is the tokens i, i + 1, ... mod 10: token 9 (the separator below) ends a document.
class CountingDataset : public data::Dataset {
 public:
  void sample(uint64_t index, int64_t seq_len, int32_t* out) const override {
    for (int64_t p = 0; p <= seq_len; ++p) out[p] = int32_t((index + uint64_t(p)) % 10);
  }
  std::optional<double> entropy_floor() const override { return std::nullopt; }
  std::string describe() const override { return "counting"; }
};

}  // namespace

TEST_CASE("batch: documents from a separator - positions restart - the crossing target is left out", "[train][documents]") {
  const CountingDataset data;
  train::BatchOptions options;
  options.document_masking = true;
  options.document_separator_token = 9;
  // Sample 6: tokens 6 7 8 9 0 1 2 | 3; inputs 6..2, targets 7..3.
  const train::MicroBatch mb = train::make_micro_batch(data, 6, 1, 7, c10::Device(c10::DeviceType::CPU), options);
  CHECK(at::equal(mb.context.documents, at::tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1}, at::kLong).view({1, 7})));
  CHECK(at::equal(mb.context.positions, at::tensor(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2}, at::kLong).view({1, 7})));
  // The separator (position 3) does not predict the next document's first token.
  const int64_t x = model::kIgnoreIndex;
  CHECK(at::equal(mb.targets, at::tensor(std::vector<int64_t>{7, 8, 9, x, 1, 2, 3}, at::kLong).view({1, 7})));
  options.predict_across_documents = true;
  options.reset_positions = false;
  const train::MicroBatch across = train::make_micro_batch(data, 6, 1, 7, c10::Device(c10::DeviceType::CPU), options);
  CHECK(at::equal(across.targets, at::tensor(std::vector<int64_t>{7, 8, 9, 0, 1, 2, 3}, at::kLong).view({1, 7})));
  CHECK(!across.context.positions.defined());
  // cp 2: the zigzag parts of the inputs and positions together (chunks 0 and 3 of 4); the
  // documents stay whole (the attention masks' under cp).
  options.reset_positions = true;
  train::MicroBatch even = train::make_micro_batch(data, 6, 1, 8, c10::Device(c10::DeviceType::CPU), options);
  const train::MicroBatch part = train::context_part(even, 2, 0);
  CHECK(at::equal(part.inputs, at::tensor(std::vector<int64_t>{6, 7, 2, 3}, at::kLong).view({1, 4})));
  CHECK(at::equal(part.context.positions, at::tensor(std::vector<int64_t>{0, 1, 2, 3}, at::kLong).view({1, 4})));
  CHECK(at::equal(part.context.documents, even.context.documents));
  // Ring attention with documents: the sample is reordered first (parallel::document_layout). Two
  // documents of 4 tokens, longer than a chunk of 2: each is split zigzag by itself, so chunk j
  // holds places j and 4 + j, and rank 0 (chunks 0 and 3) places 0, 4, 3, 7: every token with its
  // own target, position and document; the documents reordered whole.
  const train::MicroBatch ring = train::context_part(even, 2, 0, /*reorder_documents=*/true);
  CHECK(at::equal(ring.inputs, at::tensor(std::vector<int64_t>{6, 0, 9, 3}, at::kLong).view({1, 4})));
  CHECK(at::equal(ring.targets, at::tensor(std::vector<int64_t>{7, 1, 0, 4}, at::kLong).view({1, 4})));  // across documents
  CHECK(at::equal(ring.context.positions, at::tensor(std::vector<int64_t>{0, 0, 3, 3}, at::kLong).view({1, 4})));
  CHECK(at::equal(ring.context.documents, at::tensor(std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0, 1}, at::kLong).view({1, 8})));
  train::BatchOptions continuing = options;
  continuing.reset_positions = false;  // the rotary positions are then the data's places
  const train::MicroBatch places = train::context_part(
      train::make_micro_batch(data, 6, 1, 8, c10::Device(c10::DeviceType::CPU), continuing), 2, 0, true);
  CHECK(at::equal(places.context.positions, at::tensor(std::vector<int64_t>{0, 4, 3, 7}, at::kLong).view({1, 4})));
  // Multi-token prediction: module 1's target at i (token i + 2) is left out where it lies in
  // another document than i (positions 2 and 3), not only where the main target crosses.
  train::BatchOptions mtp = options;
  mtp.predict_across_documents = false;
  mtp.mtp_depth = 1;
  const train::MicroBatch ahead = train::make_micro_batch(data, 6, 1, 7, c10::Device(c10::DeviceType::CPU), mtp);
  CHECK(at::equal(ahead.context.mtp_ahead[1][0],
                  at::tensor(std::vector<int64_t>{8, 9, x, x, 2, 3, x}, at::kLong).view({1, 7})));
  mtp.predict_across_documents = true;
  const train::MicroBatch ahead_across = train::make_micro_batch(data, 6, 1, 7, c10::Device(c10::DeviceType::CPU), mtp);
  CHECK(at::equal(ahead_across.context.mtp_ahead[1][0],
                  at::tensor(std::vector<int64_t>{8, 9, 0, 1, 2, 3, x}, at::kLong).view({1, 7})));
  // One sample per micro-batch: leaving targets out does not touch the inputs they overlap.
  train::BatchOptions masked_token;
  masked_token.loss_mask_token = 9;
  const train::MicroBatch one = train::make_micro_batch(data, 6, 1, 7, c10::Device(c10::DeviceType::CPU), masked_token);
  CHECK(at::equal(one.inputs, at::tensor(std::vector<int64_t>{6, 7, 8, 9, 0, 1, 2}, at::kLong).view({1, 7})));
  CHECK(at::equal(one.targets, at::tensor(std::vector<int64_t>{7, 8, x, 0, 1, 2, 3}, at::kLong).view({1, 7})));
  CHECK(at::equal(mb.inputs, at::tensor(std::vector<int64_t>{6, 7, 8, 9, 0, 1, 2}, at::kLong).view({1, 7})));
  // Without masking: no context, every target.
  const train::MicroBatch plain = train::make_micro_batch(data, 6, 1, 7, c10::Device(c10::DeviceType::CPU));
  CHECK(!plain.context.documents.defined());
  CHECK(at::equal(plain.targets, at::tensor(std::vector<int64_t>{7, 8, 9, 0, 1, 2, 3}, at::kLong).view({1, 7})));
}

TEST_CASE("batch: the global batch's samples - contiguous - balanced by documents - document squares", "[train][documents]") {
  const CountingDataset data;
  train::BatchOptions options;
  options.document_masking = true;
  options.document_separator_token = 9;
  // 7 inputs per sample: samples 4, 5, 6, 7 hold documents of 6+1, 5+2, 4+3 and 3+4 inputs, whose
  // squares sum to 37, 29, 25 and 25. Longest first over 2 ranks of 2 samples: 37 -> rank 0,
  // 29 -> rank 1, 25 (sample 6) -> rank 1 (less work), 25 (sample 7) -> rank 0 (rank 1 is full).
  const auto contiguous = train::global_batch_samples(data, 4, 2, 2, 1, 7, options, false);
  CHECK(contiguous[0] == std::vector<std::vector<uint64_t>>{{4}, {5}});
  CHECK(contiguous[1] == std::vector<std::vector<uint64_t>>{{6}, {7}});
  const auto balanced = train::global_batch_samples(data, 4, 2, 2, 1, 7, options, true);
  CHECK(balanced[0] == std::vector<std::vector<uint64_t>>{{4}, {7}});
  CHECK(balanced[1] == std::vector<std::vector<uint64_t>>{{5}, {6}});
  // A micro-batch of non-contiguous samples holds those samples.
  const train::MicroBatch mb = train::make_micro_batch(data, std::vector<uint64_t>{7, 4}, 7, c10::Device(c10::DeviceType::CPU), options);
  CHECK(at::equal(mb.inputs[0], at::tensor(std::vector<int64_t>{7, 8, 9, 0, 1, 2, 3}, at::kLong)));
  CHECK(at::equal(mb.inputs[1], at::tensor(std::vector<int64_t>{4, 5, 6, 7, 8, 9, 0}, at::kLong)));
  CHECK(train::document_squares(mb.context.documents).item<int64_t>() == 25 + 37);
  const at::Tensor documents = at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 2, 0, 1, 1, 1, 1, 1}, at::kLong).view({2, 6});
  CHECK(train::document_squares(documents).item<int64_t>() == 9 + 4 + 1 + 1 + 25);
}
