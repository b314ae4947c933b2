#pragma once
// The step executor (DESIGN.md section 4): runs one step's list of actions (schedule.h) on this
// rank. A forward action calls the caller's chunk forward with the chunk's input (undefined for
// the model's first chunk; otherwise the activation received from the previous stage or handed
// over by the previous chunk on this stage, as a leaf that requires grad) and keeps the chunk's
// output until its backward: the hidden state for the next chunk, or for the model's last chunk
// the loss as backward should see it (a scalar). Backward starts from that output through the
// autograd engine directly with the output's gradient (ones for the loss; the gradient received
// from the next stage, or the next local chunk's input gradient): like Megatron's
// custom_backward, this needs only the output's graph node, not its data.
//
// Sends are posted and never waited on until the end of the step; once one is done, the output it
// sent keeps only its graph node (its data is released, like Megatron's deallocate_output_tensor).
// A receive is posted one compute action ahead of the one that needs it, so its transfer overlaps
// that computation. Activations and
// their gradients travel with tags (direction, model chunk, micro-batch).
//
// Around each backward the gradient buffers learn the chunk and whether it is the chunk's last
// micro-batch of the step (the one whose gradients get reduced). Zero-bubble's split backward
// runs the input gradient now (BackwardInput) and the queued weight gradients later
// (BackwardWeight).
#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/weight_grad_queue.h"
#include "parallel/pipeline/schedule.h"

namespace trainer::engine {

// The executor runs the pipeline schedules' actions (parallel/pipeline/schedule.h).
using parallel::Action;

// Backward from `output` with its incoming gradient through the autograd engine; frees the graph.
void backward_from(const at::Tensor& output, const at::Tensor& grad);

// How a pipeline stage reaches its neighbours. Without a group (one stage) the schedule may hold
// no sends or receives.
struct PipelineLinks {
  comm::Communicator* group = nullptr;          // the pipeline group; its rank is the stage
  std::function<int64_t(const Action&)> peer;   // the stage on the other side of a send or receive
  std::vector<int64_t> shape;                   // every activation and activation gradient
  at::TensorOptions options;
};

class StepExecutor {
 public:
  // (micro-batch, model chunk, input) -> output.
  using ChunkForward = std::function<at::Tensor(int64_t micro_batch, int64_t chunk, const at::Tensor& input)>;
  struct GradientHooks {
    std::function<void(int64_t chunk, bool last)> begin_backward;  // model chunk
    std::function<void(int64_t chunk)> end_backward;
  };

  // `model_chunks`: the number of chunks of the whole model (the last one returns the loss);
  // `weight_grads` is needed only for BackwardInput/BackwardWeight actions.
  StepExecutor(ChunkForward forward, GradientHooks hooks, model::WeightGradQueue* weight_grads,
               int64_t model_chunks = 1, PipelineLinks links = {});

  // Runs the actions in order (check_schedule must accept them); returns when every send is done.
  // `forward_only`: forwards and their sends and receives only (evaluation): outputs are kept only
  // until they are sent.
  void run(const std::vector<Action>& actions, bool forward_only = false);

  // Wall-clock seconds the last run spent computing, per model chunk: {forward, backward (or
  // input-gradient B), weight-gradient W}, summed over its micro-batches; zeros for chunks on
  // other stages. Host time: on a GPU it counts launches, not kernels.
  const std::vector<std::array<double, 3>>& compute_seconds() const { return compute_seconds_; }
  // With a counter of collective waits (comm::CommContext::wait_ns) given before run(): the same
  // seconds with the waits on collectives inside the computation (tensor-parallel all-reduces,
  // expert all-to-alls) left out, summed over chunks: {forward, backward + weight gradients}.
  void count_collective_waits(const std::atomic<int64_t>* wait_ns) { wait_ns_ = wait_ns; }
  std::array<double, 2> compute_seconds_without_waits() const { return net_seconds_; }

 private:
  using Key = std::pair<int64_t, int64_t>;  // (micro-batch, model chunk)
  void forward(const Action& a);
  void backward(const Action& a, bool last, bool split);
  void send(const Action& a);
  void post_receive(const Action& a);
  void finish_receive(const Action& a);
  int64_t tag(const Action& a) const;

  ChunkForward forward_;
  GradientHooks hooks_;
  model::WeightGradQueue* weight_grads_;
  int64_t model_chunks_;
  PipelineLinks links_;
  std::map<Key, at::Tensor> outputs_;      // chunk outputs awaiting their backward
  std::map<Key, at::Tensor> inputs_;       // chunk inputs (leaves) awaiting their forward, then their gradient
  std::map<Key, at::Tensor> output_grads_; // received gradients of chunk outputs
  std::map<Key, size_t> deferred_;         // weight-gradient works queued by each B
  struct Pending {
    std::unique_ptr<comm::Work> work;
    at::Tensor buffer;
    Key output{-1, -1};  // a sent chunk output (whose data is released once the send is done)
  };
  // Finishes the sends that are done; a sent output keeps only its graph node.
  void release_sent();
  std::map<std::pair<bool, Key>, Pending> receives_;  // (is gradient, key of the data) -> posted receive
  std::vector<Pending> sends_;
  std::vector<bool> local_;  // per model chunk: computed on this stage
  bool forward_only_ = false;
  std::vector<std::array<double, 3>> compute_seconds_;
  const std::atomic<int64_t>* wait_ns_ = nullptr;
  std::array<double, 2> net_seconds_{0.0, 0.0};
};

}  // namespace trainer::engine
