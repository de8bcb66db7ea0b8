# SPDX-License-Identifier: Apache-2.0
# `cmake --install BUILD [--prefix P]`: the headers of include/ckv/, libckv (static or shared),
# kvctl where it is built, the CMake package (find_package(ckv) gives ckv::ckv) and ckv.pc.
include(CMakePackageConfigHelpers)

set(CKV_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ckv)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ckv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(TARGETS ckv EXPORT ckvTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET kvctl)
  # An installed kvctl finds a shared libckv beside it, in the prefix's library directory.
  set_target_properties(kvctl PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS kvctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT ckvTargets NAMESPACE ckv:: DESTINATION ${CKV_INSTALL_CMAKEDIR})

# ckvConfig.cmake finds what libckv links: Abseil always (the public headers use it), and for a
# static libckv RocksDB, liburing, xxhash, hiredis, threads and, when built with CUDA, the CUDA runtime.
set(CKV_CONFIG_SHARED OFF)
if(BUILD_SHARED_LIBS)
  set(CKV_CONFIG_SHARED ON)
endif()
set(CKV_CONFIG_CUDA OFF)
if(CKV_HAVE_CUDA)
  set(CKV_CONFIG_CUDA ON)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ckvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ckvConfig.cmake
                              INSTALL_DESTINATION ${CKV_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ckvConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ckvConfig.cmake ${PROJECT_BINARY_DIR}/ckvConfigVersion.cmake
        DESTINATION ${CKV_INSTALL_CMAKEDIR})

# ckv.pc, for build systems other than CMake: `pkg-config --cflags --libs ckv` (add --static for
# a static libckv).
set(CKV_PC_REQUIRES "absl_status absl_statusor absl_strings absl_str_format absl_synchronization absl_flat_hash_map absl_flat_hash_set absl_btree absl_time")
set(CKV_PC_REQUIRES_PRIVATE "rocksdb liburing libxxhash hiredis")
set(CKV_PC_LIBS_PRIVATE "-lpthread")
if(CKV_HAVE_CUDA)
  string(APPEND CKV_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(CKV_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(CKV_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(CKV_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(CKV_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
set(CKV_PC_PREFIX "@CKV_PC_PREFIX@")  # kept for the install step below
configure_file(${CMAKE_CURRENT_LIST_DIR}/ckv.pc.in ${PROJECT_BINARY_DIR}/ckv.pc.in.configured @ONLY)
# The prefix is the one given to `cmake --install`, known only then.
install(CODE "
  file(READ \"${PROJECT_BINARY_DIR}/ckv.pc.in.configured\" pc)
  string(REPLACE \"@CKV_PC_PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\" pc \"\${pc}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/ckv.pc\" \"\${pc}\")
")
install(FILES ${PROJECT_BINARY_DIR}/ckv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
