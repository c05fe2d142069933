//! criu-gpu
