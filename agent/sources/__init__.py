"""Hardware sources, one interface each: NVML, sysfs, the kernel log and udev."""
