// trainer schedule --pp P [--vpp V] --microbatches M --schedule NAME [--costs F,B,W[:F,B,W...]] [--latency L] [--json]
//                  [--trace FILE]
// Draws a pipeline schedule: the generator the executor runs (lib/parallel/pipeline/schedule.h),
// simulated with the given per-chunk costs; one text row per stage, bubble and peak in-flight
// activations per stage; --trace writes the simulated timeline as a Chrome/Perfetto trace.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "parallel/pipeline/schedule_chart.h"

namespace trainer::app {

namespace {

struct ScheduleOptions {
  int64_t pp = 1;
  int64_t vpp = 0;  // 0: the schedule's default (2 for zbv, else 1)
  int64_t micro_batches = 1;
  std::string schedule;
  std::string costs = "1,1,1";
  double latency = 0;
  bool json = false;
  std::string trace_path;
};

// "F,B,W": forward, input-gradient and weight-gradient time of one model chunk.
parallel::ChunkCosts parse_chunk_costs(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw UserError(fmt::format("--costs {}: \"{}\" is not a number; expected F,B,W such as 1,1,1", text, item));
    values.push_back(value);
  }
  if (values.size() != 3)
    throw UserError(fmt::format("--costs {}: expected three numbers F,B,W (forward, input gradient, weight gradient "
                                "per model chunk), found {}",
                                text, values.size()));
  if (values[0] <= 0 || values[1] <= 0 || values[2] < 0)
    throw UserError(fmt::format("--costs {}: expected F > 0, B > 0 and W >= 0", text));
  return {values[0], values[1], values[2]};
}

// "F,B,W" for every model chunk, or one "F,B,W" per model chunk joined by ':' (model order).
parallel::SimulationCosts parse_costs(const std::string& text, int64_t model_chunks) {
  parallel::SimulationCosts costs;
  std::vector<std::string> triples;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ':');) triples.push_back(item);
  if (triples.size() == 1) {
    costs.chunk = parse_chunk_costs(triples.front());
    return costs;
  }
  if (int64_t(triples.size()) != model_chunks)
    throw UserError(fmt::format("--costs: {} per-chunk entries (F,B,W joined by ':') for {} model chunks (pp x vpp); "
                                "give one F,B,W for all chunks or one per chunk",
                                triples.size(), model_chunks));
  for (const auto& triple : triples) costs.per_chunk.push_back(parse_chunk_costs(triple));
  return costs;
}

