#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "metrics/metrics_file.h"

namespace fs = std::filesystem;
using nlohmann::json;
using trainer::metrics::MetricsFile;

namespace {

// std::filesystem::remove_all crashes in a program linked with libtorch: the wheel exports its own
// statically linked copy of libstdc++'s filesystem functions (pytorch/pytorch#133437), and that
// one calls through a null pointer. Remove entry by entry instead.
void remove_tree(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(path, ec)))
    for (const auto& entry : fs::directory_iterator(path, ec)) remove_tree(entry.path());
  fs::remove(path, ec);
}

// A fresh directory per test case, removed afterwards.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("trainer-unit-metrics-" + name + "-" + std::to_string(::getpid()))) {
    remove_tree(path);
    fs::create_directories(path);
  }
  ~TempDir() { remove_tree(path); }
};

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("one JSON object per line appended and flushed", "[metrics]") {
  TempDir dir("append");
  const fs::path file = dir.path / "logs" / "run" / "metrics.jsonl";  // parents are created
  {
    MetricsFile out(file.string());
    CHECK(out.path() == file.string());
    out.write(json{{"step", 1}, {"loss", 2.5}});
    // Flushed: visible before the file is closed.
    REQUIRE(lines_of(file).size() == 1);
    trainer::metrics::StepMetrics m;
    m.step = 2;
    out.write(m);
  }
  {
    MetricsFile again(file.string());  // a resumed run continues the same file
    again.write(json{{"step", 3}});
  }
  const auto lines = lines_of(file);
  REQUIRE(lines.size() == 3);
  CHECK(json::parse(lines[0]) == json{{"step", 1}, {"loss", 2.5}});
  CHECK(json::parse(lines[1])["step"] == 2);
  CHECK(json::parse(lines[1]).contains("mem_peak_bytes"));
  CHECK(json::parse(lines[2]) == json{{"step", 3}});
}

TEST_CASE("a metrics file that cannot be opened is a user error naming it", "[metrics]") {
  TempDir dir("error");
  std::ofstream(dir.path / "plain-file") << "x";
  const std::string under_file = (dir.path / "plain-file" / "metrics.jsonl").string();
  CHECK_THROWS_AS(MetricsFile(under_file), trainer::UserError);
  CHECK_THROWS_WITH(MetricsFile(under_file), Catch::StartsWith(under_file + ": cannot create"));
  const std::string a_directory = dir.path.string();
  CHECK_THROWS_WITH(MetricsFile(a_directory), Catch::StartsWith(a_directory + ": cannot open metrics file"));
}

TEST_CASE("a record must be a JSON object", "[metrics]") {
  TempDir dir("object");
  MetricsFile out((dir.path / "m.jsonl").string());
  CHECK_THROWS_AS(out.write(json::array({1, 2})), std::invalid_argument);
  CHECK(lines_of(dir.path / "m.jsonl").empty());
}
