# Writes OUT (a header defining KOLO_GIT_COMMIT) from `git rev-parse HEAD` in SRC, with "-dirty"
# when tracked files differ from HEAD. Run at every build (see models/CMakeLists.txt); the header is
# rewritten only when the commit changed, so an unchanged tree rebuilds nothing.
execute_process(COMMAND git rev-parse HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE result ERROR_QUIET)
if(NOT result EQUAL 0 OR commit STREQUAL "")
  set(commit unknown)
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE changes RESULT_VARIABLE result ERROR_QUIET)
  if(result EQUAL 0 AND NOT changes STREQUAL "")
    string(APPEND commit "-dirty")
  endif()
endif()
file(WRITE ${OUT}.tmp "#pragma once\n#define KOLO_GIT_COMMIT \"${commit}\"\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
