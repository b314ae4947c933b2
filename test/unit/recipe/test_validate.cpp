// Every cross-field rule: the message names the fields and their values and offers a valid
// alternative; where the alternative is a concrete value, applying it makes the recipe valid.
#include <catch2/catch.hpp>

#include "recipe_fixture.h"

using namespace trainer::test;

namespace {
// Exactly one problem, containing every fragment.
void expect_problem(const std::vector<std::string>& sets, std::optional<int64_t> world,
                    const std::vector<std::string>& fragments) {
  const auto problems = problems_of(sets, world);
  INFO("problems: " << problems.size() << (problems.empty() ? "" : " first: " + problems[0]));
  REQUIRE(problems.size() == 1);
  for (const auto& f : fragments) {
    INFO("fragment: " << f);
    CHECK(problems[0].find(f) != std::string::npos);
  }
}

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

const std::vector<std::string> kMoe = {"model.moe.num_local_experts=8"};
}  // namespace

TEST_CASE("rule: parallel.dp_shard divides dp - needs ZeRO - and its shard groups fit a node", "[recipe][rules]") {
  expect_problem({"parallel.dp_shard=3", "parallel.zero=1"}, 4, {"parallel.dp_shard=3", "dp=4", "use dp_shard in"});
  expect_problem({"parallel.dp_shard=2"}, 4, {"parallel.dp_shard=2", "parallel.zero=0"});
  expect_problem({"parallel.dp_shard=4", "parallel.zero=2", "parallel.tp=2", "hardware.gpus_per_node=4"}, 16,
                 {"tp * cp * dp_shard = 2 * 1 * 4 = 8", "hardware.gpus_per_node=4", "use dp_shard in"});
  CHECK(problems_of({"parallel.dp_shard=2", "parallel.zero=2"}, 8).empty());
  CHECK(problems_of({"parallel.dp_shard=-1", "parallel.zero=1"}, 8).empty());
}

TEST_CASE("the base recipe is valid at several world sizes", "[recipe][rules]") {
  for (int64_t world : {1, 2, 4, 8, 16}) CHECK(problems_of({}, world).empty());
}

TEST_CASE("rule: query heads are a multiple of key/value heads", "[recipe][rules]") {
  expect_problem({"model.num_key_value_heads=3"}, std::nullopt,
                 {"model.num_attention_heads=8 is not a multiple of model.num_key_value_heads=3",
                  "use num_key_value_heads in {1, 2, 4, 8}"});
}

TEST_CASE("rule: attention heads and key/value heads vs tp", "[recipe][rules]") {
  const auto heads = problems_of({"model.num_key_value_heads=8", "parallel.tp=16"});
  REQUIRE(heads.size() == 2);  // query heads and key/value heads
  CHECK(heads[0] == "model.num_attention_heads=8 is not divisible by parallel.tp=16 (tensor parallelism splits "
                    "heads); use tp in {1, 2, 4, 8}");
  CHECK(heads[1].find("model.num_key_value_heads=8 is not divisible by parallel.tp=16") == 0);
  const auto kv = problems_of({"parallel.tp=8"});
  REQUIRE(kv.size() == 1);
  CHECK(kv[0].find("model.num_key_value_heads=4 is not divisible by parallel.tp=8") != std::string::npos);
  CHECK(kv[0].find("use tp in {1, 2, 4}") != std::string::npos);
  CHECK(problems_of({"parallel.tp=4"}).empty());
}

TEST_CASE("rule: the MLP width vs tp", "[recipe][rules]") {
  expect_problem({"model.intermediate_size=510", "parallel.tp=4"}, std::nullopt,
                 {"model.intermediate_size=510 is not divisible by parallel.tp=4", "use tp in {1, 2, 3, 5, 6, 10, 15}"});
}

