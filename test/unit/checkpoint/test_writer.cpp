// CheckpointWriter: an asynchronous save holds the values of the moment it was started even when
// training changes the tensors right after the snapshot fence; one save in flight at a time;
// `keep` prunes old checkpoints; a failed write is reported and leaves the previous one intact;
// on a GPU the side-stream copy is ordered before the next update.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_writer.h"
#include "process.h"

using namespace trainer;
using namespace trainer::checkpoint;

namespace {

CheckpointContent content_of(int64_t step, const at::Tensor& t) {
  CheckpointContent c;
  c.step = step;
  c.tensors.push_back(TensorRecord::whole("t", t));
  return c;
}

}  // namespace

TEST_CASE("an asynchronous save keeps the values from before the next parameter update", "[checkpoint]") {
  test::TempDir dir;
  at::Tensor t = at::arange(1 << 20, at::kFloat);
  const at::Tensor original = t.clone();
  WriterOptions options;
  options.dir = dir.path();
  options.keep = 2;
  CheckpointWriter writer(options);
  for (int64_t step = 1; step <= 3; ++step) {
    writer.save(content_of(step, t));
    CHECK(writer.snapshot_pending());
    writer.before_parameter_update();
    CHECK_FALSE(writer.snapshot_pending());
    t.add_(1.0);  // the "optimizer step": must not reach the checkpoint being written
  }
  const std::string last = writer.wait();
  CHECK(last == dir.path() + "/step-00000003");
  const LoadedCheckpoint loaded(dir.path());
  CHECK(loaded.step() == 3);
  CHECK(at::equal(loaded.read("t"), original + 2.0));
  // keep = 2: step 1 is gone.
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/step-00000001"));
  CHECK(std::filesystem::exists(dir.path() + "/step-00000002"));
}

TEST_CASE("on a GPU the snapshot copies on a side stream before the update may change the tensor", "[checkpoint][cuda]") {
  // The copy into the pinned buffer runs on a side stream; the update, queued right after
  // before_parameter_update() on the compute stream, must wait for it on the GPU (no host wait).
  // 64 Mi floats (256 MB), so that an update not ordered after the copy would overtake it.
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: the side-stream snapshot not exercised");
    return;
  }
  test::TempDir dir;
  at::Tensor t = at::arange(int64_t(1) << 26, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
  const at::Tensor original = t.cpu();
  WriterOptions options;
  options.dir = dir.path();
  options.keep = 2;
  CheckpointWriter writer(options);
  for (int64_t step = 1; step <= 2; ++step) {
    writer.save(content_of(step, t));
    writer.before_parameter_update();
    t.mul_(-1.0).add_(0.5);  // the "optimizer step", queued at once behind the copy
  }
  writer.wait();
  const LoadedCheckpoint loaded(dir.path());
  CHECK(loaded.step() == 2);
  CHECK(at::equal(loaded.read("t"), -original + 0.5));  // the values of step 2's save: one update applied
}

TEST_CASE("a failed asynchronous write is reported and the previous checkpoint stays", "[checkpoint]") {
  test::TempDir dir;
  const at::Tensor t = at::ones({16});
  WriterOptions options;
  options.dir = dir.path();
  CheckpointWriter writer(options);
  writer.save(content_of(1, t));
  writer.wait();
  // A directory where step 2's shard file must go makes its creation fail.
  std::filesystem::create_directories(dir.path() + "/step-00000002.tmp/shard-00000.safetensors");
  writer.save(content_of(2, t));
  writer.before_parameter_update();
  REQUIRE_THROWS_WITH(writer.wait(), Catch::Contains("shard-00000.safetensors") && Catch::Contains("previous checkpoint is intact"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/step-00000002.tmp"));
  CHECK(*find_latest_checkpoint(dir.path()) == dir.path() + "/step-00000001");
  CHECK(LoadedCheckpoint(dir.path()).step() == 1);
}

TEST_CASE("a synchronous save is committed when save returns", "[checkpoint]") {
  test::TempDir dir;
  WriterOptions options;
  options.dir = dir.path();
  options.async = false;
  CheckpointWriter writer(options);
  writer.save(content_of(5, at::full({3}, 2.0)));
  CHECK_FALSE(writer.snapshot_pending());
  CHECK(std::filesystem::exists(dir.path() + "/step-00000005/manifest.json"));
  CHECK(at::equal(LoadedCheckpoint(dir.path()).read("t"), at::full({3}, 2.0)));
  // A failing synchronous save reports the same way as an asynchronous one.
  std::filesystem::create_directories(dir.path() + "/step-00000006.tmp/shard-00000.safetensors");
  REQUIRE_THROWS_WITH(writer.save(content_of(6, at::full({3}, 2.0))),
                      Catch::Contains("shard-00000.safetensors") && Catch::Contains("previous checkpoint is intact"));
  CHECK(LoadedCheckpoint(dir.path()).step() == 5);
}
