"""Opt-in integrations of rloader with frameworks that rebuild DataLoaders.

Each integration is a submodule, imported only when asked for (importing this package imports
no framework):

- :mod:`rloader.integrations.accelerate`: Hugging Face accelerate's ``Accelerator.prepare()``
  keeps rloader's engine (``rloader.integrations.accelerate.install()``).
- :mod:`rloader.integrations.transformers`: a stock Hugging Face ``Trainer`` loads with
  ``rloader.DataLoader`` (``rloader.integrations.transformers.install()``).
"""
