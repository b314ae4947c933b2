#include "engine/executor.h"
#include "runtime/trace_scope.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <stdexcept>

namespace trainer::engine {

using parallel::check_schedule;
using parallel::is_compute;
using parallel::to_string;

namespace {
// The profiler-trace name of an action (runtime/trace_scope.h).
const char* action_name(Action::Kind kind) {
  switch (kind) {
    case Action::Kind::Forward: return "forward";
    case Action::Kind::Backward: return "backward";
    case Action::Kind::BackwardInput: return "backward input";
    case Action::Kind::BackwardWeight: return "backward weight";
    case Action::Kind::SendForward: return "send activation";
    case Action::Kind::RecvForward: return "receive activation";
    case Action::Kind::SendBackward: return "send gradient";
    case Action::Kind::RecvBackward: return "receive gradient";
  }
  return "action";
}
}  // namespace

using K = Action::Kind;

void backward_from(const at::Tensor& output, const at::Tensor& grad) {
  // The engine checks the gradient against the shape recorded in the graph, not output's data.
  torch::autograd::Engine::get_default_engine().execute({torch::autograd::impl::gradient_edge(output)}, {grad},
                                                        /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true, /*outputs=*/{});
}

StepExecutor::StepExecutor(ChunkForward forward, GradientHooks hooks, model::WeightGradQueue* weight_grads,
                           int64_t model_chunks, PipelineLinks links)
    : forward_(std::move(forward)),
      hooks_(std::move(hooks)),
      weight_grads_(weight_grads),
      model_chunks_(model_chunks),
      links_(std::move(links)) {}

namespace {
bool is_receive(K kind) { return kind == K::RecvForward || kind == K::RecvBackward; }
bool is_send(K kind) { return kind == K::SendForward || kind == K::SendBackward; }
bool carries_gradient(K kind) { return kind == K::SendBackward || kind == K::RecvBackward; }
}  // namespace

void StepExecutor::run(const std::vector<Action>& actions, bool forward_only) {
  check_schedule(actions, forward_only);
  forward_only_ = forward_only;
  local_.assign(size_t(model_chunks_), false);
  compute_seconds_.assign(size_t(model_chunks_), {0.0, 0.0, 0.0});
  net_seconds_ = {0.0, 0.0};
  std::map<int64_t, size_t> last_backward;  // chunk -> index of its last (input) backward
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.chunk < 0 || a.chunk >= model_chunks_)
      throw std::logic_error(fmt::format("{}: the model has {} chunks", to_string(a), model_chunks_));
    if (is_compute(a.kind)) local_[size_t(a.chunk)] = true;
    if (a.kind == K::Backward || a.kind == K::BackwardInput) last_backward[a.chunk] = i;
    if ((is_send(a.kind) || is_receive(a.kind)) && !links_.group)
      throw std::logic_error(fmt::format("{}: a schedule with sends and receives needs the pipeline group", to_string(a)));
  }
  // Each receive is posted when the compute action before the one that needs it starts.
  size_t posted = 0;
  auto post_through = [&](size_t end) {
    for (; posted < end && posted < actions.size(); ++posted)
      if (is_receive(actions[posted].kind)) post_receive(actions[posted]);
  };
  auto next_compute_after = [&](size_t i) {
    size_t j = i + 1;
    while (j < actions.size() && !is_compute(actions[j].kind)) ++j;
    return j;
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (is_compute(a.kind)) post_through(next_compute_after(i));
    const auto start = std::chrono::steady_clock::now();
    const int64_t waited_before = wait_ns_ ? wait_ns_->load() : 0;
    const runtime::TraceScope scope("{} chunk {} micro-batch {}", action_name(a.kind), a.chunk, a.micro_batch);
    switch (a.kind) {
      case K::Forward: forward(a); break;
      case K::Backward:
      case K::BackwardInput: backward(a, i == last_backward[a.chunk], a.kind == K::BackwardInput); break;
      case K::BackwardWeight: {
        const Key key{a.micro_batch, a.chunk};
        weight_grads_->run_oldest(deferred_.at(key));
        deferred_.erase(key);
        break;
      }
      case K::SendForward:
      case K::SendBackward: send(a); break;
      case K::RecvForward:
      case K::RecvBackward:
        post_through(i + 1);
        finish_receive(a);
        break;
    }
    if (is_compute(a.kind)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      compute_seconds_[size_t(a.chunk)][a.kind == K::Forward ? 0 : a.kind == K::BackwardWeight ? 2 : 1] += seconds;
      const double waited = wait_ns_ ? double(wait_ns_->load() - waited_before) * 1e-9 : 0.0;
      net_seconds_[a.kind == K::Forward ? 0 : 1] += seconds - waited;
    }
    release_sent();
  }
  for (auto& s : sends_) s.work->wait();
  sends_.clear();
  inputs_.clear();
  output_grads_.clear();
  if (forward_only_) outputs_.clear();
}

