"""In-process restart and straggler detection (nvidia-resiliency-ext): the launching host's plan, the ranks' side."""
