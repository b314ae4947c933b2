#include <catch2/catch.hpp>

#include <stdexcept>

#include "estimate/model_counts.h"
#include "metrics/throughput.h"

using trainer::metrics::measure_throughput;

TEST_CASE("tokens/s and TFLOP/s per device and MFU by hand", "[metrics]") {
  // 2048 tokens in 0.5 s on 2 devices at 1e9 FLOPs per token: 4096 tok/s, 4.096e12 FLOP/s in all,
  // 2.048 TFLOP/s per device, against a 10 TFLOP/s peak 20.48%.
  const auto t = measure_throughput(2048, 0.5, 1e9, 2, 10.0);
  CHECK(t.tokens_per_s == 4096.0);
  CHECK(t.tflops_per_device == Approx(2.048));
  REQUIRE(t.mfu);
  CHECK(*t.mfu == Approx(0.2048));
}

TEST_CASE("no peak means no MFU", "[metrics]") {
  const auto t = measure_throughput(2048, 0.5, 1e9, 1, std::nullopt);
  CHECK(t.tflops_per_device == Approx(4.096));
  CHECK_FALSE(t.mfu);
}

TEST_CASE("torchtitan's published Llama-3.1-8B throughput is about 34% MFU", "[metrics]") {
  // torchtitan: 5,762 tokens/s per H100 at seq 8192, "about 34% MFU". Llama-3-8B and 3.1-8B have
  // the same shape. 5762 * 57,914,449,920 FLOPs = 333.703 TFLOP/s per GPU; / 989 = 0.3374.
  trainer::recipe::ModelConfig m;
  m.vocab_size = 128256;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_hidden_layers = 32;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  const auto counts = trainer::estimate::count_model(m, 8192);
  const auto t = measure_throughput(8 * 5762, 1.0, counts.flops_per_token, 8, 989.0);
  CHECK(t.tflops_per_device == Approx(333.70306043904));
  CHECK(*t.mfu == Approx(0.337414621));
}

TEST_CASE("a step needs a positive time and device count", "[metrics]") {
  CHECK_THROWS_AS(measure_throughput(1, 0.0, 1.0, 1, std::nullopt), std::invalid_argument);
  CHECK_THROWS_AS(measure_throughput(1, 1.0, 1.0, 0, std::nullopt), std::invalid_argument);
}
