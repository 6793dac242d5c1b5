"""Traffic classes as the operator writes them: ``--class`` specs parsed into rules.

Pure data and parsing (``spec``), and nested classes' arithmetic (``hierarchy``:
a tree's global limits from its leaves' demands, docs/hierarchy.md); the kernel side lays the rules out in its
maps (``kernel.classify``) and the service runs one allocator per class
(``service.class_table``).

May import: the standard library and agent/units.py.
"""
