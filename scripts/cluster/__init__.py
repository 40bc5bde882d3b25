"""The emulated cluster: `ccbench cluster`, its layout, namespaces, keeper, jobs, self-check."""
