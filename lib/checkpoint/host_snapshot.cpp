#include "checkpoint/host_snapshot.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <optional>

namespace trainer::checkpoint {

struct HostSnapshot::Impl {
  // The buffer: pinned memory from libtorch's host allocator for GPU tensors; for CPU tensors plain
  // aligned memory, outside libtorch's allocator, so that staging bytes are not counted as tensor
  // memory by the CPU memory tracker (the metrics' mem_peak_bytes and the estimator's replay).
  at::Tensor storage;
  std::unique_ptr<char, decltype(&std::free)> plain{nullptr, &std::free};
  char* image = nullptr;
  size_t capacity = 0;  // usable bytes from `image`
  bool pinned = false;

  ShardPlan plan;
  SafetensorsLayout layout;
  std::vector<at::Tensor> originals;

  std::optional<c10::cuda::CUDAStream> side_stream;
  std::optional<at::cuda::CUDAEvent> copies_done;
  bool device_copies_pending = false;

  char* data_of(size_t i) const { return image + layout.prefix.size() + layout.offsets[i]; }

  // Makes room for `needed` bytes (pinned when the tensors live on a GPU); false when it already was.
  bool ensure_capacity(size_t needed, bool on_device) {
    if (needed <= capacity && on_device == pinned) return false;
    constexpr size_t kAlign = FileWriter::kAlignment;
    storage = at::Tensor();  // free the old buffer first
    plain.reset();
    if (on_device) {
      storage = at::empty({int64_t(needed + kAlign)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      auto* base = static_cast<char*>(storage.data_ptr());
      image = base + (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
    } else {
      plain.reset(static_cast<char*>(std::aligned_alloc(kAlign, needed)));  // needed is a multiple of kAlign
      if (!plain) throw std::runtime_error(fmt::format("cannot allocate {} bytes for the checkpoint snapshot", needed));
      image = plain.get();
    }
    capacity = needed;
    pinned = on_device;
    return true;
  }
};

namespace {
size_t image_bytes(const SafetensorsLayout& layout) {
  constexpr size_t kAlign = FileWriter::kAlignment;
  return (layout.prefix.size() + layout.data_bytes + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

HostSnapshot::HostSnapshot() : impl_(std::make_unique<Impl>()) {}
HostSnapshot::~HostSnapshot() = default;

void HostSnapshot::prepare(const std::vector<TensorRecord>& records, int64_t rank) {
  auto& s = *impl_;
  s.plan = plan_rank_shard(rank, records);
  s.layout = layout_safetensors(s.plan.file, s.plan.entries, s.plan.metadata);
  s.originals.clear();
  bool on_device = false;
  for (const auto& r : records) {
    s.originals.push_back(r.tensor.detach());
    on_device = on_device || r.tensor.is_cuda();
  }
  s.ensure_capacity(image_bytes(s.layout), on_device);
  std::memcpy(s.image, s.layout.prefix.data(), s.layout.prefix.size());
}

void HostSnapshot::reserve(const std::vector<TensorRecord>& records, int64_t rank) {
  auto& s = *impl_;
  const ShardPlan plan = plan_rank_shard(rank, records);
  const SafetensorsLayout layout = layout_safetensors(plan.file, plan.entries, plan.metadata);
  bool on_device = false;
  for (const auto& r : records) on_device = on_device || r.tensor.is_cuda();
  if (!s.ensure_capacity(image_bytes(layout), on_device) || s.pinned) return;  // pinned memory is resident already
  // One write per page makes the kernel map (and zero) it now rather than during the first copy.
  const long page = ::sysconf(_SC_PAGESIZE);
  volatile char* bytes = s.image;
  for (size_t at = 0; at < s.capacity; at += size_t(page > 0 ? page : 4096)) bytes[at] = 0;
}

void HostSnapshot::start_device_copies() {
  auto& s = *impl_;
  bool any = false;
  for (const auto& t : s.originals) any = any || t.is_cuda();
  s.copies_done.reset();
  if (!any) return;
  const c10::DeviceIndex device = c10::cuda::current_device();
  if (!s.side_stream || s.side_stream->device_index() != device) s.side_stream = c10::cuda::getStreamFromPool(false, device);
  // Contiguous originals, made on the compute stream (parameters and optimizer state already are).
  for (auto& t : s.originals)
    if (t.is_cuda()) t = t.contiguous();
  // The side stream starts after everything training queued so far (the parameters are final).
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(device));
  queued.block(*s.side_stream);
  for (size_t i = 0; i < s.originals.size(); ++i) {
    const at::Tensor& original = s.originals[i];
    if (!original.is_cuda()) continue;
    C10_CUDA_CHECK(cudaMemcpyAsync(s.data_of(i), original.data_ptr(), original.nbytes(), cudaMemcpyDeviceToHost,
                                   s.side_stream->stream()));
    // The caching allocator must not reuse the memory before the side stream has read it.
    c10::cuda::CUDACachingAllocator::recordStream(original.storage().data_ptr(), *s.side_stream);
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
    if (original.is_contiguous()) {
      std::memcpy(s.data_of(i), original.data_ptr(), original.nbytes());
    } else {
      const at::Tensor packed = original.contiguous();
      std::memcpy(s.data_of(i), packed.data_ptr(), packed.nbytes());
    }
  }
}

void HostSnapshot::order_current_stream_after_copies() {
  auto& s = *impl_;
  if (!s.device_copies_pending) return;
  s.copies_done->block(c10::cuda::getCurrentCUDAStream());
  s.device_copies_pending = false;
}

nlohmann::json HostSnapshot::write(const std::string& dir, int64_t step, FileWriter& writer) {
  // Runs on the writer thread while training may call order_current_stream_after_copies(): both
  // only use the event, which CUDA allows from several threads.
  auto& s = *impl_;
  if (s.copies_done) s.copies_done->synchronize();
  nlohmann::json report = s.plan.report;
  if (s.originals.empty()) return report;
  const FileChecksum sum = writer.write_aligned(staging_file(dir, step, s.plan.file), s.image,
                                                s.layout.prefix.size() + s.layout.data_bytes);
  report["file"] = {{"name", s.plan.file}, {"bytes", sum.bytes}, {"crc32", sum.crc32}};
  return report;
}

}  // namespace trainer::checkpoint
