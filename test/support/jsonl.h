#pragma once
// Reading a JSONL file (one JSON object per line), such as a metrics file.
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "process.h"

namespace trainer::test {

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace trainer::test
