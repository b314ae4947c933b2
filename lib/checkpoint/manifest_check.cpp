#include "checkpoint/manifest_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "core/plural.h"
#include "core/regular_file.h"
#include "recipe/keys.h"
#include "recipe/recipe_json.h"
#include "recipe/schema.h"

namespace trainer::checkpoint {

namespace {

using nlohmann::json;

// No tensor trainer writes has more dimensions; more is a damaged record.
constexpr size_t kMaxRank = 8;

// 2^53 samples (9e15, a million times the largest runs' 2^32): exact as a double in metrics, and
// far from int64 overflow as training adds global batches to it.
constexpr int64_t kMaxConsumedSamples = int64_t(1) << 53;

const std::map<std::string, c10::ScalarType>& dtypes() {
  static const std::map<std::string, c10::ScalarType> names = {
      {"Float", c10::kFloat}, {"BFloat16", c10::kBFloat16}, {"Half", c10::kHalf}, {"Double", c10::kDouble},
      {"Long", c10::kLong},   {"Int", c10::kInt},           {"Byte", c10::kByte}, {"Bool", c10::kBool}};
  return names;
}

std::string json_string(const std::string& key) { return json(key).dump(); }

// Errors name the manifest and the JSON path of the field: files[1].name, tensors."w".shards[0].offsets.
struct Checker {
  const std::string& source;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw UserError(fmt::format("{}: {}: {}", source, path, what));
  }
  [[noreturn]] void wrong(const std::string& path, const json& value, const std::string& expected) const {
    fail(path, fmt::format("{} ({}); expected {}", describe_json(value), json_type_name(value), expected));
  }
  const json& field(const json& object, const std::string& key, const std::string& path) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(path, "missing");
    return *it;
  }
  const json& object(const json& parent, const std::string& key, const std::string& path) const {
    const json& value = field(parent, key, path);
    if (!value.is_object()) wrong(path, value, "an object");
    return value;
  }
  const std::string& string(const json& value, const std::string& path) const {
    if (!value.is_string()) wrong(path, value, "a string");
    return value.get_ref<const std::string&>();
  }
  int64_t integer(const json& value, const std::string& path, int64_t max = std::numeric_limits<int64_t>::max()) const {
    const bool fits = value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t(max)
                                                 : value.is_number_integer() && value.get<int64_t>() >= 0 &&
                                                       value.get<int64_t>() <= max;
    if (!fits)
      wrong(path, value, max == std::numeric_limits<int64_t>::max() ? "a non-negative integer"
                                                                    : fmt::format("an integer from 0 to {}", max));
    return value.get<int64_t>();
  }
  // An array of `count` non-negative integers; `what` says why that many ("a 2-D tensor").
  std::vector<int64_t> integers(const json& value, const std::string& path, size_t count, const std::string& what) const {
    if (!value.is_array()) wrong(path, value, fmt::format("a list of {} non-negative integers", count));
    if (value.size() != count)
      fail(path, fmt::format("{} value{} for {}", value.size(), value.size() == 1 ? "" : "s", what));
    std::vector<int64_t> out;
    for (size_t i = 0; i < value.size(); ++i) out.push_back(integer(value[i], fmt::format("{}[{}]", path, i)));
    return out;
  }
};

// Elements of a shape, or nothing when they (times 8 bytes, the widest dtype) overflow int64.
std::optional<int64_t> element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  if (n > std::numeric_limits<int64_t>::max() / 8) return std::nullopt;
  return n;
}

std::string describe_shape(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// One rectangular slice of a tensor: a whole shard, or the flat fragments that together hold it.
struct Slice {
  std::vector<int64_t> offsets, shape;
  int64_t numel = 0;
  size_t first_shard = 0;
  bool flat = false;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // flat fragments [begin, end)
};

bool overlap(const Slice& a, const Slice& b) {
  if (a.numel == 0 || b.numel == 0) return false;
  for (size_t d = 0; d < a.shape.size(); ++d)
    if (std::max(a.offsets[d], b.offsets[d]) >= std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d])) return false;
  return true;
}

