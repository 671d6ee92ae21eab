# CUDA (ADR 0025), included from the top-level CMakeLists.txt after the modules it uses.
#
# tessera_cuda (always built, plain C++): the launch and transfer planning the kernels execute,
# tested on every machine and under the sanitizers.
# tessera_cudart (built when nvcc is found and TESSERA_WITH_CUDA is ON): device regions, the paged
# MLA decode kernels and the tier transfers, compiled for sm_90 and sm_100.
tessera_module(cuda HEADERS cuda_plan SOURCES src/cuda/plan.cc DEPS manager)

option(TESSERA_WITH_CUDA "Build the CUDA kernels and transfers when nvcc is found" ON)
set(TESSERA_HAVE_CUDA OFF)
if(TESSERA_WITH_CUDA)
  # nvcc lives outside PATH on this project's machines.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90;100")
    endif()
    enable_language(CUDA)
    # kernels.cu needs no C++20 (and CMake 3.25 knows no C++20 flag for nvcc 13).
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(TESSERA_HAVE_CUDA ON)
  else()
    message(STATUS "nvcc not found: the CUDA target (tessera_cudart) is not built")
  endif()
endif()

if(TESSERA_HAVE_CUDA)
  # The shared runtime (libcudart.so, found by CUDAToolkit); the toolkit's library directory is
  # passed on, since this layout's implicit link directories do not hold libcudadevrt.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  tessera_module(cudart HEADERS cuda_device SOURCES src/cuda/cuda_device.cc src/cuda/kernels.cu
                 DEPS cuda attention tier PRIVATE_DEPS CUDA::cudart PkgConfig::XXHASH)
  target_include_directories(tessera_cudart PRIVATE ${PROJECT_SOURCE_DIR}/src/cuda)
  target_link_directories(tessera_cudart PUBLIC ${CUDAToolkit_LIBRARY_DIR})
  # The project's warning flags are the host compiler's: wrap them so nvcc never sees them, and
  # pass the essential ones to its host pass.
  get_target_property(tessera_cudart_opts tessera_cudart COMPILE_OPTIONS)
  if(tessera_cudart_opts)
    list(TRANSFORM tessera_cudart_opts PREPEND "$<$<COMPILE_LANGUAGE:CXX>:")
    list(TRANSFORM tessera_cudart_opts APPEND ">")
    set_target_properties(tessera_cudart PROPERTIES COMPILE_OPTIONS "${tessera_cudart_opts}")
  endif()
  target_compile_options(tessera_cudart PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr -lineinfo>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${TESSERA_WERROR}>>:-Werror=all-warnings>)
  # Kernels are compiled optimized in every build type (a Debug -G build would be useless to time).
  set_source_files_properties(src/cuda/kernels.cu PROPERTIES COMPILE_OPTIONS "-O3")
  set_target_properties(tessera_cudart PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endif()
