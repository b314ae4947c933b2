#include "train/run_start.h"

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "recipe/recipe_diff.h"

namespace trainer::train {

namespace {

std::optional<std::string> resume_path(const recipe::Recipe& r) {
  const auto& c = r.checkpoint;
  switch (c.resume.mode) {
    case recipe::ResumeFrom::Mode::None: return std::nullopt;
    case recipe::ResumeFrom::Mode::Auto: return c.dir ? checkpoint::find_latest_checkpoint(*c.dir) : std::nullopt;
    case recipe::ResumeFrom::Mode::Path: break;
  }
  return c.resume.path;
}

// A changed recipe is allowed (a longer run, another mesh), but never silently.
void report_recipe_changes(const checkpoint::LoadedCheckpoint& checkpoint, const nlohmann::json& resolved,
                           const std::function<void(const std::string&)>& say) {
  if (!checkpoint.manifest().contains("recipe")) return;
  const auto changes = recipe::recipe_differences(checkpoint.manifest().at("recipe"), resolved);
  if (changes.empty()) return;
  std::string list;
  for (size_t i = 0; i < changes.size() && i < 8; ++i) list += "\n  " + changes[i];
  if (changes.size() > 8) list += fmt::format("\n  ... and {} more", changes.size() - 8);
  say(fmt::format("this recipe differs from the checkpoint's in {} value{} (checkpoint -> now; now wins, the "
                  "learning-rate schedule included):{}",
                  changes.size(), changes.size() == 1 ? "" : "s", list));
}

// A checkpoint of another model: which model values of its recipe differ from this one, and the
// ways forward (the weights cannot be loaded into this model).
std::string another_model(const std::string& problem, const checkpoint::LoadedCheckpoint& checkpoint,
                          const nlohmann::json& resolved) {
  std::vector<std::string> model_changes;
  for (const auto& change : recipe::recipe_differences(checkpoint.manifest().at("recipe"), resolved))
    if (change.rfind("model.", 0) == 0) model_changes.push_back(change);
  std::string text = problem + "\n";
  if (model_changes.empty()) {
    text += "the checkpoint's recipe has the same model values as this one, so its tensors do not match its own recipe "
            "(a damaged or hand-edited checkpoint?)\n";
  } else {
    text += fmt::format("the checkpoint was saved from another model: its recipe differs in {} model value{} "
                        "(checkpoint -> now):",
                        model_changes.size(), model_changes.size() == 1 ? "" : "s");
    for (size_t i = 0; i < model_changes.size() && i < 8; ++i) text += "\n  " + model_changes[i];
    if (model_changes.size() > 8) text += fmt::format("\n  ... and {} more", model_changes.size() - 8);
    text += "\n";
  }
  text += fmt::format("to train this recipe from scratch, set checkpoint.resume=none or another checkpoint.dir;{} to "
                      "take its weights elsewhere, export them: trainer ckpt export {} --hf OUT",
                      model_changes.empty() ? "" : " to go on with the checkpoint's model, set its values (left of ->);",
                      checkpoint.path());
  return text;
}

// Optimizer state is the optimizer's own: another optimizer (or 8-bit AdamW quantising other
// tensors) cannot take it over.
void refuse_another_optimizer(const checkpoint::LoadedCheckpoint& checkpoint, const nlohmann::json& resolved) {
  const nlohmann::json& m = checkpoint.manifest();
  if (!m.contains("recipe") || !m.at("recipe").contains("optimizer")) return;
  const nlohmann::json& saved = m.at("recipe").at("optimizer");
  const nlohmann::json& now = resolved.at("optimizer");
  const std::string before = saved.value("name", "adamw"), after = now.value("name", "adamw");
  const auto refuse = [&](const std::string& key, const std::string& was, const std::string& is) {
    throw UserError(fmt::format(
        "{}: the checkpoint holds the optimizer state of optimizer.{}={}, but this recipe sets optimizer.{}={}; set it "
        "back to {} to resume, or keep only the weights: trainer ckpt export {} --hf OUT, then model.init_from=OUT "
        "with checkpoint.resume=none",
        checkpoint.path(), key, was, key, is, was, checkpoint.path()));
  };
  if (before != after) refuse("name", before, after);
  if (after == "adamw8bit" && saved.contains("min_8bit_size") && saved.at("min_8bit_size") != now.at("min_8bit_size"))
    refuse("min_8bit_size", saved.at("min_8bit_size").dump(), now.at("min_8bit_size").dump());
}

}  // namespace

RunStart prepare_run_start(const recipe::LoadedRecipe& loaded, model::Transformer& model, OptimizerDriver& optimizer,
                           const std::function<void(const std::string&)>& say) {
  const recipe::Recipe& r = loaded.recipe;
  RunStart start;
  const auto path = resume_path(r);
  if (!path) {
    if (r.model.init_from) {
      int64_t kept = 0;
      const int64_t count = load_hf_weights(*r.model.init_from, model, optimizer.parameter_writer(), &kept);
      optimizer.refresh_master_weights();  // the fp32 masters were taken from the initial values
      say(fmt::format("initialised {} parameters from Hugging Face weights in {}", count, *r.model.init_from));
      if (kept > 0)
        say(fmt::format("{} parameters of the multi-token prediction modules are not in those weights (transformers "
                        "does not save them): they start from their random initialisation", kept));
    }
    return start;
  }
  const checkpoint::LoadedCheckpoint checkpoint(*path);
  if (checkpoint.step() >= r.training.steps) {
    // Re-running a finished run: say so instead of "finished after step 200 of 60".
    say(fmt::format("nothing to train: checkpoint {} is at step {}, which is not before training.steps={}; raise "
                    "training.steps to train further, or set checkpoint.resume=none to start over",
                    checkpoint.path(), checkpoint.step(), r.training.steps));
    TrainSummary done;
    done.first_step = done.steps_completed = checkpoint.step();
    done.nothing_to_do = true;
    done.last_checkpoint = checkpoint.path();
    start.finished = done;
    return start;
  }
  refuse_another_optimizer(checkpoint, loaded.resolved);
  try {
    start.progress = restore_model(checkpoint, model, optimizer.parameter_writer());
  } catch (const CheckpointOfAnotherModel& e) {
    throw UserError(another_model(e.what(), checkpoint, loaded.resolved));
  }
  optimizer.load_state(optimizer_state_reader(checkpoint),
                       checkpoint.manifest().at("extra").value("optimizer_steps", checkpoint.step()));
  if (model::RoutingBias* bias = model.routing_bias()) {
    // A checkpoint of a run without bias balancing starts the biases at zero.
    const nlohmann::json& extra = checkpoint.manifest().at("extra");
    if (extra.contains("moe_routing_bias")) {
      try {
        bias->load(extra.at("moe_routing_bias"));
      } catch (const std::exception& e) {
        throw UserError(fmt::format("{}: {}", checkpoint.path(), e.what()));
      }
    } else {
      say("the checkpoint holds no MoE routing biases (model.moe.bias_update_rate was 0): they start at zero");
    }
  }
  say(fmt::format("resumed from {} at step {} ({} samples consumed)", checkpoint.path(), start.progress.step,
                  start.progress.consumed_samples));
  if (r.model.init_from)
    say(fmt::format("model.init_from {} is ignored: the run resumes from the checkpoint (set checkpoint.resume=none "
                    "to start from those weights)", *r.model.init_from));
  report_recipe_changes(checkpoint, loaded.resolved, say);
  return start;
}

}  // namespace trainer::train