TEST_CASE("rule: 8-bit AdamW's blocks of 256 columns are not cut by a tp split of longer rows", "[recipe][rules]") {
  // down_proj's 512 columns at tp 4: 128 per rank.
  expect_problem({"optimizer.name=adamw8bit", "parallel.tp=4"}, std::nullopt,
                 {"optimizer.name=adamw8bit", "down_proj has 512 columns", "parallel.tp=4 into 128 per rank",
                  "optimizer.name=adamw"});
  CHECK(problems_of({"optimizer.name=adamw8bit", "parallel.tp=2"}).empty());  // 256 per rank
  CHECK(problems_of({"optimizer.name=adamw", "parallel.tp=4"}).empty());
  // A matrix under min_8bit_size keeps fp32 moments: nothing to cut.
  CHECK(problems_of({"optimizer.name=adamw8bit", "parallel.tp=4", "optimizer.min_8bit_size=1000000"}).empty());
}

TEST_CASE("rule: any vocabulary under tp - it is padded and never refused", "[recipe][rules]") {
  // The embedding and LM head are padded to a multiple of make_vocab_size_divisible_by x tp.
  CHECK(problems_of({"model.vocab_size=1001", "parallel.tp=4"}).empty());
  CHECK(problems_of({"model.vocab_size=3", "parallel.tp=4"}).empty());
  CHECK(problems_of({"model.vocab_size=1001", "parallel.tp=4", "model.make_vocab_size_divisible_by=1"}).empty());
  const auto zero = problems_of({"model.make_vocab_size_divisible_by=0"});
  REQUIRE(zero.size() == 1);
  CHECK(zero[0].find("model.make_vocab_size_divisible_by") != std::string::npos);
}

TEST_CASE("padded_vocab_size is the next multiple of the divisor times tp", "[recipe][rules]") {
  trainer::recipe::ModelConfig m;
  m.vocab_size = 32000;
  CHECK(m.padded_vocab_size(1) == 32000);  // 250 x 128
  CHECK(m.padded_vocab_size(3) == 32256);  // 84 x 384
  m.vocab_size = 255;
  CHECK(m.padded_vocab_size(1) == 256);
  CHECK(m.padded_vocab_size(4) == 512);
  m.make_vocab_size_divisible_by = 1;
  CHECK(m.padded_vocab_size(1) == 255);
  CHECK(m.padded_vocab_size(4) == 256);
  m.vocab_size = 3;
  CHECK(m.padded_vocab_size(4) == 4);
}

TEST_CASE("rule: layers vs pp * vpp - any split - pipeline_layout must fit", "[recipe][rules]") {
  // Uneven splits are accepted: 8 layers over 3 stages.
  CHECK(problems_of({"parallel.pp=3"}).empty());
  expect_problem({"parallel.pp=2", "parallel.vpp=8", "parallel.pipeline_schedule=interleaved_1f1b"}, std::nullopt,
                 {"model.num_hidden_layers=8 cannot give each of the 14 middle model chunks"});
  CHECK(problems_of({"parallel.pp=2", "parallel.pipeline_layout=[5,3]"}).empty());
  expect_problem({"parallel.pp=2", "parallel.pipeline_layout=[5,4]"}, std::nullopt,
                 {"parallel.pipeline_layout has 2 entries summing to 9", "summing to model.num_hidden_layers=8"});
  expect_problem({"parallel.pp=3", "parallel.pipeline_layout=[4,4]"}, std::nullopt,
                 {"expected parallel.pp * parallel.vpp = 3 * 1 = 3 entries"});
  expect_problem({"parallel.pp=3", "parallel.pipeline_layout=[4,0,4]"}, std::nullopt,
                 {"parallel.pipeline_layout[1]=0: a model chunk between the first and the last"});
}

TEST_CASE("rule: head_dim must be given when heads do not divide hidden_size", "[recipe][rules]") {
  expect_problem({"model.hidden_size=250", "model.head_dim=null"}, std::nullopt,
                 {"model.hidden_size=250 is not divisible by model.num_attention_heads=8",
                  "set model.head_dim explicitly"});
  CHECK(problems_of({"model.hidden_size=250", "model.head_dim=32"}).empty());
}

TEST_CASE("rule: seq_len vs max_position_embeddings", "[recipe][rules]") {
  expect_problem({"training.seq_len=8192"}, std::nullopt,
                 {"training.seq_len=8192 exceeds model.max_position_embeddings=4096", "use seq_len <= 4096"});
}

