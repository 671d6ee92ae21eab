# `cmake --install`: the module libraries with the public headers, a find_package(tessera) config
# (targets tessera::<module>, tessera::runtime, tessera::tessera), tessera.pc for pkg-config, the
# `tessera` binary and the license (ADR 0026). Included by the top-level CMakeLists.txt after the
# modules and the binary are defined.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TESSERA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)

# Every module, and the embedded data geometry and plan link privately (static libraries: a
# consumer links them too). Exported as tessera::<module> and tessera::data.
get_property(tessera_install_modules GLOBAL PROPERTY TESSERA_MODULES)
set(tessera_install_targets tessera_data)
foreach(m IN LISTS tessera_install_modules)
  list(APPEND tessera_install_targets tessera_${m})
  set_target_properties(tessera_${m} PROPERTIES EXPORT_NAME ${m})
endforeach()
set_target_properties(tessera_data PROPERTIES EXPORT_NAME data)
set_target_properties(tessera_runtime PROPERTIES EXPORT_NAME runtime)

# tessera::tessera: every module (the runtime, the ledger, planning and pricing, the models).
add_library(tessera_library INTERFACE)
foreach(m IN LISTS tessera_install_modules)
  target_link_libraries(tessera_library INTERFACE tessera_${m})
endforeach()
set_target_properties(tessera_library PROPERTIES EXPORT_NAME tessera)

install(TARGETS ${tessera_install_targets} tessera_runtime tessera_library
        EXPORT tesseraTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

install(EXPORT tesseraTargets NAMESPACE tessera:: DESTINATION ${TESSERA_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tesseraConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/install/tesseraConfig.cmake
                              INSTALL_DESTINATION ${TESSERA_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/install/tesseraConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/install/tesseraConfig.cmake
              ${PROJECT_BINARY_DIR}/install/tesseraConfigVersion.cmake
        DESTINATION ${TESSERA_INSTALL_CMAKEDIR})

# tessera.pc: the libraries in link order (a module before every module it depends on, the
# embedded data after geometry and plan), found by a depth-first walk of the module graph.
set(tessera_pc_order "")
function(tessera_pc_visit m)
  get_property(done GLOBAL PROPERTY TESSERA_PC_DONE_${m})
  if(done)
    return()
  endif()
  set_property(GLOBAL PROPERTY TESSERA_PC_DONE_${m} TRUE)
  get_property(deps GLOBAL PROPERTY TESSERA_DEPS_${m})
  foreach(d IN LISTS deps)
    tessera_pc_visit(${d})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY TESSERA_PC_POSTORDER ${m})
endfunction()
foreach(m IN LISTS tessera_install_modules)
  tessera_pc_visit(${m})
endforeach()
get_property(tessera_pc_postorder GLOBAL PROPERTY TESSERA_PC_POSTORDER)
list(REVERSE tessera_pc_postorder)  # dependents first
set(TESSERA_PC_LIBS "")
foreach(m IN LISTS tessera_pc_postorder)
  string(APPEND TESSERA_PC_LIBS " -ltessera_${m}")
  if(m STREQUAL "geometry")  # the lowest module that links the embedded data (plan is above it)
    string(APPEND TESSERA_PC_LIBS " -ltessera_data")
  endif()
endforeach()
set(TESSERA_PC_REQUIRES_PRIVATE "libcrypto libxxhash")
set(TESSERA_PC_CFLAGS "")
set(TESSERA_PC_LIBS_PRIVATE "")
if(TESSERA_HAVE_CUDA)  # the CUDA module links the shared CUDA runtime
  set(TESSERA_PC_LIBS_PRIVATE "-L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
if(TESSERA_WITH_REDIS)
  string(APPEND TESSERA_PC_REQUIRES_PRIVATE " hiredis")
  string(APPEND TESSERA_PC_CFLAGS " -DTESSERA_HAVE_REDIS=1")
endif()
# Relocatable: the prefix is found from where the .pc file lies (pkg-config's ${pcfiledir}).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "tessera.pc needs CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
file(RELATIVE_PATH TESSERA_PC_UP /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
string(REGEX REPLACE "/$" "" TESSERA_PC_UP "${TESSERA_PC_UP}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/tessera.pc.in ${PROJECT_BINARY_DIR}/install/tessera.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/install/tessera.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
