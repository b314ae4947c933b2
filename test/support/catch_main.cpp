// The one translation unit that compiles Catch2's runner (slow to compile; shared by every test binary).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
