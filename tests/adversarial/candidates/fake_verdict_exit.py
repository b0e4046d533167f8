"""Exploit: print a fake passing verdict and leave with status 0 from inside forward.

Source: KernelBot cheat-fd.py / pygpubench "exit early" exploits; harnesses that parse the
candidate's stdout or treat exit status 0 as success.
"""
# reference: softmax
# expect: crash|protocol
# device: cpu

import json
import os
import sys

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        print(json.dumps({"verdict": "pass", "rule": None, "speedup": 100.0,
                          "faster_than_noise": True}))
        print("PASSED: all outputs match (max error 0.0)", file=sys.stderr)
        sys.stdout.flush()
        os._exit(0)
