"""Diagnoses: a wrong answer turned into one sentence a student can act on, one module per part.

- flash.py: attention tensors, against the oracle and against known mistakes (mistakes.py);
- ddp.py: the ranks of a DDP wrapper, against single-process training;
- fsdp.py: the gathered parameters of an FSDP wrapper, against single-process training.
"""