TEST_CASE("rule: llama3 rope scaling frequency factors", "[recipe][rules]") {
  expect_problem({"model.rope_scaling={\"low_freq_factor\": 4, \"high_freq_factor\": 1}"}, std::nullopt,
                 {"model.rope_scaling.low_freq_factor=4 must be below model.rope_scaling.high_freq_factor=1"});
}

TEST_CASE("rule: experts vs ep - and ep needs a MoE model", "[recipe][rules]") {
  expect_problem({"parallel.ep=2"}, std::nullopt, {"parallel.ep=2 needs a mixture-of-experts model", "set parallel.ep=1"});
  expect_problem(with(kMoe, {"parallel.ep=3"}), std::nullopt,
                 {"model.moe.num_local_experts=8 is not divisible by parallel.ep=3", "use ep in {1, 2, 4, 8}"});
  CHECK(problems_of(with(kMoe, {"parallel.ep=4"})).empty());
}

TEST_CASE("rule: top-k vs the number of experts", "[recipe][rules]") {
  expect_problem(with(kMoe, {"model.moe.num_experts_per_tok=9"}), std::nullopt,
                 {"model.moe.num_experts_per_tok=9 exceeds model.moe.num_local_experts=8", "use num_experts_per_tok <= 8"});
}

TEST_CASE("rule: group-limited routing", "[recipe][rules]") {
  expect_problem(with(kMoe, {"model.moe.n_group=3"}), std::nullopt,
                 {"model.moe.n_group=3 does not divide model.moe.num_local_experts=8", "use n_group in {1, 2, 4, 8}"});
  expect_problem(with(kMoe, {"model.moe.n_group=8"}), std::nullopt,
                 {"model.moe.n_group=8 leaves one expert per group", "use n_group <= 4"});
  expect_problem(with(kMoe, {"model.moe.n_group=4", "model.moe.topk_group=5"}), std::nullopt,
                 {"model.moe.topk_group=5 exceeds model.moe.n_group=4"});
  expect_problem(with(kMoe, {"model.moe.n_group=4", "model.moe.topk_group=1", "model.moe.num_experts_per_tok=3"}),
                 std::nullopt, {"model.moe.num_experts_per_tok=3 exceeds the 2 experts of model.moe.topk_group=1 groups of 2"});
  CHECK(problems_of(with(kMoe, {"model.moe.n_group=4", "model.moe.topk_group=2", "model.moe.scoring_func=\"sigmoid\""})).empty());
}

TEST_CASE("rule: MoE under tensor parallelism needs sequence parallelism", "[recipe][rules]") {
  expect_problem(with(kMoe, {"parallel.tp=2", "parallel.sequence_parallel=false"}), std::nullopt,
                 {"parallel.tp=2 with model.moe needs parallel.sequence_parallel=true"});
}

TEST_CASE("rule: expert MLP width vs etp", "[recipe][rules]") {
  expect_problem(with(kMoe, {"model.moe.moe_intermediate_size=100", "parallel.etp=8"}), std::nullopt,
                 {"model.moe.moe_intermediate_size=100 is not divisible by parallel.etp=8", "use etp in {1, 2, 4, 5, 10}"});
}

TEST_CASE("rule: MoE layer indices", "[recipe][rules]") {
  expect_problem(with(kMoe, {"model.moe.layers=[]"}), std::nullopt, {"model.moe.layers is empty"});
  expect_problem(with(kMoe, {"model.moe.layers=[1,8]"}), std::nullopt,
                 {"model.moe.layers contains 8, but the model has layers 0..7"});
  expect_problem(with(kMoe, {"model.moe.layers=[2,2]"}), std::nullopt, {"model.moe.layers lists layer 2 twice"});
}

