// ParameterSet::mark_unit_output: tells ZeRO-3 where a forward unit's backward begins (as FSDP's
// pre-backward hook does), so that it gathers the unit's parameters just before. A hook on the
// unit's output tensor runs when that tensor's gradient is complete, which is just before the
// operation that produced it (the unit's last) runs backward. No new tensor: the output itself
// is returned (a pipeline stage frees what it sent by replacing its data, which an identity view
// would keep alive).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "model/parameter.h"

namespace trainer::model {

at::Tensor ParameterSet::mark_unit_output(const at::Tensor& x, int64_t unit) const {
  const auto& hook = hooks_.before_backward;
  if (!hook || !x.requires_grad() || !at::GradMode::is_enabled()) return x;
  at::Tensor marked = x;
  marked.register_hook([hook, unit](const at::Tensor&) {
    hook(unit);
    return at::Tensor();  // the gradient unchanged
  });
  return marked;
}

}  // namespace trainer::model
