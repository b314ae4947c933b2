#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "core/crc32.h"
#include "core/error.h"
#include "core/file_tree.h"
#include "core/json_file.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

// Where a step's files are written before the commit renames the directory into place.
fs::path staging_dir(const std::string& dir, int64_t step) { return fs::path(dir) / (step_name(step) + ".tmp"); }

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("{}: cannot write", tmp.string()));
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
  fsync_path(path.parent_path());
}

// Committed step directories, oldest first.
std::vector<fs::path> committed_steps(const fs::path& dir) {
  std::vector<fs::path> steps;
  std::error_code ec;
  static const std::regex pattern(R"(step-\d{8})");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory() || !std::regex_match(entry.path().filename().string(), pattern)) continue;
    if (!fs::exists(entry.path() / "manifest.json")) {
      std::fprintf(stderr, "warning: skipping %s: no committed manifest (an interrupted save)\n",
                   entry.path().c_str());
      continue;
    }
    steps.push_back(entry.path());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
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
                                   {"recipe", content.recipe},
                                   {"mesh", content.mesh},
                                   {"extra", content.extra},
                                   {"files", files},
                                   {"tensors", tensors}};
  write_text_durably(staging / "manifest.json", manifest.dump(1));
  remove_tree(final_dir.string());  // a committed checkpoint of the same step (re-run after resume)
  fs::rename(staging, final_dir);
  fsync_path(root);
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
  if (!fs::is_directory(root)) return std::nullopt;
  std::ifstream latest(root / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && fs::exists(root / name / "manifest.json")) return (root / name).string();
  auto steps = committed_steps(root);
  if (steps.empty()) return std::nullopt;
  return steps.back().string();
}

LoadedCheckpoint::LoadedCheckpoint(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p / "manifest.json")) {
    const auto latest = find_latest_checkpoint(path);
    if (!latest) throw UserError(fmt::format("{}: no committed checkpoint (no manifest.json)", path));
    p = *latest;
  }
  path_ = p.string();
  manifest_ = read_json_file((p / "manifest.json").string());
  if (manifest_.value("format", "") != "trainer-checkpoint")
    throw UserError(fmt::format("{}: not a trainer checkpoint manifest", (p / "manifest.json").string()));
  // Every shard file must be there, whole and unchanged before any of it is used.
  for (const auto& file : manifest_.at("files")) {
    const std::string name = file.at("name").get<std::string>();
    const std::string full = (p / name).string();
    if (!fs::exists(full)) throw UserError(fmt::format("{}: missing (listed in {}/manifest.json)", full, path_));
    FileChecksum sum;
    try {
      sum = checksum_file(full);
    } catch (const std::exception& e) {
      throw UserError(e.what());
    }
    if (sum.bytes != file.at("bytes").get<uint64_t>())
      throw UserError(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)", full, sum.bytes,
                                  file.at("bytes").get<uint64_t>()));
    if (sum.crc32 != file.at("crc32").get<uint32_t>())
      throw UserError(fmt::format("{}: CRC-32 {:08x} differs from the manifest's {:08x} (the file is corrupted)", full,
                                  sum.crc32, file.at("crc32").get<uint32_t>()));
    shards_.push_back(std::make_unique<SafetensorsReader>(full));
  }
}

bool LoadedCheckpoint::contains(const std::string& name) const { return manifest_.at("tensors").contains(name); }

std::vector<int64_t> LoadedCheckpoint::global_shape(const std::string& name) const {
  return manifest_.at("tensors").at(name).at("global_shape").get<std::vector<int64_t>>();
}

at::Tensor LoadedCheckpoint::read(const std::string& name) const {
  return read(name, std::vector<int64_t>(global_shape(name).size(), 0), global_shape(name));
}

const SafetensorsReader& LoadedCheckpoint::reader(const std::string& file, const std::string& tensor) const {
  for (const auto& s : shards_)
    if (fs::path(s->path()).filename() == file) return *s;
  throw UserError(fmt::format("{}: shard file {} of {} is not listed in the manifest", path_, file, tensor));
}

at::Tensor LoadedCheckpoint::read(const std::string& name, const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& shape) const {
  if (!contains(name)) throw UserError(fmt::format("{}: checkpoint has no tensor {}", path_, name));
  const auto& record = manifest_.at("tensors").at(name);
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
