#include "estimate/hardware.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>

#include "core/error.h"
#include "core/json_file.h"
#include "core/nearest.h"

namespace trainer::estimate {

namespace detail {
const std::vector<std::pair<std::string, std::string>>& builtin_profile_texts();  // generated
}

namespace {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// One field of the JSON format: its path, and how to read and write it in natural units.
struct Field {
  const char* path;
  bool is_string;
  bool positive;  // numbers must be > 0 (else >= 0)
  std::function<double&(HardwareProfile&)> number;
  std::function<std::string&(HardwareProfile&)> text;
  double scale = 1;  // JSON value * scale = stored value
};

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> f;
    auto text = [&](const char* path, std::function<std::string&(HardwareProfile&)> get) {
      f.push_back(Field{path, true, false, nullptr, std::move(get)});
    };
    auto number = [&](const char* path, double scale, bool positive, std::function<double&(HardwareProfile&)> get) {
      f.push_back(Field{path, false, positive, std::move(get), nullptr, scale});
    };
    text("name", [](HardwareProfile& p) -> std::string& { return p.name; });
    text("description", [](HardwareProfile& p) -> std::string& { return p.description; });
    text("sources", [](HardwareProfile& p) -> std::string& { return p.sources; });
    number("memory_gib", kGiB, true, [](HardwareProfile& p) -> double& { return p.memory_bytes; });
    number("peak_tflops.bf16", 1e12, true, [](HardwareProfile& p) -> double& { return p.bf16_flops; });
    number("peak_tflops.fp32", 1e12, true, [](HardwareProfile& p) -> double& { return p.fp32_flops; });
    number("hbm_tb_s", 1e12, true, [](HardwareProfile& p) -> double& { return p.hbm_bytes_per_s; });
    number("efficiency.gemm", 1, true, [](HardwareProfile& p) -> double& { return p.gemm_efficiency; });
    number("efficiency.gemm_latency_us", 1e-6, false, [](HardwareProfile& p) -> double& { return p.gemm_latency_s; });
    number("efficiency.grouped_gemm", 1, true, [](HardwareProfile& p) -> double& { return p.grouped_gemm_efficiency; });
    number("efficiency.attention", 1, true, [](HardwareProfile& p) -> double& { return p.attention_efficiency; });
    number("efficiency.hbm", 1, true, [](HardwareProfile& p) -> double& { return p.hbm_efficiency; });
    number("efficiency.kernel_overhead_us", 1e-6, false, [](HardwareProfile& p) -> double& { return p.kernel_overhead_s; });
    number("host.us_per_kernel", 1e-6, false, [](HardwareProfile& p) -> double& { return p.host_s_per_kernel; });
    number("host.d2h_gb_s", 1e9, true, [](HardwareProfile& p) -> double& { return p.host_d2h_bytes_per_s; });
    number("links.nvlink.gb_s", 1e9, true, [](HardwareProfile& p) -> double& { return p.nvlink.bytes_per_s; });
    number("links.nvlink.latency_us", 1e-6, false, [](HardwareProfile& p) -> double& { return p.nvlink.latency_s; });
    number("links.nvlink.efficiency", 1, true, [](HardwareProfile& p) -> double& { return p.nvlink.efficiency; });
    number("links.network.gb_s", 1e9, true, [](HardwareProfile& p) -> double& { return p.network.bytes_per_s; });
    number("links.network.latency_us", 1e-6, false, [](HardwareProfile& p) -> double& { return p.network.latency_s; });
    number("links.network.efficiency", 1, true, [](HardwareProfile& p) -> double& { return p.network.efficiency; });
    number("overhead.framework_gib", kGiB, false,
           [](HardwareProfile& p) -> double& { return p.framework_overhead_bytes; });
    number("overhead.cublas_workspace_mib", kMiB, false,
           [](HardwareProfile& p) -> double& { return p.cublas_workspace_bytes; });
    number("overhead.fragmentation", 1, true, [](HardwareProfile& p) -> double& { return p.fragmentation; });
    number("storage.gb_s", 1e9, true, [](HardwareProfile& p) -> double& { return p.storage_bytes_per_s; });
    return f;
  }();
  return table;
}

std::vector<std::string> field_paths() {
  std::vector<std::string> paths;
  for (const auto& f : fields()) paths.push_back(f.path);
  return paths;
}

// Leaves of a JSON object as dotted paths ("links.nvlink.gb_s").
void flatten(const json& value, const std::string& prefix, std::map<std::string, const json*>& out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  out[prefix] = &value;
}

