#pragma once
// Precompiled first in test executables that use libtorch: c10's logging defines a glog-style
// CHECK macro that would replace Catch's CHECK (and abort on failure). Including ATen first and
// undefining it lets Catch define its own; both headers are include-guarded, so later includes in
// the test files change nothing.
#include <ATen/ATen.h>
#undef CHECK
#include <catch2/catch.hpp>
