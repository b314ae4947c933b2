#pragma once
// What the CUDA runtime sees, asked without libtorch: the device count, the first device's name
// and compute capability, and whether a kernel compiled into this binary runs on it (it does not
// when the binary lacks code for the device's architecture). Plain C++ interface; no CUDA or
// torch headers needed by callers.
#include <string>

namespace trainer::kernels {

struct DeviceProbe {
  int device_count = 0;
  std::string name;                 // of device 0
  int compute_major = 0, compute_minor = 0;
  bool kernel_runs = false;         // a probe kernel wrote its expected result on device 0
  std::string error;                // why the count is 0 or the kernel did not run
  int runtime_version = 0;          // cudaRuntimeGetVersion
  int driver_version = 0;           // cudaDriverGetVersion (0: no driver)
};

DeviceProbe probe_device();

}  // namespace trainer::kernels
