#include "train/batch.h"

#include <ATen/ATen.h>

#include <vector>

#include "model/mtp.h"
#include "model/transformer.h"
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

MicroBatch make_micro_batch(const data::Dataset& dataset, uint64_t first_sample, int64_t micro_batch_size,
                            int64_t seq_len, c10::Device device, std::optional<int64_t> loss_mask_token,
                            int64_t mtp_depth) {
  std::vector<int32_t> tokens(size_t(micro_batch_size * (seq_len + 1)));
  for (int64_t b = 0; b < micro_batch_size; ++b)
    dataset.sample(first_sample + uint64_t(b), seq_len, tokens.data() + b * (seq_len + 1));
  const at::Tensor all =
      at::from_blob(tokens.data(), {micro_batch_size, seq_len + 1}, at::TensorOptions().dtype(at::kInt))
          .to(at::kLong);
  MicroBatch batch;
  batch.inputs = to_device(all.narrow(1, 0, seq_len).contiguous(), device);
  at::Tensor targets = all.narrow(1, 1, seq_len).contiguous();
  if (loss_mask_token) targets.masked_fill_(targets == *loss_mask_token, model::kIgnoreIndex);
  batch.targets = to_device(targets, device);
  if (mtp_depth > 0)
    batch.mtp_ahead = to_device(model::mtp_ahead(all.narrow(1, 0, seq_len), targets, mtp_depth), device);
  return batch;
}

MicroBatch context_part(const MicroBatch& batch, int64_t cp, int64_t rank) {
  if (cp == 1) return batch;
  MicroBatch part{parallel::zigzag_take(batch.inputs, 1, cp, rank).contiguous(),
                  parallel::zigzag_take(batch.targets, 1, cp, rank).contiguous(), at::Tensor()};
  if (batch.mtp_ahead.defined()) part.mtp_ahead = parallel::zigzag_take(batch.mtp_ahead, 3, cp, rank).contiguous();
  return part;
}

}  // namespace trainer::train
