# ZINF_WITH_MPI=AUTO|ON|OFF: find MPI (Open MPI from Debian: libopenmpi-dev, openmpi-bin) for the
# MPI communicator, the multi-rank launch of zinfinity-train and the NCCL bootstrap. Sets
# ZINF_MPI_ENABLED and defines zinf_add_mpi_test.
string(TOUPPER "${ZINF_WITH_MPI}" _zinf_mpi_mode)
if(NOT _zinf_mpi_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "ZINF_WITH_MPI must be AUTO, ON or OFF, got '${ZINF_WITH_MPI}'")
endif()
set(ZINF_MPI_ENABLED OFF)
if(NOT _zinf_mpi_mode STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND AND MPIEXEC_EXECUTABLE)
    set(ZINF_MPI_ENABLED ON)
  elseif(_zinf_mpi_mode STREQUAL "ON")
    message(FATAL_ERROR "ZINF_WITH_MPI=ON but MPI (mpi.h, libmpi, mpiexec) was not found; "
                        "install libopenmpi-dev and openmpi-bin (scripts/install-deps.sh)")
  else()
    message(STATUS "zinfinity: MPI not found; one rank only (install libopenmpi-dev openmpi-bin)")
  endif()
endif()

# The environment of tests that start MPI ranks. Open MPI frees neither its components' strings
# nor much else at MPI_Finalize, and unloads the components first, so LeakSanitizer's reports
# cannot even be suppressed by module: leak detection is off for the MPI processes (every
# single-rank test still checks leaks), other ASan and UBSan checks stay on.
set(ZINF_MPI_TEST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
if(ZINF_SANITIZE MATCHES "address")
  list(APPEND ZINF_MPI_TEST_ENV "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
endif()

# zinf_add_mpi_test(<name> RANKS <n> [TARGET <exe>] [ARGS ...] [TIMEOUT s] [LABELS ...])
# Runs an already defined test executable under mpiexec with n ranks, oversubscribed (the CI
# machine has 2 cores), as root too (Open MPI refuses root without its two variables).
function(zinf_add_mpi_test name)
  cmake_parse_arguments(ARG "" "RANKS;TARGET;TIMEOUT" "ARGS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS mpi)
  endif()
  add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG}
    ${ARG_RANKS} $<TARGET_FILE:${ARG_TARGET}> ${ARG_ARGS})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    PROCESSORS ${ARG_RANKS}
    ENVIRONMENT "ZINF_TEST_TMPDIR=${CMAKE_BINARY_DIR}/test-tmp;ZINF_LOG_LEVEL=warning;${ZINF_MPI_TEST_ENV}")
endfunction()
