//! amdgpu-cr
