//! fake CUDA driver + NVML
