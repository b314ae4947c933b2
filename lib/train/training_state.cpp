#include "train/training_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace trainer::train {

namespace {

// Optimizer tensors are elementwise companions of a parameter: same global shape and slice, except
// the scalar step counters.
const model::Parameter* parameter_of(model::Transformer& model, const std::string& state_name) {
  const auto dot = state_name.find('.', std::string("optimizer.").size());
  return model.parameters().find(state_name.substr(dot + 1));
}

}  // namespace

checkpoint::CheckpointContent capture_training_state(model::Transformer& model, optim::AdamW& optimizer,
                                                     const recipe::LoadedRecipe& recipe, const Progress& progress) {
  checkpoint::CheckpointContent content;
  content.step = progress.step;
  content.consumed_samples = progress.consumed_samples;
  content.recipe = recipe.resolved;
  if (recipe.mesh)
    content.mesh = {{"world_size", recipe.mesh->world_size}, {"tp", recipe.mesh->tp}, {"cp", recipe.mesh->cp},
                    {"dp", recipe.mesh->dp}, {"pp", recipe.mesh->pp}, {"ep", recipe.mesh->ep}};
  for (const auto& p : model.parameters().all())
    content.tensors.push_back({p.name, p.tensor.detach(), p.global_shape, p.offsets()});
  for (const auto& s : optimizer.state()) {
    const model::Parameter* p = parameter_of(model, s.name);
    if (s.tensor.dim() == 0 || !p)
      content.tensors.push_back({s.name, s.tensor, s.tensor.sizes().vec(), std::vector<int64_t>(s.tensor.dim(), 0)});
    else
      content.tensors.push_back({s.name, s.tensor, p->global_shape, p->offsets()});
  }
  // The default CPU generator's state (nothing in training draws from it today; kept so that
  // anything that does later resumes exactly).
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  content.tensors.push_back({"rng.cpu", rng, rng.sizes().vec(), {0}});
  content.extra = {{"optimizer_steps", optimizer.steps_taken()}};
  return content;
}

Progress restore_training_state(const checkpoint::LoadedCheckpoint& loaded, model::Transformer& model,
                                optim::AdamW& optimizer) {
  at::NoGradGuard no_grad;
  auto load_into = [&](const std::string& name, at::Tensor target, const std::vector<int64_t>& global_shape,
                       const std::vector<int64_t>& offsets) {
    if (!loaded.contains(name))
      throw UserError(fmt::format("{}: checkpoint has no tensor {} (was it saved from another model?)", loaded.path(), name));
    const auto stored_shape = loaded.global_shape(name);
    if (stored_shape != global_shape)
      throw UserError(fmt::format("{}: tensor {} has global shape [{}] in the checkpoint but [{}] in this model",
                                  loaded.path(), name, fmt::join(stored_shape, ", "), fmt::join(global_shape, ", ")));
    target.copy_(loaded.read(name, offsets, target.sizes().vec()));
  };
  for (auto& p : model.parameters().all()) load_into(p.name, p.tensor.detach(), p.global_shape, p.offsets());
  for (const auto& s : optimizer.state()) {
    const model::Parameter* p = parameter_of(model, s.name);
    if (s.name.rfind("optimizer.master.", 0) == 0 && !loaded.contains(s.name)) {
      // Saved from an fp32 run: the parameters are the master weights.
      s.tensor.copy_(p->tensor.detach().to(at::kFloat));
      continue;
    }
    if (s.tensor.dim() == 0 || !p)
      load_into(s.name, s.tensor, s.tensor.sizes().vec(), std::vector<int64_t>(s.tensor.dim(), 0));
    else
      load_into(s.name, s.tensor, p->global_shape, p->offsets());
  }
  if (loaded.contains("rng.cpu")) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(loaded.read("rng.cpu"));
  }
  optimizer.set_steps_taken(loaded.manifest().at("extra").value("optimizer_steps", loaded.step()));
  return Progress{loaded.step(), loaded.consumed_samples()};
}

}  // namespace trainer::train
