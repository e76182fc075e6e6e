"""How a submission is found and run, split along the trust boundary.

harness/  runs in the grader: finds submissions (discover), makes a runner's scratch folder
          (scratch, kernel_cache), starts and confines it (sandbox), watches it (watchdog) and
          calls it (client). It trusts everything in the project.
runner/   runs inside the sandbox, the only process that imports a submission's code (serve).
          It trusts exactly runner/ and wire/, copied beside it; never reference/ or tests/.
wire/     what both sides share: the message channel, the attention cases and the tensor exchange.

The package's name is one no submission uses, so a student's `adapters.py` never shadows it.
"""
