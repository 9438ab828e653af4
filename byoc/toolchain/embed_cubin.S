/* A cubin unit's cubin (CUDA device code that nvcc compiled without a host pass), embedded
   in an object for the host unit that loads it at run time (cudaLibraryLoadData).
   BYOC_EMBED_SYMBOL and BYOC_EMBED_FILE come from the command line (byoc/toolchain/compiler.py):
   the symbol is the object's name, the file a path relative to the work directory. */
    .section .rodata
    .balign 128
    .globl BYOC_EMBED_SYMBOL
    .hidden BYOC_EMBED_SYMBOL
    .type BYOC_EMBED_SYMBOL, @object
BYOC_EMBED_SYMBOL:
    .incbin BYOC_EMBED_FILE
    .size BYOC_EMBED_SYMBOL, . - BYOC_EMBED_SYMBOL
    .section .note.GNU-stack,"",@progbits
