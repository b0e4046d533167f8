"""The ``template`` proposer: ``canon`` and ``graph`` put the reference's torch.fx graph in a
canonical form, ``match`` picks the Triton template for it, ``recognise`` is the subprocess that
does both (the reference is untrusted code), ``proposer`` turns its answer into candidates."""
