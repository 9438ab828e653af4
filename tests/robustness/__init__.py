"""The robustness suite: cases generated from what byoc supports (ONNX op schemas, the
runtime's Python API and C ABI, the library file format), each run in a forked child so
that a crash or a hang is seen, not suffered. See README.md in this folder."""
