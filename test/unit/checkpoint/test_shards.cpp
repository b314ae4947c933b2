// The checkpoint format with several writers: ZeRO fragments stored as flat ranges in several
// rank files, slices read back from any mix of them, and the assignment of replicated tensors.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/shard_assignment.h"
#include "core/error.h"
#include "process.h"

using namespace trainer;
using namespace trainer::checkpoint;

namespace {

CheckpointContent metadata(int64_t step) {
  CheckpointContent c;
  c.step = step;
  c.consumed_samples = 7 * step;
  return c;
}

}  // namespace

TEST_CASE("fragments written by two ranks read back as whole tensors and as slices", "[checkpoint]") {
  test::TempDir dir;
  const at::Tensor w = at::arange(24, at::kFloat).reshape({4, 6});
  const at::Tensor b = at::arange(5, at::kFloat) * 10;
  // Rank 0 holds elements [0, 10) of w; rank 1 holds [10, 24) of w and all of b (a rectangular slice
  // of rows 0-1 and one of rows 2-3 would be the tensor-parallel case: covered below).
  std::vector<TensorRecord> rank0 = {TensorRecord::flat("w", w.reshape({-1}).narrow(0, 0, 10), {4, 6}, {0, 0}, {4, 6}, 0)};
  std::vector<TensorRecord> rank1 = {TensorRecord::flat("w", w.reshape({-1}).narrow(0, 10, 14), {4, 6}, {0, 0}, {4, 6}, 10),
                                     TensorRecord::whole("b", b)};
  const auto report0 = write_rank_shard(dir.path(), 3, 0, rank0);
  const auto report1 = write_rank_shard(dir.path(), 3, 1, rank1);
  const std::string committed = commit_checkpoint(dir.path(), metadata(3), {report0, report1});
  CHECK(committed == dir.path() + "/step-00000003");
  CHECK(std::filesystem::exists(committed + "/shard-00000.safetensors"));
  CHECK(std::filesystem::exists(committed + "/shard-00001.safetensors"));

  const LoadedCheckpoint loaded(dir.path());
  CHECK(loaded.step() == 3);
  CHECK(loaded.consumed_samples() == 21);
  CHECK(loaded.manifest().at("files").size() == 2);
  CHECK(at::equal(loaded.read("w"), w));
  CHECK(at::equal(loaded.read("b"), b));
  // A slice that needs both fragments.
  CHECK(at::equal(loaded.read("w", {1, 2}, {2, 3}), w.narrow(0, 1, 2).narrow(1, 2, 3)));
}

TEST_CASE("rectangular slices from several ranks assemble into any other slice", "[checkpoint]") {
  test::TempDir dir;
  const at::Tensor w = at::randn({6, 4}, at::kFloat);
  std::vector<nlohmann::json> reports;
  for (int64_t r = 0; r < 3; ++r)  // three row blocks, as tensor parallelism would store a column-parallel weight
    reports.push_back(write_rank_shard(dir.path(), 1, r, {TensorRecord::slice("w", w.narrow(0, 2 * r, 2), {6, 4}, {2 * r, 0})}));
  commit_checkpoint(dir.path(), metadata(1), reports);
  const LoadedCheckpoint loaded(dir.path());
  CHECK(at::equal(loaded.read("w"), w));
  for (int64_t half = 0; half < 2; ++half)  // two column blocks: another mesh's view
    CHECK(at::equal(loaded.read("w", {0, 2 * half}, {6, 2}), w.narrow(1, 2 * half, 2)));
}

TEST_CASE("fragments that do not cover a slice are an error naming the tensor", "[checkpoint]") {
  test::TempDir dir;
  const at::Tensor w = at::arange(8, at::kFloat);
  const auto report = write_rank_shard(dir.path(), 1, 0, {TensorRecord::flat("w", w.narrow(0, 0, 5), {8}, {0}, {8}, 0)});
  commit_checkpoint(dir.path(), metadata(1), {report});
  // Refused when the checkpoint is opened, before any tensor is read.
  REQUIRE_THROWS_AS(LoadedCheckpoint(dir.path()), UserError);
  try {
    LoadedCheckpoint loaded(dir.path());
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("tensors.\"w\".shards: the flat_range fragments of the slice at offsets [0] with "
                                     "shape [8] cover 5 of its 8 elements") != std::string::npos);
  }
}

