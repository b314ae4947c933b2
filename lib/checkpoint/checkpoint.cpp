#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>

#include "checkpoint/manifest_check.h"
#include "checkpoint/synced_file.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/file_tree.h"
#include "core/json_file.h"
#include "core/regular_file.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

// What step_name makes (9 digits and more past step 99,999,999).
bool is_step_name(const std::string& name) {
  static const std::regex pattern(R"(step-\d{8,19})");
  return std::regex_match(name, pattern);
}

// Where a step's files are written before the commit renames the directory into place.
fs::path staging_dir(const std::string& dir, int64_t step) { return fs::path(dir) / (step_name(step) + ".tmp"); }

void write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  write_text_synced(tmp.string(), text);
  fs::rename(tmp, path);
  fsync_path(path.parent_path().string());
}

// Committed step directories, oldest first.
std::vector<fs::path> committed_steps(const fs::path& dir) {
  std::vector<fs::path> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory(ec) || !is_step_name(entry.path().filename().string())) continue;
    if (!fs::exists(entry.path() / "manifest.json", ec)) {
      std::fprintf(stderr, "warning: skipping %s: no committed manifest (an interrupted save)\n",
                   entry.path().c_str());
      continue;
    }
    steps.push_back(entry.path());
  }
  // By step: past step 99,999,999 the names grow a digit, so a shorter name is an older step.
  std::sort(steps.begin(), steps.end(), [](const fs::path& a, const fs::path& b) {
    const std::string x = a.filename().string(), y = b.filename().string();
    return x.size() != y.size() ? x.size() < y.size() : x < y;
  });
  return steps;
}

// Readers require the manifest's recipe, mesh and extra to be objects.
nlohmann::json or_empty(const nlohmann::json& value) { return value.is_null() ? nlohmann::json::object() : value; }

// `latest` must hold the name of a step directory directly inside DIR; anything else is damage
// (or a hand edit) that a resume must not follow. The fix names the newest committed step.
std::string read_latest(const fs::path& pointer, const fs::path& root) {
  const auto fix = [&] {
    const auto steps = committed_steps(root);
    const std::string newest = steps.empty() ? "step-NNNNNNNN" : steps.back().filename().string();
    return fmt::format("`latest` holds the name of the newest committed step directory; remove it to resume from the "
                       "highest committed step, or write the name into it (echo {} > {})",
                       newest, pointer.string());
  };
  std::string text;
  try {
    text = read_text_file(pointer.string(), 4096);
  } catch (const UserError& e) {
    throw UserError(fmt::format("{}\n{}", e.what(), fix()));
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!is_step_name(text))
    throw UserError(fmt::format("{}: holds {}, not the name of a step directory inside {} (step-NNNNNNNN)\n{}",
                                pointer.string(), describe_json(nlohmann::json(text)), root.string(), fix()));
  return text;
}

// The size and CRC-32 of an open file, read through that descriptor.
FileChecksum checksum_of(const RegularFile& file) {
  FileChecksum sum;
  std::vector<unsigned char> buffer(std::min<uint64_t>(file.size(), 1 << 20));
  while (sum.bytes < file.size()) {
    const size_t n = size_t(std::min<uint64_t>(buffer.size(), file.size() - sum.bytes));
    file.read_at(sum.bytes, buffer.data(), n);
    sum.crc32 = crc32_update(sum.crc32, buffer.data(), n);
    sum.bytes += n;
  }
  return sum;
}

}  // namespace

TensorRecord TensorRecord::whole(std::string name, at::Tensor tensor) {
  auto shape = tensor.sizes().vec();
  return slice(std::move(name), std::move(tensor), shape, std::vector<int64_t>(shape.size(), 0));
}

TensorRecord TensorRecord::slice(std::string name, at::Tensor tensor, std::vector<int64_t> global_shape,
                                 std::vector<int64_t> offsets) {
  TensorRecord r;
  r.name = std::move(name);
  r.slice_shape = tensor.sizes().vec();
  r.tensor = std::move(tensor);
  r.global_shape = std::move(global_shape);
  r.offsets = std::move(offsets);
  return r;
}

