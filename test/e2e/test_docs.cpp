// The documented examples stay true: every shell example in docs/recipe.md, docs/distributed.md,
// docs/estimator.md, README.md and recipes/README.md (a fenced block, indented or not, whose first
// line is "$ trainer ..." or "$ build/bin/trainer ...") is run from the source tree and its output
// compared with the text shown. In the expected text a line "..." stands for any number of lines,
// and "..." inside a line for any text; "$ echo $?" checks the previous command's exit code. The
// numbers in recipes/README.md's tables are compared with `trainer estimate --json` at the
// precision they are printed with, and scripts/plot_trace is run on a trainer trace.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "process.h"

using namespace trainer::test;

namespace {

struct Example {
  std::string command;                // after "$ "
  std::vector<std::string> expected;  // the lines shown after it
  int line = 0;                       // where it is in the file
};

// Fences may be indented (a block inside a list item): the fence's indentation is taken off the
// block's lines.
std::vector<std::vector<Example>> shell_blocks(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<Example>> blocks;
  std::string text;
  bool in_block = false, first_line = false, shell = false;
  size_t indent = 0;
  int number = 0;
  while (std::getline(in, text)) {
    ++number;
    const size_t start = text.find_first_not_of(' ');
    if (start != std::string::npos && text.compare(start, 3, "```") == 0) {
      in_block = !in_block;
      first_line = in_block;
      indent = start;
      shell = false;
      continue;
    }
    if (!in_block) continue;
    size_t strip = 0;
    while (strip < indent && strip < text.size() && text[strip] == ' ') ++strip;
    text = text.substr(strip);
    if (first_line) {
      // Only blocks that start with a command are examples.
      first_line = false;
      shell = text.rfind("$ ", 0) == 0;
      if (shell) blocks.emplace_back();
    }
    if (!shell) continue;
    if (text.rfind("$ ", 0) == 0)
      blocks.back().push_back({text.substr(2), {}, number});
    else
      blocks.back().back().expected.push_back(text);
  }
  return blocks;
}

// Glob match of one line, "..." matching any text.
bool line_matches(const std::string& pattern, const std::string& line) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at; (at = pattern.find("...", start)) != std::string::npos; start = at + 3)
    parts.push_back(pattern.substr(start, at - start));
  parts.push_back(pattern.substr(start));
  if (parts.size() == 1) return pattern == line;
  if (line.rfind(parts.front(), 0) != 0) return false;
  size_t position = parts.front().size();
  for (size_t i = 1; i + 1 < parts.size(); ++i) {
    const size_t found = line.find(parts[i], position);
    if (found == std::string::npos) return false;
    position = found + parts[i].size();
  }
  const std::string& last = parts.back();
  return line.size() >= position + last.size() && line.compare(line.size() - last.size(), last.size(), last) == 0;
}

// Whole-output match, a line "..." matching any number of lines.
bool lines_match(const std::vector<std::string>& expected, size_t e, const std::vector<std::string>& actual,
                 size_t a) {
  if (e == expected.size()) return a == actual.size();
  if (expected[e] == "...") {
    for (size_t skip = a; skip <= actual.size(); ++skip)
      if (lines_match(expected, e + 1, actual, skip)) return true;
    return false;
  }
  return a < actual.size() && line_matches(expected[e], actual[a]) && lines_match(expected, e + 1, actual, a + 1);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size()) text.replace(at, from.size(), to);
  return text;
}

// The arguments after "trainer" or "build/bin/trainer" (README's form); empty for anything else.
std::string trainer_arguments(const std::string& command) {
  for (const std::string prefix : {"trainer ", "build/bin/trainer "})
    if (command.rfind(prefix, 0) == 0) return command.substr(prefix.size() - 1);
  return "";
}