TEST_CASE("rule: vpp needs the interleaved schedule and vice versa", "[recipe][rules]") {
  expect_problem({"parallel.pp=2", "parallel.vpp=2"}, std::nullopt,
                 {"parallel.vpp=2 needs parallel.pipeline_schedule=\"interleaved_1f1b\"", "found \"1f1b\""});
  expect_problem({"parallel.pp=2", "parallel.pipeline_schedule=interleaved_1f1b"}, std::nullopt,
                 {"needs parallel.pp >= 2 and parallel.vpp >= 2, found pp=2 vpp=1"});
  CHECK(problems_of({"parallel.pp=2", "parallel.vpp=2", "parallel.pipeline_schedule=interleaved_1f1b"}, 2).empty());
  // zbv: a V of exactly two chunks per stage.
  CHECK(problems_of({"parallel.pp=2", "parallel.vpp=2", "parallel.pipeline_schedule=zbv"}, 2).empty());
  expect_problem({"parallel.pp=2", "parallel.pipeline_schedule=zbv"}, std::nullopt,
                 {"parallel.pipeline_schedule=\"zbv\" places two model chunks on each stage", "set vpp=2"});
}

TEST_CASE("rule: seq_len vs 2 * cp", "[recipe][rules]") {
  expect_problem({"parallel.cp=3"}, std::nullopt,
                 {"training.seq_len=256 is not divisible by 2 * parallel.cp = 6", "use seq_len 252 or 258"});
  CHECK(problems_of({"parallel.cp=3", "training.seq_len=252"}).empty());
}

TEST_CASE("rule: Ulysses needs query heads per tp rank divisible by cp", "[recipe][rules]") {
  expect_problem({"parallel.tp=2", "parallel.cp=8", "parallel.cp_method=ulysses"}, std::nullopt,
                 {"the 4 query heads per tp rank (model.num_attention_heads=8 / parallel.tp=2) are not divisible by "
                  "parallel.cp=8",
                  "use cp in {1, 2, 4}", "cp_method \"ring\""});
  CHECK(problems_of({"parallel.tp=2", "parallel.cp=8", "parallel.cp_method=ring"}).empty());
  // Fewer key/value heads than cp: they are repeated (8 query, 4 kv heads at cp 8).
  CHECK(problems_of({"parallel.cp=8", "parallel.cp_method=ulysses"}).empty());
}

TEST_CASE("rule: seq_len vs tp under sequence parallelism", "[recipe][rules]") {
  expect_problem({"parallel.tp=4", "parallel.sequence_parallel=true", "training.seq_len=250"}, std::nullopt,
                 {"parallel.sequence_parallel splits each rank's 250 tokens", "parallel.tp=4",
                  "use seq_len 248 or 252"});
  CHECK(problems_of({"parallel.tp=4", "parallel.sequence_parallel=true", "training.seq_len=252"}).empty());
}

TEST_CASE("rule: global batch vs micro batch (any world size)", "[recipe][rules]") {
  expect_problem({"training.global_batch_size=33"}, std::nullopt,
                 {"training.global_batch_size=33 is not a multiple of training.micro_batch_size=2",
                  "use global_batch_size 32 or 34"});
}

TEST_CASE("rule: world size = tp * cp * dp * pp", "[recipe][rules]") {
  expect_problem({"parallel.tp=2", "parallel.pp=2"}, 6,
                 {"world size 6 is not divisible by parallel.tp * cp * pp = 2 * 1 * 2 = 4", "multiple of 4"});
  expect_problem({"parallel.dp=4", "parallel.tp=2"}, 4,
                 {"parallel.dp=4 does not match world size 4 / (tp * cp * pp = 2) = 2", "set parallel.dp=2 or -1"});
}

TEST_CASE("rule: world size = etp * ep * edp * pp for expert layers", "[recipe][rules]") {
  expect_problem(with(kMoe, {"parallel.ep=4", "training.global_batch_size=12"}), 6,
                 {"world size 6 is not divisible by parallel.etp * ep * pp = 1 * 4 * 1 = 4",
                  "expert layers fold the same ranks"});
  CHECK(problems_of(with(kMoe, {"parallel.ep=2", "training.global_batch_size=12"}), 6).empty());
}

TEST_CASE("rule: global batch = micro batch x accumulation x dp", "[recipe][rules]") {
  expect_problem({}, 3,
                 {"training.global_batch_size=32 is not a multiple of training.micro_batch_size * dp = 2 * 3 = 6",
                  "use global_batch_size 30 or 36"});
  CHECK(problems_of({"training.global_batch_size=36"}, 3).empty());
}

