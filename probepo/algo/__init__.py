"""Pure, vectorised tensor maths of ALGORITHM.md: advantages, pivot selection, the policy loss.

Nothing here touches the store, the engines or any service; every function takes and returns tensors.
"""
