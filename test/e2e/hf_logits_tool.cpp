// Test tool: builds the recipe's model, loads its weights from a trainer checkpoint (--checkpoint)
// or Hugging Face weights (--hf), runs global samples [0, batch) of the recipe's data and writes
// tokens [B, T+1] (int64), logits [B, T, V] and the mean token loss to a safetensors file, for the
// Hugging Face comparison in hf_compare.py.
//   hf_logits_tool RECIPE (--checkpoint DIR | --hf DIR) BATCH OUT.safetensors
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "data/dataset.h"
#include "model/transformer.h"
#include "recipe/load.h"
#include "train/batch.h"
#include "train/training_state.h"

using namespace trainer;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: hf_logits_tool RECIPE (--checkpoint|--hf) DIR BATCH OUT\n");
    return 2;
  }
  try {
    recipe::LoadOptions load;
    load.world_size = 1;
    const auto loaded = recipe::load_recipe(argv[1], load);
    const std::string mode = argv[2], dir = argv[3];
    const int64_t batch = std::atoll(argv[4]);
    model::ModelOptions options;
    options.config = loaded.recipe.model;
    options.seed = uint64_t(loaded.recipe.training.seed);
    model::Transformer model(options);
    at::NoGradGuard no_grad;
    if (mode == "--checkpoint") {
      const checkpoint::LoadedCheckpoint ck(dir);
      for (auto& p : model.parameters().all()) p.tensor.detach().copy_(ck.read(p.name));
      // The routing biases the checkpoint carries (bias balancing, DeepSeek-V3's sigmoid routing).
      const auto& extra = ck.manifest().at("extra");
      if (model.routing_bias() && extra.contains("moe_routing_bias")) model.routing_bias()->load(extra.at("moe_routing_bias"));
    } else {
      train::load_hf_weights(dir, model);  // what model.init_from does
    }
    const auto dataset = data::open_dataset(loaded.recipe);
    const int64_t seq = loaded.recipe.training.seq_len;
    const auto mb = train::make_micro_batch(*dataset, 0, batch, seq, c10::Device(c10::DeviceType::CPU));
    const at::Tensor logits = model.logits(mb.inputs);
    const auto out = model.forward(mb.inputs, mb.targets);
    const at::Tensor tokens = at::cat({mb.inputs, mb.targets.narrow(1, seq - 1, 1)}, 1);
    const at::Tensor loss = (out.loss_sum / double(out.tokens)).reshape({1}).to(at::kDouble);
    checkpoint::write_safetensors(argv[5], {{"tokens", tokens}, {"logits", logits.contiguous()}, {"loss", loss}});
    std::printf("loss %.8f\n", loss.item<double>());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_logits_tool: %s\n", e.what());
    return 1;
  }
}
