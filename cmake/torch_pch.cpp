// Translation unit that carries the precompiled Torch headers (cmake/PacktrainHelpers.cmake).
