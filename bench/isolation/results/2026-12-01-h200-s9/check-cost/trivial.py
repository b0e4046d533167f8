ModelNew = object
