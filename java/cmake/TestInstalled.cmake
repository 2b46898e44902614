# cmake -DBUILD=<build dir> -DPREFIX=<scratch prefix> -DJAVA=<java> -DSRC=<InstalledSmoke.java>
#       [-DLUA=<lua5.4>] -P TestInstalled.cmake
# Installs the build into a scratch prefix and checks that the installed jar (and Lua module) work
# from there alone: the jar must find <prefix>/lib*/jni/libconflux_jni.so by itself.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed: ${err}")
endif()
file(GLOB jar ${PREFIX}/share/java/conflux.jar)
if(NOT jar)
  message(FATAL_ERROR "no ${PREFIX}/share/java/conflux.jar")
endif()
execute_process(COMMAND ${JAVA} -cp ${jar} ${SRC} WORKING_DIRECTORY ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installed jar failed (${rc}): ${out}${err}")
endif()
if(LUA)
  file(GLOB_RECURSE so ${PREFIX}/*/lua/5.4/conflux_core.so)
  get_filename_component(cdir "${so}" DIRECTORY)
  # (a list, so that "\;" expands to a plain ";" in the command)
  set(env ${CMAKE_COMMAND} -E env "LUA_PATH_5_4=${PREFIX}/share/lua/5.4/?.lua\;\;" "LUA_CPATH_5_4=${cdir}/?.so\;\;")
  execute_process(COMMAND ${env} ${LUA} -e
                  "local c = require 'conflux'; c.init{transport='local'}; assert(c.allreduce({2}, 'sum')[1] == 2); print('installed lua ok: ' .. package.searchpath('conflux_core', package.cpath)); c.shutdown()"
                  WORKING_DIRECTORY ${PREFIX} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installed Lua module failed (${rc}): ${out}${err}")
  endif()
endif()