void check_tensor(const Checker& c, const std::string& name, const json& record, const std::set<std::string>& files) {
  const std::string path = "tensors." + json_string(name);
  if (!record.is_object()) c.wrong(path, record, "an object with dtype, global_shape and shards");
  const std::string& dtype = c.string(c.field(record, "dtype", path + ".dtype"), path + ".dtype");
  if (!manifest_dtype(dtype)) {
    std::vector<std::string> known;
    for (const auto& [n, type] : dtypes()) known.push_back(n);
    c.fail(path + ".dtype", fmt::format("{} is not a dtype trainer writes ({})", json_string(dtype), fmt::join(known, ", ")));
  }
  const json& shape_json = c.field(record, "global_shape", path + ".global_shape");
  if (!shape_json.is_array() || shape_json.size() > kMaxRank)
    c.wrong(path + ".global_shape", shape_json, fmt::format("a list of at most {} non-negative integers", kMaxRank));
  const auto global = c.integers(shape_json, path + ".global_shape", shape_json.size(), "");
  const auto global_numel = element_count(global);
  if (!global_numel)
    c.fail(path + ".global_shape", fmt::format("{} has more elements than any tensor can hold", describe_shape(global)));
  const size_t rank = global.size();
  const std::string rank_words = fmt::format("a {}-D tensor", rank);
  const json& shards = c.field(record, "shards", path + ".shards");
  if (!shards.is_array() || shards.empty()) c.wrong(path + ".shards", shards, "a non-empty list of shard records");

  std::vector<Slice> slices;
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, size_t> slice_index;  // (offsets, shape) -> slices[i]
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string at = fmt::format("{}.shards[{}]", path, i);
    const json& shard = shards[i];
    if (!shard.is_object()) c.wrong(at, shard, "an object with file, offsets and shape");
    const std::string& file = c.string(c.field(shard, "file", at + ".file"), at + ".file");
    if (!files.count(file)) c.fail(at + ".file", fmt::format("{} is not among the manifest's files", json_string(file)));
    if (shard.contains("key")) c.string(shard.at("key"), at + ".key");
    if (shard.contains("replicated_over")) c.string(shard.at("replicated_over"), at + ".replicated_over");
    Slice s;
    s.first_shard = i;
    s.offsets = c.integers(c.field(shard, "offsets", at + ".offsets"), at + ".offsets", rank, rank_words);
    s.shape = c.integers(c.field(shard, "shape", at + ".shape"), at + ".shape", rank, rank_words);
    for (size_t d = 0; d < rank; ++d)
      if (s.offsets[d] > global[d] || s.shape[d] > global[d] - s.offsets[d])
        c.fail(at, fmt::format("the slice at offsets {} with shape {} does not lie inside global_shape {} (dimension {})",
                               describe_shape(s.offsets), describe_shape(s.shape), describe_shape(global), d));
    s.numel = *element_count(s.shape);  // inside the global shape: no overflow
    std::optional<std::pair<int64_t, int64_t>> range;
    if (shard.contains("flat_range")) {
      const auto r = c.integers(shard.at("flat_range"), at + ".flat_range", 2, "a range [begin, end)");
      if (r[0] > r[1] || r[1] > s.numel)
        c.fail(at + ".flat_range", fmt::format("[{}, {}); expected 0 <= begin <= end <= {} (the slice's elements)", r[0],
                                               r[1], s.numel));
      range = std::make_pair(r[0], r[1]);
    }
    const auto [known, added] = slice_index.try_emplace(std::make_pair(s.offsets, s.shape), slices.size());
    if (!added) {
      Slice* same = &slices[known->second];
      if (range.has_value() != same->flat)
        c.fail(at, fmt::format("holds part of the slice that shards[{}] holds {} (offsets {}, shape {})",
                               same->first_shard, same->flat ? "as flat fragments" : "whole", describe_shape(s.offsets),
                               describe_shape(s.shape)));
      // A whole slice written twice is a second copy (a tied embedding's step count, written by
      // both pipeline stages that hold it): either is read.
      if (range) same->ranges.push_back(*range);
      continue;
    }
    s.flat = range.has_value();
    if (range) s.ranges.push_back(*range);
    slices.push_back(std::move(s));
  }
  // Flat fragments join into their slice without gaps or overlaps.
  for (auto& s : slices) {
    if (!s.flat) continue;
    std::sort(s.ranges.begin(), s.ranges.end());
    int64_t next = 0;
    for (const auto& [begin, end] : s.ranges) {
      if (begin != next)
        c.fail(path + ".shards", fmt::format("the flat_range fragments of the slice at offsets {} with shape {} {} at "
                                             "element {} (of {})",
                                             describe_shape(s.offsets), describe_shape(s.shape),
                                             begin > next ? "leave a gap" : "overlap", std::min(begin, next), s.numel));
      next = end;
    }
    if (next != s.numel)
      c.fail(path + ".shards", fmt::format("the flat_range fragments of the slice at offsets {} with shape {} cover {} of "
                                           "its {} elements",
                                           describe_shape(s.offsets), describe_shape(s.shape), next, s.numel));
  }
  // The slices tile the global tensor: no two overlap and together they hold every element. This
  // also bounds what a whole read allocates by what the files hold.
  // Pairs are compared only along the dimension with the most distinct offsets, in order of their
  // offsets there, so a tiling of n slices costs n log n, not n^2 (40,000 slices took 4.2 s).
  size_t sweep = 0, most = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::set<int64_t> distinct;
    for (const auto& s : slices) distinct.insert(s.offsets[d]);
    if (distinct.size() > most) sweep = d, most = distinct.size();
  }
  std::vector<const Slice*> order;
  for (const auto& s : slices)
    if (s.numel > 0) order.push_back(&s);
  if (rank > 0)
    std::sort(order.begin(), order.end(), [&](const Slice* a, const Slice* b) { return a->offsets[sweep] < b->offsets[sweep]; });
  int64_t covered = 0;
  for (size_t a = 0; a < order.size(); ++a) {
    // Later slices start at or after this one along `sweep`; only those starting before its end can overlap it.
    for (size_t b = a + 1; b < order.size() && (rank == 0 || order[b]->offsets[sweep] < order[a]->offsets[sweep] +
                                                                                           order[a]->shape[sweep]); ++b)
      if (overlap(*order[a], *order[b]))
        c.fail(path + ".shards", fmt::format("shards[{}] and shards[{}] overlap (slices at offsets {} and {})",
                                             std::min(order[a]->first_shard, order[b]->first_shard),
                                             std::max(order[a]->first_shard, order[b]->first_shard),
                                             describe_shape(order[a]->offsets), describe_shape(order[b]->offsets)));
    covered += order[a]->numel;  // disjoint slices inside the tensor: at most its element count
  }
  if (covered != *global_numel)
    c.fail(path + ".shards", fmt::format("the shards hold {} of the {} elements of global_shape {} (a shard is missing)",
                                         covered, *global_numel, describe_shape(global)));
}

}  // namespace

