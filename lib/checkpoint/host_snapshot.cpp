#include "checkpoint/host_snapshot.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>
#include <optional>

namespace trainer::checkpoint {

struct HostSnapshot::Impl {
  std::vector<at::Tensor> buffers;    // host copies, reused across saves
  std::vector<at::Tensor> originals;  // the tensors of the save being snapshotted
  std::optional<c10::cuda::CUDAStream> side_stream;
  std::optional<at::cuda::CUDAEvent> copies_done;
  bool device_copies_pending = false;
};

HostSnapshot::HostSnapshot() : impl_(std::make_unique<Impl>()) {}
HostSnapshot::~HostSnapshot() = default;

void HostSnapshot::prepare(std::vector<TensorRecord>& records) {
  auto& s = *impl_;
  s.originals.clear();
  s.buffers.resize(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const at::Tensor original = records[i].tensor.detach();
    at::Tensor& buffer = s.buffers[i];
    const bool pinned = original.is_cuda();
    if (!buffer.defined() || buffer.sizes() != original.sizes() || buffer.scalar_type() != original.scalar_type() ||
        buffer.is_pinned() != pinned)
      buffer = at::empty(original.sizes(), at::TensorOptions().dtype(original.scalar_type()).pinned_memory(pinned));
    s.originals.push_back(original);
    records[i].tensor = buffer;
  }
}

void HostSnapshot::start_device_copies() {
  auto& s = *impl_;
  bool any = false;
  for (const auto& t : s.originals) any = any || t.is_cuda();
  s.copies_done.reset();
  if (!any) return;
  const c10::DeviceIndex device = c10::cuda::current_device();
  if (!s.side_stream || s.side_stream->device_index() != device) s.side_stream = c10::cuda::getStreamFromPool(false, device);
  // The side stream starts after everything training queued so far (the parameters are final).
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(device));
  queued.block(*s.side_stream);
  {
    const c10::cuda::CUDAStreamGuard guard(*s.side_stream);
    for (size_t i = 0; i < s.originals.size(); ++i) {
      const at::Tensor& original = s.originals[i];
      if (!original.is_cuda()) continue;
      s.buffers[i].copy_(original, /*non_blocking=*/true);
      // The caching allocator must not reuse the memory before the side stream has read it.
      c10::cuda::CUDACachingAllocator::recordStream(original.storage().data_ptr(), *s.side_stream);
    }
  }
  s.copies_done.emplace();
  s.copies_done->record(*s.side_stream);
  s.device_copies_pending = true;
}

void HostSnapshot::copy_host_originals() {
  auto& s = *impl_;
  for (size_t i = 0; i < s.originals.size(); ++i) {
    const at::Tensor& original = s.originals[i];
    if (original.is_cuda()) continue;
    if (original.is_contiguous())
      std::memcpy(s.buffers[i].data_ptr(), original.data_ptr(), original.nbytes());
    else
      s.buffers[i].copy_(original);
  }
}

void HostSnapshot::order_current_stream_after_copies() {
  auto& s = *impl_;
  if (!s.device_copies_pending) return;
  s.copies_done->block(c10::cuda::getCurrentCUDAStream());
  s.device_copies_pending = false;
}

void HostSnapshot::wait_device_copies() {
  // Runs on the writer thread while training may call order_current_stream_after_copies():
  // both only use the event, which CUDA allows from several threads.
  auto& s = *impl_;
  if (s.copies_done) s.copies_done->synchronize();
}

}  // namespace trainer::checkpoint
