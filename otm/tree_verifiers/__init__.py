"""Published whole-tree verification rules, their float64 numpy arithmetic (one module per rule).

The decoder-side :class:`otm.decode.tree_rules.TreeRule` of each rule lives in
``otm/decode/tree_rules_<rule>.py`` and is registered in :mod:`otm.decode.tree_registry`; block and
traversal verification's arithmetic is :mod:`otm.tree_verification`.
"""
