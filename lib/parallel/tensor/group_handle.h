#pragma once
// Carries a communicator through an autograd context to backward (IValue capsules hold
// ref-counted objects); shared by the tensor-parallel autograd functions.
#include <ATen/core/ivalue.h>

#include "comm/communicator.h"

namespace trainer::parallel {

struct GroupHandle : torch::CustomClassHolder {
  explicit GroupHandle(comm::Communicator* g) : group(g) {}
  comm::Communicator* group;
};

}  // namespace trainer::parallel