TensorRecord TensorRecord::flat(std::string name, at::Tensor data, std::vector<int64_t> global_shape,
                                std::vector<int64_t> offsets, std::vector<int64_t> slice_shape, int64_t begin) {
  TensorRecord r;
  r.name = std::move(name);
  r.flat_range = std::make_pair(begin, begin + data.numel());
  r.tensor = data.reshape({-1});
  r.global_shape = std::move(global_shape);
  r.offsets = std::move(offsets);
  r.slice_shape = std::move(slice_shape);
  return r;
}

ShardPlan plan_rank_shard(int64_t rank, const std::vector<TensorRecord>& records) {
  ShardPlan plan;
  plan.report = {{"file", nullptr}, {"tensors", nlohmann::json::object()}};
  if (records.empty()) return plan;
  plan.file = fmt::format("shard-{:05d}.safetensors", rank);
  plan.metadata = {{"format", "trainer"}, {"rank", std::to_string(rank)}};
  std::map<std::string, int> uses;  // a name may have several pieces in one file: keys "name", "name#1", ...
  for (const auto& t : records) {
    const int n = uses[t.name]++;
    const std::string key = n == 0 ? t.name : fmt::format("{}#{}", t.name, n);
    plan.entries.push_back({key, t.tensor.scalar_type(), t.tensor.sizes().vec()});
    nlohmann::json shard = {{"file", plan.file}, {"offsets", t.offsets}, {"shape", t.slice_shape}};
    if (key != t.name) shard["key"] = key;
    if (t.flat_range) shard["flat_range"] = {t.flat_range->first, t.flat_range->second};
    if (t.replicated) shard["replicated_over"] = t.replicated->group;
    auto& entry = plan.report["tensors"][t.name];
    if (entry.is_null())
      entry = {{"dtype", std::string(c10::toString(t.tensor.scalar_type()))},
               {"global_shape", t.global_shape},
               {"shards", nlohmann::json::array()}};
    entry["shards"].push_back(shard);
  }
  return plan;
}

std::string staging_file(const std::string& dir, int64_t step, const std::string& file) {
  const fs::path staging = staging_dir(dir, step);
  fs::create_directories(staging);  // a stale file of the same name is truncated when written
  return (staging / file).string();
}

nlohmann::json write_rank_shard(const std::string& dir, int64_t step, int64_t rank,
                                const std::vector<TensorRecord>& records, FileWriter* writer) {
  ShardPlan plan = plan_rank_shard(rank, records);
  if (records.empty()) return plan.report;
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < records.size(); ++i) entries.push_back({plan.entries[i].name, records[i].tensor});
  const FileChecksum sum = write_safetensors(staging_file(dir, step, plan.file), entries, plan.metadata, writer);
  plan.report["file"] = {{"name", plan.file}, {"bytes", sum.bytes}, {"crc32", sum.crc32}};
  return plan.report;
}

std::string commit_checkpoint(const std::string& dir, const CheckpointContent& content,
                              const std::vector<nlohmann::json>& reports) {
  const fs::path root(dir);
  const fs::path final_dir = root / step_name(content.step);
  const fs::path staging = staging_dir(dir, content.step);
  fs::create_directories(staging);
  nlohmann::json files = nlohmann::json::array();
  nlohmann::json tensors = nlohmann::json::object();
  std::set<std::string> listed = {"manifest.json"};
  for (const auto& report : reports) {
    if (!report.at("file").is_null()) {
      files.push_back(report.at("file"));
      listed.insert(report.at("file").at("name").get<std::string>());
    }
    for (const auto& [name, entry] : report.at("tensors").items()) {
      auto& merged = tensors[name];
      if (merged.is_null()) {
        merged = entry;
        continue;
      }
      if (merged.at("dtype") != entry.at("dtype") || merged.at("global_shape") != entry.at("global_shape"))
        throw std::runtime_error(fmt::format("checkpoint of step {}: ranks disagree on the dtype or global shape of {}",
                                             content.step, name));
      for (const auto& shard : entry.at("shards")) merged["shards"].push_back(shard);
    }
  }
  // Files an earlier, interrupted save of this step left behind are not part of this checkpoint.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(staging, ec))
    if (!listed.count(entry.path().filename().string())) remove_tree(entry.path().string());
  const nlohmann::json manifest = {{"format", "trainer-checkpoint"},
                                   {"version", 1},
                                   {"step", content.step},
                                   {"consumed_samples", content.consumed_samples},
                                   {"recipe", or_empty(content.recipe)},
                                   {"mesh", or_empty(content.mesh)},
                                   {"extra", or_empty(content.extra)},
                                   {"files", files},
                                   {"tensors", tensors}};
  write_text_durably(staging / "manifest.json", manifest.dump(1));
  remove_tree(final_dir.string());  // a committed checkpoint of the same step (re-run after resume)
  fs::rename(staging, final_dir);
  fsync_path(root.string());
  write_text_durably(root / "latest", step_name(content.step) + "\n");
  return final_dir.string();
}

