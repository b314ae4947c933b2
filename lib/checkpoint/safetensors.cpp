#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/error.h"

namespace trainer::checkpoint {

namespace {

const std::map<c10::ScalarType, std::string>& dtype_names() {
  static const std::map<c10::ScalarType, std::string> names = {
      {at::kFloat, "F32"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"}, {at::kDouble, "F64"},
      {at::kLong, "I64"},  {at::kInt, "I32"},       {at::kByte, "U8"},  {at::kBool, "BOOL"}};
  return names;
}

}  // namespace

SafetensorsLayout layout_safetensors(const std::string& path, const std::vector<SafetensorsMeta>& entries,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  SafetensorsLayout layout;
  for (const auto& e : entries) {
    const auto it = dtype_names().find(e.dtype);
    if (it == dtype_names().end()) throw std::runtime_error(fmt::format("{}: unsupported dtype for {}", path, e.name));
    if (header.contains(e.name)) throw std::runtime_error(fmt::format("{}: tensor {} given twice", path, e.name));
    int64_t numel = 1;
    for (auto d : e.shape) numel *= d;
    const uint64_t bytes = uint64_t(numel) * c10::elementSize(e.dtype);
    header[e.name] = {{"dtype", it->second}, {"shape", e.shape}, {"data_offsets", {layout.data_bytes, layout.data_bytes + bytes}}};
    layout.offsets.push_back(layout.data_bytes);
    layout.data_bytes += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  const uint64_t length = text.size();
  layout.prefix.assign(reinterpret_cast<const char*>(&length), 8);  // little-endian hosts only (x86-64, aarch64)
  layout.prefix += text;
  return layout;
}

FileChecksum write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata, FileWriter* writer) {
  std::vector<at::Tensor> cpu;
  std::vector<SafetensorsMeta> meta;
  for (const auto& e : entries) {
    cpu.push_back(e.tensor.detach().to(at::kCPU).contiguous());
    meta.push_back({e.name, cpu.back().scalar_type(), cpu.back().sizes().vec()});
  }
  const SafetensorsLayout layout = layout_safetensors(path, meta, metadata);
  std::vector<FileWriter::Piece> pieces = {{layout.prefix.data(), layout.prefix.size()}};
  for (const auto& t : cpu) pieces.push_back({t.data_ptr(), t.nbytes()});
  FileWriter local;
  return (writer ? *writer : local).write(path, pieces);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw UserError(fmt::format("{}: cannot open checkpoint file: {}", path, ec.message()));
  std::ifstream in(path, std::ios::binary);
  uint64_t length = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&length), 8) || length > size - 8)
    throw UserError(fmt::format("{}: truncated or not a safetensors file (size {} bytes)", path, size));
  std::string text(length, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(length)))
    throw UserError(fmt::format("{}: truncated safetensors header", path));
  const auto header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object())
    throw UserError(fmt::format("{}: malformed safetensors header", path));
  data_start_ = 8 + length;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : value.items()) metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    Entry entry;
    bool known = false;
    for (const auto& [type, type_name] : dtype_names())
      if (value.value("dtype", "") == type_name) {
        entry.dtype = type;
        known = true;
      }
    if (!known) throw UserError(fmt::format("{}: tensor {} has an unsupported dtype", path, name));
    entry.shape = value.at("shape").get<std::vector<int64_t>>();
    entry.begin = value.at("data_offsets")[0].get<uint64_t>();
    entry.end = value.at("data_offsets")[1].get<uint64_t>();
    int64_t numel = 1;
    for (auto d : entry.shape) numel *= d;
    const uint64_t expected = uint64_t(numel) * c10::elementSize(entry.dtype);
    if (entry.end < entry.begin || entry.end - entry.begin != expected || data_start_ + entry.end > size)
      throw UserError(fmt::format("{}: tensor {} lies outside the file or has the wrong size (file truncated?)", path, name));
    entries_[name] = entry;
  }
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

std::vector<int64_t> SafetensorsReader::shape(const std::string& name) const { return entries_.at(name).shape; }

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError(fmt::format("{}: no tensor named {}", path_, name));
  const Entry& e = it->second;
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin)))
    throw UserError(fmt::format("{}: cannot read tensor {} (file truncated?)", path_, name));
  return t;
}

}  // namespace trainer::checkpoint
