# The one place where every external dependency is pinned. Sourced by scripts/setup and
# scripts/build; nothing else names a version.

# libtorch comes from the PyPI wheel (CUDA 13.0 build, the same as the GPU machines' torch).
TORCH_VERSION="2.11.0"
# Installed with --no-deps beside torch: its CUDA libraries load these from site-packages;
# everything else CUDA comes from the toolkit in $CUDA_HOME. The versions are the ones torch 2.11.0
# itself requires (its METADATA; cuFile through cuda-toolkit[cufile]==13.0.2).
PIP_PACKAGES=(
  "torch==${TORCH_VERSION}"
  "nvidia-cusparselt-cu13==0.8.0"
  "nvidia-nvshmem-cu13==3.4.5"
  "nvidia-cufile==1.15.1.6"
)
# TorchConfig.cmake works with Debian's CMake 3.25, but we pin a newer CMake for CUDA 13 support.
CMAKE_PIP_PACKAGE="cmake==4.4.4"
CMAKE_MIN_VERSION="3.27"

# torch's own Python dependencies (its METADATA), needed only where Python imports torch: the
# benchmark's PyTorch reference and the Hugging Face test. The C++ build never imports torch.
TORCH_PYTHON_DEPS=("typing-extensions>=4.10.0" "sympy>=1.13.3" "networkx>=2.5.1" "jinja2" "fsspec>=0.8.5" "filelock")
# Installed by the Hugging Face interchange test itself (with dependencies) into the same Python
# environment as torch: the reference implementation trainer's exported weights are checked against.
TEST_PIP_PACKAGES=("transformers==5.23.0" "${TORCH_PYTHON_DEPS[@]}")
# Installed by the observability test: TensorBoard's own event-file reader checks what trainer writes.
TENSORBOARD_PIP_PACKAGES=("tensorboard==2.21.0")

# Debian 12 packages: compilers' companions and header-only libraries.
#   libgloo-dev: headers of the Gloo library whose code is compiled into libtorch_cpu (the wheel
#   ships c10d's ProcessGroupGloo.hpp but not the gloo headers it includes).
APT_PACKAGES=(
  build-essential ninja-build ccache git python3-venv
  libcli11-dev nlohmann-json3-dev libfmt-dev catch2 libgloo-dev zlib1g-dev
  openmpi-bin libopenmpi-dev procps
  slurm-wlm munge iproute2 util-linux
)

CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
# Installed by the data-format test (with --no-deps; besides torch and numpy it imports packaging,
# which nothing else installs before it when that test runs first): the reference writer of
# Megatron-LM's indexed datasets that trainer reads.
MEGATRON_TEST_PACKAGES=("megatron-core==0.16.1" "packaging==25.0")
