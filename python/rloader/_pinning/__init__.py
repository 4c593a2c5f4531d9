"""Pinning batches for the GPU: whether and how (``policy``), pinning in place by
registering memory with the CUDA driver (``cuda_host``), and the pin thread of worker
processes (``pin_thread``)."""
