# Small helpers shared by the layer CMakeLists.

# The include tree: sources include "packtrain/<layer>/<file>.h", as an installed
# project does. In the build tree, include/packtrain/<layer> links to the layer's
# source folder, so there is no generic runtime/ or graphs/ at the include root.
# runtime/ is not in it: each of its rooms has a tree of its own (packtrain_room),
# so a room sees only the rooms it depends on.
function(packtrain_include_tree)
  set(_root "${PROJECT_BINARY_DIR}/include/packtrain")
  file(MAKE_DIRECTORY "${_root}")
  if(IS_SYMLINK "${_root}/runtime")  # from a build before the rooms
    file(REMOVE "${_root}/runtime")
  endif()
  foreach(layer base profiling ensemble graphs)
    if(NOT EXISTS "${_root}/${layer}")
      file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${layer}" "${_root}/${layer}" SYMBOLIC)
    endif()
  endforeach()
endfunction()

# packtrain_room(<room> SOURCES ... DEPS ...): runtime/<room> as the library
# packtrain_runtime_<room> (alias packtrain::runtime_<room>). Its headers are
# "packtrain/runtime/<room>/..." through include/rooms/<room>, a tree holding that
# room alone: a room sees another room's headers only by depending on it (DEPS), so
# an upward include does not compile (tests/layering checks one).
function(packtrain_room room)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(_tree "${PROJECT_BINARY_DIR}/include/rooms/${room}")
  file(MAKE_DIRECTORY "${_tree}/packtrain/runtime")
  if(NOT EXISTS "${_tree}/packtrain/runtime/${room}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/runtime/${room}" "${_tree}/packtrain/runtime/${room}" SYMBOLIC)
  endif()
  set(_name runtime_${room})
  if(ARG_SOURCES)
    add_library(packtrain_${_name} ${ARG_SOURCES})
    set(_scope PUBLIC)
  else()
    add_library(packtrain_${_name} INTERFACE)
    set(_scope INTERFACE)
  endif()
  add_library(packtrain::${_name} ALIAS packtrain_${_name})
  set_target_properties(packtrain_${_name} PROPERTIES EXPORT_NAME ${_name})
  if(ARG_SOURCES)
    set_target_properties(packtrain_${_name} PROPERTIES OUTPUT_NAME packtrain_${_name})
  endif()
  target_include_directories(packtrain_${_name} ${_scope}
    $<BUILD_INTERFACE:${_tree}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(packtrain_${_name} ${_scope} ${ARG_DEPS})
endfunction()

# packtrain_layer(<name> SOURCES ... DEPS ...): the library packtrain_<name> with
# alias packtrain::<name>; its headers are included as "packtrain/<name>/...".
function(packtrain_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(packtrain_${name} ${ARG_SOURCES})
  add_library(packtrain::${name} ALIAS packtrain_${name})
  set_target_properties(packtrain_${name} PROPERTIES EXPORT_NAME ${name}
                        OUTPUT_NAME packtrain_${name})
  target_include_directories(packtrain_${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(packtrain_${name} PUBLIC ${ARG_DEPS})
endfunction()

# One precompiled header of the Torch headers, reused by every target that links
# Torch (CMake's REUSE_FROM), so the 2-core machines parse them once.
function(packtrain_torch_pch target)
  if(NOT PACKTRAIN_USE_PCH)
    return()
  endif()
  if(NOT TARGET packtrain_torch_pch)
    add_library(packtrain_torch_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp")
    target_link_libraries(packtrain_torch_pch PRIVATE torch ${PACKTRAIN_FMT_TARGET})
    target_precompile_headers(packtrain_torch_pch PRIVATE
      <ATen/ATen.h> <torch/nn.h> <torch/optim.h>)
  endif()
  target_precompile_headers(${target} REUSE_FROM packtrain_torch_pch)
  # GCC only uses a precompiled header compiled with the same -fPIC/-fPIE: build
  # executables' objects with the libraries' -fPIC (they still link as PIE).
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
endfunction()

# add_gtest(<name> SOURCES ... DEPS ...): a GoogleTest binary in build/bin,
# registered with CTest as one entry that runs the whole binary. Not test by test:
# every process start loads LibTorch (about 0.9 s here): 714 cases x 0.9 s is about
# 11 of CI's 90 minutes. One case: build/bin/<name> --gtest_filter=Suite.Case.
function(add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock packtrain_test_support)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "PACKTRAIN_DATA_DIR=${PROJECT_SOURCE_DIR}/data" TIMEOUT 2400)
endfunction()