std::optional<c10::ScalarType> manifest_dtype(const std::string& name) {
  const auto it = dtypes().find(name);
  if (it == dtypes().end()) return std::nullopt;
  return it->second;
}

std::vector<ManifestFile> check_manifest(const json& m, const std::string& source) {
  const Checker c{source};
  if (!m.is_object()) c.wrong("(top level)", m, "an object");
  const json& format = c.field(m, "format", "format");
  if (format != "trainer-checkpoint") c.wrong("format", format, "\"trainer-checkpoint\" (not a trainer checkpoint manifest)");
  const json& version = c.field(m, "version", "version");
  if (version != kManifestVersion)
    c.fail("version", fmt::format("{}; this trainer reads checkpoint format version {} only (written by another trainer "
                                  "version?)",
                                  describe_json(version), kManifestVersion));
  // No run has more steps than training.steps allows; counters past the bounds would overflow as
  // training adds to them (INT64_MAX samples resumed, then was written back negative).
  c.integer(c.field(m, "step", "step"), "step", recipe::kMaxInteger);
  c.integer(c.field(m, "consumed_samples", "consumed_samples"), "consumed_samples", kMaxConsumedSamples);
  c.object(m, "recipe", "recipe");
  c.object(m, "mesh", "mesh");
  const json& extra = c.object(m, "extra", "extra");
  if (extra.contains("optimizer_steps"))
    c.integer(extra.at("optimizer_steps"), "extra.optimizer_steps", recipe::kMaxInteger);

  std::vector<ManifestFile> files;
  std::set<std::string> names;
  const json& list = c.field(m, "files", "files");
  if (!list.is_array()) c.wrong("files", list, "a list of {name, bytes, crc32}");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = fmt::format("files[{}]", i);
    if (!list[i].is_object()) c.wrong(at, list[i], "an object {name, bytes, crc32}");
    ManifestFile f;
    f.name = c.string(c.field(list[i], "name", at + ".name"), at + ".name");
    if (!is_plain_file_name(f.name) || f.name == "manifest.json")
      c.fail(at + ".name", fmt::format("{}; expected the name of a shard file directly inside the step directory (no "
                                       "'/', not '..')",
                                       json_string(f.name)));
    if (!names.insert(f.name).second) c.fail(at + ".name", fmt::format("{} is listed twice", json_string(f.name)));
    f.bytes = uint64_t(c.integer(c.field(list[i], "bytes", at + ".bytes"), at + ".bytes"));
    f.crc32 = uint32_t(c.integer(c.field(list[i], "crc32", at + ".crc32"), at + ".crc32", 0xffffffffLL));
    files.push_back(std::move(f));
  }
  const json& tensors = c.object(m, "tensors", "tensors");
  for (const auto& [name, record] : tensors.items()) check_tensor(c, name, record, names);
  return files;
}

