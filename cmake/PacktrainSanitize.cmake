# PACKTRAIN_SANITIZE=address,undefined (the `sanitize` preset): every packtrain
# target compiles and links with those sanitizers, a frame pointer for readable
# stacks, and no recovery, so the first finding fails the test. LibTorch stays
# uninstrumented (the prebuilt one): scripts/sanitize.sh says what that costs.
set(PACKTRAIN_SANITIZE "" CACHE STRING
    "Sanitizers to build with, as -fsanitize= takes them (address,undefined); empty: none")
if(PACKTRAIN_SANITIZE)
  # C++ only: the CUDA kernels (nvcc) are not instrumented; the preset turns them off.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${PACKTRAIN_SANITIZE};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options("-fsanitize=${PACKTRAIN_SANITIZE}")
  message(STATUS "packtrain: sanitizers ${PACKTRAIN_SANITIZE}")
endif()
