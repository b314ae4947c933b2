#pragma once
// `trainer estimate` output: the JSON document (schema in docs/estimator.md, versioned by
// "schema_version") and the console text. Torch-free.
#include <nlohmann/json.hpp>
#include <string>

#include "estimate/estimate.h"
#include "estimate/hardware.h"
#include "recipe/recipe.h"

namespace trainer::estimate {

inline constexpr int kEstimateSchemaVersion = 1;

struct ReportContext {
  std::string recipe_path;
  const recipe::Recipe* recipe = nullptr;
  const HardwareProfile* gpu = nullptr;  // nullptr: CPU
  bool fused_kernels = false;
  std::string world_size_note;           // how the world size was chosen, when it was not given
};

nlohmann::json estimate_json(const JobEstimate& estimate, const ReportContext& context);
std::string estimate_text(const JobEstimate& estimate, const ReportContext& context);

// The assumptions every estimate rests on, one sentence each (also in the JSON).
std::vector<std::string> estimate_assumptions(const JobEstimate& estimate, const ReportContext& context);

// 12.34 GiB, 512.0 MiB, 3.2 KiB, 17 B.
std::string format_bytes(double bytes);

}  // namespace trainer::estimate
