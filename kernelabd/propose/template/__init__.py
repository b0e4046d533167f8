"""The ``template`` proposer: ``graph`` recognises the reference's computation in its torch.fx
graph, ``match`` picks the Triton template for it, ``proposer`` turns that into candidates."""