TEST_CASE("step 100000000 is newer than step 99999999 for latest and pruning", "[checkpoint]") {
  // Before: the names were sorted as text, so step-100000000 came first (oldest): without `latest`
  // the older step was resumed, and pruning removed the newest.
  test::TempDir dir;
  for (const int64_t step : {99999999LL, 100000000LL})
    commit_checkpoint(dir.path(), metadata(step), {write_rank_shard(dir.path(), step, 0, {TensorRecord::whole("b", at::ones({2}))})});
  std::filesystem::remove(dir.path() + "/latest");
  CHECK(find_latest_checkpoint(dir.path()) == dir.path() + "/step-100000000");
  prune_checkpoints(dir.path(), 1, "");
  CHECK(std::filesystem::exists(dir.path() + "/step-100000000"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/step-99999999"));
}

TEST_CASE("a rank with nothing to write reports no file and the commit lists only the others", "[checkpoint]") {
  test::TempDir dir;
  const auto empty = write_rank_shard(dir.path(), 2, 1, {});
  CHECK(empty.at("file").is_null());
  const auto full = write_rank_shard(dir.path(), 2, 0, {TensorRecord::whole("x", at::ones({3}))});
  commit_checkpoint(dir.path(), metadata(2), {full, empty});
  const LoadedCheckpoint loaded(dir.path());
  CHECK(loaded.manifest().at("files").size() == 1);
  CHECK(at::equal(loaded.read("x"), at::ones({3})));
}

TEST_CASE("files an interrupted save left in the staging directory are not committed", "[checkpoint]") {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/step-00000004.tmp");
  dir.write("step-00000004.tmp/shard-00007.safetensors", "left over by a run with 8 ranks");
  const auto report = write_rank_shard(dir.path(), 4, 0, {TensorRecord::whole("x", at::ones({2}))});
  const std::string committed = commit_checkpoint(dir.path(), metadata(4), {report});
  CHECK_FALSE(std::filesystem::exists(committed + "/shard-00007.safetensors"));
  CHECK(std::filesystem::exists(committed + "/shard-00000.safetensors"));
}

TEST_CASE("replicated tensors are spread over their replication group by size", "[checkpoint]") {
  CHECK(assign_replicated({100, 10, 60, 50}, 2) == std::vector<int64_t>{0, 0, 1, 1});  // 100 | 60+50, then 10 to the lighter
  CHECK(assign_replicated({5, 5, 5, 5}, 4) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(assign_replicated({5, 5}, 1) == std::vector<int64_t>{0, 0});
  // Six ranks as tp = 2 x dp = 3: "w" slices are replicated over dp (3 ranks with the same tp
  // index), "n" tensors over all six. Each record is written by exactly one rank per slice, and
  // unreplicated records by their holder.
  std::map<std::string, int> writers;
  for (int64_t rank = 0; rank < 6; ++rank) {
    const int64_t tp = rank % 2, dp = rank / 2;
    std::vector<TensorRecord> records;
    for (int i = 0; i < 5; ++i) {
      auto w = TensorRecord::whole(fmt::format("w{}.tp{}", i, tp), at::zeros({i + 1}));
      w.replicated = TensorRecord::Replication{"dp", dp, 3};
      records.push_back(w);
      auto n = TensorRecord::whole(fmt::format("n{}", i), at::zeros({2 * i + 1}));
      n.replicated = TensorRecord::Replication{"tp_dp", rank, 6};
      records.push_back(n);
    }
    records.push_back(TensorRecord::whole("mine", at::zeros({1})));
    const auto written = records_to_write(records);
    for (const auto& r : written) writers[r.name] += 1;
    if (rank == 0) CHECK(written.size() >= 3);  // its own record and a share of both groups
  }
  CHECK(writers.size() == 16);
  for (const auto& [name, count] : writers) CHECK(count == (name == "mine" ? 6 : 1));
}
