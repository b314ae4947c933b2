#pragma once
// Stopping on SIGINT/SIGTERM, agreed by all ranks without a host synchronisation per step: each
// step every rank posts whether it was asked to stop (an asynchronous maximum over the world) and
// reads the vote it posted a step earlier. A signal during step k therefore stops every rank after
// step k + 1, all at the same step (a save then is a consistent checkpoint).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

#include "comm/communicator.h"

namespace trainer::train {

class StopVote {
 public:
  StopVote(comm::Communicator& world, c10::Device device) : world_(world), device_(device) {}
  ~StopVote();
  // Reads the previous step's vote and posts this step's; true when some rank asked to stop.
  bool poll();

 private:
  comm::Communicator& world_;
  c10::Device device_;
  at::Tensor posted_;
  std::unique_ptr<comm::Work> work_;
};

}  // namespace trainer::train
