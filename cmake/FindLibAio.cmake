# FindLibAio: finds libaio (header libaio.h, library libaio) and defines the imported target
# LibAio::LibAio. Sets LibAio_FOUND, LibAio_INCLUDE_DIR, LibAio_LIBRARY.
find_path(LibAio_INCLUDE_DIR NAMES libaio.h)
find_library(LibAio_LIBRARY NAMES aio libaio)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(LibAio REQUIRED_VARS LibAio_LIBRARY LibAio_INCLUDE_DIR)

if(LibAio_FOUND AND NOT TARGET LibAio::LibAio)
  add_library(LibAio::LibAio UNKNOWN IMPORTED)
  set_target_properties(LibAio::LibAio PROPERTIES
    IMPORTED_LOCATION "${LibAio_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LibAio_INCLUDE_DIR}")
endif()
mark_as_advanced(LibAio_INCLUDE_DIR LibAio_LIBRARY)
