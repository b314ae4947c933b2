#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>

#include "metrics/step_metrics.h"

using nlohmann::json;
using trainer::metrics::format_console_line;
using trainer::metrics::StepMetrics;
using trainer::metrics::to_json;

namespace {
StepMetrics sample() {
  StepMetrics m;
  m.step = 20;
  m.total_steps = 60;
  m.loss = 2.3456;
  m.lr = 2.95e-3;
  m.grad_norm = 0.812;
  m.tokens_per_s = 12345;
  m.tflops_per_device = 0.45;
  m.mem_peak_bytes = 129394278;  // 123.4 MiB
  m.time_s = 0.166;
  m.eta_s = 41;
  return m;
}
}  // namespace

TEST_CASE("the console line", "[metrics]") {
  CHECK(format_console_line(sample()) ==
        "step 20/60 | loss 2.3456 | lr 2.95e-03 | gnorm 0.812 | 12.3k tok/s | 0.45 TFLOP/s | mfu - | mem 123.4 MiB | "
        "eta 0:00:41");
  auto m = sample();
  m.mfu = 0.41234;
  m.tflops_per_device = 407.8;
  m.loss = std::nan("");
  m.grad_norm = 123456.0;
  m.eta_s = 27 * 3600 + 2 * 60 + 9;
  m.mem_peak_bytes = int64_t{70} << 30;
  CHECK(format_console_line(m) ==
        "step 20/60 | loss nan | lr 2.95e-03 | gnorm 1.23e+05 | 12.3k tok/s | 407.8 TFLOP/s | mfu 41.2% | mem 70.0 GiB | "
        "eta 27:02:09");
}

TEST_CASE("the metrics record has every documented key", "[metrics]") {
  const json j = to_json(sample());
  CHECK(j == json{{"step", 20},
                  {"total_steps", 60},
                  {"loss", 2.3456},
                  {"lr", 2.95e-3},
                  {"grad_norm", 0.812},
                  {"tokens_per_s", 12345.0},
                  {"tflops_per_device", 0.45},
                  {"mfu", nullptr},
                  {"mem_peak_bytes", 129394278},
                  {"time_s", 0.166},
                  {"eta_s", 41.0}});
  auto m = sample();
  m.mfu = 0.5;
  CHECK(to_json(m)["mfu"] == 0.5);
}

TEST_CASE("extra keys are merged in and a clash with a standard key is a bug", "[metrics]") {
  auto m = sample();
  m.extra = {{"aux_loss", 0.01}, {"tokens", 4096}};
  const json j = to_json(m);
  CHECK(j["aux_loss"] == 0.01);
  CHECK(j["tokens"] == 4096);
  CHECK(j.size() == 13);
  m.extra = {{"loss", 1.0}};
  CHECK_THROWS_WITH(to_json(m), Catch::Contains("\"loss\""));
  m.extra = json::array({1});
  CHECK_THROWS_AS(to_json(m), std::invalid_argument);
}

TEST_CASE("non-finite numbers become null so every line stays valid JSON", "[metrics]") {
  auto m = sample();
  m.loss = std::nan("");
  m.grad_norm = INFINITY;
  const json j = to_json(m);
  CHECK(j["loss"].is_null());
  CHECK(j["grad_norm"].is_null());
  CHECK(json::parse(j.dump()) == j);
}
