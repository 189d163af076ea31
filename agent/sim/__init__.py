"""Simulated hardware: NVML library, sysfs tree, kmsg and udev that behave like the real ones."""
