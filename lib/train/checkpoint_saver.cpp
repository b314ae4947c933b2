#include "train/checkpoint_saver.h"
#include "runtime/trace_scope.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cmath>

namespace trainer::train {

using Clock = std::chrono::steady_clock;

CheckpointSaver::CheckpointSaver(const recipe::LoadedRecipe& loaded, const mesh::ProcessGroups& groups, Say say)
    : recipe_(loaded.recipe), say_(std::move(say)) {
  const recipe::Recipe& r = loaded.recipe;
  if (!r.checkpoint.dir) return;
  checkpoint::WriterOptions options;
  options.dir = *r.checkpoint.dir;
  options.keep = r.checkpoint.keep;
  options.async = r.checkpoint.async;
  const int64_t world = groups.layout().world_size();
  if (groups.store() && world > 1)
    options.channel = checkpoint::store_channel(groups.store(), groups.global_rank(), world,
                                                std::chrono::seconds(int64_t(std::ceil(r.parallel.collective_timeout_s))));
  writer_ = std::make_unique<checkpoint::CheckpointWriter>(std::move(options));
}

void CheckpointSaver::reserve(checkpoint::CheckpointContent content) {
  if (writer_) writer_->reserve(content);
}

void CheckpointSaver::save(checkpoint::CheckpointContent content, int64_t step, const char* why, bool more_steps) {
  if (!writer_) return;
  const runtime::TraceScope scope("checkpoint snapshot of step {}", step);
  const auto t0 = Clock::now();
  writer_->wait();  // timed apart: a previous write still running is the disk's cost, not the snapshot's
  const auto t1 = Clock::now();
  writer_->save(std::move(content));
  const double previous = std::chrono::duration<double>(t1 - t0).count();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!recipe_.checkpoint.async)
    say_(fmt::format("checkpoint of step {} ({}): training paused {:.4f} s", step, why, seconds));
  else if (more_steps)
    pending_ = Pending{step, why, previous, seconds - previous};
  else
    say_(fmt::format("checkpoint of step {} ({}): training paused {:.4f} s, writing in the background", step, why,
                     seconds));
}

void CheckpointSaver::fence() {
  if (!pending_) return;
  const runtime::TraceScope scope("checkpoint fence");
  const double waited = writer_->before_parameter_update();
  say_(fmt::format("checkpoint of step {} ({}): training paused {:.4f} s ({:.4f} s waiting for the previous save's "
                   "write, {:.4f} s starting the snapshot, {:.4f} s waiting for it before the next optimizer step), "
                   "writing in the background",
                   pending_->step, pending_->why, pending_->previous_s + pending_->start_s + waited,
                   pending_->previous_s, pending_->start_s, waited));
  pending_.reset();
}

void CheckpointSaver::report_committed() {
  if (!writer_) return;
  if (const auto committed = writer_->take_committed()) say_(fmt::format("checkpoint {} committed", *committed));
}

std::string CheckpointSaver::finish() {
  if (!writer_) return "";
  std::string last = writer_->wait();
  report_committed();
  return last;
}

}  // namespace trainer::train