void StepExecutor::forward(const Action& a) {
  const Key key{a.micro_batch, a.chunk};
  at::Tensor input;
  if (auto it = inputs_.find(key); it != inputs_.end()) input = it->second;
  if (a.chunk > 0 && !input.defined())
    throw std::logic_error(fmt::format("{}: no input arrived for model chunk {}", to_string(a), a.chunk));
  const at::Tensor output = forward_(a.micro_batch, a.chunk, input);
  const bool next_local = a.chunk + 1 < model_chunks_ && local_[size_t(a.chunk + 1)];
  // Forward only: an output is kept until it is sent.
  if (!forward_only_ || (a.chunk + 1 < model_chunks_ && !next_local)) outputs_[key] = output;
  // The next chunk on this stage takes the output directly, cut from this chunk's graph so that
  // the two backwards run as separate actions.
  if (next_local)
    inputs_[{a.micro_batch, a.chunk + 1}] = forward_only_ ? output : output.detach().requires_grad_(true);
}

void StepExecutor::backward(const Action& a, bool last, bool split) {
  const Key key{a.micro_batch, a.chunk};
  const at::Tensor output = outputs_.at(key);
  outputs_.erase(key);
  if (split && !weight_grads_)
    throw std::logic_error(fmt::format("{}: a split backward needs the model's weight-gradient queue", to_string(a)));
  at::Tensor grad;
  if (a.chunk == model_chunks_ - 1) {
    grad = at::ones_like(output);
  } else if (auto it = output_grads_.find(key); it != output_grads_.end()) {
    grad = it->second;
    output_grads_.erase(it);
  } else {
    // The next chunk is on this stage: its input's gradient.
    const auto next = inputs_.find({a.micro_batch, a.chunk + 1});
    if (next == inputs_.end() || !next->second.grad().defined())
      throw std::logic_error(fmt::format("{}: no gradient arrived for the output of model chunk {}", to_string(a), a.chunk));
    grad = next->second.grad();
    inputs_.erase(next);
  }
  if (hooks_.begin_backward) hooks_.begin_backward(a.chunk, last);
  const size_t before = weight_grads_ ? weight_grads_->pending() : 0;
  if (split) weight_grads_->set_deferring(true);
  backward_from(output, grad);
  if (split) {
    weight_grads_->set_deferring(false);
    deferred_[key] = weight_grads_->pending() - before;
  }
  if (hooks_.end_backward) hooks_.end_backward(a.chunk);
}

int64_t StepExecutor::tag(const Action& a) const {
  // (direction, chunk, micro-batch): unique within a step, below 2^31 for up to 1024 chunks and
  // 2^20 micro-batches.
  return ((int64_t(carries_gradient(a.kind)) * model_chunks_ + a.chunk) << 20) + a.micro_batch;
}

void StepExecutor::send(const Action& a) {
  const Key key{a.micro_batch, a.chunk};
  at::Tensor data;
  if (a.kind == K::SendForward) {
    data = outputs_.at(key).detach();
    if (forward_only_) outputs_.erase(key);
  } else {
    const auto it = inputs_.find(key);
    if (it == inputs_.end() || !it->second.grad().defined())
      throw std::logic_error(fmt::format("{}: the input gradient of model chunk {} is missing", to_string(a), a.chunk));
    data = it->second.grad();
    inputs_.erase(it);
  }
  data = data.contiguous();
  std::vector<comm::P2POp> ops{{comm::P2POp::Kind::Send, data, links_.peer(a), tag(a)}};
  const bool release = a.kind == K::SendForward && !forward_only_;
  sends_.push_back(Pending{links_.group->send_recv(ops), data, release ? key : Key{-1, -1}});
}

void StepExecutor::release_sent() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (!it->work->done()) {
      ++it;
      continue;
    }
    it->work->wait();  // returns at once; raises a failed send's error
    if (auto out = outputs_.find(it->output); out != outputs_.end())
      out->second.set_data(at::empty({0}, out->second.options()));
    it = sends_.erase(it);
  }
}

void StepExecutor::post_receive(const Action& a) {
  const auto id = std::make_pair(carries_gradient(a.kind), Key{a.micro_batch, a.chunk});
  if (receives_.count(id)) return;
  at::Tensor buffer = at::empty(links_.shape, links_.options);
  std::vector<comm::P2POp> ops{{comm::P2POp::Kind::Recv, buffer, links_.peer(a), tag(a)}};
  receives_[id] = Pending{links_.group->send_recv(ops), buffer};
}

void StepExecutor::finish_receive(const Action& a) {
  const auto id = std::make_pair(carries_gradient(a.kind), Key{a.micro_batch, a.chunk});
  auto it = receives_.find(id);
  if (it == receives_.end()) throw std::logic_error(fmt::format("{}: the receive was never posted", to_string(a)));
  it->second.work->wait();
  at::Tensor data = it->second.buffer;
  receives_.erase(it);
  if (a.kind == K::RecvForward)  // chunk c's output is c + 1's input
    inputs_[{a.micro_batch, a.chunk + 1}] = forward_only_ ? data : data.requires_grad_(true);
  else
    output_grads_[{a.micro_batch, a.chunk - 1}] = data;  // chunk c's input gradient is c - 1's output gradient
}

}  // namespace trainer::engine
