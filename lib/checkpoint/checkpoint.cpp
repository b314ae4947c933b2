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

#include "core/crc32.h"
#include "core/error.h"
#include "core/file_tree.h"
#include "core/json_file.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

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

namespace {
std::string write_and_commit(const std::string& dir, const CheckpointContent& content, int64_t keep);
}

std::string save_checkpoint(const std::string& dir, const CheckpointContent& content, int64_t keep) {
  try {
    return write_and_commit(dir, content, keep);
  } catch (...) {
    // Leave no half-written directory behind; committed checkpoints and `latest` are untouched.
    try {
      remove_tree((fs::path(dir) / (step_name(content.step) + ".tmp")).string());
    } catch (...) {
    }
    throw;
  }
}

namespace {
std::string write_and_commit(const std::string& dir, const CheckpointContent& content, int64_t keep) {
  const fs::path root(dir);
  fs::create_directories(root);
  const fs::path final_dir = root / step_name(content.step);
  const fs::path tmp_dir = root / (step_name(content.step) + ".tmp");
  remove_tree(tmp_dir.string());
  fs::create_directories(tmp_dir);

  const std::string shard_file = "shard-00000.safetensors";
  std::vector<SafetensorsEntry> entries;
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& t : content.tensors) {
    entries.push_back({t.name, t.tensor});
    tensors[t.name] = {{"dtype", std::string(c10::toString(t.tensor.scalar_type()))},
                       {"global_shape", t.global_shape},
                       {"shards", {{{"file", shard_file}, {"offsets", t.offsets}, {"shape", t.tensor.sizes().vec()}}}}};
  }
  const FileChecksum sum = write_safetensors((tmp_dir / shard_file).string(), entries, {{"format", "trainer"}});
  const nlohmann::json manifest = {{"format", "trainer-checkpoint"},
                                   {"version", 1},
                                   {"step", content.step},
                                   {"consumed_samples", content.consumed_samples},
                                   {"recipe", content.recipe},
                                   {"mesh", content.mesh},
                                   {"extra", content.extra},
                                   {"files", {{{"name", shard_file}, {"bytes", sum.bytes}, {"crc32", sum.crc32}}}},
                                   {"tensors", tensors}};
  write_text_durably(tmp_dir / "manifest.json", manifest.dump(1));
  remove_tree(final_dir.string());  // a committed checkpoint of the same step (re-run after resume)
  fs::rename(tmp_dir, final_dir);
  fsync_path(root);
  write_text_durably(root / "latest", step_name(content.step) + "\n");

  if (keep > 0) {
    auto steps = committed_steps(root);
    while (static_cast<int64_t>(steps.size()) > keep) {
      if (steps.front() != final_dir) remove_tree(steps.front().string());
      steps.erase(steps.begin());
    }
  }
  return final_dir.string();
}
}  // namespace

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

at::Tensor LoadedCheckpoint::read(const std::string& name, const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& shape) const {
  if (!contains(name)) throw UserError(fmt::format("{}: checkpoint has no tensor {}", path_, name));
  const auto& record = manifest_.at("tensors").at(name);
  at::Tensor result;
  // Assemble the requested slice from every shard that overlaps it.
  for (const auto& shard : record.at("shards")) {
    const auto file = shard.at("file").get<std::string>();
    const auto shard_offsets = shard.at("offsets").get<std::vector<int64_t>>();
    const auto shard_shape = shard.at("shape").get<std::vector<int64_t>>();
    std::vector<int64_t> lo(shape.size()), hi(shape.size());
    bool overlaps = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      lo[d] = std::max(offsets[d], shard_offsets[d]);
      hi[d] = std::min(offsets[d] + shape[d], shard_offsets[d] + shard_shape[d]);
      if (lo[d] >= hi[d]) overlaps = false;
    }
    if (!overlaps) continue;
    const SafetensorsReader* reader = nullptr;
    for (const auto& s : shards_)
      if (fs::path(s->path()).filename() == file) reader = s.get();
    if (!reader) throw UserError(fmt::format("{}: shard file {} of {} is not listed", path_, file, name));
    at::Tensor data = reader->read(name);
    if (!result.defined()) result = at::empty(shape, data.options());
    at::Tensor source = data, target = result;
    for (size_t d = 0; d < shape.size(); ++d) {
      source = source.narrow(d, lo[d] - shard_offsets[d], hi[d] - lo[d]);
      target = target.narrow(d, lo[d] - offsets[d], hi[d] - lo[d]);
    }
    target.copy_(source);
  }
  if (!result.defined()) throw UserError(fmt::format("{}: no shard holds the requested part of {}", path_, name));
  return result;
}

}  // namespace trainer::checkpoint
