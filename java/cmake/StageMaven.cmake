# cmake -DOUT=<maven project dir> -DMAIN=<java/src/main/java> -DTEST=<java/src/test/java>
#       -DGEN=<SWIG's Java output dir> -DPLATFORM=linux-x86_64 -DLIBS="<libconflux.so.N>;<libconflux_jni.so>"
#       -P StageMaven.cmake
# Lays out the Maven project of org.conflux:conflux (pom.xml is configured beside it): the hand-written
# and generated sources in src/main/java, the tests in src/test/java, and the native libraries in
# src/main/resources/org/conflux/native/PLATFORM, listed in load order in the file LIBRARIES there
# (NativeLoader extracts them from the jar). Files are copied only when they changed, and sources that
# are gone (a renamed SWIG type) are removed, so Maven's incremental build stays right.
cmake_minimum_required(VERSION 3.25)

# stage(TO FROM PREFIX [FROM PREFIX...]): TO/PREFIX/<f> for every FROM/<f>.java (PREFIX "." for TO
# itself); other .java files in TO are removed.
function(stage to)
  set(want "")
  while(ARGN)
    list(POP_FRONT ARGN from prefix)
    if(prefix STREQUAL ".")
      set(prefix "")
    else()
      string(APPEND prefix "/")
    endif()
    file(GLOB_RECURSE files RELATIVE ${from} ${from}/*.java)
    foreach(f IN LISTS files)
      get_filename_component(dir ${to}/${prefix}${f} DIRECTORY)
      file(MAKE_DIRECTORY ${dir})
      file(COPY_FILE ${from}/${f} ${to}/${prefix}${f} ONLY_IF_DIFFERENT)
      list(APPEND want ${prefix}${f})
    endforeach()
  endwhile()
  file(GLOB_RECURSE have RELATIVE ${to} ${to}/*.java)
  foreach(f IN LISTS have)
    if(NOT f IN_LIST want)
      file(REMOVE ${to}/${f})
    endif()
  endforeach()
endfunction()

stage(${OUT}/src/main/java ${MAIN} . ${GEN} org/conflux)
stage(${OUT}/src/test/java ${TEST} .)

set(res ${OUT}/src/main/resources/org/conflux/native/${PLATFORM})
file(MAKE_DIRECTORY ${res})
set(names "")
foreach(lib IN LISTS LIBS)
  get_filename_component(name ${lib} NAME)
  file(REAL_PATH ${lib} real)
  file(COPY_FILE ${real} ${res}/${name} ONLY_IF_DIFFERENT)
  string(APPEND names "${name}\n")
endforeach()
file(CONFIGURE OUTPUT ${res}/LIBRARIES CONTENT "${names}")
