#pragma once
// Installing the Python packages a test checks trainer against (transformers, megatron-core,
// TensorBoard) into the Python environment that holds torch.
#include <string>

namespace trainer::test {

// Runs `python -m pip install -q <pip_arguments>` with third_party/pins.sh sourced first (so the
// arguments may name its arrays, e.g. "\"${TEST_PIP_PACKAGES[@]}\""). Installs are serialised by a
// lock file in the temp directory: ctest runs tests in parallel, and two pip processes writing
// the same site-packages at once fail (CI once failed with pip's "ERROR: Exception" in the TensorBoard
// test started the same second as the data test's install). Fails the calling test with pip's output when the install fails.
void pip_install(const std::string& pip_arguments);

}  // namespace trainer::test