// `paths` maps a path the page shows (a checkpoint directory under /tmp) to the one the test uses,
// in commands and expected output alike.
void check_examples(const std::string& doc, const std::map<std::string, std::string>& paths = {}) {
  const std::string path = source_dir() + "/" + doc;
  const auto blocks = shell_blocks(path);
  REQUIRE(!blocks.empty());
  for (const auto& block : blocks) {
    int last_exit = 0;
    for (const auto& example : block) {
      INFO(doc << ":" << example.line << ": $ " << example.command);
      if (example.command == "echo $?") {
        REQUIRE(example.expected.size() == 1);
        CHECK(std::to_string(last_exit) == example.expected[0]);
        continue;
      }
      std::string arguments = trainer_arguments(example.command);
      REQUIRE(!arguments.empty());
      std::vector<std::string> expected = example.expected;
      for (const auto& [shown, used] : paths) {
        arguments = replace_all(arguments, shown, used);
        for (auto& line : expected) line = replace_all(line, shown, used);
      }
      // stdout and stderr in the order a terminal shows them.
      const auto r = run_process({"/bin/bash", "-c", "cd " + source_dir() + " && " + trainer_binary() + arguments + " 2>&1"},
                                 120, {"OMP_NUM_THREADS=1"});
      last_exit = r.exit_code;
      INFO("output:\n" << r.out);
      CHECK(lines_match(expected, 0, split_lines(r.out), 0));
    }
  }
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  return first == std::string::npos ? "" : text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The cells of a markdown table row ("| a | b |" -> {"a", "b"}), empty for any other line.
std::vector<std::string> table_cells(const std::string& line) {
  const std::string row = trim(line);
  if (row.size() < 2 || row.front() != '|' || row.back() != '|') return {};
  std::vector<std::string> cells;
  std::istringstream in(row.substr(1, row.size() - 2));
  for (std::string cell; std::getline(in, cell, '|');) cells.push_back(trim(cell));
  return cells;
}

// The rows of the table in `path` whose header row is `header` (indented or not).
std::vector<std::vector<std::string>> markdown_table(const std::string& path, const std::vector<std::string>& header) {
  std::istringstream lines(read_file(path));
  std::vector<std::vector<std::string>> rows;
  bool in_table = false;
  for (std::string line; std::getline(lines, line);) {
    const auto cells = table_cells(line);
    if (!in_table) {
      in_table = cells == header;
      continue;
    }
    if (cells.empty()) break;
    if (cells.front().find_first_not_of("-: ") != std::string::npos) rows.push_back(cells);  // not the separator
  }
  return rows;
}

// `actual` printed with as many decimals as `printed` has is `printed`.
bool same_at_printed_precision(const std::string& printed, double actual) {
  const size_t point = printed.find('.');
  const int decimals = point == std::string::npos ? 0 : int(printed.size() - point - 1);
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, actual);
  return printed == text;
}

nlohmann::json estimate_json(const std::string& recipe, const std::string& world_size) {
  const auto r = run_process({trainer_binary(), "estimate", source_dir() + "/recipes/" + recipe, "--world-size",
                              world_size, "--gpu", "h100-sxm", "--json"},
                             60);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

// "70.6B", "1.05M (0.66M active)": the count, and the active count where shown.
void check_parameter_counts(const std::string& cell, const nlohmann::json& model) {
  static const std::regex counts(R"(^([0-9.]+)([MB])(?: \(([0-9.]+)([MB]) active\))?$)");
  std::smatch m;
  INFO("params \"" << cell << "\"; the estimate: " << model.dump());
  REQUIRE(std::regex_match(cell, m, counts));
  const auto unit = [](const std::string& u) { return u == "M" ? 1e6 : 1e9; };
  CHECK(same_at_printed_precision(m[1], model.at("parameters").get<double>() / unit(m[2])));
  if (m[3].matched)
    CHECK(same_at_printed_precision(m[3], model.at("active_parameters").get<double>() / unit(m[4])));
  else
    CHECK(model.at("active_parameters").get<double>() == model.at("parameters").get<double>());
}

}  // namespace

TEST_CASE("docs: the example matcher", "[docs]") {
  CHECK(line_matches("a ... b", "a xyz b"));
  CHECK_FALSE(line_matches("a ... b", "a xyz c"));
  CHECK(line_matches("{ ... }", "{ \"x\": 1 }"));
  CHECK(lines_match({"first", "...", "last"}, 0, {"first", "1", "2", "last"}, 0));
  CHECK(lines_match({"first", "...", "last"}, 0, {"first", "last"}, 0));
  CHECK_FALSE(lines_match({"first", "last"}, 0, {"first", "middle", "last"}, 0));
}

TEST_CASE("docs: every example in docs/recipe.md prints what the page shows", "[docs]") {
  check_examples("docs/recipe.md");
}

TEST_CASE("docs: every example in README.md prints what the page shows", "[docs]") {
  TempDir dir;
  check_examples("README.md", {{"/tmp/ck", dir.path() + "/ck"}});
}

TEST_CASE("docs: every example in docs/distributed.md prints what the page shows", "[docs]") {
  check_examples("docs/distributed.md");
}

TEST_CASE("docs: every example in docs/estimator.md prints what the page shows", "[docs]") {
  check_examples("docs/estimator.md");
}

TEST_CASE("docs: every example in recipes/README.md prints what the page shows", "[docs]") {
  check_examples("recipes/README.md");
}

