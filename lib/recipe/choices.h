#pragma once
// The values of the recipe's enum-like keys as C++ enums, each with its spelling in the recipe. The
// recipe is typed when it is loaded (recipe.h); nothing outside lib/recipe compares a recipe value
// with a string. Properties of a value (does this schedule split the backward, how many bytes has
// this precision) are asked of the enum here. Torch-free.
#include <fmt/core.h>

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace trainer::recipe {

// Each enum E has `enum_entries(E)` (found by argument-dependent lookup) listing every value with
// its recipe spelling, in the order messages and docs list them.
template <class E, size_t N>
using EnumEntries = std::array<std::pair<E, std::string_view>, N>;

template <class E>
constexpr std::string_view name_of(E value) {
  for (const auto& [v, name] : enum_entries(E{}))
    if (v == value) return name;
  return "?";
}

template <class E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  for (const auto& [v, n] : enum_entries(E{}))
    if (n == name) return v;
  return std::nullopt;
}

template <class E>
std::vector<std::string> enum_names() {
  std::vector<std::string> names;
  for (const auto& [v, n] : enum_entries(E{})) names.emplace_back(n);
  return names;
}

// The spellings of some values of one enum, in the order given.
template <class E, size_t N>
std::vector<std::string> names_of(const std::array<E, N>& values) {
  std::vector<std::string> names;
  for (E v : values) names.emplace_back(name_of(v));
  return names;
}

// training.dtype and parallel.grad_reduce_dtype.
enum class Precision { BF16, FP32 };
constexpr EnumEntries<Precision, 2> enum_entries(Precision) {
  return {{{Precision::BF16, "bf16"}, {Precision::FP32, "fp32"}}};
}
constexpr int64_t bytes_of(Precision p) { return p == Precision::BF16 ? 2 : 4; }

// training.recompute.
enum class Recompute { None, CoreAttention, Selective, Full };
constexpr EnumEntries<Recompute, 4> enum_entries(Recompute) {
  return {{{Recompute::None, "none"},
           {Recompute::CoreAttention, "core_attention"},
           {Recompute::Selective, "selective"},
           {Recompute::Full, "full"}}};
}
// core_attention and selective run the attention core again in backward.
constexpr bool recomputes_core_attention(Recompute r) {
  return r == Recompute::CoreAttention || r == Recompute::Selective;
}
// selective: norms keep only their input, linears after a norm recompute it ("lean" layers).
constexpr bool lean_layers(Recompute r) { return r == Recompute::Selective; }

// parallel.pipeline_schedule (the first five), and the evaluation's forward-only kinds. Placement
// and action lists of each: parallel/pipeline/schedule.h.
enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZeroBubble, ZBV, ForwardOnly, ForwardOnlyV };
constexpr EnumEntries<ScheduleKind, 7> enum_entries(ScheduleKind) {
  return {{{ScheduleKind::GPipe, "gpipe"},
           {ScheduleKind::OneFOneB, "1f1b"},
           {ScheduleKind::Interleaved1F1B, "interleaved_1f1b"},
           {ScheduleKind::ZeroBubble, "zero_bubble"},
           {ScheduleKind::ZBV, "zbv"},
           {ScheduleKind::ForwardOnly, "forward_only"},
           {ScheduleKind::ForwardOnlyV, "forward_only_v"}}};
}
// The kinds a recipe may name (training schedules).
constexpr std::array<ScheduleKind, 5> kTrainingSchedules{ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                                         ScheduleKind::Interleaved1F1B, ScheduleKind::ZeroBubble,
                                                         ScheduleKind::ZBV};
// Zero-bubble kinds split every backward into BackwardInput and BackwardWeight.
constexpr bool splits_backward(ScheduleKind k) { return k == ScheduleKind::ZeroBubble || k == ScheduleKind::ZBV; }
// forward_only and forward_only_v: forwards only (evaluation).
constexpr bool is_forward_only(ScheduleKind k) {
  return k == ScheduleKind::ForwardOnly || k == ScheduleKind::ForwardOnlyV;
}
// zbv and forward_only_v place their chunks in a V.
constexpr bool v_layout(ScheduleKind k) { return k == ScheduleKind::ZBV || k == ScheduleKind::ForwardOnlyV; }
// The forward-only kind with the chunk layout of `training` (forward_only_v for zbv).
constexpr ScheduleKind forward_only_for(ScheduleKind training) {
  return v_layout(training) ? ScheduleKind::ForwardOnlyV : ScheduleKind::ForwardOnly;
}
// interleaved_1f1b and zbv hold more than one model chunk per stage.
constexpr bool takes_virtual_stages(ScheduleKind k) {
  return k == ScheduleKind::Interleaved1F1B || k == ScheduleKind::ZBV;
}

// parallel.cp_method.
enum class CpMethod { Ring, Ulysses };
constexpr EnumEntries<CpMethod, 2> enum_entries(CpMethod) {
  return {{{CpMethod::Ring, "ring"}, {CpMethod::Ulysses, "ulysses"}}};
}

// parallel.backend.
enum class Backend { Auto, Nccl, Gloo };
constexpr EnumEntries<Backend, 3> enum_entries(Backend) {
  return {{{Backend::Auto, "auto"}, {Backend::Nccl, "nccl"}, {Backend::Gloo, "gloo"}}};
}

