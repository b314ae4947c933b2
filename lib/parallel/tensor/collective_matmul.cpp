#include "parallel/tensor/collective_matmul.h"

#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace trainer::parallel {

namespace {

using comm::P2POp;

// One ring step: send `out` to the next rank, receive `in` from the previous one.
std::unique_ptr<comm::Work> ring_step(comm::Communicator& tp, const at::Tensor& out, const at::Tensor& in, int64_t step) {
  const int64_t n = tp.size(), r = tp.rank();
  return tp.send_recv({P2POp{P2POp::Kind::Send, out, (r + 1) % n, step}, P2POp{P2POp::Kind::Recv, in, (r + n - 1) % n, step}});
}

std::vector<int64_t> with_first_and_last(const at::Tensor& x, int64_t first, int64_t last) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.front() = first;
  shape.back() = last;
  return shape;
}

void check_rhs(const at::Tensor& rhs, int64_t k, const char* op) {
  if (rhs.dim() != 2 || rhs.size(0) != k)
    throw std::invalid_argument(std::string(op) + ": the right-hand side must be [" + std::to_string(k) +
                                ", n], got " + std::to_string(rhs.dim()) + " dimensions");
}

}  // namespace

std::vector<at::Tensor> all_gather_matmul(const at::Tensor& x, const std::vector<at::Tensor>& rhs, comm::Communicator& tp,
                                          at::Tensor* gathered) {
  const int64_t n = tp.size(), r = tp.rank();
  const int64_t k = x.size(-1), s = x.size(0);
  for (const auto& m : rhs) check_rhs(m, k, "all_gather_matmul");
  const at::Tensor mine = x.contiguous();
  const int64_t rows = mine.numel() / k;  // rows of one rank's chunk
  std::vector<at::Tensor> outs;
  for (const auto& m : rhs) outs.push_back(at::empty({n * rows, m.size(1)}, mine.options()));
  if (gathered) {
    *gathered = at::empty(with_first_and_last(mine, n * s, k), mine.options());
    gathered->narrow(0, r * s, s).copy_(mine);
  }
  // At step t this rank holds the chunk of rank (r - t) mod n and passes it on.
  at::Tensor held = mine;
  for (int64_t step = 0; step < n; ++step) {
    const int64_t source = (r + n - step) % n;
    std::unique_ptr<comm::Work> work;
    at::Tensor next;
    if (step + 1 < n) {
      next = gathered ? gathered->narrow(0, ((source + n - 1) % n) * s, s) : at::empty_like(mine);
      work = ring_step(tp, held, next, step);
    }
    const at::Tensor held_rows = held.view({rows, k});
    for (size_t i = 0; i < rhs.size(); ++i) {
      at::Tensor out_rows = outs[i].narrow(0, source * rows, rows);
      at::mm_out(out_rows, held_rows, rhs[i]);
    }
    if (work) {
      work->wait();
      held = next;
    }
  }
  for (size_t i = 0; i < rhs.size(); ++i) outs[i] = outs[i].view(with_first_and_last(mine, n * s, rhs[i].size(1)));
  return outs;
}

at::Tensor matmul_reduce_scatter(const at::Tensor& x, const at::Tensor& rhs, comm::Communicator& tp) {
  const int64_t n = tp.size(), r = tp.rank();
  const int64_t k = x.size(-1);
  check_rhs(rhs, k, "matmul_reduce_scatter");
  if (x.size(0) % n != 0)
    throw std::invalid_argument("matmul_reduce_scatter: " + std::to_string(x.size(0)) + " rows of the sequence for " +
                                std::to_string(n) + " ranks");
  const int64_t s = x.size(0) / n;
  const at::Tensor all_rows = x.reshape({-1, k});
  const int64_t rows = all_rows.size(0) / n;
  // Step t adds this rank's partial product for destination chunk (r - 1 - t) mod n to the running
  // sum received from the previous rank and sends it on; at step n - 1 the chunk is this rank's own.
  auto partial = [&](int64_t step) {
    const int64_t destination = (r + 2 * n - 1 - step) % n;
    return all_rows.narrow(0, destination * rows, rows).mm(rhs);
  };
  at::Tensor sum = partial(0);
  for (int64_t step = 1; step < n; ++step) {
    at::Tensor received = at::empty_like(sum);
    auto work = ring_step(tp, sum, received, step - 1);
    const at::Tensor mine = partial(step);  // while the running sum travels
    work->wait();
    sum = received.add_(mine);
  }
  return sum.view(with_first_and_last(x, s, rhs.size(1)));
}

}  // namespace trainer::parallel
