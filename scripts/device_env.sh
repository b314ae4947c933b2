# Sourced by the device scripts (scripts/device_check, scripts/gpu_profile): run the binaries built
# on the CPU machine against the GPU machine's python3 torch 2.11 (the same libtorch build), and
# give the test binaries the absolute source path they were built with.
torch_lib="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
site="$(dirname "$(dirname "$torch_lib")")"
nvidia_libs="$(ls -d "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib 2>/dev/null | paste -sd:)"
export LD_LIBRARY_PATH="$torch_lib:$nvidia_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
source_dir="$(for b in build/bin/unit_*; do strings "$b" | grep -m1 -o '^/.*/test/unit/[a-z_]*/'; done 2>/dev/null |
  head -n1 | sed 's|/test/unit/[a-z_]*/$||')"
if [ -n "$source_dir" ] && [ ! -e "$source_dir" ]; then mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir"; fi
export OMP_NUM_THREADS=4
