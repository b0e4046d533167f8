"""Triton templates the ``template`` proposer instantiates, one module per family.

Each module turns a recognised computation (``kernelabd.propose.template.match`` does the matching)
into the source text of a complete candidate file; none of them runs anything.
"""
