# FindHwloc: finds hwloc (header hwloc.h, library hwloc) and defines the imported target
# Hwloc::Hwloc. Sets Hwloc_FOUND, Hwloc_INCLUDE_DIR, Hwloc_LIBRARY.
find_path(Hwloc_INCLUDE_DIR NAMES hwloc.h)
find_library(Hwloc_LIBRARY NAMES hwloc libhwloc)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Hwloc REQUIRED_VARS Hwloc_LIBRARY Hwloc_INCLUDE_DIR)

if(Hwloc_FOUND AND NOT TARGET Hwloc::Hwloc)
  add_library(Hwloc::Hwloc UNKNOWN IMPORTED)
  set_target_properties(Hwloc::Hwloc PROPERTIES
    IMPORTED_LOCATION "${Hwloc_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Hwloc_INCLUDE_DIR}")
endif()
mark_as_advanced(Hwloc_INCLUDE_DIR Hwloc_LIBRARY)