TEST_CASE("docs: recipes/README.md's parameter counts and its memory and throughput table are trainer estimate's", "[docs]") {
  const std::string readme = source_dir() + "/recipes/README.md";
  const auto recipes = markdown_table(readme, {"file", "model", "params", "world size", "gpus", "layout"});
  const auto predicted = markdown_table(readme, {"recipe", "world size", "device total", "tokens/s per GPU (predicted)"});
  REQUIRE(recipes.size() >= 8);
  std::map<std::string, nlohmann::json> estimates;  // recipe name (no .json) -> at its world size
  std::map<std::string, std::string> world_sizes;
  for (const auto& row : recipes) {
    REQUIRE(row.size() == 6);
    INFO("recipes/README.md, recipe " << row[0] << " at world size " << row[3]);
    const std::string name = row[0].substr(0, row[0].rfind(".json"));
    estimates[name] = estimate_json(row[0], row[3]);
    world_sizes[name] = row[3];
    check_parameter_counts(row[2], estimates[name].at("model"));
  }
  // Every recipe meant for GPUs has a row, at the world size the first table gives it.
  std::set<std::string> listed;
  for (const auto& row : predicted) {
    REQUIRE(row.size() == 4);
    INFO("recipes/README.md, memory and throughput of " << row[0] << ": " << row[2] << ", " << row[3]);
    REQUIRE(estimates.count(row[0]) == 1);
    CHECK(row[1] == world_sizes.at(row[0]));
    const auto& e = estimates.at(row[0]);
    INFO("the estimate: " << e.at("memory").at("device_total_bytes").get<double>() / (1 << 30) << " GiB, "
                          << e.at("tokens_per_s_per_gpu").get<double>() << " tokens/s per GPU");
    REQUIRE(row[2].size() > 4);
    CHECK(row[2].substr(row[2].size() - 4) == " GiB");
    CHECK(same_at_printed_precision(row[2].substr(0, row[2].size() - 4),
                                    e.at("memory").at("device_total_bytes").get<double>() / (1 << 30)));
    CHECK(same_at_printed_precision(row[3], e.at("tokens_per_s_per_gpu").get<double>()));
    listed.insert(row[0]);
  }
  for (const auto& [name, world] : world_sizes)
    if (name.rfind("tiny-", 0) != 0) CHECK(listed.count(name) == 1);
}

TEST_CASE("docs: the table checker fails on a changed number", "[docs]") {
  CHECK(same_at_printed_precision("47.2", 47.21));
  CHECK_FALSE(same_at_printed_precision("47.3", 47.21));
  CHECK(same_at_printed_precision("919", 918.6));
  CHECK_FALSE(same_at_printed_precision("920", 918.6));
  CHECK(table_cells("  | llama3-70b | 64 | 47.2 GiB | 919 |") ==
        std::vector<std::string>{"llama3-70b", "64", "47.2 GiB", "919"});
  CHECK(table_cells("not a row").empty());
}

TEST_CASE("docs: scripts/plot_trace (docs/observability.md) draws trainer's trace with any python3", "[docs]") {
  TempDir dir;
  const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set",
                                "training.steps=3", "--set", "profiling.steps=[2,2]", "--set",
                                "profiling.dir=" + dir.path() + "/traces"},
                               120, {"OMP_NUM_THREADS=1"});
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const std::string png = dir.path() + "/trace.png";
  // Through its #! line: whatever python3 is first on PATH, with the standard library only.
  const auto plot = run_process({source_dir() + "/scripts/plot_trace", dir.path() + "/traces", png, "--width", "800"}, 60);
  INFO(plot.out << plot.err);
  REQUIRE(plot.exit_code == 0);
  // Decoded with Python's zlib: the size, and pixels of the forward (blue) and backward (green) ranges.
  const std::string reader = dir.write("read_png.py", R"PY(
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
width, height = struct.unpack(">II", data[16:24])
idat, at = b"", 8
while at < len(data):
    length, kind = struct.unpack(">I4s", data[at:at + 8])
    if kind == b"IDAT":
        idat += data[at + 8:at + 8 + length]
    at += 12 + length
raw = zlib.decompress(idat)
rows = [raw[y * (3 * width + 1) + 1:(y + 1) * (3 * width + 1)] for y in range(height)]
count = lambda rgb: sum(row.count(bytes(rgb)) for row in rows)
print(width, height, count((66, 133, 244)) > 0, count((52, 168, 83)) > 0)
)PY");
  const auto read = run_process({"/usr/bin/env", "python3", reader, png}, 60);
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  CHECK(read.out == "800 166 True True\n");  // one rank: 30 + 96 + 40 pixels high
}
