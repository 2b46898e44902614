# cfx_add_elastic_example_tests(LANG COMMAND...): the elastic example of language LANG (java, lua)
# under test_elastic_examples.py, one test per case (tests LANG.elastic_kill_npN_rankR,
# LANG.elastic_below_min_npN and LANG.elastic_grow_npN, labels LANG, elastic, example). Included by java/ and lua/, which know
# the command that runs their example; registered only with the Gloo transport (an elastic world
# runs over it: an MPI world cannot shrink).
function(cfx_add_elastic_example_tests lang)
  if(NOT CONFLUX_WITH_GLOO_ENABLED)
    message(STATUS "${lang}: the Gloo transport is not built (libgloo-dev): the elastic example's "
                   "tests are not registered (an MPI world cannot shrink)")
    return()
  endif()
  foreach(_case "kill;3;2" "kill;3;0" "kill;2;1" "below_min;3" "below_min;2" "grow;2")
    string(REGEX REPLACE "^([a-z_]+);([0-9]+).*$" "${lang}.elastic_\\1_np\\2" _name "${_case}")
    if(_case MATCHES "^kill;[0-9]+;([0-9]+)$")
      string(APPEND _name "_rank${CMAKE_MATCH_1}")
    endif()
    add_test(NAME ${_name}
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/test_elastic_examples.py ${_case} -- ${ARGN})
    list(GET _case 1 _np)
    if(_case MATCHES "^grow")
      math(EXPR _np "${_np} + 1")  # the newcomer
    endif()
    set_tests_properties(${_name} PROPERTIES LABELS "${lang};elastic;example" TIMEOUT 300 PROCESSORS ${_np})
    if(lang STREQUAL "lua")
      cfx_lua_env(${_name})
    endif()
  endforeach()
endfunction()
