# Installation and the CMake package: `find_package(zinfinity)` then link `zinfinity::zinfinity`
# (the engine, the model library, the data loaders and everything below them). Static libraries,
# so the package config also finds what they link privately (TBB, OpenBLAS, zlib, xxHash, ...).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(zinfinity INTERFACE)
target_link_libraries(zinfinity INTERFACE zinf_engine zinf_data)
add_library(zinfinity::zinfinity ALIAS zinfinity)

set(ZINF_EXPORTED_TARGETS zinfinity zinf_engine zinf_data zinf_model zinf_zero zinf_tier zinf_swap
    zinf_io zinf_device zinf_device_compute zinf_kernels zinf_base)
install(TARGETS ${ZINF_EXPORTED_TARGETS}
  EXPORT zinfinityTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zinfinity)
# Headers keep their repository paths: #include "src/engine/engine.h".
foreach(dir src/base src/device src/model src/data src/engine src/tier zero swap io kernels)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zinfinity/${dir}
    FILES_MATCHING PATTERN "*.h" PATTERN "cuda" EXCLUDE)
endforeach()

set(ZINF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/zinfinity)
install(EXPORT zinfinityTargets NAMESPACE zinfinity:: DESTINATION ${ZINF_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zinfinityConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zinfinityConfig.cmake INSTALL_DESTINATION ${ZINF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zinfinityConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/zinfinityConfig.cmake
  ${PROJECT_BINARY_DIR}/zinfinityConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindOpenBLAS.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindXxhash.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindHwloc.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindLibUring.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindLibAio.cmake
  DESTINATION ${ZINF_CMAKE_DIR})
