import torch
ModelNew = object
