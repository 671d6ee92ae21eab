"""Independent PyTorch oracle for Tessera's tiny DeepSeek models (docs/adr/0017).

Written from the ADR text alone, in the plain formulation (per-head K/V materialized from the
latents, ordinary softmax attention). It shares with the C++ side only the weight file format and
the ADR; see docs/ORACLE.md.
"""
