#include <catch2/catch.hpp>

#include "recipe_fixture.h"

using namespace trainer::test;

TEST_CASE("mesh sizes follow from the world size (Megatron's 16-rank example)", "[recipe]") {
  // TP2 CP2 PP2 so DP2; ETP1 EP4 so EDP2.
  const auto loaded = load_base({"parallel.tp=2", "parallel.cp=2", "parallel.pp=2", "parallel.etp=1",
                                 "parallel.sequence_parallel=true", "parallel.ep=4", "model.moe.num_local_experts=8", "training.global_batch_size=8",
                                 "training.micro_batch_size=1"},
                                16);
  const auto& m = *loaded.mesh;
  CHECK(m.tp == 2);
  CHECK(m.cp == 2);
  CHECK(m.pp == 2);
  CHECK(m.dp == 2);
  CHECK(m.etp == 1);
  CHECK(m.ep == 4);
  CHECK(m.edp == 2);
  CHECK(m.global_batch_size == 8);
  CHECK(m.grad_accum_steps == 4);
  CHECK(m.tp * m.cp * m.dp * m.pp == m.etp * m.ep * m.edp * m.pp);
}

TEST_CASE("dense and expert meshes agree on the world size for many shapes", "[recipe]") {
  for (int64_t tp : {1, 2, 4})
    for (int64_t pp : {1, 2})
      for (int64_t ep : {1, 2, 4})
        for (int64_t world : {8, 16, 32}) {
          const std::vector<std::string> sets = {
              "parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
              "parallel.ep=" + std::to_string(ep), "model.moe.num_local_experts=8", "training.global_batch_size=64",
              "parallel.sequence_parallel=true",
              "training.micro_batch_size=1"};
          INFO(tp << " " << pp << " " << ep << " " << world);
          // etp defaults to tp, so the expert side needs tp * ep * pp to divide the world.
          const bool expert_fits = world % (tp * ep * pp) == 0;
          const auto problems = problems_of(sets, world);
          REQUIRE(problems.empty() == expert_fits);
          if (!expert_fits) {
            CHECK(any_contains(problems, "is not divisible by parallel.etp * ep * pp"));
            continue;
          }
          const auto m = *load_base(sets, world).mesh;
          CHECK(m.tp * m.cp * m.dp * m.pp == world);
          CHECK(m.etp * m.ep * m.edp * m.pp == world);
          CHECK(m.etp == tp);  // etp defaults to tp
          CHECK(m.grad_accum_steps * m.dp == 64);
        }
}
