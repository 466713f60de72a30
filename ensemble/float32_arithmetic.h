#pragma once

// The arithmetic a float32 pack trains in, on a GPU: IEEE float32 (no TF32) in
// cuDNN's convolutions and cuBLAS's matmuls, and cuDNN's deterministic algorithms.
// PyTorch's defaults differ (cuDNN convolutions may use TF32, and pick algorithms
// whose backward sums in a varying order), so without this a convolutional pack on
// a GPU computes at 10-bit mantissa precision and a resumed run drifts from the
// uninterrupted one (2.6e-4 after a few epochs, H100, 2026-11-27). The flags are
// process-wide, so the scope restores them: a Python user's own torch settings stay
// theirs. Scopes nest and may overlap across threads (member-parallel steps): the
// first to open sets the flags, the last to close restores them, so no flag changes
// while any scope is open. Captured steps keep the algorithms chosen at capture.

namespace packtrain::ensemble {

class ExactFloat32Scope {
 public:
  ExactFloat32Scope();
  ~ExactFloat32Scope();
  ExactFloat32Scope(const ExactFloat32Scope&) = delete;
  ExactFloat32Scope& operator=(const ExactFloat32Scope&) = delete;
};

}  // namespace packtrain::ensemble
