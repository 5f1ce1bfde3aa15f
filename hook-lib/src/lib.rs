//! libfgpu.so
