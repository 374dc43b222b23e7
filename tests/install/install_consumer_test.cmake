# Installs the build tree to a temporary prefix, then configures, builds and runs a consumer
# project that finds it with find_package(zinfinity). Run by ctest with -D BUILD_DIR, SOURCE_DIR,
# WORK_DIR, GENERATOR, CXX_FLAGS; with PYTHON (the interpreter) and PYTHON_DIR (the package's
# install directory under the prefix), also imports the installed Python package.
file(REMOVE_RECURSE ${WORK_DIR})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run("configure consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("run consumer" ${WORK_DIR}/build/consumer)
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer output:\n${last_output}")
endif()
message(STATUS "${last_output}")
if(PYTHON)
  # The Python package, installed beside the library, imports from the prefix alone.
  run("import the installed zinfinity" ${CMAKE_COMMAND} -E env
      PYTHONPATH=${WORK_DIR}/prefix/${PYTHON_DIR} ${PYTHON} -c
      "import zinfinity, zinfinity.compat.deepspeed\nprint('python ok' if zinfinity.__file__.startswith('${WORK_DIR}/prefix/') else 'elsewhere', zinfinity.__file__)")
  if(NOT last_output MATCHES "python ok")
    message(FATAL_ERROR "python import output:\n${last_output}")
  endif()
  message(STATUS "${last_output}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