// model.rope_scaling.rope_type.
enum class RopeType { Llama3, Linear, Yarn };
constexpr EnumEntries<RopeType, 3> enum_entries(RopeType) {
  return {{{RopeType::Llama3, "llama3"}, {RopeType::Linear, "linear"}, {RopeType::Yarn, "yarn"}}};
}

// model.moe.scoring_func.
enum class ScoringFunc { Softmax, Sigmoid };
constexpr EnumEntries<ScoringFunc, 2> enum_entries(ScoringFunc) {
  return {{{ScoringFunc::Softmax, "softmax"}, {ScoringFunc::Sigmoid, "sigmoid"}}};
}

// model.moe.aux_loss_scope.
enum class AuxLossScope { MicroBatch, GlobalBatch };
constexpr EnumEntries<AuxLossScope, 2> enum_entries(AuxLossScope) {
  return {{{AuxLossScope::MicroBatch, "micro_batch"}, {AuxLossScope::GlobalBatch, "global_batch"}}};
}

// training.fused_kernels lists these (model/fused_kernels.h says what each replaces).
enum class FusedKernel { RmsNorm, Rope, Swiglu, CrossEntropy, GradAccumulation };
constexpr EnumEntries<FusedKernel, 5> enum_entries(FusedKernel) {
  return {{{FusedKernel::RmsNorm, "rms_norm"},
           {FusedKernel::Rope, "rope"},
           {FusedKernel::Swiglu, "swiglu"},
           {FusedKernel::CrossEntropy, "cross_entropy"},
           {FusedKernel::GradAccumulation, "grad_accumulation"}}};
}
inline std::vector<FusedKernel> all_fused_kernels() {
  std::vector<FusedKernel> all;
  for (const auto& [k, name] : enum_entries(FusedKernel{})) all.push_back(k);
  return all;
}
inline bool contains(const std::vector<FusedKernel>& kernels, FusedKernel k) {
  for (auto x : kernels)
    if (x == k) return true;
  return false;
}

// optimizer.name.
enum class OptimizerName { AdamW, AdamW8bit, Lion, Muon };
constexpr EnumEntries<OptimizerName, 4> enum_entries(OptimizerName) {
  return {{{OptimizerName::AdamW, "adamw"},
           {OptimizerName::AdamW8bit, "adamw8bit"},
           {OptimizerName::Lion, "lion"},
           {OptimizerName::Muon, "muon"}}};
}

// optimizer.muon.scale: how Muon's orthogonalised update is scaled per matrix.
enum class MuonScale { MatchAdamwRms, Spectral };
constexpr EnumEntries<MuonScale, 2> enum_entries(MuonScale) {
  return {{{MuonScale::MatchAdamwRms, "match_adamw_rms"}, {MuonScale::Spectral, "spectral"}}};
}

// optimizer.decay: from lr to min_lr after warm-up.
enum class LrDecay { Cosine, Linear, Constant };
constexpr EnumEntries<LrDecay, 3> enum_entries(LrDecay) {
  return {{{LrDecay::Cosine, "cosine"}, {LrDecay::Linear, "linear"}, {LrDecay::Constant, "constant"}}};
}

// data.source.
enum class DataSource { Synthetic, Tokens };
constexpr EnumEntries<DataSource, 2> enum_entries(DataSource) {
  return {{{DataSource::Synthetic, "synthetic"}, {DataSource::Tokens, "tokens"}}};
}

// data.format: auto detects the format from the files' magic numbers.
enum class DataFormat { Auto, Trainer, Megatron, Llmc };
constexpr EnumEntries<DataFormat, 4> enum_entries(DataFormat) {
  return {{{DataFormat::Auto, "auto"},
           {DataFormat::Trainer, "trainer"},
           {DataFormat::Megatron, "megatron"},
           {DataFormat::Llmc, "llmc"}}};
}

// data.balance: which rank and micro-batch processes each sample of a global batch (auto: cost
// with data.document_masking, else none).
enum class DataBalance { Auto, Cost, None };
constexpr EnumEntries<DataBalance, 3> enum_entries(DataBalance) {
  return {{{DataBalance::Auto, "auto"}, {DataBalance::Cost, "cost"}, {DataBalance::None, "none"}}};
}

// checkpoint.resume: "auto" (the latest committed checkpoint of checkpoint.dir, if any), "none"
// (start fresh) or the path of a checkpoint.
struct ResumeFrom {
  enum class Mode { Auto, None, Path };
  Mode mode = Mode::Auto;
  std::string path;  // Mode::Path only

  static ResumeFrom parse(const std::string& text) {
    if (text == "auto") return {Mode::Auto, {}};
    if (text == "none") return {Mode::None, {}};
    return {Mode::Path, text};
  }
  std::string text() const { return mode == Mode::Auto ? "auto" : mode == Mode::None ? "none" : path; }
  bool operator==(const ResumeFrom&) const = default;
};

// The enums of this file format as their recipe spelling: fmt::format("{}", Precision::BF16) is "bf16".
template <class E>
concept RecipeEnum = std::is_enum_v<E> && requires { enum_entries(E{}); };

// And so they print in test messages and logs.
template <RecipeEnum E>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << name_of(value);
}

}  // namespace trainer::recipe

template <class E>
struct fmt::formatter<E, char, std::enable_if_t<trainer::recipe::RecipeEnum<E>>> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(E value, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(trainer::recipe::name_of(value), ctx);
  }
};
