#include "device_probe.h"

#include <cuda_runtime.h>

namespace trainer::kernels {

namespace {

__global__ void write_pattern(unsigned* out, unsigned seed) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = seed * 2654435761u + i;
}

}  // namespace

DeviceProbe probe_device() {
  DeviceProbe probe;
  cudaRuntimeGetVersion(&probe.runtime_version);
  cudaDriverGetVersion(&probe.driver_version);
  cudaError_t status = cudaGetDeviceCount(&probe.device_count);
  if (status != cudaSuccess) {
    probe.device_count = 0;
    probe.error = cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error for later callers
    return probe;
  }
  if (probe.device_count == 0) {
    probe.error = "no CUDA device";
    return probe;
  }
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, 0) == cudaSuccess) {
    probe.name = props.name;
    probe.compute_major = props.major;
    probe.compute_minor = props.minor;
  }
  constexpr int kThreads = 256;
  unsigned* device_buffer = nullptr;
  unsigned host[kThreads] = {};
  if ((status = cudaMalloc(&device_buffer, sizeof(host))) != cudaSuccess) {
    probe.error = cudaGetErrorString(status);
    return probe;
  }
  write_pattern<<<1, kThreads>>>(device_buffer, 7u);
  status = cudaGetLastError();
  if (status == cudaSuccess) status = cudaMemcpy(host, device_buffer, sizeof(host), cudaMemcpyDeviceToHost);
  cudaFree(device_buffer);
  if (status != cudaSuccess) {
    probe.error = cudaGetErrorString(status);
    return probe;
  }
  probe.kernel_runs = true;
  for (unsigned i = 0; i < kThreads; ++i)
    if (host[i] != 7u * 2654435761u + i) probe.kernel_runs = false;
  if (!probe.kernel_runs) probe.error = "probe kernel wrote wrong values";
  return probe;
}

}  // namespace trainer::kernels
