# Writes OUT = a header defining NOPAD_BUILD_ID, the checkout the library is being built from:
# `git describe --always --dirty` of SRC ("unknown" outside a git checkout). Run at every build
# (the nopad_build_id target) and rewritten only when the id changed, so an unchanged checkout
# recompiles nothing. Why at build time: benchmark records read the id from the library they ran
# (nopad_build_id()), not from a tree that may have moved on since the build.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=7
                OUTPUT_VARIABLE id OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR id STREQUAL "")
  set(id "unknown")
endif()
set(text "#define NOPAD_BUILD_ID \"${id}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
