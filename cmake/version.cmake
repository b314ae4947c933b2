# Generates trainer_version (version, git commit) at build time; the generated file is rewritten
# only when the commit changes, so an unchanged tree relinks nothing.
set(version_cpp ${CMAKE_BINARY_DIR}/generated/version_info.cpp)
add_custom_target(trainer_version_info
  COMMAND ${CMAKE_COMMAND} -DOUT=${version_cpp} -DSRC=${PROJECT_SOURCE_DIR}
          -DVERSION=${PROJECT_VERSION} -P ${PROJECT_SOURCE_DIR}/cmake/write_version.cmake
  BYPRODUCTS ${version_cpp}
  COMMENT "")
add_library(trainer_version STATIC ${version_cpp})
add_dependencies(trainer_version trainer_version_info)
target_include_directories(trainer_version PUBLIC ${PROJECT_SOURCE_DIR}/lib)
