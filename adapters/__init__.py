"""Adapters: runtime (Triton), GPU (NVML), comm and external telemetry -> typed state."""
