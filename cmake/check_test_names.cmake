# A ctest entry: fails when a Catch test name contains ',' or ';'. ctest passes each name to
# Catch as a filter, where ',' means "or" (and CMake splits lists at ';'), so such a test would
# silently run nothing.
file(GLOB_RECURSE sources ${SRC}/test/*.cpp)
set(bad "")
foreach(source IN LISTS sources)
  file(STRINGS ${source} lines REGEX "TEST_CASE\\(\"[^\"]*[,;]")
  foreach(line IN LISTS lines)
    string(APPEND bad "  ${source}: ${line}\n")
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "test names must not contain ',' or ';':\n${bad}")
endif()
