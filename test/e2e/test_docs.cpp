// The documented examples stay true: every shell example in docs/recipe.md (a fenced block whose
// first line is "$ trainer ...") is run from the source tree and its output compared with the
// text shown. In the expected text a line "..." stands for any number of lines, and "..." inside
// a line for any text; "$ echo $?" checks the previous command's exit code.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "process.h"

using namespace trainer::test;

namespace {

struct Example {
  std::string command;                // after "$ "
  std::vector<std::string> expected;  // the lines shown after it
  int line = 0;                       // where it is in the file
};

std::vector<std::vector<Example>> shell_blocks(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<Example>> blocks;
  std::string text;
  bool in_block = false, first_line = false, shell = false;
  int number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.rfind("```", 0) == 0) {
      in_block = !in_block;
      first_line = in_block;
      shell = false;
      continue;
    }
    if (!in_block) continue;
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

void check_examples(const std::string& doc) {
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
      REQUIRE(example.command.rfind("trainer ", 0) == 0);
      // stdout and stderr in the order a terminal shows them.
      const auto r = run_process({"/bin/bash", "-c", "cd " + source_dir() + " && " + trainer_binary() +
                                                         example.command.substr(7) + " 2>&1"},
                                 120, {"OMP_NUM_THREADS=1"});
      last_exit = r.exit_code;
      INFO("output:\n" << r.out);
      CHECK(lines_match(example.expected, 0, split_lines(r.out), 0));
    }
  }
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