int run_schedule(const ScheduleOptions& options) {
  parallel::ScheduleSpec spec;
  try {
    spec.kind = parallel::parse_schedule_kind(options.schedule);
  } catch (const std::invalid_argument& e) {
    throw UserError(fmt::format("--schedule: {}", e.what()));
  }
  spec.pp = options.pp;
  spec.vpp = options.vpp > 0 ? options.vpp : (parallel::v_layout(spec.kind) ? 2 : 1);
  spec.micro_batches = options.micro_batches;
  // The timeline holds a few actions per (stage, chunk, micro-batch): beyond this bound it would
  // take minutes and gigabytes to draw what no pipeline runs (the products stay far from overflow
  // since each factor is checked first).
  constexpr int64_t kMaxChunkMicroBatches = int64_t(1) << 20;
  if (spec.pp > kMaxChunkMicroBatches || spec.vpp > kMaxChunkMicroBatches || spec.micro_batches > kMaxChunkMicroBatches ||
      spec.pp * spec.vpp > kMaxChunkMicroBatches || spec.pp * spec.vpp * spec.micro_batches > kMaxChunkMicroBatches)
    throw UserError(fmt::format("--pp {} --vpp {} --microbatches {}: pp x vpp x micro-batches must be at most {} (a "
                                "schedule that large is not drawn)",
                                spec.pp, spec.vpp, spec.micro_batches, kMaxChunkMicroBatches));
  try {
    parallel::check_spec(spec);
  } catch (const std::invalid_argument& e) {
    throw UserError(fmt::format("--pp {} --vpp {} --microbatches {}: {}", spec.pp, spec.vpp, spec.micro_batches,
                                e.what()));
  }
  parallel::SimulationCosts costs = parse_costs(options.costs, spec.pp * spec.vpp);
  costs.latency = options.latency;

  const auto stages = parallel::pipeline_schedule(spec);
  parallel::check_pipeline(spec, stages);  // a failure here is a bug of ours: internal error, exit 1
  const parallel::Simulation sim = parallel::simulate(stages, costs);

  if (!options.trace_path.empty()) {
    std::ofstream out(options.trace_path);
    out << parallel::chrome_trace(sim).dump() << "\n";
    if (!out) throw UserError(fmt::format("--trace {}: cannot write the file", options.trace_path));
  }
  if (options.json) {
    std::fputs((parallel::schedule_json(spec, stages, sim).dump(2) + "\n").c_str(), stdout);
    return kExitOk;
  }
  const std::string cost_text =
      costs.per_chunk.empty() ? fmt::format("per chunk F={:g} B={:g} W={:g}", costs.chunk.forward,
                                            costs.chunk.backward_input, costs.chunk.backward_weight)
                              : "costs per model chunk " + options.costs;
  std::fputs(fmt::format("{} schedule: pp={} vpp={} micro-batches={}; {}{}; model chunk 0 "
                         "(embedding) on stage {}, chunk {} (head and loss) on stage {}\n",
                         parallel::schedule_name(spec.kind), spec.pp, spec.vpp, spec.micro_batches, cost_text,
                         costs.latency > 0 ? fmt::format(", latency {:g}", costs.latency) : "",
                         parallel::first_chunk_stage(spec.kind, spec.pp, spec.vpp), spec.pp * spec.vpp - 1,
                         parallel::last_chunk_stage(spec.kind, spec.pp, spec.vpp))
                 .c_str(),
             stdout);
  std::fputs(parallel::schedule_chart(sim).c_str(), stdout);
  if (!options.trace_path.empty())
    std::fprintf(stdout, "trace written to %s (open in ui.perfetto.dev or chrome://tracing)\n",
                 options.trace_path.c_str());
  return kExitOk;
}

}  // namespace

CommandAction add_schedule_command(CLI::App& parent) {
  auto options = std::make_shared<ScheduleOptions>();
  CLI::App* command = parent.add_subcommand(
      "schedule", "Draw a pipeline schedule: each stage's simulated timeline, bubble and peak in-flight activations");
  command->add_option("--pp", options->pp, "Pipeline stages")->required()->check(positive_integer());
  command->add_option("--vpp", options->vpp, "Model chunks per stage (default: 2 for zbv and forward_only_v, else 1)")
      ->check(positive_integer());
  command->add_option("--microbatches", options->micro_batches, "Micro-batches per optimizer step")
      ->required()
      ->check(positive_integer());
  command->add_option("--schedule", options->schedule,
                      "gpipe, 1f1b, interleaved_1f1b, zero_bubble, zbv, forward_only or forward_only_v")
      ->required();
  command->add_option("--costs", options->costs,
                      "F,B,W: time of one model chunk's forward, input gradient and weight gradient (default 1,1,1; "
                      "a full backward takes B + W), or one F,B,W per model chunk joined by ':'");
  command->add_option("--latency", options->latency, "Time from a send to its arrival (default 0)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            size_t used = 0;
            double value = -1;
            try {
              value = std::stod(text, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != text.size() || !(value >= 0)) return "expected a number >= 0, found \"" + text + "\"";
            return "";
          },
          "L>=0"));
  command->add_flag("--json", options->json, "Machine-readable output: action lists, timelines, bubble and peaks");
  command->add_option("--trace", options->trace_path, "Write a Chrome/Perfetto trace of the simulated timeline");
  return [options] { return run_schedule(*options); };
}

}  // namespace trainer::app
