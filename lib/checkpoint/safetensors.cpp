#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "core/error.h"
#include "core/json_file.h"
#include "core/regular_file.h"

namespace trainer::checkpoint {

namespace {

const std::map<c10::ScalarType, std::string>& dtype_names() {
  static const std::map<c10::ScalarType, std::string> names = {
      {at::kFloat, "F32"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"}, {at::kDouble, "F64"},
      {at::kLong, "I64"},  {at::kInt, "I32"},       {at::kByte, "U8"},  {at::kBool, "BOOL"}};
  return names;
}

}  // namespace

std::string safetensors_dtype_name(c10::ScalarType dtype) {
  const auto it = dtype_names().find(dtype);
  return it == dtype_names().end() ? "unsupported" : it->second;
}

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

namespace {

// Python's safetensors refuses headers above 100 MB; a model of thousands of tensors needs a few
// hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Checks one tensor's record {dtype, shape, data_offsets}; `where` is "PATH: tensor NAME".
// Every count is checked for overflow: the record comes from a file, possibly a hostile one.
struct CheckedEntry {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

CheckedEntry check_entry(const std::string& where, const nlohmann::json& value, uint64_t data_bytes) {
  if (!value.is_object())
    throw UserError(fmt::format("{}: found {} ({}), expected an object with dtype, shape and data_offsets", where,
                                describe_json(value), json_type_name(value)));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!value.contains(field)) throw UserError(fmt::format("{}: no {} (every tensor needs dtype, shape and data_offsets)", where, field));
  CheckedEntry entry{};
  const auto& dtype = value["dtype"];
  bool known = false;
  for (const auto& [type, type_name] : dtype_names())
    if (dtype.is_string() && dtype.get<std::string>() == type_name) {
      entry.dtype = type;
      known = true;
    }
  if (!known)
    throw UserError(fmt::format("{}: dtype {} is not supported; expected one of F32, BF16, F16, F64, I64, I32, U8, BOOL",
                                where, describe_json(dtype)));
  const auto& shape = value["shape"];
  if (!shape.is_array())
    throw UserError(fmt::format("{}: shape {} is {}, expected a list of sizes", where, describe_json(shape),
                                json_type_name(shape)));
  // `extent` multiplies the sizes with each 0 taken as 1, as ATen computes strides: [0, 2^62, 4]
  // holds no element, but its strides overflow inside at::empty. Within it, numel cannot overflow.
  uint64_t numel = 1, extent = 1;
  for (const auto& d : shape) {
    // is_number_unsigned: nlohmann stores every non-negative integer as unsigned.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      throw UserError(fmt::format("{}: shape {} holds {}, expected sizes that are integers >= 0", where,
                                  describe_json(shape), describe_json(d)));
    const uint64_t size = d.get<uint64_t>();
    if (__builtin_mul_overflow(extent, std::max<uint64_t>(size, 1), &extent) || extent > uint64_t(INT64_MAX))
      throw UserError(fmt::format("{}: shape {} multiplies to 2^63 or more (sizes of 0 counted as 1): more than a tensor's "
                                  "64-bit sizes and strides hold",
                                  where, describe_json(shape)));
    numel *= size;
    entry.shape.push_back(int64_t(size));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t(c10::elementSize(entry.dtype)), &bytes))
    throw UserError(fmt::format("{}: shape {} of {} takes more bytes than 64 bits count", where, describe_json(shape),
                                dtype.get<std::string>()));
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    throw UserError(fmt::format("{}: data_offsets {} must be two integers >= 0 [begin, end]", where,
                                describe_json(offsets)));
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end)
    throw UserError(fmt::format("{}: data_offsets {} end before they begin", where, describe_json(offsets)));
  if (entry.end - entry.begin != bytes)
    throw UserError(fmt::format("{}: data_offsets {} hold {} bytes, but shape {} of {} takes {} bytes", where,
                                describe_json(offsets), entry.end - entry.begin, describe_json(shape),
                                dtype.get<std::string>(), bytes));
  if (entry.end > data_bytes)
    throw UserError(fmt::format("{}: data_offsets {} end past the {} bytes of data after the header (file truncated?)",
                                where, describe_json(offsets), data_bytes));
  return entry;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const RegularFile file(path);
  const uint64_t size = file.size();
  uint64_t length = 0;
  if (size < 8)
    throw UserError(fmt::format("{}: {} bytes, too short for a safetensors file (8-byte header length first)", path, size));
  file.read_at(0, &length, 8);  // little-endian hosts only (x86-64, aarch64)
  if (length > size - 8 || length > kMaxHeaderBytes)
    throw UserError(fmt::format("{}: the header length field says {} bytes, but {} (a {}-byte file): truncated or not "
                                "a safetensors file",
                                path, length,
                                length > size - 8 ? fmt::format("only {} bytes follow it", size - 8)
                                                  : fmt::format("headers are at most {} bytes", kMaxHeaderBytes),
                                size));
  std::string text(length, '\0');
  file.read_at(8, text.data(), text.size());
  // The JSON may be followed by spaces (padding to align the data), nothing else.
  const size_t last = text.find_last_not_of(' ');
  if (last == std::string::npos || text[0] != '{' || text[last] != '}')
    throw UserError(fmt::format("{}: the {}-byte header is not a JSON object followed only by spaces (wrong header "
                                "length, or not a safetensors file)",
                                path, length));
  const nlohmann::json header = parse_json_text(text, path + " (header)");
  data_start_ = 8 + length;
  const uint64_t data_bytes = size - data_start_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        throw UserError(fmt::format("{}: __metadata__ is {}, expected an object of strings", path, json_type_name(value)));
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          throw UserError(fmt::format("{}: __metadata__.{} is {} ({}), expected a string", path, k, describe_json(v),
                                      json_type_name(v)));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const CheckedEntry e = check_entry(fmt::format("{}: tensor {}", path, name), value, data_bytes);
    entries_[name] = Entry{e.dtype, e.shape, e.begin, e.end};
  }
  // As the format requires: the tensors tile the data exactly, no overlap, no gap, no trailing bytes.
  std::vector<std::pair<const std::string*, const Entry*>> order;
  for (const auto& [name, entry] : entries_) order.emplace_back(&name, &entry);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, entry] : order) {
    if (entry->begin < covered)
      throw UserError(fmt::format("{}: tensors {} and {} overlap (data_offsets [{}, ...] begins before {}, where {} "
                                  "ends)",
                                  path, *previous, *name, entry->begin, covered, *previous));
    if (entry->begin > covered)
      throw UserError(fmt::format("{}: bytes [{}, {}) of the data belong to no tensor (tensor {} begins at {}); "
                                  "safetensors files hold their tensors back to back",
                                  path, covered, entry->begin, *name, entry->begin));
    covered = entry->end;
    if (entry->end > entry->begin) previous = name;
  }
  if (covered != data_bytes)
    throw UserError(fmt::format("{}: {} bytes follow the last tensor, which ends at byte {} of the {} bytes of data "
                                "(trailing bytes, or a wrong header length)",
                                path, data_bytes - covered, covered, data_bytes));
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

std::vector<int64_t> SafetensorsReader::shape(const std::string& name) const { return entries_.at(name).shape; }

c10::ScalarType SafetensorsReader::dtype(const std::string& name) const { return entries_.at(name).dtype; }

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError(fmt::format("{}: no tensor named {}", path_, name));
  const Entry& e = it->second;
  // Opened again for each read (a checkpoint may have more files than a process may keep open),
  // again only if it is a regular file. The header checks bound the allocation by the file's size.
  const RegularFile file(path_);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  file.read_at(data_start_ + e.begin, t.data_ptr(), size_t(e.end - e.begin));
  return t;
}

}  // namespace trainer::checkpoint