TEST_CASE("rule: micro-batches >= pp for pipeline schedules", "[recipe][rules]") {
  expect_problem({"parallel.pp=4", "training.global_batch_size=8"}, 8,
                 {"parallel.pp=4 needs at least 4 micro-batches per step", "= 2", "use global_batch_size >= 16"});
  CHECK(problems_of({"parallel.pp=4", "training.global_batch_size=16"}, 8).empty());
  // No global batch given: micro_batch_size * dp gives 1 micro-batch.
  expect_problem({"parallel.pp=2", "training.global_batch_size=null"}, 4, {"use global_batch_size >= 8"});
}

TEST_CASE("rule: interleaved takes any micro-batch count from pp on", "[recipe][rules]") {
  const std::vector<std::string> interleaved = {"parallel.pp=4", "parallel.vpp=2",
                                                "parallel.pipeline_schedule=interleaved_1f1b"};
  CHECK(problems_of(with(interleaved, {"training.global_batch_size=6", "training.micro_batch_size=1"}), 4).empty());
  CHECK(problems_of(with(interleaved, {"training.global_batch_size=8", "training.micro_batch_size=1"}), 4).empty());
  expect_problem(with(interleaved, {"training.global_batch_size=3", "training.micro_batch_size=1"}), 4,
                 {"parallel.pp=4 needs at least 4 micro-batches per step"});
}

TEST_CASE("rule: learning-rate schedule", "[recipe][rules]") {
  expect_problem({"optimizer.min_lr=1"}, std::nullopt, {"optimizer.min_lr=1 exceeds optimizer.lr=0.0003"});
  // The hint is a number a user would type, not 0.00030000000000000003.
  expect_problem({"optimizer.min_lr=1", "optimizer.lr=0.003"}, std::nullopt, {"(for example 0.0003)"});
}

TEST_CASE("a warm-up longer than the run is a warning - not an error", "[recipe][rules]") {
  const auto loaded = load_base({"optimizer.warmup_steps=101"});
  REQUIRE(loaded.warnings.size() == 1);
  CHECK(loaded.warnings[0].find("optimizer.warmup_steps=101 exceeds training.steps=100") != std::string::npos);
  CHECK(load_base({"optimizer.warmup_steps=99"}).warnings.empty());
  CHECK(load_base({"optimizer.warmup_steps=100"}).warnings.at(0).find("never decays") != std::string::npos);
}

TEST_CASE("rule: data sources and weights", "[recipe][rules]") {
  expect_problem({"data.source=tokens"}, std::nullopt, {"data.source=\"tokens\" needs data.paths"});
  expect_problem({"data.source=synthetic", "data.paths=[\"a\"]"}, std::nullopt,
                 {"data.paths is set but data.source is \"synthetic\""});
  CHECK(problems_of({"data.paths=[\"a\"]"}, std::nullopt).empty());  // data.source left out: tokens
  expect_problem({"data.source=tokens", "data.paths=[\"a\",\"b\"]", "data.weights=[1]"}, std::nullopt,
                 {"data.weights has 1 entries but data.paths has 2"});
}