void check_shard_entries(const json& m, const std::string& source, const EntryLookup& lookup) {
  const Checker c{source};
  for (const auto& [name, record] : m.at("tensors").items()) {
    const c10::ScalarType dtype = *manifest_dtype(record.at("dtype").get<std::string>());
    const auto& shards = record.at("shards");
    for (size_t i = 0; i < shards.size(); ++i) {
      const json& shard = shards[i];
      const std::string at = fmt::format("tensors.{}.shards[{}]", json_string(name), i);
      const std::string file = shard.at("file").get<std::string>();
      const std::string key = shard.contains("key") ? shard.at("key").get<std::string>() : name;
      const auto entry = lookup(file, key);
      if (!entry) c.fail(at, fmt::format("{} has no tensor {}", file, json_string(key)));
      if (entry->dtype != dtype)
        c.fail(at, fmt::format("{} stores {} as {}, the manifest's dtype is {}", file, json_string(key),
                               c10::toString(entry->dtype), c10::toString(dtype)));
      const auto shape = shard.at("shape").get<std::vector<int64_t>>();
      if (shard.contains("flat_range")) {
        const int64_t length = shard.at("flat_range")[1].get<int64_t>() - shard.at("flat_range")[0].get<int64_t>();
        const auto stored = element_count(entry->shape);
        if (entry->shape.size() != 1 || !stored || *stored != length)
          c.fail(at, fmt::format("{} holds {} with shape {}, but flat_range says {} elements", file, json_string(key),
                                 describe_shape(entry->shape), length));
      } else if (entry->shape != shape) {
        c.fail(at, fmt::format("{} holds {} with shape {}, but the manifest's shape is {}", file, json_string(key),
                               describe_shape(entry->shape), describe_shape(shape)));
      }
    }
  }
}