HardwareProfile parse_builtin(const std::string& file, const std::string& text) {
  const json doc = parse_json_text(text, "built-in profile " + file);
  HardwareProfile empty;
  HardwareProfile p = apply_profile_overrides(empty, doc, "built-in profile " + file);
  // A built-in profile must give every field.
  std::map<std::string, const json*> given;
  flatten(doc, "", given);
  for (const auto& f : fields())
    if (!given.count(f.path)) throw std::logic_error(fmt::format("built-in profile {} lacks {}", file, f.path));
  return p;
}

}  // namespace

double HardwareProfile::peak_flops(recipe::Precision dtype) const {
  return dtype == recipe::Precision::BF16 ? bf16_flops : fp32_flops;
}

const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> profiles = [] {
    std::vector<HardwareProfile> all;
    for (const auto& [file, text] : detail::builtin_profile_texts()) all.push_back(parse_builtin(file, text));
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return all;
  }();
  return profiles;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : builtin_profiles()) names.push_back(p.name);
  return names;
}

const HardwareProfile& builtin_profile(const std::string& name) {
  for (const auto& p : builtin_profiles())
    if (p.name == name) return p;
  const auto names = builtin_profile_names();
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  const std::string nearest = nearest_candidate(name, names);
  throw UserError(fmt::format("unknown GPU \"{}\"{}; known GPUs: {} (or describe yours in a profile file, see "
                              "docs/estimator.md)",
                              name, nearest.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", nearest), list));
}

HardwareProfile apply_profile_overrides(const HardwareProfile& base, const json& overrides, const std::string& source) {
  if (!overrides.is_object())
    throw UserError(fmt::format("{}: a GPU profile must be a JSON object, found {}", source, json_type_name(overrides)));
  std::map<std::string, const json*> given;
  flatten(overrides, "", given);
  HardwareProfile p = base;
  std::vector<std::string> problems;
  const auto paths = field_paths();
  for (const auto& [path, value] : given) {
    if (path == "base") continue;  // handled by load_profile_file
    const auto it = std::find_if(fields().begin(), fields().end(), [&](const Field& f) { return f.path == path; });
    if (it == fields().end()) {
      const std::string nearest = nearest_candidate(path, paths);
      problems.push_back(fmt::format("unknown key {}{}", path,
                                     nearest.empty() ? "" : fmt::format(" (did you mean {}?)", nearest)));
      continue;
    }
    if (it->is_string) {
      if (!value->is_string()) {
        problems.push_back(fmt::format("{}: found {}, expected a string", path, describe_json(*value)));
        continue;
      }
      it->text(p) = value->get<std::string>();
      continue;
    }
    if (!value->is_number() || (it->positive ? value->get<double>() <= 0 : value->get<double>() < 0)) {
      problems.push_back(fmt::format("{}: found {}, expected a number {}", path, describe_json(*value),
                                     it->positive ? "> 0" : ">= 0"));
      continue;
    }
    it->number(p) = value->get<double>() * it->scale;
  }
  if (!problems.empty()) {
    std::string text;
    for (const auto& problem : problems) text += "\n  " + problem;
    throw UserError(fmt::format("{}: invalid GPU profile:{}", source, text));
  }
  return p;
}

HardwareProfile load_profile_file(const std::string& path, const std::string& default_base) {
  const json doc = read_json_file(path);
  std::string base = default_base;
  if (doc.is_object() && doc.contains("base")) {
    if (!doc["base"].is_string())
      throw UserError(fmt::format("{}: base: found {}, expected the name of a built-in GPU profile", path,
                                  describe_json(doc["base"])));
    base = doc["base"].get<std::string>();
  }
  HardwareProfile p = apply_profile_overrides(builtin_profile(base), doc, path);
  if (!doc.contains("name")) p.name = base + " (" + path + ")";
  return p;
}

json profile_to_json(const HardwareProfile& profile) {
  json out = json::object();
  HardwareProfile copy = profile;
  for (const auto& f : fields()) {
    json* node = &out;
    std::string path = f.path;
    size_t dot;
    while ((dot = path.find('.')) != std::string::npos) {
      node = &(*node)[path.substr(0, dot)];
      path = path.substr(dot + 1);
    }
    if (f.is_string)
      (*node)[path] = f.text(copy);
    else
      (*node)[path] = f.number(copy) / f.scale;
  }
  return out;
}

}  // namespace trainer::estimate