TEST_CASE("rule: document masking - its keys need it - synthetic data needs a separator",
          "[recipe][rules]") {
  const std::vector<std::string> masking = {"data.document_masking=true", "data.document_separator_token=2"};
  CHECK(problems_of(masking).empty());
  CHECK(problems_of(with(masking, {"parallel.tp=2", "parallel.sequence_parallel=true"}), 2).empty());
  expect_problem({"data.document_masking=true"}, std::nullopt,
                 {"data.document_masking=true", "synthetic", "data.document_separator_token"});
  expect_problem(with(masking, {"data.document_separator_token=100000"}), std::nullopt,
                 {"data.document_separator_token=100000", "model.vocab_size="});
  expect_problem({"data.document_separator_token=2"}, std::nullopt,
                 {"data.document_separator_token=2", "data.document_masking=true"});
  expect_problem({"data.reset_positions=false"}, std::nullopt, {"data.reset_positions=false", "remove it"});
  expect_problem(with(masking, {"data.document_length_median=600"}), std::nullopt,
                 {"data.document_length_median and data.document_length_p99 go together"});
  expect_problem(with(masking, {"data.document_length_median=600", "data.document_length_p99=100"}), std::nullopt,
                 {"data.document_length_p99=100 is below data.document_length_median=600"});
  CHECK(problems_of(with(masking, {"data.document_length_median=600", "data.document_length_p99=16000"})).empty());
  expect_problem({"data.document_length_median=600", "data.document_length_p99=16000"}, std::nullopt,
                 {"set data.document_masking=true or remove them"});
  expect_problem({"data.balance=\"cost\""}, std::nullopt, {"data.balance=\"cost\"", "data.document_masking"});
  CHECK(problems_of(with(masking, {"data.balance=\"none\""})).empty());
  expect_problem({"data.predict_across_documents=true"}, std::nullopt,
                 {"data.predict_across_documents=true", "remove it"});
  // With context parallelism (ring and Ulysses) and multi-token prediction too.
  CHECK(problems_of(with(masking, {"parallel.cp=2"}), 2).empty());
  CHECK(problems_of(with(masking, {"parallel.cp=2", "parallel.cp_method=\"ulysses\""}), 2).empty());
}

TEST_CASE("rule: checkpoint settings", "[recipe][rules]") {
  expect_problem({"checkpoint.interval=10"}, std::nullopt, {"checkpoint.interval=10 needs checkpoint.dir"});
  expect_problem({"checkpoint.keep=1", "checkpoint.dir=c"}, std::nullopt, {"checkpoint.keep=1", "use keep >= 2"});
  expect_problem({"checkpoint.resume=\"\""}, std::nullopt, {"checkpoint.resume is empty"});
}

TEST_CASE("world size bounds", "[recipe][rules]") {
  CHECK(any_contains(problems_of({}, 0), "world size 0 is not valid"));
  CHECK(any_contains(problems_of({}, int64_t(1) << 30), "is not valid"));
}

TEST_CASE("several problems are reported at once", "[recipe][rules]") {
  const auto problems = problems_of({"parallel.tp=3", "optimizer.min_lr=1"});
  CHECK(problems.size() >= 4);
}

TEST_CASE("rule: dp is -1 (derived) or a size", "[recipe][rules]") {
  expect_problem({"parallel.dp=0"}, std::nullopt, {"parallel.dp=0 is not a data-parallel size", "use -1"});
}

TEST_CASE("rule: latent attention (model.mla) refuses what it is not built with - multi-token prediction needs a target",
          "[recipe][rules]") {
  const std::string mla = R"(model.mla={"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 6, )"
                          R"("qk_rope_head_dim": 4, "v_head_dim": 8})";
  const std::vector<std::string> base = {mla, "model.num_key_value_heads=null"};
  CHECK(problems_of(base).empty());
  expect_problem(with(base, {"model.qk_norm=true"}), std::nullopt, {"model.qk_norm=true", "model.mla", "false"});
  expect_problem(with(base, {"model.attention_bias=true"}), std::nullopt, {"model.attention_bias=true", "model.mla"});
  expect_problem(with(base, {"model.sliding_window=8"}), std::nullopt, {"model.sliding_window=8", "null"});
  expect_problem(with(base, {"model.mla.v_head_dim=11"}), std::nullopt, {"model.mla.v_head_dim=11", "<= 10"});
  expect_problem(with(base, {"model.mla.qk_rope_head_dim=5"}), std::nullopt, {"model.mla.qk_rope_head_dim=5", "even"});
  expect_problem({mla}, std::nullopt, {"model.num_key_value_heads=", "model.num_attention_heads="});
  CHECK(problems_of({"model.num_nextn_predict_layers=2", "parallel.tp=2", "parallel.pp=2"}, 4).empty());
  CHECK(problems_of({"model.num_nextn_predict_layers=1", "parallel.cp=2"}, 2).empty());
  expect_problem({"model.num_nextn_predict_layers=64", "training.seq_len=64"}, std::nullopt,
                 {"model.num_nextn_predict_layers=64", "training.seq_len=64"});
}