recipe::Recipe manifest_recipe(const json& m, const std::string& source) {
  json filled = m.at("recipe");
  std::vector<std::string> problems;
  for (const auto& spec : recipe::schema()) {
    // Members of a section that is absent or null (a dense model's model.moe) are not there to check.
    const auto dot = spec.path.rfind('.');
    if (dot != std::string::npos) {
      const json* parent = recipe::get_path(filled, spec.path.substr(0, dot));
      if (!parent || !parent->is_object()) continue;
    }
    const json* value = recipe::get_path(filled, spec.path);
    if (!value) {
      if (spec.required) problems.push_back(fmt::format("recipe.{}: missing", spec.path));
      else recipe::set_path(filled, spec.path, spec.default_value);
      continue;
    }
    const std::string problem = recipe::check_value(spec, *value);
    if (!problem.empty()) problems.push_back(fmt::format("recipe.{}: {}", spec.path, problem));
  }
  if (problems.empty()) {
    try {
      recipe::Recipe r = recipe::recipe_from_json(filled, problems);
      if (problems.empty()) return r;
    } catch (const json::exception& e) {  // every key was checked above; kept so that no JSON error is "internal"
      problems.push_back(fmt::format("recipe: {}", e.what()));
    }
  }
  throw UserError(fmt::format("{}: {}{}", source, problems.front(),
                              problems.size() > 1
                                  ? fmt::format(" (and {} more)", count_of(int64_t(problems.size()) - 1, "problem", "problems"))
                                  : ""));
}

std::string parameter_of_optimizer_state(const std::string& name) {
  const std::string optimizer = "optimizer.";
  if (name.rfind(optimizer, 0) != 0) return "";
  const size_t kind_end = name.find('.', optimizer.size());
  return kind_end == std::string::npos ? "" : name.substr(kind_end + 1);
}

std::vector<std::string> required_optimizer_state(const std::string& name, c10::ScalarType dtype,
                                                  const std::vector<int64_t>& shape, const json& optimizer,
                                                  const std::function<bool(const std::string&)>& has) {
  const std::string kind = optimizer.is_object() ? optimizer.value("name", "adamw") : "adamw";
  std::vector<std::string> states = {"exp_avg", "exp_avg_sq"};
  if (kind == "lion") states = {"momentum"};
  if (kind == "muon" && shape.size() == 2 && !has("optimizer.exp_avg." + name)) states = {"momentum"};
  if (kind == "adamw8bit") {
    int64_t numel = 1;
    for (const int64_t d : shape) numel *= d;
    // optim::AdamW8bitRule::quantized: matrices of at least min_8bit_size elements.
    if (shape.size() >= 2 && numel >= optimizer.value("min_8bit_size", int64_t(4096)))
      states = {"exp_avg_code", "exp_avg_absmax", "exp_avg_sq_code", "exp_avg_sq_absmax"};
  }
  std::vector<std::string> out;
  for (const auto& s : states) out.push_back("optimizer." + s + "." + name);
  out.push_back("optimizer.step." + name);
  if (dtype != c10::kFloat) out.push_back("optimizer.master." + name);
  return out;
}

std::vector<std::string> missing_training_state(const json& m) {
  std::set<std::string> missing;
  const json& tensors = m.at("tensors");
  for (const auto& [name, record] : tensors.items()) {
    if (name.rfind("optimizer.", 0) == 0) {
      const std::string parameter = parameter_of_optimizer_state(name);
      if (!parameter.empty() && !tensors.contains(parameter)) missing.insert(parameter);
      continue;
    }
    if (name.rfind("model.", 0) != 0 && name != "lm_head.weight") continue;
    const json optimizer = m.contains("recipe") && m.at("recipe").contains("optimizer") ? m.at("recipe").at("optimizer")
                                                                                         : json();
    const auto has = [&](const std::string& tensor) { return tensors.contains(tensor); };
    for (const auto& state : required_optimizer_state(name, *manifest_dtype(record.at("dtype").get<std::string>()),
                                                      record.at("global_shape").get<std::vector<int64_t>>(), optimizer,
                                                      has))
      if (!tensors.contains(state)) missing.insert(state);
  }
  return {missing.begin(), missing.end()};
}

}  // namespace trainer::checkpoint