void discard_staging(const std::string& dir, int64_t step) {
  remove_tree(staging_dir(dir, step).string());
}

void prune_checkpoints(const std::string& dir, int64_t keep, const std::string& protect) {
  if (keep <= 0) return;
  auto steps = committed_steps(fs::path(dir));
  while (static_cast<int64_t>(steps.size()) > keep) {
    if (fs::path(protect) != steps.front()) remove_tree(steps.front().string());
    steps.erase(steps.begin());
  }
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;  // the non-throwing calls: an unreadable path is "no checkpoint here", not a crash
  if (!fs::is_directory(root, ec)) return std::nullopt;
  const fs::path pointer = root / "latest";
  if (fs::symlink_status(pointer, ec).type() != fs::file_type::not_found) {
    const std::string name = read_latest(pointer, root);
    if (fs::exists(root / name / "manifest.json", ec)) return (root / name).string();
    std::fprintf(stderr, "warning: %s names %s, which holds no committed checkpoint (removed by hand?); using the newest "
                 "committed step directory instead\n", pointer.c_str(), name.c_str());
  }
  auto steps = committed_steps(root);
  if (steps.empty()) return std::nullopt;
  return steps.back().string();
}

LoadedCheckpoint::LoadedCheckpoint(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p / "manifest.json", ec)) {
    const auto latest = find_latest_checkpoint(path);
    if (!latest) throw UserError(fmt::format("{}: no committed checkpoint (no manifest.json)", path));
    p = *latest;
  }
  path_ = p.string();
  const std::string manifest_path = (p / "manifest.json").string();
  manifest_ = read_json_file(manifest_path);
  // Every field first, then every file whole and unchanged, then each record against its file's
  // header: nothing is allocated or opened that the manifest has not been checked to allow.
  const std::vector<ManifestFile> files = check_manifest(manifest_, manifest_path);
  for (const auto& file : files) {
    const std::string full = (p / file.name).string();
    if (!fs::exists(full, ec)) throw UserError(fmt::format("{}: missing (listed in {})", full, manifest_path));
    const RegularFile opened(full);
    if (opened.size() != file.bytes)
      throw UserError(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)", full, opened.size(),
                                  file.bytes));
    const FileChecksum sum = checksum_of(opened);
    if (sum.crc32 != file.crc32)
      throw UserError(fmt::format("{}: CRC-32 {:08x} differs from the manifest's {:08x} (the file is corrupted)", full,
                                  sum.crc32, file.crc32));
    shards_.try_emplace(file.name, full);
  }
  check_shard_entries(manifest_, manifest_path,
                      [&](const std::string& file, const std::string& key) -> std::optional<StoredEntry> {
                        const SafetensorsReader& r = reader(file, key);
                        if (!r.contains(key)) return std::nullopt;
                        return StoredEntry{r.dtype(key), r.shape(key)};
                      });
}

bool LoadedCheckpoint::contains(const std::string& name) const { return manifest_.at("tensors").contains(name); }

std::vector<int64_t> LoadedCheckpoint::global_shape(const std::string& name) const {
  return manifest_.at("tensors").at(name).at("global_shape").get<std::vector<int64_t>>();
}

at::Tensor LoadedCheckpoint::read(const std::string& name) const {
  return read(name, std::vector<int64_t>(global_shape(name).size(), 0), global_shape(name));
}

