"""drl's agent, in packages by layer (docs/design.md "Modules and the allowed imports").

The modules at this level are what every layer shares: the constants both the BPF program
and Python use (``abi``), value types and shared rules (``model``), units and their bounds
(``units``), log lines (``logs``), burst budgets (``burst``) and the demand estimator
(``estimator``).  The import arrows are import-linter contracts in pyproject.toml.
"""
