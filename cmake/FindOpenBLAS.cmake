# FindOpenBLAS: provides OpenBLAS::OpenBLAS, OpenBLAS's library and the cblas.h that declares
# openblas_set_num_threads (Debian: libopenblas-dev; the pthread flavour's headers live under
# /usr/include/<triplet>/openblas-pthread). Prefers OpenBLAS's own CMake config, which names
# both, and falls back to searching for them.
include(FindPackageHandleStandardArgs)

find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_INCLUDE_DIRS AND OpenBLAS_LIBRARIES)
  set(_zinf_openblas_include ${OpenBLAS_INCLUDE_DIRS})
  set(_zinf_openblas_library ${OpenBLAS_LIBRARIES})
else()
  find_path(_zinf_openblas_include cblas.h
    PATH_SUFFIXES openblas-pthread openblas openblas-openmp openblas-serial
                  x86_64-linux-gnu/openblas-pthread aarch64-linux-gnu/openblas-pthread)
  find_library(_zinf_openblas_library NAMES openblas)
endif()

find_package_handle_standard_args(OpenBLAS
  REQUIRED_VARS _zinf_openblas_library _zinf_openblas_include)

if(OpenBLAS_FOUND AND NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
  target_include_directories(OpenBLAS::OpenBLAS INTERFACE ${_zinf_openblas_include})
  target_link_libraries(OpenBLAS::OpenBLAS INTERFACE ${_zinf_openblas_library})
endif()
