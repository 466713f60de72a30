# install(): libraries, public headers and a CMake package, so another project can
#   find_package(packtrain REQUIRED)   # finds Torch, fmt and CUDA's NVTX too
#   target_link_libraries(app PRIVATE packtrain::runtime)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS packtrain_base packtrain_profiling packtrain_ensemble packtrain_graphs packtrain_runtime
                packtrain_runtime_data packtrain_runtime_io packtrain_runtime_distributed
                packtrain_runtime_trainers packtrain_runtime_measure
        EXPORT packtrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS packtrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Headers as include/packtrain/<layer>/...; the CLI's headers are not an API, nor
# are a class's private headers (*_internal.h, shared by the .cpp files beside them).
foreach(layer base profiling ensemble graphs runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/packtrain/${layer}
          FILES_MATCHING PATTERN "*.h" PATTERN "cli" EXCLUDE PATTERN "*_internal.h" EXCLUDE)
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/ DESTINATION ${CMAKE_INSTALL_DATADIR}/packtrain/data)
install(EXPORT packtrainTargets NAMESPACE packtrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/packtrain)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/packtrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/packtrainConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/packtrain)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/packtrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/packtrainConfig.cmake ${PROJECT_BINARY_DIR}/packtrainConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/packtrain)
