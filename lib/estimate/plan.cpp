#include "estimate/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <tuple>

#include "core/error.h"
#include "estimate/report.h"
#include "recipe/mesh_shape.h"
#include "recipe/runtime_support.h"
#include "parallel/gpu_support.h"
#include "recipe/validate.h"

namespace trainer::estimate {

namespace {

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= std::min(n, limit); ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<int64_t> powers_of_two(int64_t limit) {
  std::vector<int64_t> p;
  for (int64_t i = 1; i <= limit; i *= 2) p.push_back(i);
  return p;
}

std::vector<std::string> overrides_of(const recipe::Recipe& base, const recipe::Recipe& r) {
  const auto& p = r.parallel;
  const auto& t = r.training;
  std::vector<std::string> o = {
      fmt::format("parallel.tp={}", p.tp),
      fmt::format("parallel.cp={}", p.cp),
      fmt::format("parallel.pp={}", p.pp),
      fmt::format("parallel.vpp={}", p.vpp),
      fmt::format("parallel.pipeline_schedule={}", p.pipeline_schedule),
      fmt::format("parallel.sequence_parallel={}", p.sequence_parallel ? "true" : "false"),
      fmt::format("parallel.zero={}", p.zero),
      fmt::format("training.micro_batch_size={}", t.micro_batch_size),
      fmt::format("training.recompute={}", t.recompute),
  };
  if (p.cp > 1 || p.cp_method != base.parallel.cp_method) o.push_back(fmt::format("parallel.cp_method={}", p.cp_method));
  if (r.model.moe) {
    o.push_back(fmt::format("parallel.ep={}", p.ep));
    o.push_back(fmt::format("parallel.etp={}", p.etp));
  }
  if (base.parallel.dp != -1) o.push_back("parallel.dp=-1");
  if (!base.training.global_batch_size)
    o.push_back(fmt::format("training.global_batch_size={}", t.global_batch_size.value_or(0)));
  return o;
}

}  // namespace

PlanResult plan_search(const recipe::Recipe& base, const HardwareProfile& gpu, const PlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t N = options.gpus;
  if (N < 1) throw UserError(fmt::format("--gpus {} is not a number of GPUs", N));
  const auto& m = base.model;
  const auto& bt = base.training;
  PlanResult result;
  std::map<std::tuple<recipe::ScheduleKind, int64_t, int64_t, int64_t, std::optional<recipe::CpMethod>>, bool> gpu_runnable;
  // The global batch stays what the recipe trains with: its own, or (null) one micro-batch per
  // data-parallel rank of the recipe's own layout at N GPUs.
  const int64_t recipe_dense = base.parallel.tp * base.parallel.cp * base.parallel.pp;
  const int64_t gbs = bt.global_batch_size.value_or(bt.micro_batch_size * std::max<int64_t>(1, N / recipe_dense));
  result.global_batch_size = gbs;

  const int64_t gpn = base.hardware.gpus_per_node;
  std::vector<int64_t> tps;
  for (int64_t t : powers_of_two(std::min(gpn, N)))
    if (m.num_attention_heads % t == 0 && m.num_key_value_heads % t == 0 && m.intermediate_size % t == 0 &&
        m.vocab_size >= t)
      tps.push_back(t);
  std::vector<int64_t> cps;
  for (int64_t c : powers_of_two(std::min<int64_t>(32, N)))
    if (c == 1 || bt.seq_len % (2 * c) == 0) cps.push_back(c);
  const std::vector<int64_t> pps = divisors(m.num_hidden_layers, N);
  std::vector<int64_t> mbss = {1, 2, 4, 8, 16};
  if (std::find(mbss.begin(), mbss.end(), bt.micro_batch_size) == mbss.end()) mbss.push_back(bt.micro_batch_size);
  const std::vector<recipe::Recompute> recomputes = {recipe::Recompute::None, recipe::Recompute::Selective,
                                                      recipe::Recompute::Full};
  std::vector<int64_t> eps = {1};
  if (m.moe) eps = divisors(m.moe->num_local_experts, N);

  ModelCache cache;
  const ModelCounts counts = count_model(m, bt.seq_len);
  EstimateOptions memory_only;
  memory_only.compute_time = false;
  memory_only.describe_peak = false;
  memory_only.counts = &counts;
  // Faster first: more tokens/s, then less memory.
  const auto faster = [](const JobEstimate& a, const JobEstimate& b) {
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.device_total_bytes < b.device_total_bytes;
  };
  const auto by_speed = [&](const PlanCandidate& a, const PlanCandidate& b) { return faster(a.estimate, b.estimate); };
  const int64_t top = std::max<int64_t>(1, options.top);
  std::vector<PlanCandidate> kept;
  const double limit = (1.0 - options.memory_margin) * gpu.memory_bytes;
  recipe::Recipe r = base;  // the candidate, rewritten in place
  for (int64_t tp : tps)
    for (int64_t cp : cps)
      for (int64_t pp : pps) {
        if (N % (tp * cp * pp) != 0) continue;
        const int64_t dp = N / (tp * cp * pp);
        std::vector<int64_t> vpps = {1};
        if (pp > 1)
          for (int64_t v : divisors(m.num_hidden_layers / pp, 8))
            if (v > 1) vpps.push_back(v);
        std::vector<int64_t> etps = {tp};
        if (m.moe && tp > 1) etps.push_back(1);
        for (int64_t mbs : mbss) {
          if (gbs % (mbs * dp) != 0) continue;
          const int64_t micro = gbs / (mbs * dp);
          if (pp > 1 && micro < pp) continue;
          for (int64_t vpp : vpps) {
            if (vpp > 1 && micro % pp != 0) continue;
            for (int64_t ep : eps)
              for (int64_t etp : etps) {
                if (m.moe && (N % (etp * ep * pp) != 0 || m.moe->moe_intermediate_size % etp != 0)) continue;
                const int64_t edp = N / (etp * ep * pp);
                for (const auto& recompute : recomputes)
                  for (int64_t zero = 0; zero <= 3; ++zero) {
                    // Without data parallelism every ZeRO stage is the same configuration.
                    if (zero > 0 && dp * cp == 1 && edp == 1) continue;
                    ++result.considered;
                    auto& p = r.parallel;
                    p.tp = tp;
                    p.cp = cp;
                    // Plans use Ulysses for context parallelism: ring attention's blocks run
                    // FlashAttention-2, 1.6-1.9x SDPA's kernel time on an H200 (docs/benchmarks.md),
                    // which the time model does not price apart yet.
                    p.cp_method = cp > 1 ? recipe::CpMethod::Ulysses : base.parallel.cp_method;
                    p.pp = pp;
                    p.vpp = vpp;
                    p.dp = -1;
                    p.ep = ep;
                    p.etp = m.moe ? etp : tp;
                    p.zero = zero;
                    p.sequence_parallel = tp > 1;
                    p.pipeline_schedule = vpp > 1 ? recipe::ScheduleKind::Interleaved1F1B : recipe::ScheduleKind::OneFOneB;
                    r.training.micro_batch_size = mbs;
                    r.training.global_batch_size = gbs;
                    r.training.recompute = recompute;
                    if (const auto problems = recipe::validate_recipe(r, N); !problems.empty()) {
                      if (result.first_invalid.empty()) result.first_invalid = problems.front();
                      continue;
                    }
                    ++result.valid;
                    const recipe::MeshShape mesh = recipe::mesh_shape(r, N);
                    // Plans are for GPUs: what `run` refuses there is not runnable either (the
                    // answer depends on the schedule's shape only: cached, schedules are long).
                    const auto gpu_key = std::make_tuple(p.pipeline_schedule, mesh.pp, mesh.vpp, mesh.grad_accum_steps,
                                                         mesh.cp > 1 ? std::optional(p.cp_method) : std::nullopt);
                    auto known = gpu_runnable.find(gpu_key);
                    if (known == gpu_runnable.end())
                      known = gpu_runnable.emplace(gpu_key, parallel::gpu_support_problems(r, mesh).empty()).first;
                    const bool runnable = recipe::runtime_supports(r) && known->second;
                    if (!runnable && options.runnable_only) {
                      ++result.not_runnable;
                      continue;
                    }
                    JobEstimate e = estimate_job(r, mesh, &gpu, memory_only, &cache);
                    if (e.device_total_bytes > limit) continue;
                    ++result.fitting;
                    add_step_time(e, r, gpu, memory_only, &cache);
                    // Keep the `top` fastest: a heap whose front is the slowest kept.
                    if (int64_t(kept.size()) == top && !faster(e, kept.front().estimate)) continue;
                    PlanCandidate c;
                    c.estimate = std::move(e);
                    c.recipe = r;
                    c.runnable = runnable;
                    kept.push_back(std::move(c));
                    std::push_heap(kept.begin(), kept.end(), by_speed);
                    if (int64_t(kept.size()) > top) {
                      std::pop_heap(kept.begin(), kept.end(), by_speed);
                      kept.pop_back();
                    }
                  }
              }
          }
        }
      }
  std::sort(kept.begin(), kept.end(), by_speed);
  for (auto& c : kept) {
    c.overrides = overrides_of(base, c.recipe);
    c.estimate = estimate_job(c.recipe, c.estimate.mesh, &gpu, {}, &cache);  // with the peak described
  }
  result.best = std::move(kept);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

nlohmann::json plan_json(const PlanResult& result, const HardwareProfile& gpu, const PlanOptions& options,
                         const std::string& recipe_path) {
  nlohmann::json configurations = nlohmann::json::array();
  int rank = 0;
  for (const auto& c : result.best) {
    const auto& p = c.recipe.parallel;
    const auto& e = c.estimate;
    configurations.push_back({
        {"rank", ++rank},
        {"parallel",
         {{"tp", p.tp}, {"cp", p.cp}, {"pp", p.pp}, {"vpp", p.vpp}, {"ep", p.ep}, {"etp", p.etp}, {"dp", e.mesh.dp},
          {"edp", e.mesh.edp}, {"zero", p.zero}, {"sequence_parallel", p.sequence_parallel},
          {"pipeline_schedule", recipe::name_of(p.pipeline_schedule)}}},
        {"training",
         {{"micro_batch_size", c.recipe.training.micro_batch_size},
          {"recompute", recipe::name_of(c.recipe.training.recompute)},
          {"microbatches", e.microbatches}}},
        {"memory",
         {{"peak_bytes", e.peak_bytes},
          {"peak_bytes_worst_routing", e.peak_bytes_worst_routing},
          {"device_total_bytes", e.device_total_bytes}}},
        {"step_time_s", e.step_time_s},
        {"tokens_per_s", e.tokens_per_s},
        {"tokens_per_s_per_gpu", e.tokens_per_s_per_gpu},
        {"tflops_per_gpu", e.tflops_per_gpu},
        {"mfu", e.mfu},
        {"runnable", c.runnable},
        {"overrides", c.overrides},
    });
  }
  return {{"schema_version", kEstimateSchemaVersion},
          {"recipe", recipe_path},
          {"gpus", options.gpus},
          {"gpu", gpu.name},
          {"global_batch_size", result.global_batch_size},
          {"memory_margin", options.memory_margin},
          {"memory_limit_bytes", (1.0 - options.memory_margin) * gpu.memory_bytes},
          {"considered", result.considered},
          {"valid", result.valid},
          {"not_runnable", result.not_runnable},
          {"runnable_only", options.runnable_only},
          {"fitting", result.fitting},
          {"search_seconds", result.seconds},
          {"configurations", configurations}};
}

std::string plan_text(const PlanResult& result, const HardwareProfile& gpu, const PlanOptions& options,
                      const std::string& recipe_path) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  line(fmt::format("plan for {} on {} x {} (global batch {} sequences; memory limit {:.0f}% of {} = {})", recipe_path,
                   options.gpus, gpu.name, result.global_batch_size, 100 * (1 - options.memory_margin),
                   format_bytes(gpu.memory_bytes), format_bytes((1 - options.memory_margin) * gpu.memory_bytes)));
  line(fmt::format("considered {} combination{} of tp, cp, pp, vpp, ep, etp, micro-batch, recompute and ZeRO: {} valid{}, "
                   "{} fit ({:.2f} s)",
                   result.considered, result.considered == 1 ? "" : "s", result.valid,
                   result.not_runnable ? fmt::format(" ({} of them refused by `trainer run` on GPUs; --all "
                                                     "shows them)",
                                                     result.not_runnable)
                                       : "",
                   result.fitting, result.seconds));
  if (result.best.empty()) {
    if (result.considered == 0)
      line(fmt::format("no layout splits the global batch of {} sequences: it must be a multiple of micro_batch_size x "
                       "dp, where dp = {} GPUs / (tp x cp x pp); set training.global_batch_size to a multiple of {} "
                       "(or of the data-parallel size you want)",
                       result.global_batch_size, options.gpus, options.gpus));
    else if (result.valid == 0)
      line(fmt::format("no combination passes the recipe's rules; the first problem: {}", result.first_invalid));
    else if (result.fitting == 0 && result.not_runnable > 0)
      line("nothing that `trainer run` accepts on GPUs fits; --all also ranks what it refuses there (for the recipe's "
           "own settings, which `trainer run` names), or try more GPUs, a smaller micro-batch or sequence, or a GPU "
           "with more memory");
    else
      line("no configuration fits; try more GPUs, a smaller micro-batch or sequence, or a GPU with more memory");
    return out;
  }
  line("");
  line(fmt::format("{:>3} {:>3} {:>3} {:>3} {:>3} {:>3} {:>3} {:>5} {:>4} {:>9} {:>4} {:>16} {:>10} {:>9} {:>10} {:>8} {:>6}{}",
                   "#", "tp", "cp", "pp", "vpp", "ep", "etp", "dp", "mbs", "recompute", "zero", "schedule", "memory",
                   "step", "tokens/s", "per GPU", "MFU", options.runnable_only ? "" : "  runs here"));
  int rank = 0;
  for (const auto& c : result.best) {
    const auto& p = c.recipe.parallel;
    const auto& e = c.estimate;
    line(fmt::format("{:>3} {:>3} {:>3} {:>3} {:>3} {:>3} {:>3} {:>5} {:>4} {:>9} {:>4} {:>16} {:>10} {:>8.3f}s {:>10.0f} "
                     "{:>8.0f} {:>5.1f}%",
                     ++rank, p.tp, p.cp, p.pp, p.vpp, p.ep, p.etp, e.mesh.dp, c.recipe.training.micro_batch_size,
                     c.recipe.training.recompute, p.zero, p.pp > 1 ? recipe::name_of(p.pipeline_schedule) : std::string_view("-"),
                     format_bytes(e.device_total_bytes), e.step_time_s, e.tokens_per_s, e.tokens_per_s_per_gpu,
                     100 * e.mfu) +
         (options.runnable_only ? "" : c.runnable ? "  yes" : "  no"));
  }
  line("");
  std::string sets;
  for (const auto& o : result.best.front().overrides) sets += " --set " + o;
  line(fmt::format("#1 as overrides:{}", sets));
  line("memory is the device total (allocated x fragmentation + framework overhead); details: trainer estimate with "
       "these overrides");
  return out;
}

}  // namespace trainer::estimate