const SafetensorsReader& LoadedCheckpoint::reader(const std::string& file, const std::string& tensor) const {
  const auto it = shards_.find(file);
  if (it != shards_.end()) return it->second;
  throw UserError(fmt::format("{}: shard file {} of {} is not listed in the manifest", path_, file, tensor));
}

at::Tensor LoadedCheckpoint::read(const std::string& name, const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& shape) const {
  if (!contains(name)) throw UserError(fmt::format("{}: checkpoint has no tensor {}", path_, name));
  const auto& record = manifest_.at("tensors").at(name);
  // The manifest was checked; the request comes from a model, which may be another model.
  const auto global = global_shape(name);
  bool inside = offsets.size() == global.size() && shape.size() == global.size();
  for (size_t d = 0; inside && d < global.size(); ++d)
    inside = offsets[d] >= 0 && shape[d] >= 0 && offsets[d] <= global[d] && shape[d] <= global[d] - offsets[d];
  if (!inside)
    throw UserError(fmt::format("{}: tensor {} has global shape [{}] in the checkpoint; the slice at [{}] with shape [{}] "
                                "is not inside it (a checkpoint of another model?)",
                                path_, name, fmt::join(global, ", "), fmt::join(offsets, ", "), fmt::join(shape, ", ")));
  // Stored pieces grouped by the rectangular slice they belong to; flattened fragments (ZeRO
  // shards) are joined into their slice first.
  struct Slice {
    std::vector<int64_t> offsets, shape;
    at::Tensor data;
    int64_t covered = 0;
  };
  std::vector<Slice> slices;
  for (const auto& shard : record.at("shards")) {
    const auto file = shard.at("file").get<std::string>();
    const auto key = shard.value("key", name);
    Slice piece{shard.at("offsets").get<std::vector<int64_t>>(), shard.at("shape").get<std::vector<int64_t>>(), {}, 0};
    bool overlaps = true;
    for (size_t d = 0; d < shape.size(); ++d)
      overlaps = overlaps && std::max(offsets[d], piece.offsets[d]) <
                                 std::min(offsets[d] + shape[d], piece.offsets[d] + piece.shape[d]);
    if (!overlaps) continue;
    at::Tensor data = reader(file, name).read(key);
    if (!shard.contains("flat_range")) {
      piece.data = data;
      slices.push_back(std::move(piece));
      continue;
    }
    auto it = std::find_if(slices.begin(), slices.end(),
                           [&](const Slice& s) { return s.offsets == piece.offsets && s.shape == piece.shape; });
    if (it == slices.end()) {
      piece.data = at::empty(piece.shape, data.options());
      slices.push_back(std::move(piece));
      it = std::prev(slices.end());
    }
    const int64_t begin = shard.at("flat_range")[0].get<int64_t>(), end = shard.at("flat_range")[1].get<int64_t>();
    it->data.view({-1}).narrow(0, begin, end - begin).copy_(data.reshape({-1}));
    it->covered += end - begin;
  }
  at::Tensor result;
  int64_t filled = 0;
  for (const auto& s : slices) {
    if (s.covered > 0 && s.covered != s.data.numel())
      throw UserError(fmt::format("{}: the fragments of {} cover {} of {} elements of a slice", path_, name, s.covered,
                                  s.data.numel()));
    if (!result.defined()) result = at::empty(shape, s.data.options());
    at::Tensor source = s.data, target = result;
    int64_t count = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t lo = std::max(offsets[d], s.offsets[d]), hi = std::min(offsets[d] + shape[d], s.offsets[d] + s.shape[d]);
      source = source.narrow(int64_t(d), lo - s.offsets[d], hi - lo);
      target = target.narrow(int64_t(d), lo - offsets[d], hi - lo);
      count *= hi - lo;
    }
    target.copy_(source);
    filled += count;
  }
  int64_t wanted = 1;
  for (auto d : shape) wanted *= d;
  if (!result.defined() || filled < wanted)
    throw UserError(fmt::format("{}: the shards of {} do not cover the requested part", path_, name));
  return result;
}

}  // namespace trainer::checkpoint
