# conflux_option(NAME DOC DEFAULT): a tri-state AUTO|ON|OFF cache option.
# conflux_resolve(NAME FOUND): after a find step, turns AUTO into ON/OFF and fails when ON is unmet.
function(conflux_option name doc default)
  set(${name} ${default} CACHE STRING "${doc} (AUTO|ON|OFF)")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
endfunction()

function(conflux_resolve name found what)
  if(${name} STREQUAL "OFF")
    set(${name}_ENABLED OFF PARENT_SCOPE)
  elseif(found)
    set(${name}_ENABLED ON PARENT_SCOPE)
  elseif(${name} STREQUAL "ON")
    message(FATAL_ERROR "${name}=ON but ${what} was not found")
  else()
    set(${name}_ENABLED OFF PARENT_SCOPE)
  endif()
endfunction()
