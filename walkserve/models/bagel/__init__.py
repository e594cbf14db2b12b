"""BAGEL (ByteDance-Seed/BAGEL-7B-MoT): one MoT LLM that understands, generates and edits images.

Importing this package is torch-free; the modules that hold tensors import torch themselves.
"""
