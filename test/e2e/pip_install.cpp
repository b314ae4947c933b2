#include "pip_install.h"

#include <catch2/catch.hpp>

#include <filesystem>

#include "process.h"

namespace trainer::test {

void pip_install(const std::string& pip_arguments) {
  const std::string python = TRAINER_PYTHON;
  // One lock for every environment (TRAINER_PYTHON may be a bare "python3"): installs are rare.
  const std::string lock = (std::filesystem::temp_directory_path() / "trainer-pip-install.lock").string();
  const auto r = run_process({"/bin/bash", "-c",
                              "source " + source_dir() + "/third_party/pins.sh && flock -w 600 \"" + lock + "\" \"" + python +
                                  "\" -m pip install -q --disable-pip-version-check " + pip_arguments},
                             900);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
}

}  // namespace trainer::test
