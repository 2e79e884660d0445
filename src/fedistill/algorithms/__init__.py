"""Algorithms, one folder per family; `registry` imports them all and looks them up by name.

`base` says what an algorithm is; `shared/` holds the pieces several families use (training loops,
the stage-1 cache, distillation data, selection, oracles). A family imports `shared/`, its own folder,
and another family only through that family's package (its public face), never its internals.
"""
