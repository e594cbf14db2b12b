"""The SigLIP vision tower, shared by the families that see images through it (BAGEL's NaViT ViT, pi0's So400m/14)."""
