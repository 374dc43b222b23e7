# Warning flags, sanitizers and the zinf_add_library / zinf_add_test helpers.
# Everything is attached to targets through an interface library; no global flags.

add_library(zinf_compile_options INTERFACE)
target_compile_options(zinf_compile_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
if(ZINF_WERROR)
  target_compile_options(zinf_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
# GCC does not vectorise sqrt loops without it; the project never reads errno after math calls.
target_compile_options(zinf_compile_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>)

if(ZINF_SANITIZE)
  string(REPLACE ";" "," _zinf_sanitize "${ZINF_SANITIZE}")
  target_compile_options(zinf_compile_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_zinf_sanitize} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zinf_compile_options INTERFACE -fsanitize=${_zinf_sanitize})
endif()

# zinf_add_library(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
function(zinf_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:include/zinfinity>)
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS}
    $<BUILD_INTERFACE:zinf_compile_options>)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# zinf_add_test(<name> SOURCES ... [DEPS ...] [LABELS ...] [TIMEOUT s])
# Labels: unit, gpu, nvme, slow. CI runs everything not labelled slow.
function(zinf_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} zinf_test_main zinf_compile_options)
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "ZINF_TEST_TMPDIR=${CMAKE_BINARY_DIR}/test-tmp;ZINF_LOG_LEVEL=warning")
endfunction()
