#include "comm/argument_checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

namespace trainer::comm {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw CommError(fmt::format("{}: {}", where, what));
}

void check_pair(const std::string& where, const at::Tensor& output, const at::Tensor& input) {
  if (!output.is_contiguous() || !input.is_contiguous()) fail(where, "input and output must be contiguous");
  if (output.scalar_type() != input.scalar_type())
    fail(where, fmt::format("input is {} but output is {}", c10::toString(input.scalar_type()),
                            c10::toString(output.scalar_type())));
  if (output.device() != input.device()) fail(where, "input and output are on different devices");
}

}  // namespace

void check_reduce_scatter(const std::string& where, int64_t group_size, const at::Tensor& output,
                          const at::Tensor& input) {
  check_pair(where, output, input);
  if (input.numel() != output.numel() * group_size)
    fail(where, fmt::format("input has {} elements, expected output's {} x {} ranks = {}", input.numel(),
                            output.numel(), group_size, output.numel() * group_size));
}

void check_all_gather(const std::string& where, int64_t group_size, const at::Tensor& output,
                      const at::Tensor& input) {
  check_pair(where, output, input);
  if (output.numel() != input.numel() * group_size)
    fail(where, fmt::format("output has {} elements, expected input's {} x {} ranks = {}", output.numel(),
                            input.numel(), group_size, input.numel() * group_size));
}

void check_all_to_all(const std::string& where, int64_t group_size, const at::Tensor& output, const at::Tensor& input,
                      const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  check_pair(where, output, input);
  if (int64_t(output_splits.size()) != group_size || int64_t(input_splits.size()) != group_size)
    fail(where, fmt::format("{} output and {} input splits for a group of {} ranks", output_splits.size(),
                            input_splits.size(), group_size));
  for (const auto& splits : {output_splits, input_splits})
    for (int64_t s : splits)
      if (s < 0) fail(where, fmt::format("negative split in [{}]", fmt::join(splits, ", ")));
  const int64_t in_rows = std::accumulate(input_splits.begin(), input_splits.end(), int64_t(0));
  const int64_t out_rows = std::accumulate(output_splits.begin(), output_splits.end(), int64_t(0));
  if (input.dim() == 0 || output.dim() == 0) fail(where, "input and output need a first dimension to split");
  if (input.size(0) != in_rows || output.size(0) != out_rows)
    fail(where, fmt::format("input has {} rows and output {}, but the splits add up to {} and {}", input.size(0),
                            output.size(0), in_rows, out_rows));
  const int64_t in_row = in_rows ? input.numel() / in_rows : 0, out_row = out_rows ? output.numel() / out_rows : 0;
  if (in_rows && out_rows && in_row != out_row)
    fail(where, fmt::format("rows of {} elements cannot land in rows of {}", in_row, out_row));
}

void check_send_recv(const std::string& where, int64_t group_size, int64_t rank, const std::vector<P2POp>& ops) {
  for (const auto& op : ops) {
    if (op.peer < 0 || op.peer >= group_size || op.peer == rank)
      fail(where, fmt::format("peer {} is not another rank of this group of {} (this rank is {})", op.peer, group_size,
                              rank));
    if (!op.tensor.is_contiguous()) fail(where, "tensors must be contiguous");
  }
}

}  // namespace trainer::comm
