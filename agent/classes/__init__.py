"""Traffic classes as the operator writes them: ``--class`` specs parsed into rules.

Pure data and parsing (``spec``); the kernel side lays the rules out in its
maps (``kernel.classify``) and the service runs one allocator per class
(``service.class_table``).

May import: the standard library only.
"""
