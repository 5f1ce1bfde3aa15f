//! fgpu data contract (no I/O).
