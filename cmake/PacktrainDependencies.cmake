# Finds packtrain's dependencies. Torch comes from the cached virtual environment
# that scripts/setup.sh fills (or from Torch_DIR / the python3 on PATH); the rest
# from Debian's packages and the CUDA toolkit already on the machine.

set(PACKTRAIN_TORCH_VERSION 2.11.0)

# --- Torch -----------------------------------------------------------------
# Building the Python package (pip install ., scikit-build-core): the torch of the
# environment it installs into, which scikit-build-core's interpreter sees.
if(SKBUILD AND NOT Torch_DIR)
  set(Python3_EXECUTABLE "${Python_EXECUTABLE}")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _pt_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _pt_rc)
  if(NOT _pt_rc EQUAL 0)
    message(FATAL_ERROR "packtrain's Python package builds against the torch of the environment, which ${Python_EXECUTABLE} cannot import: pip install torch==2.11.0, then pip install --no-build-isolation .")
  endif()
  set(Torch_DIR "${_pt_prefix}/Torch" CACHE PATH "Directory holding TorchConfig.cmake")
endif()
if(NOT Torch_DIR)
  if(DEFINED ENV{PACKTRAIN_CACHE})
    set(_pt_cache "$ENV{PACKTRAIN_CACHE}")
  elseif(DEFINED ENV{XDG_CACHE_HOME})
    set(_pt_cache "$ENV{XDG_CACHE_HOME}/packtrain")
  else()
    set(_pt_cache "$ENV{HOME}/.cache/packtrain")
  endif()
  file(GLOB _pt_torch_dirs
       "${_pt_cache}/venv-torch-${PACKTRAIN_TORCH_VERSION}/lib/python*/site-packages/torch/share/cmake/Torch")
  if(_pt_torch_dirs)
    list(GET _pt_torch_dirs 0 _pt_torch_dir)
  else()
    # A machine with PyTorch installed for its python3 (the GPU machines).
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
        OUTPUT_VARIABLE _pt_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_pt_prefix)
        set(_pt_torch_dir "${_pt_prefix}/Torch")
      endif()
    endif()
  endif()
  if(_pt_torch_dir)
    set(Torch_DIR "${_pt_torch_dir}" CACHE PATH "Directory holding TorchConfig.cmake")
  endif()
endif()

# Torch's CUDA build looks for the toolkit; point it at the usual place if nvcc is
# not on PATH.
if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CUDAToolkit_ROOT /usr/local/cuda)
  set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda)
endif()

# Without an explicit list Torch's CMake tries to run a GPU probe at configure
# time, which fails on machines without a GPU. Hopper (H100/H200) is what the GPU
# machines have; override with -DTORCH_CUDA_ARCH_LIST=... for others.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for Torch's CMake")
endif()
find_package(Torch REQUIRED)
if(NOT Torch_VERSION VERSION_EQUAL PACKTRAIN_TORCH_VERSION)
  message(WARNING "packtrain is built and tested against Torch ${PACKTRAIN_TORCH_VERSION}; found ${Torch_VERSION} in ${Torch_DIR}")
endif()
# Torch's directory that holds its shared libraries, for RPATHs and tests.
get_filename_component(PACKTRAIN_TORCH_LIB_DIR "${Torch_DIR}/../../../lib" ABSOLUTE)
# The Python whose torch this is (the Python package and its tests use it):
# <env>/lib/pythonX.Y/site-packages/torch/share/cmake/Torch -> <env>/bin/python3.
get_filename_component(_pt_env "${Torch_DIR}/../../../../../../.." ABSOLUTE)
if(NOT Python3_EXECUTABLE AND EXISTS "${_pt_env}/bin/python3")
  set(Python3_EXECUTABLE "${_pt_env}/bin/python3")
endif()

# --- CUDA toolkit: NVTX (header-only nvtx3), NCCL later -------------------------
find_package(CUDAToolkit QUIET)
if(TARGET CUDA::nvtx3)
  set(PACKTRAIN_HAVE_NVTX ON)
else()
  set(PACKTRAIN_HAVE_NVTX OFF)
  message(STATUS "packtrain: NVTX headers not found; NVTX ranges compile to nothing")
endif()

# --- fmt ------------------------------------------------------------------
# Torch's include directory carries its own fmt (12.x) and comes before
# /usr/include, so a translation unit that includes Torch sees Torch's fmt while one
# that does not sees Debian's (9.x). Both are used header-only (FMT_HEADER_ONLY),
# so no translation unit links a compiled fmt of another version than the headers
# it saw; fmt's versioned inline namespaces (fmt::v9, fmt::v12) keep the two apart.
# Rule that follows: fmt appears in .cpp files only, never in a public header.
# tests/fmt_consistency_test.cpp checks this.
find_package(fmt REQUIRED)
set(PACKTRAIN_FMT_TARGET fmt::fmt-header-only)
# Defined for every target, so all translation units (and the precompiled Torch
# header they share) agree.
add_compile_definitions(FMT_HEADER_ONLY=1)

# --- libzip: .npz archives (runtime/data/npy_file.cpp; Debian's libzip-dev) -----
# Through pkg-config: Debian's libzip CMake package names tools (zipcmp, ...) that
# libzip-dev does not install, so find_package(libzip) fails without them.
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET GLOBAL libzip)
# --- PCRE2: GPT-2's Unicode pre-tokenization pattern (runtime/data/bpe_tokenizer.cpp;
# Debian's libpcre2-dev) ----------------------------------------------------------
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET GLOBAL libpcre2-8)
# --- SentencePiece: Llama's tokenizer (runtime/data/sentencepiece_tokenizer.cpp;
# Debian's libsentencepiece-dev) ---------------------------------------------------
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET GLOBAL sentencepiece)

if(PACKTRAIN_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(PACKTRAIN_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
